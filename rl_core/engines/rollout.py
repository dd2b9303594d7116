"""Native rollout: batched sampling with a KV cache from the training weights, in the same process.

    engine = NativeRolloutEngine(model, eos_token_ids=[258, 256], pad_token_id=256)
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=128, n=4), generator=g)
    input_ids, attention_mask, position_ids = batch.to_sequences()
    engine.free_cache()                     # before the training update

The engine holds a reference to the training model, never a copy: every `generate` reads the
current weights, so rollout is colocated with training by construction.

Two decoders share one sampling loop:

- the fast decoder, for Llama-style decoders (Qwen2, Qwen3, Llama, Mistral without a sliding
  window in reach): it runs the model's own weights through a short hand-written forward with a
  preallocated (static) KV cache, fused q/k/v and gate/up projections, one rotary table per call,
  logits for the last position only, and no per-step bookkeeping beyond the sampled tokens; it
  can compute in another dtype than the model's (`dtype=torch.bfloat16` for float32 weights);
- the Hugging Face decoder, for any other causal LM: the model's own `forward` with a
  `DynamicCache`.

Prompts are left-padded, so every response starts in the same column; position ids are
`cumsum(mask) - 1`, as in Hugging Face `generate` and verl. Each prompt is prefilled once and
its cache copied to its `n` sample rows. Rows stop on any eos id; generation stops when every
row has stopped or after `max_new_tokens`, and once a quarter of the rows have stopped the
batch is compacted to those still running. Sampling draws from the `generator` passed in
(on the engine's device), so a seed reproduces a rollout.

Log-probs are those of the sampled token under softmax(logits / temperature), before top-k,
top-p and min-p filtering (what verl's `old_log_prob` recomputes); with `do_sample=False` the
temperature is 1.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rl_core.data.batch import Batch, left_pad

# Llama-style decoders whose layers the fast decoder can run (checked structurally as well).
FAST_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Rows the packed linear weights are tuned for (any count works).
PACK_ROWS = 64
# Compact the batch once 1/COMPACT_FRACTION of its rows have stopped.
COMPACT_FRACTION = 4
# Rotary variants whose frequencies change with the sequence length: not a fixed table.
_DYNAMIC_ROPE = ("dynamic", "longrope")


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


# --------------------------------------------------------------------------- prompts


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (N, P) of a left-padded mask: cumsum - 1, and 0 on padding."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


# --------------------------------------------------------------------------- decoders


class _FastDecoder:
    """A hand-written forward over a Llama-style model's own weights, with a static KV cache.

    Built once per `generate` call from the current weights, so training updates between calls
    are always seen. The weights are rearranged for fewer kernel launches: q/k/v and gate/up
    concatenated, each RMSNorm's weight folded into the projection after it, the attention
    scale folded into the queries. Decoding runs about a hundred small kernels per token.

    `dtype` is the compute dtype of the layers (the weights are cast once per call); the final
    norm and the logits are always computed in float32. On CPU the KV cache and the attention
    are float32 too: 16-bit batched matmuls there copy a strided cache at every step.
    """

    def __init__(self, model: torch.nn.Module, cache: _StaticCache, dtype: torch.dtype) -> None:
        inner = model.model
        self.embed = inner.embed_tokens.weight.to(dtype)
        self.cache_dtype = torch.float32 if self.embed.device.type == "cpu" else dtype
        self.layers = [_LayerWeights(layer, dtype) for layer in inner.layers]
        final_weight, self.final_eps = _norm_params(inner.norm)
        head, bias = model.lm_head.weight, model.lm_head.bias
        self.head = _Linear(  # (V, H), the final norm's weight folded in
            (head * final_weight).float(), bias.float() if bias is not None else None
        )
        self.rotary = inner.rotary_emb
        first = self.layers[0]
        self.heads, self.kv_heads, self.head_dim = first.heads, first.kv_heads, first.head_dim
        self.cache = cache
        self.cos = self.sin = self.key_bias = torch.empty(0)

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, repeats: int, max_new_tokens: int
    ) -> torch.Tensor:
        """Run the prompts (N, P); store their cache `repeats` times; logits (N*repeats, V)."""
        n, width = ids.shape
        rows, length = n * repeats, width + max_new_tokens
        self._rotary_table(length, ids.device)
        shape = (len(self.layers), rows, self.kv_heads, length, self.head_dim)
        self.cache.reserve(shape, self.cache_dtype, ids.device)
        self.key_bias = self._key_bias(mask.repeat_interleave(repeats, 0), length)
        positions = mask_positions(mask)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # (N, P, 1, d)
        attend = _prompt_attention(mask)
        x = F.embedding(ids, self.embed)  # (N, P, H)
        for index, layer in enumerate(self.layers):
            x = self._prefill_layer(x, layer, index, cos, sin, attend, repeats)
        return self._logits(x[:, -1]).repeat_interleave(repeats, 0)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """Feed one token per row (B,) at cache `column`; logits (B, V) for the next one."""
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, d)
        bias = self.key_bias[..., : column + 1]  # (B*kv, 1, S)
        x = F.embedding(tokens, self.embed)  # (B, H)
        for index, layer in enumerate(self.layers):
            x = self._decode_layer(x, layer, index, cos, sin, bias, column)
        return self._logits(x)

    def select(self, keep: torch.Tensor, columns: int) -> None:
        """Keep only batch rows `keep` (their first `columns` cache columns are filled)."""
        self.cache.select(keep, columns)
        self.key_bias = self.key_bias.view(-1, self.kv_heads, *self.key_bias.shape[1:])[keep]
        self.key_bias = self.key_bias.flatten(0, 1)

    def _key_bias(self, mask: torch.Tensor, length: int) -> torch.Tensor:
        """Additive attention bias of decoding (B*kv, 1, length), -inf on prompt padding; a
        row's bias repeated for each of its kv heads."""
        bias = mask.new_zeros((mask.shape[0], 1, length), dtype=self.cache_dtype)
        bias[..., : mask.shape[1]].masked_fill_(mask[:, None] == 0, float("-inf"))
        return bias.repeat_interleave(self.kv_heads, 0)

    def _rotary_table(self, length: int, device: torch.device) -> None:
        positions = torch.arange(length, device=device)[None]
        cos, sin = self.rotary(self.embed[:1], positions)  # (1, S, d), as the model computes them
        half = self.head_dim // 2
        self.cos = cos[0]
        # rotate_half(x) * sin == swap_halves(x) * [-sin_1, sin_2]
        self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    def _prefill_layer(
        self,
        x: torch.Tensor,
        w: _LayerWeights,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: torch.Tensor,
        repeats: int,
    ) -> torch.Tensor:
        n, t, _ = x.shape
        q, k, v = self._project(x, w, cos, sin)  # (N, T, heads, d)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (N, heads, T, d)
        self.cache.write_prompts(index, k, v, repeats)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attend, scale=1.0, enable_gqa=self.heads != self.kv_heads
        )  # (N, heads, T, d)
        x = x + w.o(out.transpose(1, 2).reshape(n, t, -1))
        return x + self._mlp(x, w)

    def _decode_layer(
        self,
        x: torch.Tensor,
        w: _LayerWeights,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        column: int,
    ) -> torch.Tensor:
        rows, pairs = x.shape[0], x.shape[0] * self.kv_heads
        q, k, v = self._project(x, w, cos, sin)  # (B, heads, d)
        keys, values = self.cache.write_column(index, column, k, v)  # (B, kv, S, d)
        # One small matmul per (row, kv head): its `group` query heads against its keys.
        q = q.to(self.cache_dtype).reshape(pairs, -1, self.head_dim)  # (B*kv, group, d)
        keys = keys.reshape(pairs, -1, self.head_dim).transpose(1, 2)  # (B*kv, d, S)
        scores = torch.baddbmm(bias, q, keys)  # (B*kv, group, S)
        weights = scores.softmax(-1, dtype=torch.float32).to(values.dtype)
        out = torch.bmm(weights, values.reshape(pairs, -1, self.head_dim))  # (B*kv, group, d)
        x = x + w.o(out.view(rows, -1).to(x.dtype))
        return x + self._mlp(x, w)

    def _project(
        self, x: torch.Tensor, w: _LayerWeights, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (scaled), keys (both rotated) and values, each (..., heads, d), of x (..., H)."""
        qkv = w.qkv(_rms_norm(x, w.eps1))
        qkv = qkv.view(*x.shape[:-1], self.heads + 2 * self.kv_heads, self.head_dim)
        rotating = self.heads + self.kv_heads
        if w.q_norm is None:
            qk = _rotate(qkv[..., :rotating, :], cos, sin)
        else:  # Qwen3: per-head norms before the rotation (the scale is in q_norm's weight)
            assert w.k_norm is not None
            q = _rms_norm(qkv[..., : self.heads, :], w.q_norm[1], w.q_norm[0])
            k = _rms_norm(qkv[..., self.heads : rotating, :], w.k_norm[1], w.k_norm[0])
            qk = _rotate(torch.cat([q, k], dim=-2), cos, sin)
        return qk[..., : self.heads, :], qk[..., self.heads :, :], qkv[..., rotating:, :]

    def _mlp(self, x: torch.Tensor, w: _LayerWeights) -> torch.Tensor:
        gate, up = w.gate_up(_rms_norm(x, w.eps2)).chunk(2, -1)
        return w.down(w.act(gate) * up)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(_rms_norm(hidden.float(), self.final_eps))


class _LayerWeights:
    """One decoder layer's weights rearranged for `_FastDecoder` (see there)."""

    def __init__(self, layer: torch.nn.Module, dtype: torch.dtype) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.head_dim = attn.head_dim
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        norm1, self.eps1 = _norm_params(layer.input_layernorm)
        norm2, self.eps2 = _norm_params(layer.post_attention_layernorm)
        self.q_norm: tuple[torch.Tensor, float] | None = None
        self.k_norm: tuple[torch.Tensor, float] | None = None
        q_scale = attn.scaling
        if hasattr(attn, "q_norm"):  # the scale goes after q's own norm
            weight, eps = _norm_params(attn.q_norm)
            k_weight, k_eps = _norm_params(attn.k_norm)
            self.q_norm = ((weight * attn.scaling).to(dtype), eps)
            self.k_norm = (k_weight.to(dtype), k_eps)
            q_scale = 1.0
        q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
        self.qkv = _Linear(
            torch.cat([q.weight * q_scale, k.weight, v.weight]) * norm1,
            _cat_biases((q, k, v), (q_scale, 1.0, 1.0)),
            dtype,
        )
        self.o = _Linear(attn.o_proj.weight, attn.o_proj.bias, dtype)
        gate, up = mlp.gate_proj, mlp.up_proj
        self.gate_up = _Linear(
            torch.cat([gate.weight, up.weight]) * norm2,
            _cat_biases((gate, up), (1.0, 1.0)),
            dtype,
        )
        self.down = _Linear(mlp.down_proj.weight, mlp.down_proj.bias, dtype)
        self.act: Callable[[torch.Tensor], torch.Tensor] = mlp.act_fn


class _Linear:
    """x @ weight.T + bias, in `dtype`; on CPU with oneDNN, through a copy of the weight
    prepacked for oneDNN's GEMM (about a fifth faster at the row counts of decoding)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None = None
    ) -> None:
        if dtype is not None:
            weight, bias = weight.to(dtype), bias.to(dtype) if bias is not None else None
        self.bias = bias
        self.packed = _pack(weight) if _onednn_packing(weight) else None
        self.weight = weight if self.packed is None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def _onednn_packing(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and _onednn_works(weight.dtype)
    )


@functools.cache
def _onednn_works(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU run oneDNN's prepacked linear (a private op inductor
    uses) in `dtype`: its bfloat16 path needs AVX512 (BW, VL, DQ) or AVX-NE-CONVERT."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight, x = torch.ones(4, 8, dtype=dtype), torch.ones(2, 8, dtype=dtype)
        out = torch.ops.mkldnn._linear_pointwise(x, _pack(weight), None, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, F.linear(x, weight)))


def _prompt_attention(mask: torch.Tensor) -> torch.Tensor:
    """Which prompt positions each attends to (N, 1, P, P): itself and the real tokens before
    it. A padding position sees itself, so no attention row is empty (no NaN in its keys)."""
    width = mask.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=mask.device).tril()
    itself = torch.eye(width, dtype=torch.bool, device=mask.device)
    return ((causal & mask.bool()[:, None, :]) | itself)[:, None]


def _cat_biases(
    linears: Sequence[torch.nn.Linear], scales: Sequence[float]
) -> torch.Tensor | None:
    if all(lin.bias is None for lin in linears):
        return None
    return torch.cat(
        [
            lin.bias * scale if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
            for lin, scale in zip(linears, scales)
        ]
    )


def _norm_params(norm: torch.nn.Module) -> tuple[torch.Tensor, float]:
    eps = getattr(norm, "variance_epsilon", None)
    return norm.weight, float(eps if eps is not None else norm.eps)


def _rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """x / rms(x) over the last dim, computed in float32 (weight folded elsewhere if None)."""
    x32 = x.float()
    normed = (x32 * x32.square().mean(-1, keepdim=True).add_(eps).rsqrt_()).to(x.dtype)
    return normed if weight is None else normed * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (..., heads, d) with cos/sin (..., 1, d) (sin pre-signed)."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)  # [x2, x1]
    return torch.addcmul(x * cos, swapped, sin)


class _StaticCache:
    """Preallocated keys and values (layers, rows, kv_heads, length, head_dim), kept between
    calls while they fit and dropped by `free`."""

    ROUND = 64  # lengths are allocated in multiples of this, so similar calls reuse the buffer

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def reserve(
        self, shape: tuple[int, int, int, int, int], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Make room for `shape` (reusing the buffers when they are long enough)."""
        layers, rows, heads, length, dim = shape
        keys = self.keys
        fits = (
            keys is not None
            and keys.shape[:3] == (layers, rows, heads)
            and keys.shape[3] >= length
            and keys.shape[4] == dim
            and keys.dtype == dtype
            and keys.device == device
        )
        if not fits:
            self.free()
            length = -(-length // self.ROUND) * self.ROUND
            size = (layers, rows, heads, length, dim)
            self.keys = torch.empty(size, dtype=dtype, device=device)
            self.values = torch.empty(size, dtype=dtype, device=device)

    def write_column(
        self, layer: int, column: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one token's k, v (B, kv, d) at `column`; the layer's cache (B, kv, S, d) up to
        and including it."""
        assert self.keys is not None and self.values is not None
        self.keys[layer, :, :, column] = k
        self.values[layer, :, :, column] = v
        return self.keys[layer, :, :, : column + 1], self.values[layer, :, :, : column + 1]

    def write_prompts(self, layer: int, k: torch.Tensor, v: torch.Tensor, repeats: int) -> None:
        """Store the prompts' k, v (N, kv, P, d) from column 0, each prompt in `repeats` rows."""
        assert self.keys is not None and self.values is not None
        n, heads, width, dim = k.shape
        for store, new in ((self.keys, k), (self.values, v)):
            store[layer, :, :, :width].view(n, repeats, heads, width, dim).copy_(new[:, None])

    def select(self, keep: torch.Tensor, columns: int) -> None:
        """Keep only batch rows `keep`, copying their first `columns` columns."""
        assert self.keys is not None and self.values is not None
        layers, _, heads, length, dim = self.keys.shape
        shape = (layers, keep.shape[0], heads, length, dim)
        keys, values = self.keys.new_empty(shape), self.values.new_empty(shape)
        keys[..., :columns, :] = self.keys[:, keep, :, :columns]
        values[..., :columns, :] = self.values[:, keep, :, :columns]
        self.keys, self.values = keys, values

    def free(self) -> None:
        self.keys = self.values = None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


class _HFDecoder:
    """Any causal LM through its own `forward` and a transformers `DynamicCache`."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache: Any = None
        # transformers 5 renamed `past_key_values` to `cache` (the old name warns until 5.40).
        parameters = inspect.signature(model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"
        self.key_mask: torch.Tensor | None = None

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, repeats: int, max_new_tokens: int
    ) -> torch.Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        out = self._forward(ids, mask, mask_positions(mask))
        self.cache.batch_repeat_interleave(repeats)
        rows, width = ids.shape[0] * repeats, ids.shape[1]
        self.key_mask = torch.ones(
            (rows, width + max_new_tokens), dtype=torch.long, device=ids.device
        )
        self.key_mask[:, :width] = mask.repeat_interleave(repeats, 0)
        return out.repeat_interleave(repeats, 0)

    def select(self, keep: torch.Tensor, columns: int) -> None:
        self.cache.batch_select_indices(keep)
        self.key_mask = self.key_mask[keep]  # type: ignore[index]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        assert self.key_mask is not None
        return self._forward(tokens[:, None], self.key_mask[:, : column + 1], positions[:, None])

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_argument: self.cache},
            logits_to_keep=1,
        )
        return out.logits[:, -1]

    def close(self) -> None:
        self.cache = None


def fast_path_reason(model: torch.nn.Module, length: int | None = None) -> str | None:
    """Why the fast decoder cannot run `model` (for sequences of `length` tokens); None if it
    can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAST_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(sorted(FAST_MODEL_TYPES))}"
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if inner is None or not all(hasattr(inner, name) for name in needed):
        return "not a Llama-style decoder (model.model.{embed_tokens,layers,norm,rotary_emb})"
    if not hasattr(model, "lm_head"):
        return "no lm_head"
    rope = str(getattr(inner.rotary_emb, "rope_type", "default"))
    if any(name in rope for name in _DYNAMIC_ROPE):
        return f"rope_type {rope!r} changes with the sequence length"
    for layer in inner.layers:
        window = getattr(layer.self_attn, "sliding_window", getattr(config, "sliding_window", None))
        if window is not None and (length is None or length > window):
            return f"a sliding attention window ({window}) shorter than the sequence"
    return None


# --------------------------------------------------------------------------- engine


class NativeRolloutEngine:
    """Generates responses with `model`'s current weights, batched, with a KV cache.

    `eos_token_ids`: any of them ends a response (it is kept, inside the response mask).
    `pad_token_id`: fills the prompts' left and the responses' right padding.
    `fast`: use the hand-written decoder where the architecture allows (default); False always
    goes through the model's own forward.
    `dtype`: compute dtype of the layers, e.g. torch.bfloat16 to roll out a float32 model in
    bfloat16 (weights cast once per call; logits and log-probs stay float32); default the
    model's. Needs the fast decoder.
    `check_every`: how many steps between checks that every row has stopped (each check waits
    for the device); default 1 on CPU, 8 elsewhere.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: str | torch.device = "cpu",
        *,
        fast: bool = True,
        dtype: torch.dtype | None = None,
        check_every: int | None = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: responses could only stop at max_new_tokens")
        self.model = model
        self.device = torch.device(device)
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.fast = fast
        self.dtype = dtype
        self.check_every = check_every or (1 if self.device.type == "cpu" else 8)
        self._cache = _StaticCache()

    # it reads the model it was given: over the training model, no sync is ever needed
    shares_weights = True

    @classmethod
    def from_spec(cls, model: torch.nn.Module, tokenizer: Any, spec: Any,
                  device: str | torch.device = "cpu", **_: Any) -> NativeRolloutEngine:
        """The engine over `model` (the training weights); it needs nothing of the spec."""
        return cls(model, eos_token_ids=eos_ids(tokenizer, model),
                   pad_token_id=tokenizer.pad_token_id, device=device)

    def load_weights(self, buckets: Iterable[list[tuple[str, torch.Tensor]]],
                     version: int | None = None) -> None:
        """Copy weights by name into the model (from a training engine's `weight_buckets`).

        The native engine usually holds the training model itself and needs no copy; this is
        for an engine over a model of its own (a sharded actor's full copy). An unknown name is
        an error. `version` is the policy's; the model is read live, so it needs no record."""
        own = self.model.state_dict()
        with torch.no_grad():
            for bucket in buckets:
                for name, tensor in bucket:
                    if name not in own:
                        raise KeyError(f"the rollout model has no weight named {name!r}")
                    if own[name].data_ptr() != tensor.data_ptr():
                        own[name].copy_(tensor)
        self._cache.free()

    def sleep(self) -> None:
        """Free the KV cache; the weights are the training model's and stay where it puts them."""
        self._cache.free()

    def wake_up(self) -> None:
        """Nothing to restore: the cache is allocated again by the next `generate`."""

    @property
    def cache_nbytes(self) -> int:
        """Bytes held by the KV cache between calls (0 after `free_cache`)."""
        return self._cache.nbytes

    def free_cache(self) -> None:
        """Drop the KV-cache buffers (before a training update, when memory is shared)."""
        self._cache.free()

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        uniforms: torch.Tensor | None = None,
    ) -> Batch:
        """Sample `params.n` responses to each prompt (token ids, no padding).

        The draws come from `uniforms` (rows = len(prompts) × n, max_new_tokens), see
        `draw_uniforms`, or are drawn from `generator` as one such table."""
        ids, mask = left_pad(prompts, self.pad_token_id, self.device)
        rows = ids.shape[0] * params.n
        if params.do_sample and uniforms is None:
            uniforms = draw_uniforms(rows, params.max_new_tokens, generator, device=self.device)
        if uniforms is not None and tuple(uniforms.shape) != (rows, params.max_new_tokens):
            raise ValueError(f"uniforms must be ({rows}, {params.max_new_tokens}) for "
                             f"{ids.shape[0]} prompts x n={params.n}, got {tuple(uniforms.shape)}")
        with torch.inference_mode(), _eval_mode(self.model):
            decoder = self._decoder(ids.shape[1] + params.max_new_tokens)
            tokens, logprobs, alive = self._loop(decoder, ids, mask, params, uniforms)
            if isinstance(decoder, _HFDecoder):
                decoder.close()
        # Outside inference mode: the batch feeds autograd-tracked training code.
        outputs = (t.clone() for t in (ids, mask, tokens, logprobs, alive))
        return self._batch(*outputs, params.n)

    def _decoder(self, length: int) -> _FastDecoder | _HFDecoder:
        model_dtype = self.model.get_input_embeddings().weight.dtype
        reason = fast_path_reason(self.model, length) if self.fast else "fast=False"
        if reason is None:
            return _FastDecoder(self.model, self._cache, self.dtype or model_dtype)
        if self.dtype not in (None, model_dtype):
            raise ValueError(
                f"dtype {self.dtype} differs from the model's {model_dtype}, which only the "
                f"fast decoder can do, and it cannot run this model: {reason}"
            )
        return _HFDecoder(self.model)

    def _loop(
        self,
        decoder: _FastDecoder | _HFDecoder,
        ids: torch.Tensor,
        mask: torch.Tensor,
        params: SamplingParams,
        uniforms: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode; returns tokens, logprobs and the alive mask, each (B, steps taken).

        Stopped rows keep being computed (their tokens are ignored) until a quarter of the
        batch has stopped; then the batch is compacted to the rows still running.
        """
        rows, width, limit = ids.shape[0] * params.n, ids.shape[1], params.max_new_tokens
        out = _Responses(rows, limit, self.pad_token_id, self.device)
        active = torch.arange(rows, device=self.device)  # batch row -> output row
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        eos = torch.tensor(self.eos_token_ids, device=self.device)
        positions = mask.sum(1).repeat_interleave(params.n)  # (B,) position of response token 0
        logits = decoder.prefill(ids, mask, params.n, limit)
        for step in range(limit):
            uniform = uniforms[active, step] if uniforms is not None else None
            token, logprob = sample_tokens(logits, params, uniform=uniform)
            out.record(step, active, token, logprob, done)
            done |= torch.isin(token, eos)
            if step + 1 == limit:
                break
            if (step + 1) % self.check_every == 0:
                stopped = int(done.sum())
                if stopped == done.shape[0]:
                    break
                if stopped >= max(1, done.shape[0] // COMPACT_FRACTION):
                    keep = (~done).nonzero().squeeze(1)
                    decoder.select(keep, width + step)
                    active, done, positions, token = (
                        active[keep], done[keep], positions[keep], token[keep]
                    )
            logits = decoder.decode(token, positions + step, width + step)
        return out.first(step + 1)

    def _batch(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        alive: torch.Tensor,
        n: int,
    ) -> Batch:
        lengths = alive.sum(1)  # (B,)
        width = int(lengths.max())
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        eos = torch.tensor(self.eos_token_ids, device=tokens.device)
        return Batch({
            "prompt_ids": ids.repeat_interleave(n, 0),
            "prompt_mask": mask.repeat_interleave(n, 0),
            "response_ids": tokens[:, :width].contiguous(),
            "response_mask": alive[:, :width].long(),
            "logprobs": logprobs[:, :width].contiguous(),
            "prompt_index": torch.arange(ids.shape[0], device=ids.device).repeat_interleave(n),
            "response_lengths": lengths,
            "finished": torch.isin(last, eos),
        })


class _Responses:
    """Output buffers (rows, max_new_tokens): tokens (pad-filled), log-probs, alive mask."""

    def __init__(self, rows: int, limit: int, pad: int, device: torch.device) -> None:
        self.pad = pad
        self.tokens = torch.full((rows, limit), pad, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, limit), dtype=torch.float32, device=device)
        self.alive = torch.zeros((rows, limit), dtype=torch.bool, device=device)

    def record(
        self,
        step: int,
        rows: torch.Tensor,
        token: torch.Tensor,
        logprob: torch.Tensor,
        done: torch.Tensor,
    ) -> None:
        """Store step `step` of output `rows`; rows already `done` get padding."""
        self.tokens[rows, step] = token.masked_fill(done, self.pad)
        self.logprobs[rows, step] = logprob.masked_fill(done, 0.0)
        self.alive[rows, step] = ~done

    def first(self, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tokens[:, :steps], self.logprobs[:, :steps], self.alive[:, :steps]


def eos_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Every token id that ends a response: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) while generating; every module's own mode restored afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


__all__ = [
    "NativeRolloutEngine",
    "SamplingParams",
    "apply_min_p",
    "apply_top_k",
    "apply_top_p",
    "draw_uniforms",
    "fast_path_reason",
    "filter_logits",
    "sample_tokens",
]
