"""The submit form, generated from the RunSpec JSON Schema (rl_core.spec is the contract).

Every leaf of the schema is a form field named `spec.<dotted path>`; an empty field means "the
preset's default" and is left out of the spec, so a submission holds only what the user chose,
exactly as a hand-written YAML spec would. Values are parsed by their schema type; a value that
does not parse is an error at its field, and nothing else is lost.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import yaml

from rl_core.spec import SpecError, load_yaml, spec_defaults, spec_json_schema

PREFIX = "spec."
# Shown above the sections: what nearly every run sets.
MAIN_FIELDS = {"model.path": "Model", "data.train_files": "Training files",
               "data.val_files": "Validation files", "data.synthetic.task": "Synthetic task",
               "trainer.total_steps": "Total steps"}
SECTION_TITLES = {"dpo": "DPO"}
# Sections open at first sight; the rest are folded ("advanced").
OPEN_SECTIONS = ("data", "trainer")


@dataclass
class Field:
    path: str                       # dotted path in the spec, e.g. "actor.lr"
    kind: str                       # integer | number | boolean | string | enum | list | json
    label: str
    help: str = ""
    choices: list[str] = field(default_factory=list)
    default: Any = None             # the schema's default (before any preset)
    nullable: bool = False
    minimum: float | None = None

    @property
    def name(self) -> str:
        return PREFIX + self.path

    @property
    def dom_id(self) -> str:
        """The id of its input (paths hold letters, digits, underscores and dots)."""
        return "spec-" + self.path.replace(".", "-")


@dataclass
class Section:
    path: str
    title: str
    help: str
    fields: list[Field]


def _resolve(schema: dict, node: dict) -> tuple[dict, bool]:
    """The node behind $ref / anyOf-with-null, and whether null is allowed."""
    nullable = False
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        nullable = len(options) < len(node["anyOf"])
        if len(options) == 1:
            node = {**options[0], **{k: v for k, v in node.items() if k != "anyOf"}}
    if "$ref" in node:
        target = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node, nullable


def _fields(schema: dict, node: dict, prefix: str) -> list[Field]:
    out = []
    for key, raw in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        prop, nullable = _resolve(schema, raw)
        if prop.get("type") == "object" and "properties" in prop:
            out.extend(_fields(schema, prop, path + "."))
            continue
        kind = prop.get("type") if isinstance(prop.get("type"), str) else "json"
        items = prop.get("items", {})
        if "enum" in prop:
            kind = "enum"
        elif kind == "array":
            kind = "list" if items.get("type") in ("string", "integer", "number") else "json"
        elif kind not in ("integer", "number", "boolean", "string"):
            kind = "json"
        out.append(Field(
            path=path, kind=kind, label=key.replace("_", " "), help=prop.get("description", ""),
            choices=[str(c) for c in prop.get("enum", [])], default=prop.get("default"),
            nullable=nullable, minimum=prop.get("minimum", prop.get("exclusiveMinimum")),
        ))
    return out


@cache
def sections() -> tuple[list[Field], list[Section]]:
    """(main fields, sections of the other fields) from the RunSpec JSON Schema."""
    schema = spec_json_schema()
    general = Section("general", "General", "Settings of the whole run.", [])
    grouped = [general]
    for key, raw in schema["properties"].items():
        node, _ = _resolve(schema, raw)
        if node.get("type") == "object" and "properties" in node:
            grouped.append(Section(key, SECTION_TITLES.get(key, key.replace("_", " ").capitalize()),
                                   raw.get("description", ""), _fields(schema, node, key + ".")))
        elif key not in ("algorithm", "name"):  # both have fields of their own on the form
            general.fields.extend(_fields(schema, {"properties": {key: raw}}, ""))
    by_path = {f.path: f for s in grouped for f in s.fields}
    main = [replace(by_path[path], label=label) for path, label in MAIN_FIELDS.items()]
    for section in grouped:
        section.fields = [f for f in section.fields if f.path not in MAIN_FIELDS]
    return main, [s for s in grouped if s.fields]


def all_fields() -> dict[str, Field]:
    main, grouped = sections()
    return {f.path: f for f in [*main, *(f for s in grouped for f in s.fields)]}


def flatten(spec: dict, prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested spec as dotted paths (lists stay whole: they are one field)."""
    flat: dict[str, Any] = {}
    for key, value in spec.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path in _object_paths():
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


@cache
def _object_paths() -> frozenset[str]:
    """Dotted paths of the objects that hold fields (flatten descends into these only)."""
    paths = set()
    for path in all_fields():
        parts = path.split(".")
        paths.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(paths)


@cache
def defaults(algorithm: str) -> dict[str, Any]:
    """Every field's value under the algorithm's preset when the spec leaves it out (shown as
    placeholders; what an empty field sends). The fields of a section that is unset by default
    (data.synthetic) have none: they are absent until one of them is set."""
    return flatten(spec_defaults(algorithm))


UNSET = object()  # a path `defaults` has no value for (inside a section unset by default)


def display(value: Any, kind: str) -> str:
    """A spec value as the text of its field."""
    if value is None:
        return ""
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "list" and isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if kind == "json":
        return json.dumps(value)
    return str(value)


def _parse(f: Field, text: str) -> Any:
    if f.nullable and text.lower() in ("null", "none"):
        return None
    if f.kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"Enter a whole number, not {text!r}.") from None
    if f.kind == "number":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"Enter a number (e.g. 1e-5), not {text!r}.") from None
        if not math.isfinite(value):
            raise ValueError(f"Enter a finite number (e.g. 1e-5), not {text!r}.")
        return value
    if f.kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError("Choose true or false.")
        return text == "true"
    if f.kind == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    if f.kind == "json":
        try:
            return load_yaml(text, "Enter JSON or YAML")
        except SpecError as exc:
            raise ValueError(str(exc)) from None
    return text


def _set(spec: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def spec_from_form(data) -> tuple[dict, dict[str, str]]:
    """(spec, errors by path) from posted form data: only the fields the user filled."""
    spec: dict[str, Any] = {"algorithm": data.get("algorithm") or "grpo"}
    if data.get("run_name", "").strip():
        spec["name"] = data["run_name"].strip()
    errors = {}
    for path, f in all_fields().items():
        text = (data.get(f.name) or "").strip()
        if not text:
            continue
        try:
            _set(spec, path, _parse(f, text))
        except ValueError as exc:
            errors[path] = str(exc)
    return spec, errors


def form_values(spec: dict) -> dict[str, str]:
    """Field texts (by path) of a spec; what no field holds stays out (see `unplaced`)."""
    fields = all_fields()
    return {path: display(value, fields[path].kind)
            for path, value in flatten(spec).items() if path in fields}


def unplaced(spec: dict) -> list[str]:
    """Paths of the spec no form field can hold (unknown keys): the YAML view keeps them."""
    fields = all_fields()
    return [p for p in flatten(spec) if p not in fields and p not in ("algorithm", "name")]


def minimal(spec: dict) -> dict:
    """The spec without the values its algorithm's preset gives anyway (for clones): resolved
    again, it is `spec` exactly."""
    algorithm = spec.get("algorithm", "grpo")
    base = defaults(algorithm)
    out: dict[str, Any] = {"algorithm": algorithm}
    for path, value in flatten(spec).items():
        if path != "algorithm" and base.get(path, UNSET) != value:
            _set(out, path, value)
    return out


def to_yaml(spec: dict) -> str:
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, default_flow_style=False)
