"""The critic's value model: no dropout (a token classifier's default is 0.1), so its values are
a function of its weights — the same in every pass and on every data-parallel rank."""

from __future__ import annotations

import torch

from rl_core.roles.actors import CriticWorker
from rl_core.spec import resolve_spec


def test_the_value_model_has_no_dropout_and_repeats_its_values_in_training_mode():
    spec = resolve_spec({"algorithm": "ppo", "model": {"path": "tiny:nano"},
                         "data": {"synthetic": {"task": "addition"}},
                         "reward": {"functions": [{"name": "exact_match"}]},
                         "trainer": {"logger": []}})
    critic = CriticWorker(spec, total_steps=1)
    assert all(m.p == 0 for m in critic.model.modules() if isinstance(m, torch.nn.Dropout))
    ids = torch.arange(3, 19).reshape(2, 8)
    critic.model.train()
    with torch.no_grad():
        first, second = (critic.model(input_ids=ids).logits for _ in range(2))
    assert torch.equal(first, second)
