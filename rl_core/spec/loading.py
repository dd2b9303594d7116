"""Reading a spec: YAML without anchors, aliases or tags (`load_yaml`), bounded mappings
(`check_spec_bounds`), dotted overrides, the preset underneath (`resolve_spec`), one
`SpecError` listing every problem by field path, the defaults and the JSON Schema."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from rl_core.errors import InputError
from rl_core.spec.limits import (
    ALGORITHMS,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_NODES,
    MAX_YAML_CHARS,
    is_model,
    scan,
    without_none,
)
from rl_core.spec.model import RunSpec, SpecRuleViolation
from rl_core.spec.presets import PRESETS
from rl_core.spec.rules import NOT_IMPLEMENTED, not_implemented_note

# --------------------------------------------------------------------------- errors


class SpecError(InputError):
    """A spec that cannot be resolved; `errors` lists `{"field": dotted path, "message": ...}`.

    `field` is "" for problems with the whole spec (YAML syntax, a malformed override).
    """

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__(
            "\n".join(
                f"{e['field']}: {e['message']}" if e["field"] else e["message"] for e in errors
            )
        )

    @classmethod
    def single(cls, field: str, message: str) -> SpecError:
        return cls([{"field": field, "message": message}])

    @classmethod
    def from_validation_error(cls, exc: ValidationError) -> SpecError:
        errors: list[dict[str, str]] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            prefix = ".".join(str(part) for part in loc)
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, SpecRuleViolation):
                errors += [
                    {"field": f"{prefix}.{field}" if prefix else field, "message": message}
                    for field, message in cause.violations
                ]
                continue
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message += _unknown_key_hint(loc)
            errors.append({"field": prefix, "message": message})
        return cls(errors)


def _unknown_key_hint(loc: tuple[Any, ...]) -> str:
    known = _known_keys(loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f": unknown key, did you mean {close[0]!r}?"
    return f": unknown key, expected one of {', '.join(known)}" if known else ": unknown key"


def _known_keys(parent: tuple[Any, ...]) -> list[str]:
    """Field names of the model found at `parent` (a pydantic loc) inside RunSpec."""
    tp: Any = RunSpec
    for part in parent:
        tp = without_none(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif is_model(tp) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return []
    tp = without_none(tp)
    return list(tp.model_fields) if is_model(tp) else []


# --------------------------------------------------------------------------- resolution


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A deep copy of `raw` with each `dotted.key=value` applied; values are parsed as YAML."""
    data = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise SpecError.single(
                "",
                f"override {item!r} must look like dotted.key=value "
                "(e.g. rollout.n_samples_per_prompt=8)",
            )
        try:
            value, _ = _read_yaml(text)
        except _YAMLProblem as exc:
            verdict = "is not accepted" if exc.refused else "is not valid YAML"
            raise SpecError.single(
                ".".join(parts), f"override value {_short(text)} {verdict}: {exc}"
            ) from exc
        _set_dotted(data, parts, value)
    return data


def override_refusal(item: str) -> str | None:
    """Why the value of a `dotted.key=value` override is refused (an anchor, alias or tag, too
    long or too deep), or None; a malformed key or a YAML syntax error is `apply_overrides`'s to
    report at the field."""
    _, sep, text = item.partition("=")
    try:
        value = _read_yaml(text)[0] if sep else None
    except _YAMLProblem as exc:
        return f"override value {_short(text)} is not accepted: {exc}" if exc.refused else None
    problem = scan(value, MAX_SPEC_DEPTH, MAX_SPEC_NODES)
    return f"override value {_short(text)}: {problem[1]}" if problem else None


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _set_dotted(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
            elif node.get(part) is None:
                node[part] = {}
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SpecError.single(
                    ".".join(parts[: i + 1]),
                    f"override: {part!r} is not an index of this list of {len(node)} items",
                )
            if last:
                node[int(part)] = value
            node = node[int(part)]
        else:
            parent = ".".join(parts[:i])
            raise SpecError.single(
                parent, f"override: {parent} is a {type(node).__name__}, not a section"
            )


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `top`, recursively for mappings; lists and scalars of `top` win whole."""
    merged = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_spec(raw: Mapping[str, Any], overrides: Sequence[str] = ()) -> RunSpec:
    """Apply `overrides` to `raw`, fill the rest from the algorithm's preset, and validate."""
    if not isinstance(raw, Mapping):
        raise SpecError.single(
            "", f"a run spec is a mapping of sections, not a {type(raw).__name__}"
        )
    check_spec_bounds(raw)
    data = apply_overrides(raw, overrides)
    check_spec_bounds(data)
    algorithm = data.setdefault("algorithm", "grpo")
    if not isinstance(algorithm, str) or algorithm not in PRESETS:
        raise SpecError.single(
            "algorithm", f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}"
        )
    merged = _deep_merge(PRESETS[algorithm], data)
    try:
        return RunSpec.model_validate(merged)
    except ValidationError as exc:
        first = SpecError.from_validation_error(exc)
        rules_ran = any(isinstance(e.get("ctx", {}).get("error"), SpecRuleViolation)
                        for e in exc.errors())
        behind = [] if rules_ran else _errors_behind(merged, first.errors)
        raise SpecError(first.errors + behind) from exc


def _errors_behind(data: dict[str, Any], errors: list[dict[str, str]], rounds: int = 3) -> list[dict[str, str]]:
    """The errors that field errors hide (pydantic checks the rules of a whole spec only once
    every field is valid): with the fields in error left out (their defaults taken), the spec is
    checked again, so one answer holds a type error here and a rule broken there."""
    found: list[dict[str, str]] = []
    seen = {e["field"] for e in errors}
    for _ in range(rounds):
        data = copy.deepcopy(data)
        if not [_drop(data, field.split(".")) for field in sorted(seen) if field].count(True):
            return found
        try:
            RunSpec.model_validate(data)
            return found
        except ValidationError as exc:
            new = [e for e in SpecError.from_validation_error(exc).errors if e["field"] not in seen]
        if not new:
            return found
        found += new
        seen |= {e["field"] for e in new}
    return found


def _drop(data: Any, parts: list[str]) -> bool:
    """Remove the value at a dotted error path (a list item takes its whole list along)."""
    node = data
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return False
        if i == len(parts) - 1 or not isinstance(node[part], dict):
            del node[part]
            return True
        node = node[part]
    return False


def check_spec_bounds(data: Any) -> None:
    """Refuse a spec (the raw mapping, whatever its source) that is too deep, holds too many
    values or is too large as JSON; the SpecError says the limit."""
    problem = scan(data, MAX_SPEC_DEPTH, MAX_SPEC_NODES)
    if problem:
        where, message = problem
        raise SpecError.single(where, f"the spec is {message}" if not where else message)
    size = len(json.dumps(data, default=str))
    if size > MAX_SPEC_BYTES:
        raise SpecError.single(
            "",
            f"the spec is {size} bytes as JSON, more than the limit of {MAX_SPEC_BYTES}: shorten "
            "it; large data belongs in files (data.train_files)",
        )


def load_yaml(text: str, source: str = "<spec>") -> Any:
    """The value of one YAML document read by the spec loader (no anchors, aliases or tags,
    bounded length and nesting); a problem raises SpecError naming the line and column."""
    try:
        return _read_yaml(text)[0]
    except _YAMLProblem as exc:
        raise SpecError.single("", f"{source}: {exc}") from exc


def parse_spec_yaml(text: str, source: str = "<spec>") -> dict[str, Any]:
    """The mapping in a YAML document; a syntax error, a refused construct (anchor, alias, tag),
    a non-mapping or a spec beyond the limits raises SpecError (with the line)."""
    try:
        data, node = _read_yaml(text)
    except _YAMLProblem as exc:
        raise SpecError.single("", f"{source}: {exc}") from exc
    if node is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError.single(
            "",
            f"{source}: line {node.start_mark.line + 1}: the top level must be a mapping of "
            f"sections (algorithm:, model:, data:, ...), not a {type(data).__name__}",
        )
    check_spec_bounds(data)
    return data


class _YAMLProblem(ValueError):
    """Why a YAML text was not read; `refused` when it is valid YAML the spec does not accept."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class _Refused(yaml.MarkedYAMLError):
    """A construct the spec loader does not accept (raised while composing)."""


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases or tags, and with bounded nesting: a spec
    is plain data, and an alias can expand a few bytes into gigabytes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._refuse(event, f"YAML aliases (*{event.anchor})", "write the value out in full")
        if event.anchor is not None:
            self._refuse(event, f"YAML anchors (&{event.anchor})", "write the value out in full")
        if getattr(event, "tag", None) is not None:
            self._refuse(event, f"YAML tags ({event.tag})", "remove the tag, write a plain value")
        if isinstance(event, yaml.CollectionStartEvent) and self._depth >= MAX_SPEC_DEPTH:
            raise _Refused(
                problem=f"nesting deeper than the limit of {MAX_SPEC_DEPTH} levels is not "
                "accepted in a run spec",
                problem_mark=event.start_mark,
                note="flatten it",
            )
        self._depth += isinstance(event, yaml.CollectionStartEvent)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= isinstance(event, yaml.CollectionStartEvent)

    @staticmethod
    def _refuse(event: yaml.Event, what: str, fix: str) -> None:
        raise _Refused(
            problem=f"{what} are not accepted in a run spec",
            problem_mark=event.start_mark,
            note=fix,
        )


def _read_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """(value, root node) of one YAML document, read by `_SpecLoader`; raises _YAMLProblem."""
    if len(text) > MAX_YAML_CHARS:
        raise _YAMLProblem(
            f"{len(text)} characters of YAML, more than the limit of {MAX_YAML_CHARS}: shorten "
            "it; large data belongs in files",
            refused=True,
        )
    try:
        loader = _SpecLoader(text)  # its reader refuses control characters at once
    except yaml.YAMLError as exc:
        raise _YAMLProblem(f"YAML error: {exc}") from exc
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except _Refused as exc:
        message = f"{exc.problem} (at {_position(exc.problem_mark)}): {exc.note}"
        raise _YAMLProblem(message, refused=True) from exc
    except yaml.MarkedYAMLError as exc:
        message = f"YAML syntax error at {_position(exc.problem_mark)}: {exc.problem}"
        if exc.context:
            message += f" ({exc.context} at {_position(exc.context_mark)})"
        raise _YAMLProblem(message) from exc
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        raise _YAMLProblem(f"YAML error: {exc}") from exc
    finally:
        loader.dispose()


def _position(mark: yaml.Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown position"


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> RunSpec:
    """Read a YAML spec file and resolve it (see `resolve_spec`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError.single("", f"{path}: cannot read: {exc.strerror or exc}") from exc
    return resolve_spec(parse_spec_yaml(text, str(path)), overrides)


def spec_defaults(algorithm: str = "grpo") -> dict[str, Any]:
    """Every value a spec of `algorithm` gets when it sets nothing (the preset over the field
    defaults, as JSON, list defaults included), without the rules that need a whole spec (a
    spec that sets nothing has no data). What a form shows where the user left a field empty."""
    preset = PRESETS.get(algorithm, {})
    values: dict[str, Any] = {}
    for name, info in RunSpec.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            values[name] = kind.model_validate(preset.get(name, {})).model_dump(mode="json")
        else:
            values[name] = preset.get(name, info.get_default(call_default_factory=True))
    values["algorithm"] = algorithm
    return values


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of RunSpec, for forms and external validation. The
    description of each field in NOT_IMPLEMENTED begins with what is built."""
    schema = RunSpec.model_json_schema()
    for path in NOT_IMPLEMENTED:
        node = schema
        for part in path.split("."):
            node = _schema_object(schema, node)["properties"][part]
        node["description"] = described(path, node.get("description", ""))
    return schema


def _schema_object(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The object schema a property refers to (through `$ref`, or `anyOf` with null)."""
    refs = [n["$ref"] for n in (node, *node.get("anyOf", ())) if "$ref" in n]
    return schema["$defs"][refs[0].rsplit("/", 1)[1]] if refs else node


def described(path: str, description: str) -> str:
    """A field's description, led by its not-implemented note when it has one."""
    note = not_implemented_note(path)
    return f"{note[0].upper()}{note[1:]}. {description}" if note else description
