"""The native engine's two decoders, behind one step interface: the fast decoder (a hand-written
forward over a Llama-style model's own weights with a static KV cache) and the Hugging Face
decoder (the model's own `forward` with a `DynamicCache`), and `fast_path_reason`, which says
when the fast one cannot run a model. rl_core.rollout.native picks one per `generate`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rl_core.collectives import all_reduce

# Llama-style decoders whose layers the fast decoder can run (checked structurally as well).
FAST_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Rows the packed linear weights are tuned for (any count works).
PACK_ROWS = 64
# Rotary variants whose frequencies change with the sequence length: not a fixed table.
_DYNAMIC_ROPE = ("dynamic", "longrope")


# --------------------------------------------------------------------------- prompts


def mask_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids (N, P) of a left-padded mask: cumsum - 1, and 0 on padding."""
    return (mask.cumsum(-1) - 1).clamp(min=0)



# --------------------------------------------------------------------------- decoders


class FastDecoder:
    """A hand-written forward over a Llama-style model's own weights, with a static KV cache.

    Built once per `generate` call from the current weights, so training updates between calls
    are always seen. The weights are rearranged for fewer kernel launches: q/k/v and gate/up
    concatenated, each RMSNorm's weight folded into the projection after it, the attention
    scale folded into the queries. Decoding runs about a hundred small kernels per token.

    `dtype` is the compute dtype of the layers (the weights are cast once per call); the final
    norm and the logits are always computed in float32. On CPU the KV cache and the attention
    are float32 too: 16-bit batched matmuls there copy a strided cache at every step.

    `group`: the model holds one rank's part of each layer (`rl_core.rollout.parts`): the
    output and down projections' partial sums are added up over the group (an all-reduce
    each), so every rank computes the same hidden states and logits.
    """

    def __init__(self, model: torch.nn.Module, cache: StaticCache, dtype: torch.dtype,
                 group: Any = None) -> None:
        self.group = group
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
        self.cos = self.sin = self.key_bias = self._columns = torch.empty(0)

    def prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, repeats: int, max_new_tokens: int
    ) -> torch.Tensor:
        """Run the prompts (N, P); store their cache `repeats` times; logits (N*repeats, V)."""
        n, width = ids.shape
        rows, length = n * repeats, width + max_new_tokens
        self._rotary_table(length, ids.device)
        shape = (len(self.layers), rows, self.kv_heads, length, self.head_dim)
        self.cache.reserve(shape, self.cache_dtype, ids.device)
        self.key_bias = self._key_bias(mask.repeat_interleave(repeats, 0), self.cache.length)
        self._columns = torch.arange(self.cache.length, device=ids.device)
        positions = mask_positions(mask)
        cos, sin = self.cos[positions][:, :, None], self.sin[positions][:, :, None]  # (N, P, 1, d)
        attend = _prompt_attention(mask)
        x = F.embedding(ids, self.embed)  # (N, P, H)
        for index, layer in enumerate(self.layers):
            x = self._prefill_layer(x, layer, index, cos, sin, attend, repeats)
        return self._logits(x[:, -1]).repeat_interleave(repeats, 0)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """Feed one token per row (B,) at cache `column`; logits (B, V) for the next one."""
        return self.step(tokens, positions, column, column + 1)

    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, column: int | torch.Tensor, span: int
    ) -> torch.Tensor:
        """`decode` with the column given as an int or a one-element tensor on the device, the
        keys read over the first `span` cache columns (those after `column` masked out): with
        a tensor column and a fixed span its shapes and addresses do not change from step to
        step, so a device graph can capture it (`StepGraphs`)."""
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, d)
        bias = self.key_bias[: tokens.shape[0] * self.kv_heads, :, :span]  # (B*kv, 1, S)
        if isinstance(column, torch.Tensor):
            bias = bias.masked_fill(self._columns[:span] > column, float("-inf"))
        x = F.embedding(tokens, self.embed)  # (B, H)
        for index, layer in enumerate(self.layers):
            x = self._decode_layer(x, layer, index, cos, sin, bias, column, span)
        return self._logits(x)

    def select(self, keep: torch.Tensor, columns: int) -> None:
        """Keep only batch rows `keep` (their first `columns` cache columns are filled), moved
        to the first rows of the same buffers, so their addresses stay what a graph captured."""
        self.cache.select(keep, columns)
        bias = self.key_bias.view(-1, self.kv_heads, *self.key_bias.shape[1:])
        bias[: keep.shape[0]] = bias[keep]

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
        x = x + self._summed(w.o(out.transpose(1, 2).reshape(n, t, -1)))
        return x + self._mlp(x, w)

    def _decode_layer(
        self,
        x: torch.Tensor,
        w: _LayerWeights,
        index: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        column: int | torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        rows, pairs = x.shape[0], x.shape[0] * self.kv_heads
        q, k, v = self._project(x, w, cos, sin)  # (B, heads, d)
        keys, values = self.cache.write_column(index, column, k, v, span)  # (B, kv, S, d)
        # One small matmul per (row, kv head): its `group` query heads against its keys.
        q = q.to(self.cache_dtype).reshape(pairs, -1, self.head_dim)  # (B*kv, group, d)
        keys = keys.reshape(pairs, -1, self.head_dim).transpose(1, 2)  # (B*kv, d, S)
        scores = torch.baddbmm(bias, q, keys)  # (B*kv, group, S)
        weights = scores.softmax(-1, dtype=torch.float32).to(values.dtype)
        out = torch.bmm(weights, values.reshape(pairs, -1, self.head_dim))  # (B*kv, group, d)
        x = x + self._summed(w.o(out.view(rows, -1).to(x.dtype)))
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
        return self._summed(w.down(w.act(gate) * up))

    def _summed(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-split projection's output summed over the rollout group (itself alone)."""
        return partial if self.group is None else all_reduce(partial, self.group)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(_rms_norm(hidden.float(), self.final_eps))


class _LayerWeights:
    """One decoder layer's weights rearranged for `FastDecoder` (see there)."""

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


# --------------------------------------------------------------------------- device graphs


class StepGraphs:
    """The fast decoder's decode step replayed from device graphs (CUDA graphs; Ascend's
    NPUGraph where torch_npu has it): one launch per step instead of about a hundred kernels
    per layer, which on an accelerator is what keeps small decode steps from the memory
    bandwidth limit.

    A graph fixes shapes and addresses, so the step reads its tokens, positions and column
    from buffers of its own, rows come in buckets (powers of two up to the batch: the rows of
    a bucket past the batch's compute unread garbage) and the keys in spans of `SPAN` columns
    (the columns past the current one masked out). A graph is captured the first time its
    (rows, span) pair comes; the pairs of one `generate` only go one way (spans grow, buckets
    shrink), so only the current graph is kept and the next one reuses its memory pool.
    """

    SPAN = 128

    def __init__(self, decoder: FastDecoder, rows: int, backend: GraphBackend) -> None:
        device = decoder.embed.device
        self.decoder, self.backend, self.rows = decoder, backend, rows
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.key: tuple[int, int] | None = None
        self.graph: Any = None
        self.logits = torch.empty(0)
        self.captures = 0

    def bucket(self, rows: int) -> int:
        """The rows a graph for a batch of `rows` runs: the next power of two, at most all."""
        return min(1 << max(rows - 1, 0).bit_length(), self.rows)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        """As `FastDecoder.decode`; the logits are a view of the graph's output, valid until
        the next step."""
        rows = tokens.shape[0]
        self.tokens[:rows].copy_(tokens)
        self.positions[:rows].copy_(positions)
        self.column.fill_(column)
        span = min(-(-(column + 1) // self.SPAN) * self.SPAN, self.decoder.cache.length)
        key = (self.bucket(rows), span)
        if key != self.key:
            self.graph = self.logits = None  # its pool is free for the next capture
            self.graph, self.logits = self.backend.capture(functools.partial(
                self.decoder.step, self.tokens[: key[0]], self.positions[: key[0]],
                self.column, span))
            self.key, self.captures = key, self.captures + 1
        self.graph.replay()
        return self.logits[:rows]

    def select(self, keep: torch.Tensor, columns: int) -> None:
        self.decoder.select(keep, columns)

    def compacts(self, batch: int, running: int) -> bool:
        """Whether dropping the stopped rows changes the bucket (else they cost nothing)."""
        return self.bucket(running) < self.bucket(batch)


class GraphBackend:
    """Captures a function into a device graph: `capture(fn) -> (graph, output)`, where
    `graph.replay()` reruns fn's kernels on the buffers fn read and wrote when captured."""

    def __init__(self, module: Any) -> None:
        self.module = module  # torch.cuda, or torch.npu with torch_npu
        self.pool = module.graph_pool_handle()

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        module = self.module
        side = module.Stream()
        side.wait_stream(module.current_stream())
        with module.stream(side):  # once outside the graph: lazy initialisation, workspaces
            fn()
        module.current_stream().wait_stream(side)
        graph = module.CUDAGraph() if module is torch.cuda else module.NPUGraph()
        with module.graph(graph, pool=self.pool):
            out = fn()
        return graph, out


class EagerGraphs:
    """`GraphBackend`'s contract without a device graph: replay calls the function again and
    copies its result into the output of the capture. It runs `StepGraphs` where there are no
    device graphs (CPUs), so what it computes is checked everywhere."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Any, torch.Tensor]:
        out = fn()
        return _EagerReplay(fn, out), out


class _EagerReplay:
    def __init__(self, fn: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.out = fn, out

    def replay(self) -> None:
        self.out.copy_(self.fn())


def graph_backend(device: torch.device) -> GraphBackend | None:
    """The device graphs of `device`'s kind: CUDA graphs, Ascend's NPUGraph (torch_npu with
    graph capture), or None (CPUs, and torch_npu builds without it)."""
    if device.type == "cuda":
        return GraphBackend(torch.cuda)
    module = getattr(torch, device.type, None)
    if device.type == "npu" and all(hasattr(module, n) for n in ("NPUGraph", "graph_pool_handle")):
        return GraphBackend(module)
    return None


class StaticCache:
    """Preallocated keys and values (layers, rows, kv_heads, length, head_dim), kept between
    calls while they fit and dropped by `free`. Dropping rows (`select`) moves the rows kept to
    the front of the same buffers: the batch's rows are the first `rows`, at fixed addresses."""

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
            # zeros, not empty: a step may read columns not yet written (masked, weight 0),
            # and 0 * NaN of uninitialised memory would still be NaN
            self.keys = torch.zeros(size, dtype=dtype, device=device)
            self.values = torch.zeros(size, dtype=dtype, device=device)

    @property
    def length(self) -> int:
        """Columns allocated (0 when freed)."""
        return 0 if self.keys is None else self.keys.shape[3]

    def write_column(
        self, layer: int, column: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor, span: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one token's k, v (B, kv, d) at `column` (an int, or a one-element tensor on
        the device) of the first B rows; their cache (B, kv, span, d) from column 0."""
        assert self.keys is not None and self.values is not None
        keys, values = self.keys[layer, : k.shape[0]], self.values[layer, : k.shape[0]]
        if isinstance(column, torch.Tensor):
            keys.index_copy_(2, column, k[:, :, None])
            values.index_copy_(2, column, v[:, :, None])
        else:
            keys[:, :, column] = k
            values[:, :, column] = v
        return keys[:, :, :span], values[:, :, :span]

    def write_prompts(self, layer: int, k: torch.Tensor, v: torch.Tensor, repeats: int) -> None:
        """Store the prompts' k, v (N, kv, P, d) from column 0, each prompt in `repeats` rows."""
        assert self.keys is not None and self.values is not None
        n, heads, width, dim = k.shape
        for store, new in ((self.keys, k), (self.values, v)):
            store[layer, :, :, :width].view(n, repeats, heads, width, dim).copy_(new[:, None])

    def select(self, keep: torch.Tensor, columns: int) -> None:
        """Move batch rows `keep` (their first `columns` columns) to the first rows."""
        assert self.keys is not None and self.values is not None
        for store in (self.keys, self.values):
            store[:, : keep.shape[0], :, :columns] = store[:, keep, :, :columns]

    def free(self) -> None:
        self.keys = self.values = None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


class HFDecoder:
    """Any causal LM through its own `forward` and a transformers `DynamicCache`. `images`: a
    vision-language model's image inputs of the prompts (`rl_core.models.vision.image_inputs`),
    read by the prefill, which then computes its own (3-D) positions; decoding continues each
    row's text positions from there (the row's offset between its 3-D positions and its token
    count, Qwen2.5-VL's `rope_deltas`), and never samples the image placeholder token (a
    response holding one could not be read back with the images)."""

    def __init__(self, model: torch.nn.Module, images: dict[str, torch.Tensor] | None = None
                 ) -> None:
        self.model = model
        self.images = images
        self.offsets: torch.Tensor | None = None  # per row: 3-D position - token count
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
        if self.images is None:
            out = self._forward(ids, mask, mask_positions(mask))
        else:
            out = self._forward(ids, mask, None, **self.images)
            deltas = self.model.model.rope_deltas.reshape(-1)  # (B,)
            self.offsets = deltas.to(ids.device).repeat_interleave(repeats)
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
        if self.offsets is not None:
            self.offsets = self.offsets[keep]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, column: int) -> torch.Tensor:
        assert self.key_mask is not None
        if self.offsets is not None:
            positions = positions + self.offsets
        return self._forward(tokens[:, None], self.key_mask[:, : column + 1], positions[:, None])

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor | None,
        **extra: torch.Tensor,
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_argument: self.cache},
            logits_to_keep=1,
            **extra,
        )
        logits = out.logits[:, -1]
        if self.images is not None:  # a response never holds an image's placeholder token
            logits[:, self.model.config.image_token_id] = float("-inf")
        return logits

    def close(self) -> None:
        self.cache = self.images = self.offsets = None


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
