"""Limits of the run spec: the YAML loader, depth and size bounds, finite floats, upper bounds of
the numeric fields and the typing of reward kwargs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rl_core.spec import (
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_NODES,
    MAX_YAML_CHARS,
    PRESETS,
    RunSpec,
    SpecError,
    load_yaml,
    override_refusal,
    parse_spec_yaml,
    resolve_spec,
)

MINIMAL = {"data": {"synthetic": {"task": "addition"}}}
LAUGHS = (
    "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
)


def error_of(raw: dict[str, Any], *overrides: str) -> dict[str, str]:
    with pytest.raises(SpecError) as caught:
        resolve_spec(raw, overrides)
    [error] = caught.value.errors
    return error


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


# --------------------------------------------------------------------------- the YAML loader


@pytest.mark.parametrize(("text", "what", "where"), [
    ("seed: &s 1\n", "anchors (&s)", "line 1, column 7"),
    ("a: 1\nseed: *s\n", "aliases (*s)", "line 2, column 7"),
    ("seed: !!int 3\n", "tags (tag:yaml.org,2002:int)", "line 1, column 7"),
    ("name: !!python/object/apply:os.system [ls]\n", "tags (tag:yaml.org,2002:python/object/apply",
     "line 1, column 7"),
    ("name: !!binary aGVsbG8=\n", "tags (tag:yaml.org,2002:binary)", "line 1"),
    ("data: !!set {a, b}\n", "tags (tag:yaml.org,2002:set)", "line 1"),
    ("model: !custom {path: x}\n", "tags (!custom)", "line 1, column 8"),
    ("name: ! text\n", "tags (!)", "line 1"),
])
def test_it_refuses_anchors_aliases_and_tags_naming_the_position(text, what, where):
    with pytest.raises(SpecError) as caught:
        parse_spec_yaml(text, "spec.yaml")
    [error] = caught.value.errors
    assert error["field"] == ""
    assert error["message"].startswith("spec.yaml: YAML ")
    assert f"{what}" in error["message"] and "are not accepted" in error["message"]
    assert where in error["message"]


def test_it_refuses_a_billion_laughs_before_expanding_it():
    started = time.monotonic()
    with pytest.raises(SpecError, match=r"anchors \(&a\) are not accepted.*line 1, column 4"):
        load_yaml(LAUGHS)
    assert time.monotonic() - started < 0.5


def test_it_refuses_a_billion_laughs_in_an_override_at_its_field():
    error = error_of(MINIMAL, "reward.functions=[" + LAUGHS.replace("\n", ", ") + "]")
    assert error["field"] == "reward.functions"
    assert "is not accepted: YAML anchors (&a)" in error["message"]


def test_it_refuses_yaml_longer_than_the_limit():
    text = "name: " + "x" * MAX_YAML_CHARS
    with pytest.raises(SpecError, match=f"more than the limit of {MAX_YAML_CHARS}"):
        parse_spec_yaml(text)


def test_it_refuses_yaml_nested_deeper_than_the_limit_without_recursing():
    text = "a: " + "[" * 5000 + "]" * 5000
    with pytest.raises(SpecError, match=f"deeper than the limit of {MAX_SPEC_DEPTH} levels"):
        parse_spec_yaml(text)


def test_plain_yaml_still_loads():
    assert load_yaml("{a: [1, 2.5, true, null, 'x'], b: {c: d}}") == {
        "a": [1, 2.5, True, None, "x"], "b": {"c": "d"}}
    assert parse_spec_yaml("") == {}


@pytest.mark.parametrize(("override", "fragment"), [
    ("reward.functions.0.kwargs={a: &x 1}", "anchors (&x)"),
    ("seed=!!int 3", "tags"),
    ("data.train_files=" + "[" * 20 + "]" * 20, "limit of 16 levels"),
])
def test_override_refusal_says_why(override, fragment):
    assert fragment in override_refusal(override)


@pytest.mark.parametrize(
    "override", ["seed=3", "data.train_files=[a,", "no-equals-sign", "a.b=[[1]]"]
)
def test_override_refusal_leaves_syntax_and_keys_to_the_resolution(override):
    assert override_refusal(override) is None


# --------------------------------------------------------------------------- depth and size


def test_it_refuses_a_spec_deeper_than_the_limit_naming_the_path():
    raw = {**MINIMAL, "reward": {"functions": [{"name": "format", "kwargs": {"a": nested(500)}}]}}
    error = error_of(raw)
    assert error["field"].startswith("reward.functions.0.kwargs.a.0.0")
    assert f"limit of {MAX_SPEC_DEPTH} levels" in error["message"]


def test_it_refuses_a_spec_with_too_many_values():
    raw = {**MINIMAL, "tools": {"profiling": {"steps": list(range(1, MAX_SPEC_NODES + 10))}}}
    error = error_of(raw)
    assert error["field"] == "" and f"limit of {MAX_SPEC_NODES} values" in error["message"]


def test_it_refuses_a_spec_larger_than_the_limit_in_bytes():
    raw = {**MINIMAL, "name": "x" * MAX_SPEC_BYTES}
    error = error_of(raw)
    assert error["field"] == "" and f"more than the limit of {MAX_SPEC_BYTES}" in error["message"]


def test_bounds_apply_to_the_spec_after_its_overrides():
    deep = "[" * 15 + "]" * 15
    assert override_refusal(f"reward.functions={deep}") is None  # the value alone fits
    error = error_of(MINIMAL, f"reward.functions={deep}")
    assert error["field"].startswith("reward.functions.0.0")
    assert f"limit of {MAX_SPEC_DEPTH} levels" in error["message"]


def test_a_number_too_long_to_read_is_a_spec_error():
    with pytest.raises(SpecError, match="YAML error"):
        parse_spec_yaml("seed: " + "9" * 5000)


def test_a_control_character_is_a_spec_error_in_a_file_and_in_an_override():
    with pytest.raises(SpecError, match="unacceptable character #x0005"):
        parse_spec_yaml("name: a\u0005b")
    error = error_of(MINIMAL, "name=\u0005")
    assert error["field"] == "name" and "unacceptable character" in error["message"]


# --------------------------------------------------------------------------- finite numbers


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("field", ["actor.lr", "rollout.temperature", "reward.timeout_s",
                                   "resources.memory_gb", "advantage.gamma"])
def test_it_refuses_non_finite_floats(field, value):
    error = error_of(MINIMAL, f"{field}={value}")
    assert error == {"field": field, "message": "Input should be a finite number"}


def test_every_float_field_is_finite_only():
    assert RunSpec.model_config["allow_inf_nan"] is False


# --------------------------------------------------------------------------- upper bounds


@pytest.mark.parametrize(("override", "field", "limit"), [
    ("rollout.n_samples_per_prompt=1.0e+30", "rollout.n_samples_per_prompt", "1024"),
    ("actor.lr=1.0e+308", "actor.lr", "less than or equal to 1"),
    ("critic.lr=2", "critic.lr", "less than or equal to 1"),
    ("resources.num_nodes=10000000000", "resources.num_nodes", "4096"),
    (f"resources.num_nodes={2**70}", "resources.num_nodes", "4096"),
    ("resources.devices_per_node=65", "resources.devices_per_node", "64"),
    (f"seed={2**63}", "seed", "less than 9223372036854775808"),
    ("trainer.total_steps=100000000", "trainer.total_steps", "10000000"),
    ("trainer.total_epochs=100000", "trainer.total_epochs", "10000"),
    ("data.train_batch_size=100000", "data.train_batch_size", "16384"),
    ("actor.ppo_micro_batch_size=100000", "actor.ppo_micro_batch_size", "4096"),
    ("rollout.max_new_tokens=1000000", "rollout.max_new_tokens", "131072"),
    ("data.max_prompt_length=1000000", "data.max_prompt_length", "131072"),
    ("parallel.tensor_parallel_size=2048", "parallel.tensor_parallel_size", "1024"),
    ("rollout.temperature=100", "rollout.temperature", "10"),
    ("reward.functions.0.weight=1.0e+9", "reward.functions.0.weight", "1000"),
    ("tools.profiling.steps=[100000000]", "tools.profiling.steps.0", "10000000"),
    ("name=" + "n" * 129, "name", "at most 128 characters"),
])
def test_implausible_values_are_refused_saying_the_limit(override, field, limit):
    raw = {**MINIMAL, "reward": {"functions": [{"name": "format"}]}}
    error = error_of(raw, override)
    assert error["field"] == field and limit in error["message"], error


def test_a_whole_float_for_an_integer_field_is_still_an_integer():
    spec = resolve_spec(MINIMAL, ["rollout.n_samples_per_prompt=8.0"])
    assert spec.rollout.n_samples_per_prompt == 8


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_presets_stay_within_the_bounds(algorithm):
    raw = {"algorithm": algorithm, **MINIMAL}
    if algorithm == "ppo":
        raw["rollout"] = {"n_samples_per_prompt": 1}
    assert resolve_spec(raw).algorithm == algorithm


# --------------------------------------------------------------------------- reward kwargs


def kwargs_error(kwargs: Any) -> dict[str, str]:
    return error_of({**MINIMAL, "reward": {"functions": [{"name": "format", "kwargs": kwargs}]}})


def test_kwargs_take_json_values():
    kwargs = {"a": [1, 2.5, "x", None, True], "b": {"c": {"d": []}}}
    functions = [{"name": "format", "kwargs": kwargs}]
    spec = resolve_spec({**MINIMAL, "reward": {"functions": functions}})
    assert spec.reward.functions[0].kwargs == kwargs


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"a": float("nan")}, "a: nan is not a finite number"),
    ({"a": [1, float("inf")]}, "a.1: inf is not a finite number"),
    ({"a": 2**70}, "a: integers must fit in 64 bits"),
    ({"a": nested(8)}, "limit of 8 levels"),
    ({"a": list(range(2000))}, "limit of 1000 values"),
    ({"a": "x" * 20_000}, "more than the limit of 16384"),
    ({"a": {1: "x"}}, "a: key 1 must be text"),
    ({"a": {1, 2}}, "not a valid JSON value"),
])
def test_kwargs_are_bounded_json(kwargs, fragment):
    error = kwargs_error(kwargs)
    assert error["field"].startswith("reward.functions.0.kwargs")
    assert fragment in error["message"], error
