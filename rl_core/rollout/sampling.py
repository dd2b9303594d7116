"""Sampling parameters and the sampling kernels shared by every rollout engine: top-k, top-p and
min-p filtering, and one draw per row from a table of uniforms (so a seed reproduces a rollout
whatever the batch's order).

    params = SamplingParams.from_config(spec.rollout)
    token, logprob = sample_tokens(logits, params, uniform=uniforms[:, step])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class SamplingParams:
    """How to sample responses; names and meanings follow the spec's `RolloutConfig`."""

    max_new_tokens: int
    """Longest response in tokens."""
    temperature: float = 1.0
    """Logits are divided by it before sampling (and for the returned log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the likeliest tokens whose mass reaches top_p; 1 disables."""
    top_k: int = 0
    """Keep the k likeliest tokens; 0 (or -1, the spec's default) disables."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top probability; 0 disables."""
    do_sample: bool = True
    """False decodes greedily and ignores temperature, top_p, top_k and min_p."""
    n: int = 1
    """Responses per prompt; the rows of one prompt are adjacent in the batch."""

    def __post_init__(self) -> None:
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        checks = [
            (self.max_new_tokens > 0, "max_new_tokens must be > 0"),
            (self.temperature > 0, "temperature must be > 0 (use do_sample=False for greedy)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k >= 0, "top_k must be >= 0 (0 or -1 disables it)"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.n > 0, "n must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"{message}, got {self}")

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> SamplingParams:
        """From the spec's `RolloutConfig` (its `n_samples_per_prompt` becomes `n`)."""
        values = {
            "max_new_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "top_k": config.top_k,
            "min_p": config.min_p,
            "do_sample": config.do_sample,
            "n": config.n_samples_per_prompt,
        }
        return cls(**{**values, **overrides})

    @property
    def filters(self) -> bool:
        """Whether any of top-k, top-p, min-p changes the distribution sampled from."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0



# --------------------------------------------------------------------------- sampling


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits (B, V) with all but the k largest of each row set to -inf (ties at the k-th kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits (B, V) keeping, per row, the likeliest tokens whose probability mass first reaches
    `top_p` (always at least the top token); the rest set to -inf."""
    if top_p >= 1:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # (B, V): mass of the likelier tokens
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Logits (B, V) with tokens whose probability is below `min_p` times the row's top
    probability set to -inf (the top token is always kept)."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    threshold = probs.amax(-1, keepdim=True) * min_p  # (B, 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits (B, V) after top-k, top-p and min-p, in that order (as in
    Hugging Face's logits warpers)."""
    logits = apply_top_k(logits, params.top_k)
    logits = apply_top_p(logits, params.top_p)
    return apply_min_p(logits, params.min_p)


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` (B, V); returns (tokens (B,), logprobs (B,)).

    The log-prob is under softmax(logits / temperature), before filtering. Sampling is by
    inverse CDF, one uniform number per row: `uniform` (B,) when given, else drawn from
    `generator` (torch.multinomial and the exponential race draw per vocabulary entry, which
    costs far more on CPU).
    """
    logits = logits.float()
    if not params.do_sample:
        tokens = logits.argmax(-1)
        return tokens, _gather(logits.log_softmax(-1), tokens)
    scaled = logits / params.temperature if params.temperature != 1 else logits
    logp = scaled.log_softmax(-1)  # (B, V)
    probs = filter_logits(scaled, params).softmax(-1) if params.filters else logp.exp()
    if uniform is None:
        uniform = torch.rand(
            probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device
        )
    tokens = _inverse_cdf(probs, uniform)
    return tokens, _gather(logp, tokens)


def draw_uniforms(
    rows: int,
    steps: int,
    generator: torch.Generator | None = None,
    *,
    row_range: tuple[int, int] | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """The sampling draws of a whole batch: (rows, steps) float64 uniforms, row r's draw at
    step t in [r, t]. `row_range` keeps rows [start, stop) of the table: a data-parallel rank
    generating its shard of a batch samples exactly the tokens the whole batch would."""
    table = torch.rand(rows, steps, generator=generator, dtype=torch.float64)
    if row_range is not None:
        table = table[row_range[0]:row_range[1]]
    return table.to(device)


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of probs (B, V), drawn with one uniform number per row (B,): the first
    token whose cumulative probability exceeds it, so a token of probability 0 is not drawn.
    Sum and draw are float64, so even a 150k-token vocabulary's tail keeps its probabilities."""
    cdf = probs.double().cumsum(-1)  # (B, V)
    draw = uniform.to(cdf.dtype).view(-1, 1) * cdf[:, -1:]
    # A draw rounded up to the total mass would land past the end (odds about 1e-16).
    return torch.searchsorted(cdf, draw, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def _gather(logp: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return logp.gather(-1, tokens[:, None]).squeeze(-1)
