"""Prompt and preference-pair datasets read from jsonl or parquet files through a key mapping.

    load_prompts("gsm8k.parquet", prompt_key="question", answer_key="reward_model.ground_truth")
    load_pairs("prefs.jsonl", prompt_key="prompt", chosen_key="chosen", rejected_key="rejected")

A key is a field name, or a dotted path into nested objects and lists (`reward_model.ground_truth`,
`messages.0.content`); a field whose own name contains the dot wins over the path. Every problem
in a file (a malformed line, a missing field, a wrong type) is collected and raised as one
`DataError` naming the file, the key and the lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_core.errors import InputError

SUPPORTED_SUFFIXES = (".jsonl", ".parquet")
MAX_REPORTED = 10  # problems listed in one error; the rest are counted

Messages = list[dict[str, str]]


class DataError(InputError):
    """A dataset, template or generator request that cannot be used; the message says why."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt with its reference answer.

    `prompt` is text, or chat messages (`[{"role": "user", "content": ...}]`). `extra` holds the
    record's other top-level fields. `images`: what its image field names (paths, bytes or
    mappings; `rl_core.data.images` reads them). `row` is the 1-based line number in a jsonl
    file (what an editor shows) and the 0-based row index in a parquet file (what pyarrow
    takes).
    """

    prompt: str | Messages
    ground_truth: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    row: int = 0
    images: tuple[Any, ...] = ()

    @property
    def where(self) -> str:
        return _where(self.source, self.row)


@dataclass(frozen=True)
class PairRecord:
    """One DPO preference pair: a prompt, the preferred and the rejected response."""

    prompt: str | Messages
    chosen: str | Messages
    rejected: str | Messages
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    row: int = 0

    @property
    def where(self) -> str:
        return _where(self.source, self.row)


def _row_label(source: str | Path, row: int) -> str:
    return f"line {row}" if str(source).endswith(".jsonl") else f"row {row}"


def _where(source: str, row: int) -> str:
    return f"{source} {_row_label(source, row)}"


# --------------------------------------------------------------------------- fields


_MISSING = object()


def get_field(record: Mapping[str, Any], key: str) -> Any:
    """The value at `key` (a name or a dotted path); raises KeyError when absent."""
    if key in record:
        return record[key]
    value: Any = record
    for part in key.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(key)
    return value


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    )


def _text_or_messages(value: Any) -> str | Messages:
    """`value` as a prompt or response; raises TypeError naming what it got."""
    if isinstance(value, str):
        return value
    if _is_messages(value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise TypeError(
        f"must be text or a list of {{role, content}} messages, got {type(value).__name__}"
    )


# --------------------------------------------------------------------------- problems


class _Problems:
    """The problems of one file: malformed rows listed by line, missing fields summarised by key."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[str] = []
        self.row_count = 0
        self.missing: dict[str, list[Any]] = {}  # label -> [count, first where, fields there]

    def bad_row(self, where: str, message: str) -> None:
        self.row_count += 1
        if len(self.rows) < MAX_REPORTED:
            self.rows.append(f"{where}: {message}")

    def missing_field(self, label: str, where: str, fields: Iterable[str]) -> None:
        entry = self.missing.setdefault(label, [0, where, sorted(fields)])
        entry[0] += 1

    def raise_if_any(self, total: int) -> None:
        if not self.rows and not self.missing:
            return
        lines = [f"{self.path}: unusable records"]
        for label, (count, where, fields) in self.missing.items():
            present = ", ".join(fields) or "none"
            lines.append(
                f"  field {label} missing in {count} of {total} records "
                f"(first at {where}); fields present there: {present}"
            )
        lines.extend(f"  {row}" for row in self.rows)
        if self.row_count > len(self.rows):
            lines.append(f"  ... and {self.row_count - len(self.rows)} more bad records")
        raise DataError("\n".join(lines))


# --------------------------------------------------------------------------- reading


def _check_path(path: Path) -> None:
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {path.suffix or '(no extension)'!r}; "
            f"use one of {', '.join(SUPPORTED_SUFFIXES)}"
        )
    if not path.is_file():
        raise DataError(f"{path}: no such file")


def _jsonl_rows(path: Path, problems: _Problems) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            where = f"line {number}"
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                problems.bad_row(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
                continue
            except json.JSONDecodeError as exc:
                problems.bad_row(where, f"invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(row, dict):
                problems.bad_row(where, f"expected a JSON object, got {type(row).__name__}")
                continue
            yield number, row


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    yield from enumerate(table.to_pylist())


def read_rows(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """The raw records of a jsonl or parquet file as (line or row, record) pairs."""
    path = Path(path)
    _check_path(path)
    problems = _Problems(path)
    if path.suffix == ".jsonl":
        rows = list(_jsonl_rows(path, problems))
    else:
        rows = list(_parquet_rows(path))
    problems.raise_if_any(len(rows) + problems.row_count)
    if not rows:
        raise DataError(f"{path}: no records (the file is empty)")
    return rows


def write_rows(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write records to a jsonl or parquet file chosen by the suffix; returns the path."""
    path = Path(path)
    if path.suffix not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"{path}: unsupported file type {path.suffix!r}; "
            f"use one of {', '.join(SUPPORTED_SUFFIXES)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(list(rows))
        except pa.ArrowException as exc:
            raise DataError(f"{path}: records do not fit one parquet schema ({exc})") from exc
        pq.write_table(table, path)
    return path


def image_refs(value: Any) -> list[Any]:
    """The images a record's image field names: one image (a path, bytes, or a mapping with
    `bytes` or `path`) or a list of them (None or an empty list: none); TypeError for anything
    else. `rl_core.data.images` reads them."""
    if value is None:
        return []
    if isinstance(value, (str, bytes, bytearray, Mapping)):
        return [value]
    if isinstance(value, Sequence) or hasattr(value, "tolist"):  # a list, or a parquet array
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        for item in items:
            if not isinstance(item, (str, bytes, bytearray, Mapping)):
                raise TypeError(f"an image must be a path, bytes or a mapping with 'bytes' or "
                                f"'path', got {type(item).__name__}")
        return items
    raise TypeError(f"expected an image or a list of images, got {type(value).__name__}")


# --------------------------------------------------------------------------- mapping


def _map_rows(
    path: str | Path, keys: Mapping[str, str | None]
) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(row, record, {role: value}) for every record of `path`, where `keys` maps a role
    (`prompt_key`, ...) to the record field that holds it; None means the role is not used.
    Text roles are checked to be text or chat messages."""
    path = Path(path)
    rows = read_rows(path)
    problems = _Problems(path)
    mapped = []
    for row, record in rows:
        where = _row_label(path, row)
        values: dict[str, Any] = {}
        for role, key in keys.items():
            if key is None:
                continue
            try:
                value = get_field(record, key)
            except KeyError:
                problems.missing_field(f"{key!r} ({role})", where, record)
                continue
            if role == "image_key":
                try:
                    value = tuple(image_refs(value))
                except TypeError as exc:
                    problems.bad_row(where, f"field {key!r} ({role}): {exc}")
                    continue
            elif role != "answer_key":
                try:
                    value = _text_or_messages(value)
                except TypeError as exc:
                    problems.bad_row(where, f"field {key!r} ({role}) {exc}")
                    continue
            values[role] = value
        mapped.append((row, record, values))
    problems.raise_if_any(len(rows))
    return mapped


def _extra(record: Mapping[str, Any], keys: Iterable[str | None]) -> dict[str, Any]:
    used = {k for k in keys if k is not None}
    return {k: v for k, v in record.items() if k not in used}


def load_prompts(
    path: str | Path, *, prompt_key: str = "prompt", answer_key: str | None = "answer",
    image_key: str | None = None,
) -> list[PromptRecord]:
    """The prompts of one jsonl or parquet file. `answer_key: None` reads prompts without a
    reference answer (a model reward scores them); `image_key`: the field naming each
    prompt's images (one or a list; None: text only)."""
    keys = {"prompt_key": prompt_key, "answer_key": answer_key, "image_key": image_key}
    return [
        PromptRecord(
            prompt=values["prompt_key"],
            ground_truth=values.get("answer_key"),
            extra=_extra(record, keys.values()),
            source=str(path),
            row=row,
            images=values.get("image_key", ()),
        )
        for row, record, values in _map_rows(path, keys)
    ]


def load_pairs(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    chosen_key: str = "chosen",
    rejected_key: str = "rejected",
) -> list[PairRecord]:
    """The preference pairs of one jsonl or parquet file, for DPO."""
    keys = {"prompt_key": prompt_key, "chosen_key": chosen_key, "rejected_key": rejected_key}
    return [
        PairRecord(
            prompt=values["prompt_key"],
            chosen=values["chosen_key"],
            rejected=values["rejected_key"],
            extra=_extra(record, keys.values()),
            source=str(path),
            row=row,
        )
        for row, record, values in _map_rows(path, keys)
    ]


def load_prompt_files(paths: Sequence[str | Path], **keys: Any) -> list[PromptRecord]:
    """`load_prompts` over several files, concatenated in order."""
    if not paths:
        raise DataError("no data files given")
    return [record for path in paths for record in load_prompts(path, **keys)]


def load_pair_files(paths: Sequence[str | Path], **keys: Any) -> list[PairRecord]:
    """`load_pairs` over several files, concatenated in order."""
    if not paths:
        raise DataError("no data files given")
    return [record for path in paths for record in load_pairs(path, **keys)]
