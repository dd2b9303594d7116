"""The submit page's starters ("Start from" links): each model family's spec, under each
algorithm that can run it, is a valid spec that admission takes and the form holds whole; an
algorithm that cannot run a family's spec is refused with the field named."""

from __future__ import annotations

import pytest

from experiments.starter import STARTER_FAMILIES, starter_spec
from frontend import specform
from rl_core.admission import admit
from rl_core.spec import SpecError, resolve_spec

ALGORITHMS = ("grpo", "dapo", "ppo", "dpo")
# what each algorithm cannot run of a family's spec, named in the refusal
REFUSED = {("ppo", "vision"): "critic.enable", ("dpo", "vision"): "algorithm",
           ("dpo", "agent"): "rollout.multi_turn",
           ("dapo", "agent"): "rollout.multi_turn"}


@pytest.mark.parametrize("family", sorted(STARTER_FAMILIES))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_starter_is_a_spec_admission_takes_and_the_form_holds(family, algorithm):
    spec = starter_spec(algorithm, family)
    assert specform.unplaced(spec) == [], "the form must hold each of the starter's values"
    try:
        resolved = resolve_spec(spec)
    except SpecError as error:
        assert (algorithm, family) in REFUSED, str(error)
        assert REFUSED[algorithm, family] in str(error)
        return
    assert (algorithm, family) not in REFUSED
    verdict = admit(resolved)
    assert verdict.admitted, [refusal.message for refusal in verdict.refusals]


def test_the_agent_starter_offers_the_calculator_over_two_turns():
    spec = resolve_spec(starter_spec("grpo", "agent"))
    assert spec.model.path == "tiny:small-calculator"
    assert spec.rollout.multi_turn.max_turns == 2
    assert [tool.name for tool in spec.rollout.multi_turn.tools] == ["calculator"]
    assert spec.data.synthetic.task == "multiplication"
