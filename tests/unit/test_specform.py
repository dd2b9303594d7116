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
           "data": {"synthetic": {"task": "addition", "digits": 1}},
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
