"""Every run-spec field takes effect or is refused: a leaf that no code reads must be listed in
`NOT_IMPLEMENTED`, and a spec that sets such a field to another value is refused at the field."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import types
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, Field, ValidationError

from frontend import specform
from rl_core.spec import (
    NOT_IMPLEMENTED,
    PRESETS,
    RunSpec,
    SpecError,
    resolve_spec,
    spec_reference_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"data": {"synthetic": {"task": "addition"}}}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Attributes of library objects (torch modules and tensors, os, logging, argparse) that share a
# name with a field: reading `.weight` of a layer says nothing about `reward.functions[].weight`.
LIBRARY_NAMES = frozenset({"name", "path", "dtype", "weight", "modules", "mode", "level"})


# --------------------------------------------------------------------------- the schema


def _inner(annotation: Any) -> Any:
    """`X | None` -> X, anything else unchanged."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    tp = _inner(annotation)
    if get_origin(tp) is list:
        tp = get_args(tp)[0]
    is_model = get_origin(tp) is None and isinstance(tp, type) and issubclass(tp, BaseModel)
    return tp if is_model else None


def schema_leaves(model: type[BaseModel], prefix: str = "",
                  parent: str = "spec") -> Iterator[tuple[str, str, str]]:
    """(dotted path, parent section name, field name) of every leaf; a list of sections
    (`reward.functions`) is a leaf and its items' fields are leaves too."""
    for name, field in model.model_fields.items():
        inner, path = _model_of(field.annotation), f"{prefix}{name}"
        if inner is None or get_origin(_inner(field.annotation)) is list:
            yield path, parent, name
        if inner is not None:
            yield from schema_leaves(inner, f"{path}.", name)


def section_names(model: type[BaseModel]) -> set[str]:
    """Names of the fields that hold sections, and `spec` for the top level."""
    names = {"spec"}
    for name, field in model.model_fields.items():
        inner = _model_of(field.annotation)
        if inner is not None:
            names |= {name} | section_names(inner)
    return names


def field_name_counts(model: type[BaseModel]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, field in model.model_fields.items():
        counts[name] += 1
        inner = _model_of(field.annotation)
        if inner is not None:
            counts += field_name_counts(inner)
    return counts


# --------------------------------------------------------------------------- the code


def _tail(node: ast.AST) -> str:
    """The last name of an expression: `self.spec.actor` -> "actor", `fns[0]` -> "fns"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, (ast.Call, ast.Subscript)):
        return _tail(node.func if isinstance(node, ast.Call) else node.value)
    return ""


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reads_of(node: ast.AST) -> Iterator[tuple[str, str]]:
    """(base, key) read by one node: `base.key`, `base["key"]`, `base.get("key")`,
    `getattr(base, "key")` or any helper called as `f(base, "key")`."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        yield _tail(node.value), node.attr
    elif isinstance(node, ast.Subscript) and _text(node.slice):
        yield _tail(node.value), _text(node.slice)
    elif isinstance(node, ast.Call):
        func, args = node.func, node.args
        if isinstance(func, ast.Attribute) and func.attr == "get" and args and _text(args[0]):
            yield _tail(func.value), _text(args[0])
        if len(args) >= 2 and _text(args[1]):
            yield _tail(args[0]), _text(args[1])


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _bound_params(trees: list[ast.Module], sections: set[str]) -> dict[tuple[str, str], set[str]]:
    """(function name, parameter) -> the sections some call passes to it, e.g.
    `SamplingParams.from_config(spec.rollout)` binds ("from_config", "config") to rollout."""
    defs: dict[str, list[list[str]]] = defaultdict(list)
    calls = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, FUNCTIONS):
                defs[node.name].append(_params(node))
            elif isinstance(node, ast.Call):
                calls.append(node)
    bound: dict[tuple[str, str], set[str]] = defaultdict(set)
    for call in calls:
        callee = _tail(call.func)
        for params in defs.get(callee, ()):
            named = list(zip(params, call.args))
            named += [(kw.arg, kw.value) for kw in call.keywords if kw.arg in params]
            for param, arg in named:
                if _tail(arg) in sections:
                    bound[(callee, param)].add(_tail(arg))
    return bound


def _aliases(scope: ast.AST, sections: set[str],
             bound: dict[tuple[str, str], set[str]]) -> dict[str, set[str]]:
    """Local names standing for a section in `scope`: parameters a call binds to one, and
    `adv = spec.advantage` or `for entry in spec.reward.functions`."""
    aliases: dict[str, set[str]] = defaultdict(set)
    if isinstance(scope, FUNCTIONS):
        for param in _params(scope):
            aliases[param] |= bound.get((scope.name, param), set())
    for _ in range(2):  # an alias of an alias
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.For):
                target, value = node.target, node.iter
            else:
                continue
            if isinstance(target, ast.Name):
                tail = _tail(value)
                aliases[target.id] |= ({tail} & sections) | aliases.get(tail, set())
    return aliases


def _defined(tree: ast.Module) -> set[str]:
    """Names the code gives its own objects: attributes it sets, functions, class attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            names.add(node.attr)
        elif isinstance(node, FUNCTIONS):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                one = getattr(item, "target", None)
                targets = item.targets if isinstance(item, ast.Assign) else [one]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


class CodeIndex:
    """What a body of Python code reads: key -> the bases it is read from (a base is the last
    name of the object, or the section a local name stands for), and the names it defines."""

    def __init__(self, sources: Iterable[str], sections: set[str]):
        trees = [ast.parse(source) for source in sources]
        bound = _bound_params(trees, sections)
        self.reads: dict[str, set[str]] = defaultdict(set)
        self.defined: set[str] = set()
        for tree in trees:
            self.defined |= _defined(tree)
            for scope in (tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTIONS))):
                aliases = _aliases(scope, sections, bound)
                for node in ast.walk(scope):
                    for base, key in _reads_of(node):
                        self.reads[key] |= {base} | aliases.get(base, set())


def unread_fields(model: type[BaseModel], code: CodeIndex, refused: Iterable[str]) -> list[str]:
    """Leaves of `model` that are neither refused nor read by `code`. A field name that several
    sections share, or that the code or a library also uses for something else, counts as read
    only when read from its own section (`actor.lr`, `adv.gamma` after `adv = spec.advantage`);
    any other name counts as read wherever it is read."""
    counts, refused = field_name_counts(model), set(refused)
    unread = []
    for path, parent, name in schema_leaves(model):
        bases = code.reads.get(name, set())
        ambiguous = counts[name] > 1 or name in code.defined or name in LIBRARY_NAMES
        if path not in refused and not (parent in bases if ambiguous else bases):
            unread.append(path)
    return unread


@functools.cache
def project_code() -> CodeIndex:
    """rl_core (except the spec itself) and the platform, which reads what it schedules."""
    spec = ROOT / "rl_core" / "spec"
    files = [p for p in sorted((ROOT / "rl_core").rglob("*.py")) if spec not in p.parents]
    files += sorted((ROOT / "platform").rglob("*.py"))
    return CodeIndex((p.read_text(encoding="utf-8") for p in files), section_names(RunSpec))


# --------------------------------------------------------------------------- every field is built


def test_every_leaf_is_read_by_code_or_refused():
    leaves = list(schema_leaves(RunSpec))
    unread = unread_fields(RunSpec, project_code(), NOT_IMPLEMENTED)
    assert not unread, (
        f"{len(unread)} of the {len(leaves)} leaf fields are read by no code outside "
        f"rl_core/spec/ and not refused ({len(NOT_IMPLEMENTED)} are refused as not implemented "
        f"yet): {', '.join(unread)}. Read each where it takes effect, or add it to NOT_IMPLEMENTED "
        "in rl_core/spec/rules.py."
    )


def test_every_refused_path_is_a_leaf_of_the_schema():
    leaves = {path for path, _, _ in schema_leaves(RunSpec)}
    assert set(NOT_IMPLEMENTED) <= leaves, sorted(set(NOT_IMPLEMENTED) - leaves)


class _Section(BaseModel):
    lr: float = Field(1.0, description="shared with actor.lr, read only there")
    enable: bool = Field(False, description="shared: `.enable` is read on other sections")
    never_read_by_anything: int = Field(0, description="a unique name that nothing reads")


class _Synthetic(BaseModel):
    seed: int = Field(0, description="read as spec.seed")
    actor: _Section = Field(default_factory=_Section, description="reuses the name actor")
    profiler_x: _Section = Field(default_factory=_Section, description="a section nobody reads")


def test_the_check_catches_a_field_that_nothing_reads():
    unread = unread_fields(_Synthetic, project_code(), refused=())
    assert unread == [
        "actor.enable", "actor.never_read_by_anything", "profiler_x.lr", "profiler_x.enable",
        "profiler_x.never_read_by_anything",
    ]
    assert unread_fields(_Synthetic, project_code(), refused=unread) == []


def test_the_check_lets_a_field_through_only_while_the_table_refuses_it():
    fields = section_names(RunSpec)
    assert "seed" not in unread_fields(RunSpec, CodeIndex(["x = spec.seed\n"], fields), ())
    assert "seed" in unread_fields(RunSpec, CodeIndex(["x = 1\n"], fields), ())
    assert "seed" not in unread_fields(RunSpec, CodeIndex(["x = 1\n"], fields), {"seed"})


def test_the_check_follows_local_names_and_parameters_to_their_section():
    code = CodeIndex([
        "def step(spec):\n    adv = spec.advantage\n    return adv.gamma\n",
        "def make(config):\n    return config.lr\n\nmake(spec.critic)\n",
        "def enable(x):\n    return x.enable\n",
        "for entry in spec.reward.functions:\n    _field(entry, 'weight')\n",
    ], section_names(RunSpec))
    assert {"advantage"} <= code.reads["gamma"] and {"critic"} <= code.reads["lr"]
    assert "functions" in code.reads["weight"]
    assert "enable" in code.defined and code.reads["enable"] == {"x"}


# --------------------------------------------------------------------------- refusals
# Every value is built today (NOT_IMPLEMENTED is empty): the machinery is tested with a stand-in
# entry, the virtual pipeline size limited to 1.
STAND_IN = "parallel.virtual_pipeline_parallel_size"


@pytest.fixture
def refused(monkeypatch):
    """The stand-in entry, with the web form (built once from the schema) built afresh for it
    and again after it."""
    monkeypatch.setitem(NOT_IMPLEMENTED, STAND_IN, (1,))
    specform.sections.cache_clear()
    yield STAND_IN
    specform.sections.cache_clear()


def _other_value(path: str) -> Any:
    """A valid value of the field at `path` that NOT_IMPLEMENTED does not allow."""
    allowed = NOT_IMPLEMENTED[path]
    model: Any = RunSpec
    for part in path.split(".")[:-1]:
        model = _model_of(model.model_fields[part].annotation)
    tp = _inner(model.model_fields[path.rsplit(".", 1)[-1]].annotation)
    if get_origin(tp) is Literal:
        return next(choice for choice in get_args(tp) if choice not in allowed)
    if tp is bool:
        return not allowed[0]
    if get_origin(tp) is list:
        item = _inner(get_args(tp)[0])
        return ["other"] if item is str else [max(allowed[0], default=0) + 1]
    numbers = [a for a in allowed if isinstance(a, int | float)]
    if tp is int:
        return max(numbers) + 1
    if tp is float:
        return numbers[0] / 2 if numbers else 1.5
    return "other"


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return str(value).replace("'", '"')


def _nested(path: str, value: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"data": {"synthetic": {"task": "addition"}}}
    *parents, leaf = path.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return raw


def test_a_value_not_implemented_yet_is_refused_at_its_field(refused):
    path = refused
    value = _other_value(path)
    only = " or ".join(_shown(a) for a in NOT_IMPLEMENTED[path])
    with pytest.raises(SpecError) as caught:
        resolve_spec(_nested(path, value))
    assert caught.value.errors == [{
        "field": path,
        "message": f"{_shown(value)} is not implemented yet (only {only}); see docs/run-spec.md",
    }]


def test_the_refusal_reads_as_one_line_naming_the_field(refused):
    with pytest.raises(SpecError) as caught:
        resolve_spec(MINIMAL, [f"{refused}=2"])
    assert str(caught.value) == (
        f"{refused}: 2 is not implemented yet (only 1); see docs/run-spec.md"
    )


def test_the_refusal_comes_instead_of_the_cross_field_rules(refused):
    # virtual stages without a pipeline, and the clip ratios are crossed: only the refusal
    with pytest.raises(SpecError) as caught:
        resolve_spec(MINIMAL, [f"{refused}=3", "actor.clip_ratio_low=0.5"])
    assert [e["field"] for e in caught.value.errors] == [refused]


def test_validating_runspec_directly_reports_the_refusal_at_the_field(refused):
    with pytest.raises(ValidationError) as caught:
        RunSpec.model_validate({**MINIMAL, "parallel": {"virtual_pipeline_parallel_size": 2}})
    [error] = SpecError.from_validation_error(caught.value).errors
    assert error == {"field": refused,
                     "message": "2 is not implemented yet (only 1); see docs/run-spec.md"}


def test_every_refused_field_defaults_to_a_value_that_is_built(refused):
    defaults = RunSpec.model_construct()
    for path, allowed in NOT_IMPLEMENTED.items():
        value: Any = defaults
        for part in path.split("."):
            value = getattr(value, part)
        assert value in allowed, (path, value, allowed)


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_each_preset_validates_and_every_device_is_a_data_parallel_replica(algorithm):
    raw = {"algorithm": algorithm, **MINIMAL, "resources": {"devices_per_node": 2}}
    spec = resolve_spec(raw, ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4"])
    assert spec.model_parallel_size == 1
    assert spec.data_parallel_size == spec.world_size == 2


def test_the_cli_exits_2_on_a_refused_value():
    result = subprocess.run(
        [sys.executable, "-m", "rl_core", "spec", "validate",
         str(ROOT / "examples" / "spec_grpo_minimal.yaml"), "resources.devices_per_node=2",
         "parallel.pipeline_parallel_size=2"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "parallel.pipeline_parallel_size: 2 cuts the layers into pipeline stages, which the "
        "megatron engine trains: set actor.strategy: megatron, or pipeline_parallel_size: 1")


# --------------------------------------------------------------------------- docs and form


def _marker(path: str) -> str:
    """How a description starts for a refused field: "Not implemented yet (only 1). "."""
    return f"Not implemented yet (only {' or '.join(_shown(a) for a in NOT_IMPLEMENTED[path])}). "


def test_the_reference_marks_every_refused_field_and_only_those(refused):
    rows = {line.split("`")[1]: line for line in spec_reference_markdown().splitlines()
            if line.startswith("| `")}
    for path in NOT_IMPLEMENTED:
        assert f"| {_marker(path)}" in rows[path], rows[path]
    marked = [path for path, row in rows.items() if "not implemented yet" in row.lower()]
    assert sorted(marked) == sorted(NOT_IMPLEMENTED)


def test_the_form_says_a_refused_field_is_not_implemented_yet(refused):
    fields = specform.all_fields()  # from the JSON Schema's descriptions
    for path in NOT_IMPLEMENTED:
        assert fields[path].help.startswith(_marker(path)), fields[path].help
    marked = [path for path, f in fields.items() if "not implemented yet" in f.help.lower()]
    assert sorted(marked) == sorted(NOT_IMPLEMENTED)


def test_fsdp2_trains_the_actor_and_the_critic():
    raw = {"algorithm": "ppo", **MINIMAL, "resources": {"devices_per_node": 2}}
    spec = resolve_spec(raw, ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4",
                              "actor.strategy=fsdp2"])
    assert spec.actor.strategy == "fsdp2" and spec.critic.enable



def test_offload_is_refused_on_cpu_and_offloaded_parameters_need_fsdp2():
    raw = {"algorithm": "grpo", **MINIMAL}
    with pytest.raises(SpecError) as caught:
        resolve_spec(raw, ["actor.offload.optimizer=true"])
    assert caught.value.errors == [{
        "field": "actor.offload.optimizer",
        "message": "on cpu the training state is in host memory already: offload is for npu "
                   "and cuda devices; set it to false"}]
    npu = {**raw, "resources": {"device_type": "npu", "devices_per_node": 2}}
    sizes = ["data.train_batch_size=8", "actor.ppo_mini_batch_size=4"]
    with pytest.raises(SpecError) as caught:
        resolve_spec(npu, [*sizes, "actor.offload.param=true"])
    assert [e["field"] for e in caught.value.errors] == ["actor.offload.param"]
    assert "needs actor.strategy=fsdp2" in caught.value.errors[0]["message"]
    spec = resolve_spec(npu, [*sizes, "actor.strategy=fsdp2", "actor.offload.param=true",
                              "actor.offload.optimizer=true"])
    assert spec.actor.offload.param and spec.actor.offload.optimizer
    assert resolve_spec(npu, [*sizes, "actor.offload.optimizer=true"]).actor.offload.optimizer


def test_vllm_settings_need_the_vllm_engine_and_an_accelerator_for_the_share():
    raw = {"algorithm": "grpo", **MINIMAL}
    for field, value in (("rollout.gpu_memory_utilization", "0.7"),
                         ("rollout.max_model_len", "512")):
        with pytest.raises(SpecError) as caught:
            resolve_spec(raw, ["rollout.engine=native", f"{field}={value}"])
        assert caught.value.errors == [{"field": field, "message": "is a vLLM setting: set "
                                        "rollout.engine=vllm or remove it"}]
        with pytest.raises(SpecError) as caught:  # auto, the default, is native on cpu
            resolve_spec(raw, [f"{field}={value}"])
        assert caught.value.errors == [{"field": field, "message": "is a vLLM setting and "
                                        "rollout.engine=auto is the native engine on cpu: set "
                                        "rollout.engine=vllm or remove it"}]
        for kind in ("gpu", "npu"):  # where auto may take vLLM
            spec = resolve_spec({**raw, "resources": {"device_type": kind}}, [f"{field}={value}"])
            assert (spec.rollout.engine, str(getattr(spec.rollout, field.split(".")[1]))) == (
                "auto", value)
    with pytest.raises(SpecError) as caught:
        resolve_spec(raw, ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.7"])
    assert [e["field"] for e in caught.value.errors] == ["rollout.gpu_memory_utilization"]
    assert "on cpu vLLM's KV cache is sized" in caught.value.errors[0]["message"]
    npu = {**raw, "resources": {"device_type": "npu"}}
    spec = resolve_spec(npu, ["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.7"])
    assert spec.rollout.gpu_memory_utilization == 0.7


def test_a_max_model_len_shorter_than_prompt_and_response_is_refused():
    raw = {"algorithm": "grpo", **MINIMAL}
    seq = "data.max_prompt_length=100"
    with pytest.raises(SpecError) as caught:
        resolve_spec(raw, ["rollout.engine=vllm", seq, "rollout.max_new_tokens=64",
                           "rollout.max_model_len=150"])
    assert caught.value.errors == [{
        "field": "rollout.max_model_len",
        "message": "150 is shorter than data.max_prompt_length + rollout.max_new_tokens = 164: "
                   "raise it or remove it"}]
    spec = resolve_spec(raw, ["rollout.engine=vllm", seq, "rollout.max_new_tokens=64",
                              "rollout.max_model_len=164", "actor.rollout_is=sequence",
                              "actor.rollout_is_cap=5"])
    assert (spec.rollout.max_model_len, spec.actor.rollout_is) == (164, "sequence")


def test_the_is_cap_needs_is_on():
    with pytest.raises(SpecError) as caught:
        resolve_spec({"algorithm": "grpo", **MINIMAL}, ["actor.rollout_is_cap=3"])
    assert caught.value.errors == [{"field": "actor.rollout_is_cap",
                                    "message": "applies only with actor.rollout_is=token or "
                                               "sequence"}]
