"""The submit form's spec logic (frontend/specform.py): fields from the RunSpec JSON Schema,
parsing by type, and round trips between specs and form fields."""

from __future__ import annotations

import pytest

from frontend import specform
from rl_core.spec import PRESETS, resolve_spec


def test_every_leaf_of_the_schema_has_one_field():
    main, sections = specform.sections()
    paths = [f.path for f in main] + [f.path for s in sections for f in s.fields]
    assert len(paths) == len(set(paths))
    assert {"model.path", "actor.lr", "rollout.temperature", "data.synthetic.digits",
            "tools.profiling.enable", "resources.device_type", "seed"} <= set(paths)
    kinds = specform.all_fields()
    assert (kinds["actor.lr"].kind, kinds["trainer.total_steps"].kind) == ("number", "integer")
    assert kinds["model.dtype"].kind == "enum" and "bfloat16" in kinds["model.dtype"].choices
    assert kinds["reward.functions"].kind == "json" and kinds["data.train_files"].kind == "list"


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_a_resolved_spec_survives_the_form_both_ways(algorithm):
    raw = {"algorithm": algorithm, "name": "round trip",
           "data": {"synthetic": {"task": "addition", "digits": 2}},
           "actor": {"lr": 3e-4}, "reward": {"functions": [{"name": "exact_match"}]},
           "trainer": {"total_steps": 7, "logger": ["console"]}}
    resolved = resolve_spec(raw).model_dump(mode="json")
    minimal = specform.minimal(resolved)
    assert resolve_spec(minimal).model_dump(mode="json") == resolved
    posted = {specform.PREFIX + path: text for path, text in specform.form_values(minimal).items()}
    spec, errors = specform.spec_from_form({"algorithm": algorithm, "run_name": "round trip", **posted})
    assert errors == {}
    assert resolve_spec(spec).model_dump(mode="json") == resolved


def test_values_that_do_not_parse_are_errors_at_their_fields_and_the_rest_is_kept():
    spec, errors = specform.spec_from_form({
        "algorithm": "dapo", specform.PREFIX + "actor.lr": "fast",
        specform.PREFIX + "trainer.total_steps": "2.5", specform.PREFIX + "rollout.top_p": "0.9",
        specform.PREFIX + "reward.functions": "[{name: exact_match", specform.PREFIX + "seed": " "})
    assert set(errors) == {"actor.lr", "trainer.total_steps", "reward.functions"}
    assert "Enter a number" in errors["actor.lr"] and "whole number" in errors["trainer.total_steps"]
    assert spec == {"algorithm": "dapo", "rollout": {"top_p": 0.9}}


def test_placeholders_follow_the_preset():
    assert specform.defaults("grpo")["actor.use_kl_loss"] is True
    assert specform.defaults("dapo")["actor.clip_ratio_high"] == PRESETS["dapo"]["actor"]["clip_ratio_high"]
    assert specform.display(True, "boolean") == "true" and specform.display(None, "number") == ""


@pytest.mark.parametrize("algorithm", sorted(PRESETS))
def test_a_clone_of_a_spec_whose_synthetic_task_is_all_defaults_keeps_the_task(algorithm):
    # every value of data.synthetic equals its field's default, yet the section is set: a
    # clone that dropped it would have no training data
    resolved = resolve_spec({"algorithm": algorithm, "data": {"synthetic": {}}}).model_dump(mode="json")
    minimal = specform.minimal(resolved)
    assert minimal["data"]["synthetic"]["task"] == "addition"
    assert resolve_spec(minimal).model_dump(mode="json") == resolved


def test_defaults_are_the_values_an_empty_field_sends():
    grpo = specform.defaults("grpo")
    # list and object defaults are known (no "none" where the default is a list)
    assert grpo["trainer.logger"] == ["console"]
    assert grpo["reward.functions"] == [{"name": "math_accuracy", "weight": 1.0, "kwargs": {},
                                         "in_process": None}]
    assert grpo["tools.profiling.steps"] == [2] and grpo["data.train_files"] == []
    # a section that is off by default has no defaults for its fields: it is absent
    assert grpo["data.synthetic"] is None and "data.synthetic.task" not in grpo
    resolved = resolve_spec({"data": {"synthetic": {"digits": 2}}}).model_dump(mode="json")
    assert specform.minimal(resolved) == {"algorithm": "grpo", "data": {"synthetic": {
        "task": "addition", "digits": 2, "num_train": 256, "num_val": 32}}}
