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
  registered here: with boundaries it runs `scaled_dot_product_attention` causally on each row's
  slice of the packed queries, keys and values, the rows of one length batched into one call
  (the CPU's flash kernel; each row costs its own length squared, not N²); without them
  (generation, any unpacked call) it is transformers' sdpa itself, so the model behaves as
  before everywhere else. A block-diagonal mask over the
  whole sequence would also be exact, but sdpa with an arbitrary mask materialises N² scores
  per head.
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


def varlen_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, attention_mask: torch.Tensor | None, *,
                cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any
                ) -> tuple[torch.Tensor, None]:
    """transformers' sdpa, row by row over a packed sequence when `cu_seq_lens_q` is given.

    query (1, H, N, D), key and value (1, Hkv, N, D) -> (1, N, H, D), as sdpa returns. Rows of
    one length go through one causal sdpa call as a batch, so a micro-batch of many short rows
    costs one call per distinct length, not one per row. The tokens are put in that grouped
    order by one gather per input and back by one gather of the output, whatever the number
    of lengths (a scatter per length would copy the whole output each time).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs["is_causal"] = True
    groups, order = _length_groups(cu_seq_lens_q)
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
    return torch.cat(pieces).index_select(0, inverse)[None], None  # (1, N, H, D)


def _length_groups(cu_seq_lens: torch.Tensor) -> tuple[list[tuple[int, int]], torch.Tensor]:
    """(length, rows) of each group of equal-length rows of a packed sequence, and the token
    positions (N,) in that grouped order (each group's rows in sequence order)."""
    bounds = cu_seq_lens.tolist()
    starts: dict[int, list[int]] = {}
    for a, b in zip(bounds, bounds[1:]):
        starts.setdefault(b - a, []).append(a)
    order = torch.cat([(torch.tensor(firsts)[:, None] + torch.arange(length)).flatten()
                       for length, firsts in starts.items()])
    return [(length, len(firsts)) for length, firsts in starts.items()], order


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

    input_ids, position_ids (1, N); attention_mask (1, 1, N, N) or None (varlen); keep (K,)
    packed indices of the positions predicting the K valid response tokens, labels (K,) those
    tokens; where (b, R) bool: which response columns they are; attention: the rows'
    boundaries for the model's attention (`cu_seq_lens_q/k` (b + 1,) int32, `max_length_q/k`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    keep: torch.Tensor
    labels: torch.Tensor
    where: torch.Tensor
    attention: dict[str, Any] = field(default_factory=dict)

    def model_inputs(self) -> dict[str, Any]:
        """The keyword arguments of the model's forward for this packed sequence."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "position_ids": self.position_ids, "use_cache": False, **self.attention}

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(K,) per valid response token -> (b, R), 0 in the response's padding."""
        out = values.new_zeros(self.where.shape)
        out[self.where] = values
        return out


def pack(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    attention: str = "sdpa",
    dtype: torch.dtype = torch.float32,
) -> Packed:
    """Pack the valid tokens of (b, T) rows whose last `response_len` columns are the response.

    Every row needs at least one valid token before its first valid response token (the
    prompt), which predicts it. `attention`: the model's implementation (`PACKED_ATTENTION`);
    `dtype`: that of an additive mask (`eager`).
    """
    if attention not in PACKED_ATTENTION:
        raise ValueError(f"packing needs one of {list(PACKED_ATTENTION)}, got {attention!r}")
    valid = attention_mask.bool()  # (b, T)
    b, width = valid.shape
    n = int(valid.sum())
    index = torch.full((b, width), -1, dtype=torch.long, device=valid.device)
    index[valid] = torch.arange(n, device=valid.device)  # packed position of each valid token
    response_index = index[:, width - response_len:]  # (b, R)
    where = response_index >= 0
    targets = response_index[where]  # (K,) packed positions of the response tokens
    packed_ids = input_ids[valid]  # (N,)
    lengths = valid.sum(1)  # (b,)
    cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    longest = int(lengths.max())
    bounds = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
              "max_length_k": longest}
    mask = None
    if PACKED_ATTENTION[attention] == "additive-mask":
        rows = torch.arange(b, device=valid.device)[:, None].expand(b, width)[valid]  # (N,)
        allowed = (rows[:, None] == rows[None, :]).tril()  # (N, N): same row, not after
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)[None, None]
        bounds = {}
    return Packed(input_ids=packed_ids[None], position_ids=position_ids[valid][None],
                  attention_mask=mask, keep=targets - 1, labels=packed_ids[targets], where=where,
                  attention=bounds)
