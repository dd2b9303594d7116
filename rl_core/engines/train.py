"""Training engine on plain PyTorch: response log-probs and micro-batched AdamW steps.

    engine = TrainEngine.from_spec(model, spec.actor, total_steps=100, dtype="float32",
                                   device="cpu")
    old_logprobs, _ = engine.forward_logprobs(ids, mask, positions, response_len=R)
    metrics = engine.train_step(batch, loss_fn)          # one optimizer step on a mini-batch
    torch.save(engine.state_dict(), path)                # optimizer + step (weights: the model)

Sequences are laid out as the rollout produces them (`Batch.to_sequences`): prompts
left-padded, responses right-padded, the response in the last R columns of every row, position
ids `cumsum(mask) - 1`. Log-probs are those of the response tokens under
softmax(logits / temperature); logits are computed only for the R positions that predict the
response (the hidden states are sliced before the LM head through `logits_to_keep`), in float32.

Micro-batches and the loss scale. `train_step` splits a mini-batch into micro-batches: runs of
`micro_batch_size` consecutive rows, or, with a token budget `max_token_len` (dynamic batch
size), the fewest micro-batches whose valid tokens fit it, balanced by Karmarkar–Karp
(`rl_core.engines.balance.token_micro_batches`: a micro-batch's rows need not be adjacent;
outputs come back in the batch's order). It calls the caller's `loss_fn(micro, logprobs,
entropy) -> (loss, metrics)` on each, where `loss` is aggregated over the micro-batch exactly as
it would be over a whole batch (the `rl_core.algos` losses do this). The engine backpropagates
`loss * share`, where share is the micro-batch's part of the mini-batch's normaliser under
`loss_agg_mode` (`MICRO_SHARES`): its valid response tokens over the mini-batch's for
token-mean, its sequences with a valid token over the mini-batch's for the seq-mean modes. The
accumulated gradient is then that of the mini-batch loss, whatever the micro-batch size and
however uneven the token counts (micro 2 and micro 8 give the same step). Mode `sum` adds the
micro losses unscaled: the loss function returns its own share (e.g. a masked sum divided by a
mini-batch normaliser it closes over). Metrics are averaged with the same shares (by rows for
`sum`).

Padding columns. Each micro-batch drops the leading columns that are padding in all of its rows
(left padding of the prompts) and the trailing ones (right padding of the responses); padding
never influences a valid token, so the result is unchanged and short micro-batches run faster.
Log-probs of dropped response columns are 0. With `remove_padding` (the spec's
`actor.use_remove_padding`) a micro-batch's rows are instead packed into one sequence of their
valid tokens with attention confined to each row (`rl_core.engines.packing`): no padding is
computed at all, and log-probs, entropy and values come back in the padded (b, R) layout, 0 in
the response's padding. Results equal the padded path's up to floating-point rounding.

Dtypes. `param_dtype` float32 trains in float32. bfloat16 casts the parameters (not buffers
such as rotary frequencies) to bfloat16, the dtype every forward and backward computes in, and
(`master_weights`, the default) keeps float32 master copies of them: each parameter's bfloat16
gradient is added into its master's float32 gradient as soon as backward has made it (a
post-accumulate hook, so micro-batches accumulate in float32 and the bfloat16 gradient is freed
at once), AdamW steps the masters with float32 moments, and the model's parameters are set from
them after each step (the model a rollout engine shares stays bfloat16). Without master
weights AdamW updates the bfloat16 parameters themselves, so an update below a weight's
bfloat16 resolution (about 0.4% of it) is lost: half the optimizer memory, for smoke runs.
float16 needs loss scaling and is refused.

Optimizer: AdamW (the fused kernel where the device supports it, else foreach) with weight decay
on every parameter (as verl), a learning rate `lr * lr_factor(step)` set before each step
(linear warmup, then constant, cosine or linear decay to 0 at `total_steps`), and the global
gradient norm clipped to `grad_clip` (0: not clipped; the pre-clip norm is reported either way).
A non-finite loss or gradient norm raises `NonFiniteError` before the optimizer steps.

Data parallelism. With `dp_group` (a `torch.distributed` process group), each rank holds a full
copy of the model and calls `train_step` on its own shard of the mini-batch. The shares above
are then taken over the whole mini-batch (one all-reduce of the ranks' counts), gradients are
summed over the ranks before clipping (one flattened all-reduce), and the metrics are summed
with the same shares, so every rank takes the same step, equal up to floating-point rounding
to one rank stepping on the whole mini-batch.

Context parallelism. With `cp_group` (and `remove_padding`), the ranks of that group hold the
same rows and split each packed micro-batch's tokens (`rl_core.engines.context`: attention by
Ulysses' all-to-all or ring attention, `cp_algorithm`): each computes the whole loss from the
gathered log-probs, its parameter gradients are partial and are summed over the group (the
plain engine's all-reduce; FSDP2 shards over the data- and context-parallel ranks together).
`dp_group` then holds one rank of each context group's rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rl_core.algos.entropy import chunked_logprobs
from rl_core.collectives import all_reduce, reduce_numbers
from rl_core.engines.balance import token_micro_batches
from rl_core.engines.base import LossFn, WeightBucket, in_buckets
from rl_core.engines.context import context_parallel, gather_shards
from rl_core.engines.experts import RouterRecorder
from rl_core.engines.lora import (adapter_state, adapters_off, check_resumed, is_adapted,
                                  load_adapter_state, merged_weights, with_adapters)
from rl_core.engines.packing import Packed, attention_of, pack, prepare_packing
from rl_core.engines.tensor import is_vocab_parallel, vocab_parallel_logprobs
from rl_core.errors import InputError, NonFiniteError

if TYPE_CHECKING:
    from rl_core.spec import ActorConfig

PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
METRIC_PREFIX = "actor/"


# --------------------------------------------------------------------------- lr schedule


def _constant(progress: float) -> float:
    return 1.0


def _cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _linear(progress: float) -> float:
    return 1.0 - progress


LR_DECAYS: dict[str, Callable[[float], float]] = {
    "constant": _constant,
    "cosine": _cosine,
    "linear": _linear,
}


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base lr for the optimizer step taken after `step` completed steps.

    Warmup: (step + 1) / warmup_steps, so the first step already moves and step `warmup_steps`
    runs at the full lr. Then progress p = (step - warmup) / (total - warmup), clamped to 1,
    scales the lr by 1 (constant), (1 + cos(pi p)) / 2 (cosine) or 1 - p (linear). With
    cosine and linear the last of `total_steps` steps still moves; steps past it run at 0.
    """
    if schedule not in LR_DECAYS:
        raise ValueError(f"unknown lr_scheduler {schedule!r}; choose one of {', '.join(LR_DECAYS)}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return LR_DECAYS[schedule](progress)


# --------------------------------------------------------------------------- micro-batches


def _valid_tokens(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum()


def _valid_sequences(mask: torch.Tensor) -> torch.Tensor:
    return (mask.sum(-1) > 0).sum()


# How much of a mini-batch's loss normaliser a micro-batch holds, per loss_agg_mode: the count
# of the micro-batch's response_mask (b, R) over that of the mini-batch. None: unscaled (`sum`).
MICRO_SHARES: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
    "token-mean": _valid_tokens,
    "seq-mean-token-mean": _valid_sequences,
    "seq-mean-token-sum": _valid_sequences,
    "seq-mean-token-sum-norm": _valid_sequences,
    "sum": None,
}


def split_rows(n_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive runs of at most `micro_batch_size` rows (the rows' indices)."""
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
    return [list(range(i, min(i + micro_batch_size, n_rows)))
            for i in range(0, n_rows, micro_batch_size)]


@dataclass(frozen=True)
class Extents:
    """Per row: first and last valid column and valid-token count (host lists: one sync)."""

    first: list[int]
    last: list[int]
    lengths: list[int]

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> Extents:
        valid = attention_mask.bool()  # (B, T)
        cols = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
        first = torch.where(valid, cols, valid.shape[1]).amin(1)  # (B,)
        last = torch.where(valid, cols, -1).amax(1)  # (B,)
        rows = torch.stack([first, last, valid.sum(1)]).tolist()
        return cls(*rows)

    def window(self, rows: Sequence[int], width: int, response_len: int) -> tuple[int, int]:
        """Columns (left, right) to drop from a micro-batch: all-padding on each side, keeping
        the column that predicts the first response token and at least one response column."""
        left = min(min(self.first[i] for i in rows), width - response_len - 1)
        right = min(width - 1 - max(self.last[i] for i in rows), response_len - 1)
        return max(left, 0), max(right, 0)


# --------------------------------------------------------------------------- log-probs


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature)[label] and optionally the entropy, in float32 (float64
    for float64 logits).

    logits (b, R, V), labels (b, R) -> logprobs (b, R), entropy (b, R) | None. Computed a chunk
    of positions at a time (`chunked_logprobs`): no float32 copy of the (b, R, V) logits is made
    or kept for backward, only the logits as the model returned them.
    """
    if is_vocab_parallel(logits):  # a tensor-parallel LM head's part of the vocabulary
        return vocab_parallel_logprobs(logits, labels, temperature, with_entropy)
    return chunked_logprobs(logits, labels, temperature, with_entropy)


# --------------------------------------------------------------------------- heads


class LogProbHead:
    """A causal LM's response log-probs (and entropy): logits only for the `keep` positions
    that predict the response (`logits_to_keep`), in float32."""

    def __call__(self, model, ids, attention_mask, position_ids, keep: int, temperature: float,
                 with_entropy: bool, **extra: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False, logits_to_keep=keep + 1, **extra)
        logits = out.logits[:, :-1]  # (b, keep, V): positions predicting the response tokens
        return token_logprobs(logits, ids[:, -keep:], temperature, with_entropy)

    def packed(self, model, packed: Packed, temperature: float,
               with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The same on a packed micro-batch, (K,) in packed order (`Packed.unpack` lays them
        out): logits of the K `packed.keep` positions only."""
        out = model(**packed.model_inputs(), logits_to_keep=packed.keep)
        logprobs, entropy = token_logprobs(out.logits, packed.labels[None], temperature,
                                           with_entropy)  # (1, K)
        return logprobs[0], (entropy[0] if entropy is not None else None)


class ValueHead:
    """A value model (a token classifier with one output): the value of the state before each
    response token (b, keep); no entropy."""

    def __call__(self, model, ids, attention_mask, position_ids, keep: int, temperature: float,
                 with_entropy: bool, **extra: Any) -> tuple[torch.Tensor, None]:
        out = model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=False, **extra)
        return out.logits[:, -keep - 1:-1, 0].float(), None

    def packed(self, model, packed: Packed, temperature: float,
               with_entropy: bool) -> tuple[torch.Tensor, None]:
        """The same on a packed micro-batch, (K,) in packed order."""
        out = model(**packed.model_inputs())
        return out.logits[0, packed.keep, 0].float(), None


# --------------------------------------------------------------------------- engine


class TrainEngine:
    """Owns a causal LM's optimizer on one device: response log-probs and optimizer steps.

    The model is moved to `device` (parameters cast to `param_dtype`) and updated in place, so
    a rollout engine holding the same model sees every update. The `head` turns the model's
    output into what the losses read: response log-probs (`LogProbHead`, the policy) or values
    (`ValueHead`, the critic).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        lr_scheduler: str = "constant",
        total_steps: int = 1,
        grad_clip: float = 1.0,
        param_dtype: str = "float32",
        device: str | torch.device = "cpu",
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        loss_agg_mode: str = "token-mean",
        trim_padding: bool = True,
        remove_padding: bool = False,
        dp_group: Any = None,
        cp_group: Any = None,
        cp_algorithm: str = "ulysses",
        metric_prefix: str = METRIC_PREFIX,
        head: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None = None,
        sharded: bool = False,
        offload_optimizer: bool = False,
        master_weights: bool = True,
        router_aux_loss_coef: float | None = 0.0,
        lora: Any = None,
    ) -> None:
        """`micro_batch_size` (rows), `max_token_len` (valid tokens per micro-batch: dynamic
        batch size, which then overrides every row count) and `loss_agg_mode` are defaults for
        `train_step` and `forward_logprobs`; without either size a call is one micro-batch.
        `trim_padding=False` keeps all-padding columns (for comparisons). `remove_padding`:
        forward passes on packed micro-batches (`rl_core.engines.packing`; an attention
        implementation that cannot confine attention to each row raises InputError). `dp_group`: the
        data-parallel process group and `cp_group` the context-parallel one, which needs
        `remove_padding`, with `cp_algorithm` "ulysses" or "ring" (see the module docstring); `metric_prefix` names the
        engine's own metrics (`actor/`, or `critic/` for a value model). `sharded`: the model's
        parameters are DTensors sharded by FSDP2 over `dp_group`, which reduces the gradients
        itself (see `rl_core.engines.fsdp`). `offload_optimizer`: AdamW's moments wait in host
        memory and come to the device for each optimizer step only (nothing moves on cpu).
        `master_weights`: with a `param_dtype` below float32, step float32 master copies (see
        the module docstring); a sharded model's parameters are float32 already.
        `router_aux_loss_coef`: of a mixture of experts, the weight of the routers'
        load-balancing loss added to each micro-batch's loss in `train_step`, whose metrics
        then include the router's (`rl_core.engines.experts`); None: the model config's
        `router_aux_loss_coef` (0 where it has none). `lora`: the spec's `actor.lora`, the
        model then wrapped with PEFT's LoRA adapters first (`rl_core.engines.lora`): only they
        are trained (and have master copies and AdamW state), `weight_buckets` yields the
        merged weights and `adapters_off` computes as the frozen base."""
        if param_dtype not in PARAM_DTYPES:
            raise ValueError(
                f"param_dtype {param_dtype!r} is not supported; use float32 or bfloat16 "
                "(float16 would need loss scaling)"
            )
        lr_factor(0, warmup_steps=warmup_steps, total_steps=total_steps, schedule=lr_scheduler)
        if loss_agg_mode not in MICRO_SHARES:
            raise ValueError(
                f"unknown loss_agg_mode {loss_agg_mode!r}; choose one of {list(MICRO_SHARES)}"
            )
        self.device = torch.device(device)
        self.dtype = PARAM_DTYPES[param_dtype]
        if lora is not None:
            model = with_adapters(model, lora)
        self.model = _cast_parameters(model, self.dtype).to(self.device)
        self.lr, self.warmup_steps, self.total_steps = lr, warmup_steps, total_steps
        self.lr_scheduler, self.grad_clip = lr_scheduler, grad_clip
        self.micro_batch_size, self.max_token_len = micro_batch_size, max_token_len
        self.loss_agg_mode, self.trim_padding = loss_agg_mode, trim_padding
        if remove_padding:
            prepare_packing(self.model)
        self.remove_padding = remove_padding
        if cp_group is not None and not remove_padding:
            raise ValueError("context parallelism (cp_group) splits packed micro-batches: "
                             "set remove_padding")
        self.dp_group, self.cp_group, self.metric_prefix = dp_group, cp_group, metric_prefix
        self.cp_algorithm = cp_algorithm
        self.head = head or LogProbHead()
        self.router = RouterRecorder.attach(self.model)
        if self.router is not None and cp_group is not None:
            raise InputError("parallel.context_parallel_size: context parallelism is not "
                             "supported for a mixture of experts (its balancing loss is "
                             "taken over whole micro-batches); set it to 1")
        if router_aux_loss_coef and self.router is None:
            raise InputError("actor.router_aux_loss_coef: the model is not a mixture of "
                             "experts with routers to balance; leave it unset")
        if router_aux_loss_coef is None:
            router_aux_loss_coef = float(getattr(model.config, "router_aux_loss_coef", 0.0)
                                         or 0.0) if self.router is not None else 0.0
        self.router_aux_loss_coef = router_aux_loss_coef
        self.sharded = sharded
        self.offload_optimizer = offload_optimizer
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        wants_masters = master_weights and not sharded and self.dtype != torch.float32
        self.masters = _master_copies(self.params) if wants_masters else []
        self.stepped = self.masters or self.params  # what AdamW steps, and whose grads it reads
        # a frozen model (every parameter without gradients) gets no optimizer: forward only
        self.optimizer = _adamw(self.stepped, lr, betas, weight_decay, self.device,
                                fused=not sharded) if self.params else None
        self.step = 0  # optimizer steps taken

    @classmethod
    def from_spec(
        cls,
        model: torch.nn.Module,
        actor: ActorConfig,
        total_steps: int,
        dtype: str,
        device: str | torch.device,
        dp_group: Any = None,
    ) -> TrainEngine:
        """An engine configured by the spec's `actor` section (`actor.lora`: with adapters);
        `dtype` is `model.dtype`."""
        return cls(model, **engine_options(actor, total_steps), param_dtype=dtype, device=device,
                   dp_group=dp_group, lora=actor.lora)

    # ----------------------------------------------------------------------- forward

    def forward_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_len: int,
        temperature: float = 1.0,
        micro_batch_size: int | None = None,
        with_entropy: bool = False,
        grad: bool = False,
        max_token_len: int | None = None,
        images: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, R) of the last R = `response_len` tokens of each row under
        softmax(logits / temperature), and their entropy (B, R) when `with_entropy`.

        input_ids, attention_mask, position_ids (B, T). Without `grad` this runs under no_grad
        in eval mode (the model's mode is restored after). Micro-batched by rows or tokens.
        `images`: a vision-language model's image columns of the rows (pixel_values,
        image_grid_thw: `rl_core.models.vision.IMAGE_COLUMNS`).
        """
        extents = Extents.of(attention_mask)
        slices = self._slices(len(extents.lengths), extents, micro_batch_size, max_token_len)
        was_training = self.model.training
        if not grad:
            self.model.eval()
        try:
            with torch.set_grad_enabled(grad):
                outs = [
                    self._forward(
                        take_rows(input_ids, rows), take_rows(attention_mask, rows),
                        take_rows(position_ids, rows), response_len, temperature, with_entropy,
                        extents, rows,
                        images=(take_rows(images[0], rows), take_rows(images[1], rows))
                        if images is not None else None,
                    )
                    for rows in (s or [0] for s in slices)  # None: padding (sharded)
                ]
        finally:
            self.model.train(was_training)
        real = [(out, rows) for out, rows in zip(outs, slices) if rows is not None]
        order = torch.tensor([i for _, rows in real for i in rows])
        logprobs = in_order(torch.cat([lp for (lp, _), _ in real]), order)
        entropy = (in_order(torch.cat([ent for (_, ent), _ in real]), order)
                   if with_entropy else None)
        return logprobs, entropy

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_len: int,
        temperature: float,
        with_entropy: bool,
        extents: Extents,
        rows: list[int],
        host_mask: torch.Tensor | None = None,
        images: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropy) of one micro-batch; `host_mask`: its attention mask where
        the batch came from (packing plans from it: on the host, without waiting for the
        device); `images`: its rows' image columns (a vision-language model)."""
        width = input_ids.shape[1]
        if not 0 < response_len < width:
            raise ValueError(f"response_len must be in 1..{width - 1}, got {response_len}")
        if self.remove_padding:
            size = 1 if self.cp_group is None else dist.get_world_size(self.cp_group)
            ids, positions, inputs = input_ids.to(self.device), position_ids.to(self.device), {}
            if images is not None:  # the text positions first, then the 3-D ones (4, b, T)
                from rl_core.models.vision import image_inputs, image_positions

                inputs = image_inputs(self.model, ids, *images)
                rope = image_positions(self.model, ids, attention_mask.to(self.device), inputs)
                positions = torch.cat([positions[None], rope])
                del inputs["mm_token_type_ids"]  # what the positions are computed from
            packed = pack(ids, attention_mask if host_mask is None else host_mask, positions,
                          response_len, attention=attention_of(self.model), dtype=self.dtype,
                          multiple_of=size)
            if inputs:  # each row's patches in row order: the packed order
                packed = dataclasses.replace(packed, inputs=inputs)
            if self.cp_group is None:
                with self._routing(None), self._vision(images, inputs):  # all tokens valid
                    values, extra = self.head.packed(self.model, packed, temperature,
                                                     with_entropy)
            else:
                values, extra = self._context_parallel(packed, size, temperature, with_entropy)
            return packed.unpack(values), (packed.unpack(extra) if extra is not None else None)
        left, right = extents.window(rows, width, response_len) if self.trim_padding else (0, 0)
        cols = slice(left, width - right)
        keep = response_len - right  # response columns computed
        mask = attention_mask[:, cols].to(self.device)
        ids, positions, extra = input_ids[:, cols].to(self.device), position_ids[:, cols], {}
        if images is not None:  # the model computes its own (3-D) positions from the images
            from rl_core.models.vision import image_inputs

            extra, positions = image_inputs(self.model, ids, *images), None
        with self._routing(mask), self._vision(images, extra):
            logprobs, entropy = self.head(
                self.model, ids, mask, positions.to(self.device) if positions is not None
                else None, keep, temperature, with_entropy, **extra)
        if right:
            logprobs = F.pad(logprobs, (0, right))
            entropy = F.pad(entropy, (0, right)) if entropy is not None else None
        return logprobs, entropy

    def _vision(self, images: Any, inputs: Mapping[str, Any]) -> Any:
        """In a backward pass of a vision-language model over rows without a picture, its
        vision tower still in the graph (`rl_core.models.vision.vision_tower_in_graph`): every
        rank's sharded vision tower then gets gradients, zeros where it saw no picture, and
        all ranks reduce the same ones."""
        if images is None or "pixel_values" in inputs or not torch.is_grad_enabled():
            return contextlib.nullcontext()
        from rl_core.models.vision import vision_tower_in_graph

        return vision_tower_in_graph(self.model)

    def _routing(self, mask: torch.Tensor | None) -> Any:
        """Record the routers in a `train_step`'s forward (`mask`: the model input's valid
        tokens; None: all); nothing elsewhere."""
        if self.router is None or not torch.is_grad_enabled() or not self.model.training:
            return contextlib.nullcontext()
        return self.router.recording(mask)

    def _context_parallel(self, packed: Packed, size: int, temperature: float,
                          with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's (K,) values of `packed`, this rank computing its share of the tokens
        and the group's pieces gathered (`rl_core.engines.context`)."""
        local = packed.shard(dist.get_rank(self.cp_group), size)
        with context_parallel(self.cp_group, self.cp_algorithm):
            values, extra = self.head.packed(self.model, local, temperature, with_entropy)
        values = gather_shards(values, local.counts, self.cp_group)
        return values, (gather_shards(extra, local.counts, self.cp_group)
                        if extra is not None else None)

    def _slices(
        self,
        n_rows: int,
        extents: Extents,
        micro_batch_size: int | None,
        max_token_len: int | None,
    ) -> list[list[int] | None]:
        """The rows of each micro-batch: by a token budget (`token_micro_batches`: balanced,
        rows not in order) or consecutive runs of rows. None: a padding micro-batch (sharded)."""
        max_token_len = max_token_len or self.max_token_len
        if max_token_len is not None:  # dynamic batch size: row counts are ignored
            slices = token_micro_batches(extents.lengths, max_token_len)
        else:
            slices = split_rows(n_rows, micro_batch_size or self.micro_batch_size or max(n_rows, 1))
        return self._even(slices) if self.sharded else slices

    def _even(self, slices: list[list[int]]) -> list[list[int] | None]:
        """As many micro-batches on this rank as on the rank with the most: FSDP2 gathers the
        parameters in every forward and reduces gradients in every backward on all ranks
        together (`even_micro_batches`)."""
        return even_micro_batches(slices, self.dp_group, self.device)

    # ----------------------------------------------------------------------- update

    def train_step(
        self,
        batch: Mapping[str, Any],
        loss_fn: LossFn,
        *,
        micro_batch_size: int | None = None,
        max_token_len: int | None = None,
        loss_agg_mode: str | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """One optimizer step on the mini-batch `batch`; returns its metrics.

        batch: input_ids, attention_mask, position_ids (B, T), response_mask (B, R), and what
        `loss_fn` reads (old_logprobs, advantages, ...); every value is indexed by row. Each
        micro-batch's loss is scaled by its share (see the module docstring), so the step
        equals one on the whole mini-batch. A loss over groups of rows (DPO pairs) needs
        micro-batches that keep each group whole: adjacent rows and a micro_batch_size that is
        a multiple of the group (a token budget may split groups).

        Returns the share-weighted means of the loss function's (scalar) metrics, `actor/loss`,
        `actor/grad_norm` (before clipping) and `actor/lr` (the lr of this step). Raises
        NonFiniteError (weights, optimizer state and step count untouched) on a non-finite
        loss or gradient norm.
        """
        mode = loss_agg_mode or self.loss_agg_mode
        if mode not in MICRO_SHARES:
            raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(MICRO_SHARES)}")
        response_mask = batch["response_mask"]
        extents = Extents.of(batch["attention_mask"])
        slices = self._slices(response_mask.shape[0], extents, micro_batch_size, max_token_len)
        real = [rows for rows in slices if rows is not None]
        shares, metric_shares = micro_shares(response_mask, real, mode)
        shares += [0.0] * (len(slices) - len(real))  # padding micro-batches (sharded) count 0
        metric_shares += [0.0] * (len(slices) - len(real))
        if self.dp_group is not None:
            loss_scale, metric_scale = self._rank_share(response_mask, mode)
            shares = [share * loss_scale for share in shares]
            metric_shares = [share * metric_scale for share in metric_shares]
        was_training = self.model.training
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=self.device)
        totals: dict[str, torch.Tensor] = {}
        try:
            for rows, share, metric_share in zip(slices, shares, metric_shares):
                padding, rows = rows is None, rows or [0]
                micro = {k: _to(take_rows(v, rows), self.device) for k, v in batch.items()}
                logprobs, entropy = self._forward(
                    micro["input_ids"], micro["attention_mask"], micro["position_ids"],
                    response_mask.shape[1], temperature, with_entropy, extents, rows,
                    take_rows(batch["attention_mask"], rows),
                    images=(micro["pixel_values"], micro["image_grid_thw"])
                    if "pixel_values" in micro else None,
                )
                routed = self.router.take() if self.router is not None else None
                if padding:  # every parameter's gradient reduction takes part, adding nothing
                    (logprobs.sum() * 0.0 + (routed[0] * 0.0 if routed else 0.0)).backward()
                    continue
                loss, metrics = loss_fn(micro, logprobs, entropy)
                if routed is not None:  # a mixture of experts: balance its routers
                    loss = loss + self.router_aux_loss_coef * routed[0]
                    metrics = {**metrics, **{f"{self.metric_prefix}{name}": value
                                             for name, value in routed[1].items()}}
                (loss * share).backward()
                loss_sum += loss.detach().float() * share
                for name, value in metrics.items():
                    value = torch.as_tensor(value, device=self.device).detach().float()
                    totals[name] = totals.get(name, 0) + value * metric_share
            if self.cp_group is not None and not self.sharded:  # partial sums of the group
                self._all_reduce_gradients(self.cp_group)
            if self.dp_group is not None:
                loss_sum, totals = self._all_reduce(loss_sum, totals)
            return self._apply(loss_sum, totals)
        finally:
            self.model.train(was_training)

    def _rank_share(self, response_mask: torch.Tensor, mode: str) -> tuple[float, float]:
        """This rank's part of the whole mini-batch's normaliser: (loss, metric) scales."""
        count = MICRO_SHARES[mode]
        rows = response_mask.shape[0]
        local = int(count(response_mask)) if count is not None else rows  # counts of a 0/1 mask
        total, total_rows = reduce_numbers([local, rows], self.dp_group, device=self.device)
        by_rows = rows / total_rows if total_rows else 0.0
        if count is None:  # `sum`: the ranks' losses add up; metrics are averaged by rows
            return 1.0, by_rows
        if total == 0:
            return by_rows, by_rows
        return local / total, local / total

    def _all_reduce(
        self, loss: torch.Tensor, totals: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sum gradients (unless FSDP2 did), loss and metrics over the data-parallel ranks."""
        if not self.sharded:
            self._all_reduce_gradients()
        names = list(totals)
        values = torch.stack([loss.float(), *(totals[n].float() for n in names)])
        values = all_reduce(values, self.dp_group)
        return values[0], dict(zip(names, values[1:]))

    def _all_reduce_gradients(self, group: Any = None) -> None:
        """One flattened all-reduce (sum) of every rank's full gradients over `group` (default
        the data-parallel one)."""
        group = group if group is not None else self.dp_group
        for param in self.stepped:
            if param.grad is None:  # a parameter no rank's loss reached still takes part
                param.grad = torch.zeros_like(param)
        grads = [p.grad for p in self.stepped]
        flat = torch._utils._flatten_dense_tensors(grads)
        flat = all_reduce(flat, group)
        for grad, summed in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            grad.copy_(summed)

    def _apply(self, loss: torch.Tensor, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """Clip, check, step: the end of `train_step`."""
        grad_norm = self._clip_grad_norm()
        prefix = self.metric_prefix
        names = [*totals, f"{prefix}loss", f"{prefix}grad_norm"]
        values = torch.stack([*totals.values(), loss, grad_norm.float()]).tolist()  # one sync
        metrics = dict(zip(names, values))
        for what, name in (("loss", names[-2]), ("gradient norm", names[-1])):
            if not math.isfinite(metrics[name]):
                self.optimizer.zero_grad(set_to_none=True)
                raise NonFiniteError(what, self.step, metrics)
        lr = self.lr * lr_factor(
            self.step,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
            schedule=self.lr_scheduler,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.offload_optimizer:
            self._move_optimizer(self.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters:  # the model computes in a copy of the stepped float32 masters
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.masters)
        if self.offload_optimizer:
            self._move_optimizer(torch.device("cpu"))
        self.step += 1
        metrics[f"{prefix}lr"] = lr
        return metrics

    def _clip_grad_norm(self) -> torch.Tensor:
        """The global gradient norm before clipping; grads clipped to `grad_clip` unless 0.
        Sharded gradients on several meshes (the experts' beside the rest): each mesh's norm
        in full, then their root sum of squares."""
        grads = [p.grad for p in self.stepped if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.device)
        groups: dict[Any, list[torch.Tensor]] = {}
        for grad in grads:
            groups.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
        if len(groups) == 1:
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            if self.grad_clip > 0:  # a non-finite norm spoils the grads, but then nothing steps
                torch.nn.utils.clip_grads_with_norm_(self.stepped, self.grad_clip, norm,
                                                     foreach=True)
            return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor
        norms = [torch.nn.utils.get_total_norm(group, foreach=True) for group in groups.values()]
        norm = torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n
                            for n in norms]).norm()
        if self.grad_clip > 0:
            scale = (self.grad_clip / (norm + 1e-6)).clamp(max=1.0)
            torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads],
                                scale)
        return norm

    # ----------------------------------------------------------------------- weights, memory

    def weight_buckets(self, bucket_bytes: int = 512 << 20,
                       keep_split: Callable[[str], bool] | None = None) -> Iterator[WeightBucket]:
        """The model's full weights (parameters and buffers of its state dict) as buckets of
        (name, tensor) pairs of at most about `bucket_bytes` each (a larger tensor is a bucket
        of its own); the tensors are the live ones, not copies. Sharded (FSDP2): each tensor is
        gathered in full as its bucket is reached, so every rank must iterate alike; the
        tensors for which `keep_split(name)` is true are gathered over the FSDP2 shards only,
        giving this rank's tensor-parallel part (a rollout group of the same layout needs no
        more)."""
        def full(name: str, tensor: Any) -> torch.Tensor:
            if not hasattr(tensor, "full_tensor"):
                return tensor
            # a DTensor shard: all-gather it (over the FSDP2 shards only, where kept split)
            return tensor_part(tensor) if keep_split and keep_split(name) \
                else tensor.full_tensor()

        if self.adapted:  # LoRA: the base's weights with the adapters merged into them
            yield from in_buckets(merged_weights(self.model, full), bucket_bytes)
            return
        yield from in_buckets(((name, full(name, tensor))
                               for name, tensor in self.model.state_dict().items()), bucket_bytes)

    @property
    def adapted(self) -> bool:
        """Whether the model trains LoRA adapters (`actor.lora`)."""
        return is_adapted(self.model)

    def adapters_off(self) -> Any:
        """A context in which the model computes as its frozen base (LoRA: the reference)."""
        return adapters_off(self.model)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """LoRA: the adapters' tensors, whole (sharded: gathered, every rank calls it)."""
        return adapter_state(self.model, lambda name, t: t.full_tensor()
                             if hasattr(t, "full_tensor") else t)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight in full on the CPU (LoRA: merged), as `weight_buckets` gives them."""
        return {name: tensor.cpu() for bucket in self.weight_buckets() for name, tensor in bucket}

    def offload(self) -> None:
        """Parameters, gradients and optimizer state to host memory (a no-op on CPU)."""
        self._move(torch.device("cpu"))

    def reload(self) -> None:
        """Back to the engine's device after `offload`."""
        self._move(self.device)

    def _move(self, device: torch.device) -> None:
        if device.type == "cpu" and self.device.type == "cpu":
            return
        self.model.to(device)
        for master in self.masters:
            master.data = master.data.to(device, non_blocking=device.type != "cpu")
        self._move_optimizer(device)

    def _move_optimizer(self, device: torch.device) -> None:
        """AdamW's moments (not the step counts) to `device`; nothing moves on a cpu engine.
        Sharded moments are DTensors: each rank moves its own shard."""
        if self.optimizer is None or (device.type == "cpu" and self.device.type == "cpu"):
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = value.to(device, non_blocking=device.type != "cpu")

    # ----------------------------------------------------------------------- checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state, schedule, step count and the float32 master weights, if any (the
        weights the model computes with are its own state).

        With LoRA adapters (`lora: True`) the adapters themselves too, unless sharded (FSDP2's
        checkpoint holds them).

        Tensors are shared with the live optimizer: `torch.save` or deep-copy to keep them.
        """
        masters = {"master_weights": [m.detach() for m in self.masters]} if self.masters else {}
        if self.adapted:
            masters["lora"] = True
            if not self.sharded:
                masters["adapters"] = adapter_state(self.model)
        return {
            **masters,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {
                "lr": self.lr,
                "lr_scheduler": self.lr_scheduler,
                "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps,
            },
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` output; the lr then follows this engine's schedule from the
        restored step (a resumed run may change the schedule). Master weights saved by an engine
        that had them are restored; otherwise they start from the model's weights. LoRA: the
        adapters are restored; an InputError when the state was saved with adapters and this
        engine has none or the other way round."""
        check_resumed(state, self.adapted)
        if "adapters" in state:
            load_adapter_state(self.model, state["adapters"])
        if self.masters and "master_weights" in state:
            with torch.no_grad():
                torch._foreach_copy_(self.masters, [t.to(self.device)
                                                    for t in state["master_weights"]])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])


# --------------------------------------------------------------------------- helpers


def engine_options(actor: ActorConfig, total_steps: int) -> dict[str, Any]:
    """The optimizer, schedule and batching options of a training engine from `actor`."""
    return {
        "lr": actor.lr,
        "weight_decay": actor.weight_decay,
        "warmup_steps": actor.warmup_steps,
        "lr_scheduler": actor.lr_scheduler,
        "total_steps": total_steps,
        "grad_clip": actor.grad_clip,
        "micro_batch_size": actor.ppo_micro_batch_size,
        "loss_agg_mode": actor.loss_agg_mode,
        "offload_optimizer": actor.offload.optimizer,
        "master_weights": actor.master_weights,
        "router_aux_loss_coef": actor.router_aux_loss_coef,
        **batch_options(actor),
    }


def batch_options(actor: ActorConfig) -> dict[str, Any]:
    """How every training and forward-only engine of a run lays out its micro-batches (the
    actor's settings, shared by the reference and the critic): a token budget with
    `use_dynamic_bsz`, packing with `use_remove_padding`."""
    return {
        "max_token_len": actor.max_token_len_per_gpu if actor.use_dynamic_bsz else None,
        "remove_padding": actor.use_remove_padding,
    }


def tensor_part(tensor: Any) -> torch.Tensor:
    """A DTensor gathered over every mesh dimension but "tp": this rank's tensor-parallel part
    (the whole tensor where it is not split there)."""
    from torch.distributed.tensor import Replicate

    names = tensor.device_mesh.mesh_dim_names or ()
    placements = [p if name == "tp" else Replicate()
                  for name, p in zip(names or [None] * tensor.device_mesh.ndim,
                                     tensor.placements)]
    return tensor.redistribute(placements=placements).to_local()


def even_micro_batches(slices: list[list[int]], group: Any,
                       device: torch.device) -> list[list[int] | None]:
    """As many micro-batches on this rank as on the rank of `group` with the most (an engine
    whose every forward and backward is a collective of the group). A rank with fewer splits
    its widest micro-batches, then adds padding ones (None: a forward and backward on one row
    that counts for nothing)."""
    if not slices:
        raise ValueError("a sharded engine needs at least one row on every rank: make the "
                         "batch sizes divisible by the number of devices")
    [count] = reduce_numbers([len(slices)], group, dist.ReduceOp.MAX, device)
    out: list[list[int] | None] = list(slices)
    while len(out) < count:
        widest = max(range(len(out)), key=lambda i: len(out[i]))
        rows = out[widest]
        if len(rows) < 2:
            out += [None] * (count - len(out))
            break
        middle = len(rows) // 2
        out[widest:widest + 1] = [rows[:middle], rows[middle:]]
    return out


def micro_shares(
    response_mask: torch.Tensor, slices: list[list[int]], mode: str
) -> tuple[list[float], list[float]]:
    """Loss and metric weights of each micro-batch; they sum to 1 (loss: all 1 for `sum`)."""
    n_rows = response_mask.shape[0]
    by_rows = [len(s) / n_rows for s in slices]
    count = MICRO_SHARES[mode]
    if count is None:
        return [1.0] * len(slices), by_rows
    counts = [float(count(take_rows(response_mask, s))) for s in slices]
    total = sum(counts)
    if total == 0:  # no valid token anywhere: every loss is 0, weigh by rows
        return by_rows, by_rows
    shares = [c / total for c in counts]
    return shares, shares


def take_rows(value: Any, rows: list[int]) -> Any:
    """The rows `rows` of a tensor (a slice when they run consecutively: no copy)."""
    if not isinstance(value, torch.Tensor):
        return [value[i] for i in rows]
    if rows == list(range(rows[0], rows[-1] + 1)):
        return value[rows[0]:rows[-1] + 1]
    return value[torch.tensor(rows, device=value.device)]


def in_order(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Rows computed in `order` (micro-batch after micro-batch) back in the batch's order."""
    if torch.equal(order, torch.arange(len(order))):
        return values
    out = torch.empty_like(values)
    out[order.to(values.device)] = values
    return out


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def _cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast floating parameters (not buffers: rotary tables stay float32) to `dtype`."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)
    return model


def _master_copies(params: list[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """A float32 master copy of each parameter, on its device; each parameter's gradient goes
    into its master's as soon as backward has accumulated it (and is then freed)."""
    masters = []
    for param in params:
        master = torch.nn.Parameter(param.detach().float().clone())
        param.register_post_accumulate_grad_hook(functools.partial(_into_master, master))
        masters.append(master)
    return masters


def _into_master(master: torch.nn.Parameter, param: torch.nn.Parameter) -> None:
    """Add `param`'s low-precision gradient into `master`'s float32 one; free it."""
    if master.grad is None:
        master.grad = param.grad.float()
    else:
        master.grad.add_(param.grad)
    param.grad = None


def _adamw(
    params: list[torch.nn.Parameter],
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    device: torch.device,
    fused: bool = True,
) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch supports it on `device` (and `fused`),
    else foreach."""
    options = {"lr": lr, "betas": betas, "weight_decay": weight_decay}
    if fused:
        try:
            return torch.optim.AdamW(params, fused=True, **options)
        except RuntimeError:
            pass
    return torch.optim.AdamW(params, foreach=True, **options)
