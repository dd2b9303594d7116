"""Training engine on Megatron-Core (`actor.strategy: megatron`): tensor, pipeline (with
virtual stages) and expert parallelism from one library, its distributed optimizer, the model
converted from the Hugging Face folder by mbridge (`rl_core.engines.mcore`).

    engine = MegatronEngine.from_spec(folder, spec, total_steps=100)   # a collective
    old_logprobs, _ = engine.forward_logprobs(ids, mask, positions, response_len=R)
    metrics = engine.train_step(batch, loss_fn)        # one optimizer step, as TrainEngine's
    for bucket in engine.weight_buckets():             # Hugging Face names, full tensors
        rollout.load_weights(...)
    engine.save_sharded(folder); engine.load_sharded(folder)   # Megatron's dist checkpoint

It offers what `TrainEngine` offers the roles, with the same meaning: the same micro-batches
(rows, or a token budget), the same loss shares over the whole mini-batch and its ranks, the
same learning-rate schedule, clipping and non-finite checks, the same metrics.

Ranks. Megatron's parallel state is built over the role's process group in Megatron's order
(tensor fastest, then context, expert, data, pipeline): the ranks with the same data-parallel
index hold the same rows (`RunSpec.data_rank` tells the controller which). The role's rows
reach every rank of a tensor- and pipeline-parallel block alike.

Forward. Each micro-batch is a padded (b, T) block with a causal and padding mask (Megatron's
local attention; its (b, 1, T, T) mask costs T² a row) or, with `actor.use_remove_padding`, one
packed THD sequence of the rows' valid tokens with their boundaries (`PackedSeqParams`: needs
Transformer Engine's attention). The last pipeline stage's output layer gives this rank's part
of the vocabulary's logits; log-probs and entropy are computed across the tensor-parallel parts
(`rl_core.engines.tensor.split_vocab_logprobs`: two all-reduces of a few numbers a position,
never the full logits), then the caller's loss. Micro-batches flow through the pipeline
stages by Megatron's schedule (`get_forward_backward_func`: 1F1B, interleaved with virtual
stages).

Loss scale. `calculate_per_token_loss` is set, so Megatron neither divides a micro-batch's loss
by the number of micro-batches nor averages gradients over the data-parallel ranks, and the
gradient scaling by a token count is skipped (`finalize_model_grads` without one): each
micro-batch's loss is multiplied by its share of the whole mini-batch's normaliser
(`TrainEngine`'s shares, over the data-parallel ranks), and the summed gradients are those of
the mini-batch loss, as in the other engines.

Step. The distributed optimizer keeps float32 main weights and AdamW's moments sharded over
the data-parallel ranks and steps in three parts (`prepare_grads`, the global gradient norm,
`step_with_ready_grads`): a non-finite norm raises `NonFiniteError` before anything steps;
the norm is clipped to `grad_clip` with Megatron's own clip; the learning rate is `TrainEngine`'s
schedule, and the weight decay `TrainEngine`'s (every parameter, biases and norms too, where
Megatron's own scheduler would spare them), set on every parameter group before each step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rl_core.collectives import all_reduce, reduce_numbers
from rl_core.engines.balance import token_micro_batches
from rl_core.engines.base import LossFn, WeightBucket, in_buckets
from rl_core.engines.mcore import (MegatronLayout, adapt_device, build_model, export_weights,
                                   has_transformer_engine, init_parallel, make_bridge,
                                   require_megatron)
from rl_core.engines.packing import pack
from rl_core.engines.tensor import split_vocab_logprobs
from rl_core.engines.train import (METRIC_PREFIX, MICRO_SHARES, Extents, batch_options,
                                   engine_options, even_micro_batches, in_order, lr_factor,
                                   micro_shares, split_rows, take_rows)
from rl_core.errors import InputError, NonFiniteError

RECOMPUTE = {  # actor.recompute -> Megatron's TransformerConfig
    "full": {"recompute_granularity": "full", "recompute_method": "uniform",
             "recompute_num_layers": 1},
    "selective": {"recompute_granularity": "selective"},
}


# The distributed optimizer's checkpoint as a canonical state per parameter: loadable on any
# layout (Megatron's other formats reshard over the data-parallel ranks only)
CHECKPOINT_FORMAT = {"distrib_optim_sharding_type": "fully_reshardable"}


def recompute_config(recompute: str | None, checkpointing: bool = False) -> dict[str, Any]:
    """Megatron's recomputation settings of `actor.recompute` (None: full when
    `model.gradient_checkpointing`, else none)."""
    if recompute is None:
        recompute = "full" if checkpointing else None
    return dict(RECOMPUTE.get(recompute, {}))


def _sum_gradients(chunks: list[Any]) -> None:
    """After the micro-batches, Megatron's gradient reduction over the data-parallel ranks
    (and the pipeline's tied embeddings, sequence-parallel norms), without its division by a
    token count: the losses carry their shares already."""
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.utils import get_model_config

    def finalize(model: list[Any], num_tokens: Any = None, **options: Any) -> None:
        finalize_model_grads(model, None, **options)

    get_model_config(chunks[0]).finalize_model_grads_func = finalize


def _set_states(optimizer: Any, model_param: Any, tensors: Mapping[str, torch.Tensor]) -> None:
    """A distributed optimizer's main weight and moments of `model_param` from `tensors`,
    those of its states that `tensors` holds (Megatron's own copy, without the step count)."""
    group, order = optimizer.model_param_group_index_map[model_param]
    main = optimizer.optimizer.param_groups[group]["params"][order]
    for key, tensor in {"param": main, **optimizer.optimizer.state[main]}.items():
        if key in tensors:
            tensor.copy_(tensors[key])


class MegatronEngine:
    """A `TrainEngine` over Megatron-Core's model chunks (see the module docstring)."""

    def __init__(self, folder: str, *, layout: MegatronLayout, lr: float,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.999),
                 warmup_steps: int = 0, lr_scheduler: str = "constant", total_steps: int = 1,
                 grad_clip: float = 1.0, param_dtype: str = "bfloat16",
                 micro_batch_size: int | None = None, max_token_len: int | None = None,
                 loss_agg_mode: str = "token-mean", remove_padding: bool = False,
                 recompute: Mapping[str, Any] | None = None, value: bool = False,
                 train: bool = True, metric_prefix: str = METRIC_PREFIX,
                 offload_optimizer: bool = False, seed: int = 0, master_weights: bool = True,
                 router_aux_loss_coef: float | None = None) -> None:
        """`folder`: the Hugging Face folder whose weights the chunks load. `value`: a
        one-output head (a critic: values instead of log-probs). `train=False`: frozen, no
        optimizer (the reference). `recompute`: Megatron's recomputation settings
        (`recompute_config`). The rest as `TrainEngine`'s options: float32 master weights
        always (`master_weights` must be true), no balancing loss for the routers
        (`router_aux_loss_coef` unset or 0; the spec refuses others)."""
        if not master_weights or router_aux_loss_coef:
            raise ValueError("the megatron engine keeps float32 master weights and trains the "
                             "routers without a balancing loss")
        require_megatron()
        if remove_padding and not has_transformer_engine():  # local attention reads no bounds
            raise InputError("actor.use_remove_padding: with actor.strategy: megatron packed "
                             "sequences need Transformer Engine's attention (THD), which is "
                             "not installed here: install transformer-engine[pytorch] (the CUDA "
                             "image has it), or set actor.use_remove_padding: false")
        adapt_device()
        if not dist.is_initialized():
            raise RuntimeError("MegatronEngine needs torch.distributed initialised (the role's "
                               "process group)")
        init_parallel(layout, seed)
        from megatron.core import parallel_state as mpu

        self.mpu, self.layout, self.value = mpu, layout, value
        self.device = torch.device(torch.accelerator.current_accelerator().type,
                                   torch.accelerator.current_device_index())
        self.bridge = make_bridge(folder, param_dtype, calculate_per_token_loss=True,
                                  **dict(recompute or {}))
        self.chunks = build_model(self.bridge, folder, value=value, train=train)
        if train:
            _sum_gradients(self.chunks)
        self.vocab = self.bridge.vocab_size or self.bridge.hf_config.vocab_size
        self.lr, self.betas, self.weight_decay = lr, betas, weight_decay
        self.warmup_steps, self.lr_scheduler = warmup_steps, lr_scheduler
        self.total_steps, self.grad_clip = total_steps, grad_clip
        self.micro_batch_size, self.max_token_len = micro_batch_size, max_token_len
        self.loss_agg_mode, self.remove_padding = loss_agg_mode, remove_padding
        self.metric_prefix, self.offload_optimizer = metric_prefix, offload_optimizer
        self.dp_group = mpu.get_data_parallel_group()
        self.tp_group = mpu.get_tensor_model_parallel_group()
        self.pp_group = mpu.get_pipeline_model_parallel_group()
        self.optimizer = self._optimizer(param_dtype) if train else None
        self.step = 0

    @classmethod
    def from_spec(cls, folder: str, spec: Any, total_steps: int, **overrides: Any
                  ) -> MegatronEngine:
        """The actor's engine as the spec configures it (`overrides`: options to replace)."""
        options = {**engine_options(spec.actor, total_steps), **overrides}
        return cls(folder, layout=MegatronLayout.of(spec), param_dtype=spec.model.dtype,
                   recompute=recompute_config(spec.actor.recompute,
                                              spec.model.gradient_checkpointing),
                   seed=spec.seed, **options)

    @classmethod
    def frozen(cls, folder: str, spec: Any) -> MegatronEngine:
        """The reference: the same layout, frozen in `model.dtype`, no optimizer."""
        return cls(folder, layout=MegatronLayout.of(spec), param_dtype=spec.model.dtype,
                   lr=0.0, train=False, seed=spec.seed, **batch_options(spec.actor))

    # ----------------------------------------------------------------------- optimizer

    def _optimizer(self, param_dtype: str) -> Any:
        """Megatron's distributed AdamW over the chunks (clipping is `train_step`'s)."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        config = OptimizerConfig(
            optimizer="adam", lr=self.lr, weight_decay=self.weight_decay,
            adam_beta1=self.betas[0], adam_beta2=self.betas[1], clip_grad=0.0,
            bf16=param_dtype == "bfloat16", params_dtype=torch.float32,
            use_distributed_optimizer=True)
        return get_megatron_optimizer(config, self.chunks)

    def _parameters(self) -> list[torch.nn.Parameter]:
        chained = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        return [p for optimizer in chained for p in optimizer.get_parameters()]

    # ----------------------------------------------------------------------- forward

    def forward_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, response_len: int, temperature: float = 1.0,
                         micro_batch_size: int | None = None, with_entropy: bool = False,
                         grad: bool = False, max_token_len: int | None = None,
                         images: Any = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (values, for a critic) (B, R) of the last R columns and the entropy, on
        every rank of the block (broadcast from the last pipeline stage)."""
        if images is not None:
            raise InputError("actor.strategy: megatron trains text models; use fsdp2 for "
                             "prompts with images")
        batch = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "position_ids": position_ids}
        extents = Extents.of(attention_mask)
        slices = self._slices(extents, micro_batch_size, max_token_len)
        real = [rows for rows in slices if rows is not None]
        for chunk in self.chunks:
            chunk.eval()
        with torch.no_grad():
            outputs = self._schedule(batch, extents, slices, [0.0] * len(slices), response_len,
                                     temperature, with_entropy, loss_fn=None, forward_only=True)
        outputs = [o for o in outputs if o]  # the last stage's; none from padding
        empty = torch.empty(0, response_len, device=self.device)
        logprobs = torch.cat([o["logprobs"] for o in outputs]) if outputs else empty
        entropy = None
        if with_entropy:
            entropy = torch.cat([o["entropy"] for o in outputs]) if outputs else empty
        logprobs, entropy = self._from_last_stage(logprobs, entropy, sum(map(len, real)),
                                                  response_len)
        order = torch.tensor([i for rows in real for i in rows])
        return in_order(logprobs, order), (in_order(entropy, order) if with_entropy else None)

    def _from_last_stage(self, logprobs: torch.Tensor, entropy: torch.Tensor | None,
                         rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The last pipeline stage's outputs on every stage of this pipeline."""
        if self.mpu.get_pipeline_model_parallel_world_size() == 1:
            return logprobs, entropy
        out = torch.zeros(1 + (entropy is not None), rows, width, device=self.device)
        if self.mpu.is_pipeline_last_stage(ignore_virtual=True):  # the others add zeros
            out[0] = logprobs
            if entropy is not None:
                out[1] = entropy
        out = all_reduce(out, self.pp_group)
        return out[0], (out[1] if entropy is not None else None)

    def _slices(self, extents: Extents, micro_batch_size: int | None,
                max_token_len: int | None) -> list[list[int] | None]:
        """Micro-batches as `TrainEngine`'s, as many on every data-parallel rank (an expert-
        parallel all-to-all and the pipeline's schedule take them together), a multiple of
        the pipeline's stages with virtual stages (padding ones, None, that count for
        nothing)."""
        lengths = extents.lengths
        budget = max_token_len or self.max_token_len
        if budget is not None:
            slices = token_micro_batches(lengths, budget)
        else:
            rows = len(lengths)
            slices = split_rows(rows, micro_batch_size or self.micro_batch_size or max(rows, 1))
        slices = even_micro_batches(slices, self.dp_group, self.device)
        if self.layout.vpp > 1:  # the interleaved schedule takes micro-batches pp at a time
            slices += [None] * (-len(slices) % self.layout.pp)
        return slices

    def _schedule(self, batch: Mapping[str, Any], extents: Extents,
                  slices: list[list[int] | None],
                  shares: list[float], response_len: int, temperature: float,
                  with_entropy: bool, loss_fn: LossFn | None, forward_only: bool
                  ) -> list[dict[str, Any]]:
        """The micro-batches through Megatron's schedule; what each returned on the last
        stage (the loss function's metrics, or the forward's log-probs)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micros = [self._micro(batch, extents, rows or [0], response_len) for rows in slices]
        step = partial(self._forward_step, response_len=response_len, temperature=temperature,
                       with_entropy=with_entropy, loss_fn=loss_fn)
        items = list(zip(micros, shares, [rows is None for rows in slices]))
        # one iterator per virtual stage: each chunk's forward steps take every micro-batch
        data = [iter(items) for _ in self.chunks]
        widest = max(m["_inputs"]["input_ids"].shape[1] for m in micros)
        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=data if len(data) > 1 else data[0],
            model=self.chunks, num_microbatches=len(micros), seq_length=widest,
            micro_batch_size=max(m["_inputs"]["input_ids"].shape[0] for m in micros),
            forward_only=forward_only)

    def _micro(self, batch: Mapping[str, Any], extents: Extents, rows: list[int],
               response_len: int) -> dict[str, Any]:
        """One micro-batch's columns on the device, and the model's inputs: packed (THD: the
        rows' valid tokens, their boundaries) or padded. Megatron's rotary embedding numbers
        the positions of a padded block 0, 1, ... in every row (it reads no position ids), so
        each row's valid tokens, which are contiguous, are moved to its first columns (the
        padding after them: the causal mask then keeps them apart) and the block is cut to
        the longest row; `_response_at` says where each response token's predicting position
        went."""
        micro = {k: (v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                 for k, v in ((k, take_rows(v, rows)) for k, v in batch.items())}
        if self.remove_padding:
            from megatron.core.packed_seq_params import PackedSeqParams

            packed = pack(micro["input_ids"], take_rows(batch["attention_mask"], rows),
                          micro["position_ids"], response_len, attention="flash_attention_2",
                          multiple_of=self.layout.tp)
            bounds = packed.attention
            micro["_inputs"] = {
                "input_ids": packed.input_ids, "position_ids": packed.position_ids,
                "attention_mask": None,
                "packed_seq_params": PackedSeqParams(
                    qkv_format="thd", cu_seqlens_q=bounds["cu_seq_lens_q"],
                    cu_seqlens_kv=bounds["cu_seq_lens_k"], max_seqlen_q=bounds["max_length_q"],
                    max_seqlen_kv=bounds["max_length_k"])}
            micro["_packed"] = packed
            return micro
        width = micro["input_ids"].shape[1]
        longest = max(extents.lengths[i] for i in rows)
        first = torch.tensor([extents.first[i] for i in rows], device=self.device)  # (b,)
        valid = micro["attention_mask"].bool()
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :longest]
        ids = micro["input_ids"].gather(1, order)
        columns = torch.arange(width - response_len, width, device=self.device)  # (R,)
        micro["_response_at"] = (columns[None] - first[:, None] - 1).clamp(0, longest - 1)
        positions = torch.arange(longest, device=self.device).expand_as(ids)
        micro["_inputs"] = {"input_ids": ids, "position_ids": positions, "attention_mask": None}
        return micro

    def _forward_step(self, data: Any, model: Any, *, response_len: int, temperature: float,
                      with_entropy: bool, loss_fn: LossFn | None) -> tuple[Any, Any]:
        """Megatron's forward step: this stage's output and, for the last stage, the
        function that turns it into the loss (or the log-probs)."""
        micro, share, padding = next(data)
        output = model(**micro["_inputs"])
        return output, partial(self._loss, micro, share, padding, response_len, temperature,
                               with_entropy, loss_fn)

    def _loss(self, micro: dict[str, Any], share: float, padding: bool, response_len: int,
              temperature: float, with_entropy: bool, loss_fn: LossFn | None,
              output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The last stage's loss of a micro-batch times its share, Megatron's token count
        (unused: `_finalize` scales nothing) and what to report."""
        values, entropy = self.head_outputs(output, micro, response_len, temperature,
                                            with_entropy)
        one = torch.ones((), dtype=torch.int, device=self.device)
        if loss_fn is None:  # a forward: the outputs themselves (none of padding)
            if padding:
                return values.sum() * 0.0, one, {}
            report = {"logprobs": values.detach().float()}
            if with_entropy:
                report["entropy"] = entropy.detach().float()
            return values.sum() * 0.0, one, report
        if padding:  # every collective of the backward takes part, adding nothing
            return values.sum() * 0.0, one, {}
        loss, metrics = loss_fn(micro, values, entropy)
        report = {name: torch.as_tensor(value, device=self.device).detach().float()
                  for name, value in metrics.items()}
        report[f"{self.metric_prefix}loss"] = loss.detach().float()
        return loss * share, one, {"share": share, "metrics": report}

    def head_outputs(self, output: torch.Tensor, micro: Mapping[str, Any], response_len: int,
                     temperature: float, with_entropy: bool
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(b, R) log-probs (and entropy) of the response tokens from the last stage's output:
        this rank's part of the vocabulary's logits (b, T, V/t), or values (b, T, 1)."""
        packed = micro.get("_packed")
        if packed is not None:
            picked, labels = output[0, packed.keep][None], packed.labels[None]  # (1, K, .)
        else:  # (b, R, .) at the positions that predict the response tokens
            at = micro["_response_at"]
            picked = output.gather(1, at[..., None].expand(-1, -1, output.shape[-1]))
            labels = micro["input_ids"][:, -response_len:]
        if self.value:
            values = picked[..., 0].float()
            return (packed.unpack(values[0]) if packed is not None else values), None
        start = self.mpu.get_tensor_model_parallel_rank() * picked.shape[-1]
        logprobs, entropy = split_vocab_logprobs(picked, labels, start, self.vocab,
                                                 self.tp_group, temperature, with_entropy)
        if packed is not None:
            logprobs = packed.unpack(logprobs[0])
            entropy = packed.unpack(entropy[0]) if entropy is not None else None
        return logprobs, entropy

    # ----------------------------------------------------------------------- update

    def train_step(self, batch: Mapping[str, Any], loss_fn: LossFn, *,
                   micro_batch_size: int | None = None, max_token_len: int | None = None,
                   loss_agg_mode: str | None = None, temperature: float = 1.0,
                   with_entropy: bool = False) -> dict[str, float]:
        """One optimizer step on this rank's rows of a mini-batch (`TrainEngine.train_step`);
        every rank of the role calls it together."""
        if self.optimizer is None:
            raise RuntimeError("a frozen MegatronEngine does not train")
        mode = loss_agg_mode or self.loss_agg_mode
        if mode not in MICRO_SHARES:
            raise ValueError(f"unknown loss_agg_mode {mode!r}; choose one of {list(MICRO_SHARES)}")
        response_mask = batch["response_mask"]
        extents = Extents.of(batch["attention_mask"])
        slices = self._slices(extents, micro_batch_size, max_token_len)
        real = [rows for rows in slices if rows is not None]
        shares, metric_shares = micro_shares(response_mask, real, mode)
        loss_scale, metric_scale = self._rank_share(response_mask, mode)
        scaled = iter(zip(shares, metric_shares))
        both = [next(scaled) if rows is not None else (0.0, 0.0) for rows in slices]
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._schedule(batch, extents, slices, [s * loss_scale for s, _ in both],
                                 response_mask.shape[1], temperature, with_entropy, loss_fn,
                                 forward_only=False)
        metric_weights = [m * metric_scale for (s, m), rows in zip(both, slices)
                          if rows is not None]
        totals = self._metrics([o for o in outputs if o], metric_weights)
        return self._apply(totals)

    def _rank_share(self, response_mask: torch.Tensor, mode: str) -> tuple[float, float]:
        """This rank's part of the whole mini-batch's normaliser over the data-parallel ranks
        (as `TrainEngine`'s)."""
        count = MICRO_SHARES[mode]
        rows = response_mask.shape[0]
        local = int(count(response_mask)) if count is not None else rows
        total, total_rows = reduce_numbers([local, rows], self.dp_group, device=self.device)
        by_rows = rows / total_rows if total_rows else 0.0
        if count is None:
            return 1.0, by_rows
        if total == 0:
            return by_rows, by_rows
        return local / total, local / total

    def _metrics(self, outputs: list[dict[str, Any]], weights: list[float]
                 ) -> dict[str, torch.Tensor]:
        """The loss function's metrics, weighted by share and summed over the data-parallel
        ranks, on every stage (the last stage's names are sent to the others)."""
        names: list[str] = sorted(outputs[0]["metrics"]) if outputs else []
        if self.mpu.get_pipeline_model_parallel_world_size() > 1:
            holder = [names]
            dist.broadcast_object_list(holder, src=self.mpu.get_pipeline_model_parallel_last_rank(),
                                       group=self.pp_group)
            names = holder[0]
        values = torch.zeros(len(names), device=self.device)
        for output, weight in zip(outputs, weights):
            values += torch.stack([output["metrics"][n] for n in names]) * weight
        if self.mpu.get_pipeline_model_parallel_world_size() > 1:
            values = all_reduce(values, self.pp_group)  # only the last stage's are non-zero
        values = all_reduce(values, self.dp_group)
        return dict(zip(names, values))

    def _apply(self, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        """Gradients ready, norm checked, clipped, the step: the end of `train_step`."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        prefix = self.metric_prefix
        if self.offload_optimizer:  # the shards come back for the step (gradients land there)
            self._move_optimizer(self.device)
        self.optimizer.prepare_grads()
        grad_norm = float(self.optimizer.get_grad_norm())
        metrics = {name: float(v) for name, v in zip(totals, torch.stack(list(totals.values()))
                                                     .tolist())} if totals else {}
        metrics[f"{prefix}grad_norm"] = grad_norm
        for what, name in (("loss", f"{prefix}loss"), ("gradient norm", f"{prefix}grad_norm")):
            if name in metrics and not math.isfinite(metrics[name]):
                self.optimizer.zero_grad()
                for chunk in self.chunks:
                    chunk.zero_grad_buffer()
                if self.offload_optimizer:
                    self._move_optimizer(torch.device("cpu"))
                raise NonFiniteError(what, self.step, metrics)
        if self.grad_clip > 0:
            clip_grad_by_total_norm_fp32(self._parameters(), self.grad_clip, grad_norm)
        lr = self.lr * lr_factor(self.step, warmup_steps=self.warmup_steps,
                                 total_steps=self.total_steps, schedule=self.lr_scheduler)
        for group in self.optimizer.param_groups:  # every parameter decays, as elsewhere
            group["lr"], group["weight_decay"] = lr, self.weight_decay
        self.optimizer.step_with_ready_grads()
        if self.offload_optimizer:
            self._move_optimizer(torch.device("cpu"))
        self.step += 1
        metrics[f"{prefix}lr"] = lr
        return metrics

    # ----------------------------------------------------------------------- weights

    def weight_buckets(self, bucket_bytes: int = 512 << 20,
                       keep_split: Any = None) -> Iterator[WeightBucket]:
        """Every weight in full under its Hugging Face name, bucket by bucket (each tensor
        gathered from its parts as it is reached: every rank iterates alike). A critic's
        value head is the token classifier's `score`."""
        if keep_split is not None:
            raise InputError("parallel.resharding: none sends the training layout's parts, "
                             "which the megatron engine does not: use resharding: auto")
        yield from in_buckets(export_weights(self.bridge, self.chunks), bucket_bytes)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight in full on the CPU, on every rank (for a Hugging Face folder)."""
        return {name: t.detach().cpu() for bucket in self.weight_buckets() for name, t in bucket}

    # ----------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The step (small, the same on every rank); weights and optimizer state are sharded:
        `save_sharded` writes them."""
        return {"step": self.step, "sharded": True, "strategy": "megatron"}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.step = int(state["step"])

    def _sharded_state(self, loading: bool = False) -> dict[str, Any]:
        """Megatron's sharded state dict of the chunks (`model0`, `model1`, ... one per virtual
        stage) and of the optimizer, which finds its parameters in theirs (`loading`: its
        states are made first, as before a first step)."""
        from megatron.core.utils import unwrap_model

        state: dict[str, Any] = {f"model{i}": model.sharded_state_dict()
                                 for i, model in enumerate(unwrap_model(self.chunks))}
        if self.optimizer is not None and loading:
            self._initial_states()
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(
                state, is_loading=loading, metadata=CHECKPOINT_FORMAT)
        return state

    def _initial_states(self) -> None:
        """AdamW's states of a fresh optimizer made before a checkpoint loads into them: the
        moments (Megatron's `init_state_fn`) and the step count, which Megatron's state dict
        reads from them where torch's Adam keeps it (without Transformer Engine or Apex)."""
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            optimizer.init_state_fn(optimizer.optimizer, optimizer.config)
            for state in optimizer.optimizer.state.values():
                state.setdefault("step", torch.zeros((), dtype=torch.float32))

    def _load_optimizer(self, state: Mapping[str, Any]) -> None:
        """The optimizer's loaded state into it. Megatron writes each parameter's main weight
        and moments, and restores torch Adam's step count (which its fused Adams lack) from
        its own record before copying them, as one tensor shared by every parameter (which
        Adam's foreach step would then count once per parameter); its copy then asks for a
        step count among the written tensors too. Here the tensors are copied key by key and
        each parameter gets its own step count."""
        chained = getattr(self.optimizer, "chained_optimizers", [self.optimizer])
        for optimizer in chained:
            optimizer._set_main_param_and_optimizer_states = partial(_set_states, optimizer)
        try:
            self.optimizer.load_state_dict(state)
        finally:
            for optimizer in chained:
                del optimizer._set_main_param_and_optimizer_states
        for optimizer in chained:
            for states in optimizer.optimizer.state.values():
                if isinstance(states.get("step"), torch.Tensor):
                    states["step"] = states["step"].clone()

    def save_sharded(self, folder: str | Path) -> None:
        """Weights and optimizer state as Megatron's distributed checkpoint, each rank
        writing its shards (the optimizer's in Megatron's fully reshardable format). A
        collective."""
        from megatron.core import dist_checkpointing

        Path(folder).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(self._sharded_state(), str(folder))

    def load_sharded(self, folder: str | Path) -> None:
        """Weights and optimizer state of a `save_sharded` folder (an InputError naming it
        when it is not one, or holds another model's). A collective."""
        from megatron.core import dist_checkpointing

        folder = Path(folder)
        if not dist_checkpointing.check_is_distributed_checkpoint(str(folder)):
            raise InputError(f"{folder}: not a Megatron distributed checkpoint; it was saved "
                             "with another actor.strategy, or is incomplete")
        try:
            state = dist_checkpointing.load(self._sharded_state(loading=True), str(folder))
        except Exception as exc:  # Megatron reports a mismatch in many ways
            first = next((line for line in str(exc).splitlines() if line.strip()),
                         type(exc).__name__)
            raise InputError(f"{folder}: cannot load this checkpoint into the model of "
                             f"model.path: {first}") from exc
        from megatron.core.utils import unwrap_model

        for i, model in enumerate(unwrap_model(self.chunks)):
            model.load_state_dict(state[f"model{i}"])
        if self.optimizer is not None:
            self._load_optimizer(state["optimizer"])

    # ----------------------------------------------------------------------- memory

    def offload(self) -> None:
        """To host memory: the optimizer's shards (float32 main weights and AdamW's moments,
        back for `train_step`'s step), or a frozen engine's weights."""
        if self.optimizer is None:
            for chunk in self.chunks:
                chunk.to("cpu")
        self._move_optimizer(torch.device("cpu"))

    def reload(self) -> None:
        if self.optimizer is None:
            for chunk in self.chunks:
                chunk.to(self.device)
        self._move_optimizer(self.device)

    def _move_optimizer(self, device: torch.device) -> None:
        """The distributed optimizer's shards of this rank (main weights, moments) to
        `device`; their gradients are made on the device, after they are back."""
        if self.optimizer is None:
            return
        moving = {"non_blocking": device.type != "cpu"}
        for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            for group in optimizer.optimizer.param_groups:
                for param in group["params"]:
                    param.data = param.data.to(device, **moving)
            for state in optimizer.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":
                        state[key] = value.to(device, **moving)

    @property
    def model(self) -> Any:
        """The first model chunk (the roles read its mode and dtype)."""
        return self.chunks[0]
