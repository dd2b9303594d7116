"""Rollout sampling: SamplingParams, the top-k / top-p / min-p filters, and one sampling step."""

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rl_core.rollout.sampling import (
    SamplingParams,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    filter_logits,
    sample_tokens,
)
from rl_core.spec import RolloutConfig

INF = float("inf")


def logits_of(*probs: float) -> torch.Tensor:
    """One row of logits whose softmax is `probs`."""
    return torch.tensor([probs]).log()


def kept(logits: torch.Tensor) -> list[bool]:
    return (logits[0] > -INF).tolist()


# --------------------------------------------------------------------------- params


def test_params_defaults_turn_every_filter_off():
    params = SamplingParams(max_new_tokens=8)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (1.0, 1.0, 0, 0.0)
    assert params.do_sample and params.n == 1 and not params.filters


def test_params_take_the_specs_minus_one_as_top_k_off():
    assert SamplingParams(max_new_tokens=8, top_k=-1).top_k == 0


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_new_tokens", 0, "max_new_tokens"),
        ("temperature", 0.0, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -2, "top_k"),
        ("min_p", 1.5, "min_p"),
        ("n", 0, "n must be"),
    ],
)
def test_params_refuse_values_out_of_range(field, value, message):
    values = {"max_new_tokens": 8, field: value}
    with pytest.raises(ValueError, match=message):
        SamplingParams(**values)


def test_params_from_the_specs_rollout_config():
    config = RolloutConfig(
        n_samples_per_prompt=3, temperature=0.7, top_p=0.9, top_k=-1, min_p=0.05,
        max_new_tokens=32, do_sample=True,
    )
    params = SamplingParams.from_config(config)
    assert params == SamplingParams(
        max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=0, min_p=0.05, n=3
    )
    assert SamplingParams.from_config(config, max_new_tokens=4).max_new_tokens == 4


# --------------------------------------------------------------------------- filters


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert kept(apply_top_k(logits, 2)) == [False, True, True, False]
    assert kept(apply_top_k(logits, 0)) == [True] * 4  # off
    assert kept(apply_top_k(logits, 9)) == [True] * 4  # k beyond the vocabulary


def test_top_p_keeps_the_likeliest_tokens_until_the_mass_reaches_p():
    logits = logits_of(0.15, 0.5, 0.05, 0.3)
    # sorted: 0.5, 0.3 (mass before it 0.5 < 0.7), 0.15 (mass before it 0.8 >= 0.7): dropped
    assert kept(apply_top_p(logits, 0.7)) == [False, True, False, True]
    # 0.85: 0.15 has 0.8 of mass before it, kept; 0.05 has 0.95, dropped
    assert kept(apply_top_p(logits, 0.85)) == [True, True, False, True]
    assert kept(apply_top_p(logits, 1.0)) == [True] * 4


def test_a_tiny_top_p_keeps_only_the_top_token():
    logits = logits_of(0.25, 0.26, 0.24, 0.25)
    assert kept(apply_top_p(logits, 1e-9)) == [False, True, False, False]


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    logits = logits_of(0.05, 0.6, 0.25, 0.1)
    # threshold 0.2 * 0.6 = 0.12: keeps 0.6 and 0.25
    assert kept(apply_min_p(logits, 0.2)) == [False, True, True, False]
    # threshold 0.5 * 0.6 = 0.3: only the top token
    assert kept(apply_min_p(logits, 0.5)) == [False, True, False, False]
    assert kept(apply_min_p(logits, 0.0)) == [True] * 4


def test_min_p_on_a_flat_distribution_keeps_everything():
    logits = logits_of(0.25, 0.25, 0.25, 0.25)
    assert kept(apply_min_p(logits, 1.0)) == [True] * 4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filters_agree_with_transformers_warpers(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(16, 50, generator=g) * 3
    params = SamplingParams(max_new_tokens=1, top_k=20, top_p=0.8, min_p=0.05)
    expected = logits
    for warper in (TopKLogitsWarper(20), TopPLogitsWarper(0.8), MinPLogitsWarper(0.05)):
        expected = warper(None, expected)
    assert torch.equal(filter_logits(logits, params) > -INF, expected > -INF)


# --------------------------------------------------------------------------- one step


def test_sampling_follows_the_distribution_and_never_draws_a_zero_probability_token():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.log().expand(40_000, 4)
    tokens, _ = sample_tokens(logits, SamplingParams(1), torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=4) / tokens.numel()
    assert freq[3] == 0
    assert torch.allclose(freq[:3], probs[:3], atol=0.01)


def test_sampling_draws_only_filtered_tokens_but_reports_unfiltered_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]]).expand(2_000, 4)
    params = SamplingParams(1, temperature=0.5, top_k=2)
    tokens, logprobs = sample_tokens(logits, params, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    expected = (logits / 0.5).log_softmax(-1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs, expected)


def test_greedy_takes_the_argmax_with_temperature_one_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    params = SamplingParams(1, temperature=0.3, do_sample=False)
    tokens, logprobs = sample_tokens(logits, params)
    assert tokens.tolist() == [1, 0]
    assert logprobs[0].item() == pytest.approx(3.0 - math.log(1 + math.exp(3) + math.e))


def test_sampling_with_the_same_generator_seed_repeats():
    logits = torch.randn(64, 100, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(1, top_p=0.9)
    first, _ = sample_tokens(logits, params, torch.Generator().manual_seed(7))
    again, _ = sample_tokens(logits, params, torch.Generator().manual_seed(7))
    other, _ = sample_tokens(logits, params, torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
