"""The Markdown reference of every field, the presets and the cross-field rules
(`python -m rl_core spec docs`, docs/run-spec.md)."""

from __future__ import annotations

import json
import types
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from rl_core.spec.limits import is_model, without_none
from rl_core.spec.loading import described
from rl_core.spec.model import RunSpec, flatten_params
from rl_core.spec.presets import PRESETS
from rl_core.spec.rules import NOT_IMPLEMENTED, RULES, not_implemented_note

# --------------------------------------------------------------------------- reference docs


def spec_reference_markdown() -> str:
    """Markdown reference of every field, the presets and the cross-field rules."""
    lines = ["## Top level", "", *_table(RunSpec, "", with_sections=False)]
    for name, field in RunSpec.model_fields.items():
        if is_model(field.annotation):
            lines += ["", f"## `{name}`", "", _summary(field.annotation.__doc__), ""]
            lines += _table(field.annotation, f"{name}.")
    lines += ["", "## Presets", "", "What each algorithm fills in where the spec is silent.", ""]
    for algorithm, preset in PRESETS.items():
        values = ", ".join(f"`{key}: {value}`" for key, value in flatten_params(preset).items())
        lines.append(f"- **{algorithm}**: {values}")
    lines += ["", "## Cross-field rules", ""]
    lines += [f"- {_summary(rule.__doc__)}" for rule in RULES]
    lines += ["", "## Not implemented yet", "", _NOT_IMPLEMENTED_INTRO, ""]
    lines += [f"- `{path}`: {not_implemented_note(path)}" for path in NOT_IMPLEMENTED] or [
        "None today: every value the schema accepts is built."]
    return "\n".join(lines) + "\n"


_NOT_IMPLEMENTED_INTRO = (
    "These fields are part of the schema, but only the values listed are built today: a spec "
    "that sets another value is refused at the field (`field: value is not implemented yet "
    "(only ...)`), before the cross-field rules run."
)


def _table(model: type[BaseModel], prefix: str, with_sections: bool = True) -> list[str]:
    header = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    return header + list(_rows(model, prefix, with_sections))


def _rows(model: type[BaseModel], prefix: str, with_sections: bool = True) -> Iterator[str]:
    for name, field in model.model_fields.items():
        path, inner = f"{prefix}{name}", without_none(field.annotation)
        if is_model(inner) and field.default_factory is not None:
            if with_sections:  # an always-present section: list its fields instead
                yield from _rows(inner, f"{path}.")
            continue
        type_name = _type_name(field.annotation) + _bounds(field.metadata)
        cells = (f"`{path}`", type_name, _default(field), described(path, field.description or ""))
        yield "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
        if is_model(inner):
            yield from _rows(inner, f"{path}.")
        elif get_origin(inner) is list and is_model(get_args(inner)[0]):
            yield from _rows(get_args(inner)[0], f"{path}[].")


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is Annotated:
        return _type_name(args[0]) + _bounds(tp.__metadata__)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "mapping"
    if is_model(tp):
        return "object"
    return "any" if tp is Any else tp.__name__


_BOUND_SYMBOLS = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "min_length": "length >=",
    "max_length": "length <=",
}


def _bounds(metadata: Iterable[Any]) -> str:
    """Constraints such as Gt(0) as " (> 0)"; a nested FieldInfo contributes its own."""
    items = [x for m in metadata for x in (m.metadata if isinstance(m, FieldInfo) else [m])]
    bounds = [
        f"{symbol} {getattr(item, attr)}"
        for item in items
        for attr, symbol in _BOUND_SYMBOLS.items()
        if getattr(item, attr, None) is not None
    ]
    return f" ({', '.join(bounds)})" if bounds else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{json.dumps(to_jsonable_python(value), ensure_ascii=False)}`"


def _summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())
