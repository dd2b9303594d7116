"""Remove padding: the rows of a micro-batch packed into one sequence, attention kept to each row.

    prepare_packing(model)                                  # once: sdpa -> sdpa_varlen
    packed = pack(input_ids, attention_mask, position_ids, response_len,
                  attention=attention_of(model))
    out = model(**packed.model_inputs(), logits_to_keep=packed.keep)
    logprobs = packed.unpack(token_logprobs(out.logits, packed.labels[None])[0][0])  # (b, R)

A padded micro-batch (b, T) computes b·T positions, however few are real tokens; packed, the
model sees only the N = attention_mask.sum() valid tokens, row after row, as one sequence
(1, N) whose position ids restart at every row (each row keeps its own), with the rows'
boundaries as cumulative sequence lengths `cu_seq_lens_q/k` (b + 1,) and `max_length_q/k`
passed to the model's attention as keyword arguments (transformers' flash-attention kwargs).
Attention must then stay inside each row; how depends on the model's attention implementation
(`config._attn_implementation`, `PACKED_ATTENTION`):

- `sdpa` (transformers' default): `prepare_packing` switches the model to `sdpa_varlen`,
  registered here. With boundaries it computes each layer's attention over the whole packed
  sequence in one variable-length kernel call where the device has one (`packed_kernel`):
  PyTorch's `varlen_attn` on CUDA (torch >= 2.10), else flash-attn's `flash_attn_varlen_func`
  where installed, both for bfloat16 and float16; `torch_npu.npu_fusion_attention` in its TND
  layout on Ascend. Elsewhere (the CPU, float32 on CUDA) it runs `scaled_dot_product_attention`
  causally on each row's slice, the rows of one length batched into one call (each row costs
  its own length squared, not N²). Without boundaries (generation, any unpacked call) it is
  transformers' sdpa itself, so the model behaves as before everywhere else. A block-diagonal
  mask over the whole sequence would also be exact, but sdpa with an arbitrary mask
  materialises N² scores per head. One kernel call per layer matters on an accelerator: a call
  per distinct row length costs milliseconds of host time each (a new kernel plan per shape),
  which made packed updates 20-30x slower than padded ones on an H200.
- `flash_attention_2` / `flash_attention_3` (flash-attn on CUDA; transformers routes the same
  names to `torch_npu.npu_fusion_attention` on Ascend): the variable-length kernel reads the
  same boundaries.
- `eager`: an additive block-diagonal causal mask (1, 1, N, N) in the model's dtype (for
  debugging: N² memory).

Any other implementation (flex attention, a model's own kernel) is refused (`check_packing`),
since it could attend across rows without an error.

Only the positions that predict a response token are taken to the LM head: `keep` (K,) holds
their packed indices (the token before each valid response token) and `labels` (K,) the
tokens they predict, so the head computes K rows of logits instead of b·R. `unpack` scatters
a (K,) result back to the (b, R) response layout, 0 in the response's padding.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rl_core.errors import InputError

VARLEN_SDPA = "sdpa_varlen"
# attention implementation -> how a packed batch confines attention to each row
PACKED_ATTENTION = {
    "sdpa": "varlen",  # switched to VARLEN_SDPA by `prepare_packing`
    VARLEN_SDPA: "varlen",
    "flash_attention_2": "varlen",
    "flash_attention_3": "varlen",
    "eager": "additive-mask",
}


# The boundaries of a packed sequence's rows as a host list, beside `cu_seq_lens_q`: what the
# row groups and Ascend's kernel read, without a device-to-host copy in every layer.
HOST_BOUNDS = "rl_core_cu_seq_lens"


def varlen_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, attention_mask: torch.Tensor | None, *,
                cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any
                ) -> tuple[torch.Tensor, None]:
    """transformers' sdpa, confined to each row of a packed sequence when `cu_seq_lens_q` is
    given: one variable-length kernel call where the device has one (`packed_kernel`), else
    the rows grouped by length (`row_group_attention`).

    query (1, H, N, D), key and value (1, Hkv, N, D) -> (1, N, H, D), as sdpa returns. In a
    `context_parallel` forward this rank holds N / size of the tokens: `ulysses_attention`
    runs it on the whole sequence for a share of the heads, `ring_attention` on this rank's
    queries with every rank's keys in turn.
    """
    from rl_core.engines.context import active_group, ring_attention, ulysses_attention

    active = active_group()
    if active is not None and cu_seq_lens_q is not None:
        group, algorithm = active
        if algorithm == "ring":
            bounds = kwargs.get(HOST_BOUNDS)
            return ring_attention(module, query, key, value, group,
                                  bounds if bounds is not None else cu_seq_lens_q.tolist(),
                                  kwargs.get("scaling"))
        return ulysses_attention(varlen_sdpa_whole, module, query, key, value, group,
                                 cu_seq_lens_q=cu_seq_lens_q, **kwargs)
    return varlen_sdpa_whole(module, query, key, value, attention_mask,
                             cu_seq_lens_q=cu_seq_lens_q, **kwargs)


def varlen_sdpa_whole(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None, *,
                      cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any
                      ) -> tuple[torch.Tensor, None]:
    """`varlen_sdpa` over the whole sequence in this process."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    max_length = kwargs.pop("max_length_q", None)
    bounds = kwargs.pop(HOST_BOUNDS, None)
    for name in ("cu_seq_lens_k", "max_length_k"):
        kwargs.pop(name, None)
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    bounds = bounds if bounds is not None else cu_seq_lens_q.tolist()
    kernel = packed_kernel(query.device.type, query.dtype)
    if kernel is not None:
        max_length = max_length or max(b - a for a, b in zip(bounds, bounds[1:]))
        out = kernel(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                     cu_seq_lens_q, bounds, max_length, kwargs.get("scaling"))  # (N, H, D)
        return out[None], None
    return row_group_attention(module, query, key, value, bounds, **kwargs), None


def row_group_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, bounds: list[int], **kwargs: Any) -> torch.Tensor:
    """Causal sdpa on each row of a packed sequence (row boundaries `bounds`, b + 1 host ints),
    the rows of one length batched into one call: a micro-batch of many short rows costs one
    call per distinct length, not one per row. The tokens are put in that grouped order by one
    gather per input and back by one gather of the output, whatever the number of lengths (a
    scatter per length would copy the whole output each time).

    query (1, H, N, D), key and value (1, Hkv, N, D) -> (1, N, H, D).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs["is_causal"] = True
    groups, order = _length_groups(bounds)
    order = order.to(query.device)
    query, key, value = (x[0].index_select(1, order) for x in (query, key, value))  # (h, N, D)
    pieces, offset = [], 0
    for length, rows in groups:
        span = slice(offset, offset + rows * length)
        offset = span.stop

        def batch(x: torch.Tensor) -> torch.Tensor:  # (h, N, D) -> (rows, h, length, D)
            return x[:, span].unflatten(1, (rows, length)).transpose(0, 1)

        attended, _ = sdpa_attention_forward(module, batch(query), batch(key), batch(value),
                                             None, **kwargs)  # (rows, length, H, D)
        pieces.append(attended.flatten(0, 1))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(pieces).index_select(0, inverse)[None]  # (1, N, H, D)


def _length_groups(bounds: list[int]) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """(length, rows) of each group of equal-length rows of a packed sequence (row boundaries
    `bounds`), and the token positions (N,) in that grouped order (each group's rows in
    sequence order)."""
    starts: dict[int, list[int]] = {}
    for a, b in zip(bounds, bounds[1:]):
        starts.setdefault(b - a, []).append(a)
    order = torch.cat([(torch.tensor(firsts)[:, None] + torch.arange(length)).flatten()
                       for length, firsts in starts.items()])
    return [(length, len(firsts)) for length, firsts in starts.items()], order


# --------------------------------------------------------------------------- one-call kernels
# Each takes q (N, H, D), k and v (N, Hkv, D), the boundaries on the device (b + 1,) int32 and
# on the host, the longest row and the softmax scale (None: 1/sqrt(D)); returns (N, H, D).
PackedKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int], int,
                         float | None], torch.Tensor]
HALF_DTYPES = (torch.bfloat16, torch.float16)  # what the flash kernels compute in


def packed_kernel(device_type: str, dtype: torch.dtype) -> PackedKernel | None:
    """The one-call variable-length attention for tensors of `dtype` on `device_type`, or None
    (then the rows are grouped by length). The choice: `kernel_name`."""
    return KERNELS.get(kernel_name(device_type, dtype, installed_kernels()))


def kernel_name(device_type: str, dtype: torch.dtype, installed: frozenset[str]) -> str:
    """Which kernel packed attention uses, given what is installed ("varlen_attn": torch's,
    "flash_attn", "torch_npu"): "varlen_attn", "flash_attn", "npu_fusion_attention" or
    "row_groups"."""
    if device_type == "cuda" and dtype in HALF_DTYPES:
        for name in ("varlen_attn", "flash_attn"):
            if name in installed:
                return name
    if device_type == "npu" and dtype in HALF_DTYPES and "torch_npu" in installed:
        return "npu_fusion_attention"
    return "row_groups"


@functools.cache
def installed_kernels() -> frozenset[str]:
    """The variable-length kernels this process can import (checked once)."""
    found = {name for name in ("flash_attn", "torch_npu")
             if importlib.util.find_spec(name) is not None}
    if importlib.util.find_spec("torch.nn.attention.varlen") is not None:
        found.add("varlen_attn")
    return frozenset(found)


def _repeat_kv(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """kv (N, Hkv, D) repeated to q's H heads (grouped-query attention), as transformers does."""
    groups = q.shape[1] // kv.shape[1]
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def _torch_varlen(q, k, v, cu, bounds, longest, scale):
    """PyTorch's `varlen_attn` (flash attention on CUDA), causal. Its causal switch changed
    name between releases (`is_causal` in 2.10-2.11, `window_size=(-1, 0)` since), as did its
    grouped-query support (`enable_gqa`); both are read from its signature."""
    from torch.nn.attention.varlen import varlen_attn

    options = _varlen_options(tuple(inspect.signature(varlen_attn).parameters))
    if "enable_gqa" not in options:
        k, v = _repeat_kv(q, k), _repeat_kv(q, v)
    return varlen_attn(q, k, v, cu, cu, longest, longest, scale=scale, **options)


@functools.cache
def _varlen_options(parameters: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {"is_causal": True} if "is_causal" in parameters else {
        "window_size": (-1, 0)}
    if "enable_gqa" in parameters:
        options["enable_gqa"] = True
    return options


def _flash_attn(q, k, v, cu, bounds, longest, scale):
    """flash-attn's `flash_attn_varlen_func`, causal (grouped-query attention built in)."""
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, softmax_scale=scale,
                                  causal=True)


@functools.cache
def _npu_causal_mask(device: torch.device) -> torch.Tensor:
    """The 2048 x 2048 upper-triangular mask `npu_fusion_attention` takes with sparse_mode 3
    (causal, whatever the rows' lengths)."""
    return torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device=device), diagonal=1)


def _npu_fusion_attention(q, k, v, cu, bounds, longest, scale):
    """Ascend's fused attention in the TND layout, rows given by their cumulative ends on the
    host (grouped-query attention built in), causal by sparse_mode 3."""
    import torch_npu

    ends = tuple(bounds[1:])
    return torch_npu.npu_fusion_attention(
        q, k, v, q.shape[1], "TND", atten_mask=_npu_causal_mask(q.device), sparse_mode=3,
        scale=scale if scale is not None else q.shape[-1] ** -0.5, keep_prob=1.0,
        actual_seq_qlen=ends, actual_seq_kvlen=ends)[0]


KERNELS: dict[str, PackedKernel] = {
    "varlen_attn": _torch_varlen,
    "flash_attn": _flash_attn,
    "npu_fusion_attention": _npu_fusion_attention,
}


def _register_varlen_sdpa() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa)
    AttentionMaskInterface.register(VARLEN_SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def prepare_packing(model: torch.nn.Module, spec_field: str = "actor.use_remove_padding") -> None:
    """Make `model` ready for packed forwards: refuse an attention that cannot keep rows apart
    (`check_packing`), and switch sdpa to its row-by-row form (`varlen_sdpa`), in place."""
    check_packing(model, spec_field)
    if attention_of(model) != "sdpa":
        return
    _register_varlen_sdpa()
    for module in model.modules():  # the model's config and every sub-config its layers hold
        config = getattr(module, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = VARLEN_SDPA


def attention_of(model: torch.nn.Module) -> str:
    """The attention implementation a transformers model runs (`sdpa` when it names none)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) or "sdpa"


def check_packing(model: torch.nn.Module, spec_field: str = "actor.use_remove_padding") -> None:
    """Refuse packing for a model whose attention cannot be confined to each packed row."""
    attention = attention_of(model)
    if attention not in PACKED_ATTENTION:
        raise InputError(
            f"{spec_field}: the model's attention implementation {attention!r} cannot keep "
            f"packed rows apart (packing needs one of {', '.join(PACKED_ATTENTION)}); load the "
            f"model with one of them or set {spec_field}: false")


@dataclass(frozen=True)
class Packed:
    """One micro-batch of b rows packed into a sequence of N valid tokens.

    input_ids (1, N); position_ids (1, N), or (k, 1, N) for k kinds of positions (a
    vision-language model's text and 3-D ones); attention_mask (1, 1, N, N) or None (varlen);
    keep (K,) packed indices of the positions predicting the K valid response tokens, labels
    (K,) those tokens; where (b, R) bool: which response columns they are, and slots (K,)
    their flat indices; attention: the rows' boundaries for the model's attention (`cu_seq_lens_q/k`
    (b + 1,) int32, `max_length_q/k`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    keep: torch.Tensor
    labels: torch.Tensor
    where: torch.Tensor
    slots: torch.Tensor
    attention: dict[str, Any] = field(default_factory=dict)
    host_keep: torch.Tensor | None = None  # keep, on the host (what `shard` splits by)
    counts: tuple[int, ...] = ()  # a shard's: the response tokens of each rank's share
    inputs: dict[str, Any] = field(default_factory=dict)  # more of the model's inputs (images)

    def shard(self, rank: int, size: int) -> Packed:
        """This rank's share of the packed tokens for context parallelism (`rl_core.engines.
        context`): tokens [rank·N/size, (rank+1)·N/size) (N divisible by size: `pack`'s
        `multiple_of`), the response positions among them (`keep` relative to the share,
        `labels`), and `counts`, every rank's number of them; the boundaries of the rows and
        `where`/`slots` stay the whole sequence's."""
        n = self.input_ids.shape[1]
        if n % size or self.host_keep is None or self.attention_mask is not None:
            raise ValueError(f"a packed sequence of {n} tokens cannot be shared by {size} ranks: "
                             "pack it with multiple_of=size and variable-length attention")
        per = n // size
        owner = torch.div(self.host_keep, per, rounding_mode="floor")
        counts = tuple(torch.bincount(owner, minlength=size).tolist())
        mine = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        tokens = slice(rank * per, (rank + 1) * per)
        return dataclasses.replace(
            self, input_ids=self.input_ids[:, tokens], position_ids=self.position_ids[..., tokens],
            keep=self.keep[mine] - rank * per, labels=self.labels[mine], host_keep=None,
            counts=counts)

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments of the model's forward for this packed sequence."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "use_cache": False, **self.attention,
                **self.inputs}

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(K,) per valid response token -> (b, R), 0 in the response's padding."""
        out = values.new_zeros(self.where.numel())
        return out.index_put_((self.slots,), values).view(self.where.shape)


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    attention: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    multiple_of: int = 1,
) -> Packed:
    """Pack the valid tokens of (b, T) rows whose last `response_len` columns are the response.

    Every row needs at least one valid token before its first valid response token (the
    prompt), which predicts it. `position_ids` (b, T), or (k, b, T) for k kinds of positions
    (packed to (k, 1, N)). `attention`: the model's implementation (`PACKED_ATTENTION`);
    `dtype`: that of an additive mask (`eager`). `multiple_of`: the packed length is rounded up
    to a multiple of it by a last row of filler tokens (context parallelism's equal shares).
    """
    if attention not in PACKED_ATTENTION:
        raise ValueError(f"packing needs one of {list(PACKED_ATTENTION)}, got {attention!r}")
    # Which tokens go where is worked out where the mask is: on the host (the batch as it
    # arrives) nothing waits for the device; the device only gathers, by index.
    valid = attention_mask.bool()  # (b, T)
    b, width = valid.shape
    flat = valid.flatten().nonzero().squeeze(1)  # (N,) valid tokens' flat positions
    n = flat.shape[0]
    index = torch.full((b * width,), -1, dtype=torch.long, device=valid.device)
    index[flat] = torch.arange(n, device=valid.device)  # packed position of each valid token
    response_index = index.view(b, width)[:, width - response_len:]  # (b, R)
    where = response_index >= 0
    slots = where.flatten().nonzero().squeeze(1)  # (K,) flat (b, R) positions of the responses
    targets = response_index.flatten()[slots]  # (K,) packed positions of the response tokens
    lengths = valid.sum(1)  # (b,)
    filler = -n % multiple_of
    if filler:  # a row of its own, attending to itself only; nothing reads its outputs
        lengths = torch.cat([lengths, lengths.new_tensor([filler])])
    cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    host = cu.tolist()  # the boundaries for every layer (no wait when the mask is on the host)
    longest = max(b - a for a, b in zip(host, host[1:]))
    device = input_ids.device
    host_keep = targets - 1
    flat, targets, slots, where, cu = (
        t.to(device, non_blocking=True) for t in (flat, targets, slots, where, cu))
    packed_ids = input_ids.flatten().index_select(0, flat)  # (N,)
    positions = position_ids.flatten(-2).index_select(-1, flat)  # (N,) or (k, N)
    if filler:
        packed_ids = torch.cat([packed_ids, packed_ids.new_zeros(filler)])
        positions = torch.cat([positions, torch.arange(filler, device=device).expand(
            *positions.shape[:-1], filler)], -1)
    bounds = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
              "max_length_k": longest}
    if attention in ("sdpa", VARLEN_SDPA):
        bounds[HOST_BOUNDS] = host
    mask = None
    if PACKED_ATTENTION[attention] == "additive-mask":
        rows = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                       lengths.to(device), output_size=n + filler)  # (N,)
        allowed = (rows[:, None] == rows[None, :]).tril()  # (N, N): same row, not after
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)[None, None]
        bounds = {}
    return Packed(input_ids=packed_ids[None], position_ids=positions[..., None, :],
                  attention_mask=mask, keep=targets - 1,
                  labels=packed_ids.index_select(0, targets), where=where, slots=slots,
                  attention=bounds, host_keep=host_keep)
