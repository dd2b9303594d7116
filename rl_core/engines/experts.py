"""Mixture-of-experts training: the routers' load-balancing loss and metrics, and expert
parallelism (each rank holds some of every layer's experts; tokens travel to them by all-to-all).

    recorder = RouterRecorder.attach(model)            # None for a dense model
    with recorder.recording(mask):                      # the micro-batch's valid tokens
        out = model(...)
    aux, metrics = recorder.take()                      # balancing loss and router metrics

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("edp", "ep"))
    shard_experts(model, mesh["ep"])                    # experts split 2 ways, Shard(0) DTensors

Models. Hugging Face's mixtures of experts of the Qwen3-MoE kind (`Qwen3MoeForCausalLM`, and
those laid out alike): each layer's MLP is a router (a linear map to one logit per expert; each
token goes to the `top_k` experts of highest probability, weighted by their renormalised
probabilities) and an experts module holding all experts' weights as two 3-D parameters,
`gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I). Routing is dropless: every token is computed
by all of its `top_k` experts, however uneven the load.

Load-balancing loss (Switch Transformer, eq. 4-6, as `load_balancing_loss_func` of
transformers computes it for Qwen3-MoE): over the valid tokens of a micro-batch and all MoE
layers together, with f_i the fraction of (token, choice) pairs routed to expert i times top_k
and P_i the mean router probability of expert i, loss = E · Σ_i f_i · P_i (top_k when perfectly
balanced). Its gradient reaches the routers through P. The engine adds
`actor.router_aux_loss_coef` times it to each micro-batch's loss, with the micro-batch's share.
Metrics: `moe/aux_loss`, and the load of the busiest and the idlest expert of any layer relative
to a perfectly even load (`moe/load_max`, `moe/load_min`: 1.0 each when balanced, load_min 0
when an expert got no token).

Expert parallelism (`parallel.expert_parallel_size` p, with fsdp2). Ranks form blocks of p
consecutive ranks; in each block rank j holds experts [j·E/p, (j+1)·E/p) of every layer, as
DTensors `Shard(0)` over the block ("ep" mesh dimension), and FSDP2 shards those over the
ranks holding the same experts in other blocks ("edp"); the other weights (attention, routers,
norms, embeddings) are sharded over all ranks as without it. The ranks keep their own rows. In
each MoE layer a rank routes its tokens, sends each (token, choice) pair to the rank holding its
expert (one all-to-all of the counts, whose sizes come to the host, then one of the hidden
states), computes the pairs it received with its experts (one grouped matrix multiply for all
of them where the device has the kernel), sends the results back (one all-to-all) and sums them
weighted by the router. Backward runs the same exchanges in reverse. An expert's gradient thus
holds every rank's tokens of the block; FSDP2 sums it over "edp". The result equals computing
every expert on every rank, up to floating-point rounding.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rl_core.collectives import all_to_all, all_to_all_rows
from rl_core.errors import InputError

FIELD = "parallel.expert_parallel_size"
EP_DIM = "ep"  # the mesh dimension experts are split over
EDP_DIM = "edp"  # the ranks holding the same experts
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
METRIC_PREFIX = "moe/"


def num_experts(config: Any) -> int:
    """The routed experts of a model's config (0 for a dense model)."""
    for key in EXPERT_COUNT_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def expert_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The experts modules of a model: those holding 3-D `gate_up_proj` and `down_proj`."""
    return [module for module in model.modules()
            if _is_3d(getattr(module, "gate_up_proj", None))
            and _is_3d(getattr(module, "down_proj", None))]


def _is_3d(param: Any) -> bool:
    return isinstance(param, torch.nn.Parameter) and param.dim() == 3


def check_expert_parallel(config: Any, size: int, field: str = FIELD) -> None:
    """An InputError naming `field` when `size` > 1 and the model has no experts, or a number
    of experts `size` does not divide."""
    if size <= 1:
        return
    experts = num_experts(config)
    if not experts:
        raise InputError(f"{field}: {size}, but the model ({getattr(config, 'model_type', '?')}) "
                         "is dense: expert parallelism splits a mixture of experts' experts; "
                         "set it to 1")
    if experts % size:
        raise InputError(f"{field}: {size} does not divide the model's {experts} experts (each "
                         "rank holds an equal share of them): pick a divisor of "
                         f"{experts}")


# --------------------------------------------------------------------------- balancing loss


def balance_loss(logits: list[torch.Tensor], top_k: int,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The load-balancing loss over the router logits of every MoE layer (each (T, E), the
    same T tokens) and the load of each layer's experts relative to an even one, (L, E).
    `mask` (T,): the valid tokens (None: all)."""
    experts = logits[0].shape[-1]
    weight = None if mask is None else mask.reshape(-1).float()
    counts, probs = [], []
    for layer in logits:
        p = torch.softmax(layer.float(), dim=-1)  # (T, E)
        chosen = torch.topk(p, top_k, dim=-1).indices  # (T, k)
        picks = F.one_hot(chosen, experts).sum(1).float()  # (T, E)
        if weight is not None:
            picks, p = picks * weight[:, None], p * weight[:, None]
        counts.append(picks.sum(0))
        probs.append(p.sum(0))
    tokens = (weight.sum() if weight is not None
              else torch.tensor(float(logits[0].shape[0]), device=logits[0].device))
    tokens = tokens.clamp(min=1.0)
    counts_by_layer = torch.stack(counts)  # (L, E)
    fraction = counts_by_layer.sum(0) / (tokens * len(logits))
    probability = torch.stack(probs).sum(0) / (tokens * len(logits))
    loss = experts * (fraction.detach() * probability).sum()
    load = counts_by_layer / (tokens * top_k / experts)
    return loss, load


class RouterRecorder:
    """Records the router logits of a model's MoE layers while `recording` (forward hooks on
    the routers the model's class names for `router_logits`), for the balancing loss."""

    def __init__(self, routers: list[torch.nn.Module], index: int, top_k: int) -> None:
        self.index, self.top_k = index, top_k
        self.logits: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None
        self.active = False
        self.handles = [router.register_forward_hook(self._hook) for router in routers]

    @classmethod
    def attach(cls, model: torch.nn.Module) -> RouterRecorder | None:
        """A recorder on `model`'s routers; None for a dense model (or one whose class records
        no router logits)."""
        if not num_experts(model.config):
            return None
        spec = getattr(type(model), "_can_record_outputs", None) or {}
        recorder = spec.get("router_logits")
        target = getattr(recorder, "target_class", None)
        routers = [m for m in model.modules() if target is not None and isinstance(m, target)]
        if not routers:
            return None
        top_k = getattr(routers[0], "top_k", None) or model.config.num_experts_per_tok
        return cls(routers, getattr(recorder, "index", 0) or 0, int(top_k))

    def _hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self.active:
            logits = output[self.index] if isinstance(output, tuple) else output
            self.logits.append(logits.reshape(-1, logits.shape[-1]))

    @contextlib.contextmanager
    def recording(self, mask: torch.Tensor | None) -> Iterator[None]:
        """Record the routers of the forward passes inside; `mask`: the valid tokens of the
        model's input, flattened as the routers see them (None: all)."""
        self.logits, self.mask, self.active = [], mask, True
        try:
            yield
        finally:
            self.active = False

    def take(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The balancing loss of what was recorded, and the router metrics; clears it."""
        logits, mask = self.logits, self.mask
        self.logits, self.mask = [], None
        loss, load = balance_loss(logits, self.top_k, mask)
        return loss, {f"{METRIC_PREFIX}aux_loss": loss.detach(),
                      f"{METRIC_PREFIX}load_max": load.max().detach(),
                      f"{METRIC_PREFIX}load_min": load.min().detach()}


# --------------------------------------------------------------------------- expert parallelism


def shard_experts(model: torch.nn.Module, mesh: Any) -> None:
    """Split every experts module's weights over the 1-D `mesh` (rank j keeps experts
    [j·E/p, (j+1)·E/p) as a `Shard(0)` DTensor) and route their forward through the exchange
    (see the module docstring); in place, before FSDP2 shards the rest."""
    from torch.distributed.tensor import Shard, distribute_tensor

    # gathering an expert weight in full (a sync, a checkpoint's export) takes two all-gathers
    # over "edp" and "ep", which DTensor warns of at every gather; they are intended
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    group = mesh.get_group()
    for module in expert_modules(model):
        for name in ("gate_up_proj", "down_proj"):
            param = getattr(module, name)
            sharded = distribute_tensor(param.data, mesh, [Shard(0)])
            setattr(module, name, torch.nn.Parameter(sharded, requires_grad=param.requires_grad))
        module.forward = _ExpertParallelForward(module, group)


class _ExpertParallelForward:
    """An experts module's forward over its rank's share of the experts (see the module
    docstring): (T, H) hidden states, (T, k) expert indices and weights -> (T, H)."""

    def __init__(self, module: torch.nn.Module, group: Any) -> None:
        self.module, self.group = module, group
        self.size = dist.get_world_size(group)

    def __call__(self, hidden: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        module, size = self.module, self.size
        gate_up, down = _local(module.gate_up_proj), _local(module.down_proj)
        local = gate_up.shape[0]
        experts = local * size
        flat = top_k_index.reshape(-1)  # (T·k,) the expert of each (token, choice) pair
        order = torch.argsort(flat, stable=True)  # the pairs by expert, so by destination
        counts = torch.bincount(flat, minlength=experts)  # (E,) pairs per expert
        received = all_to_all(counts.view(size, local), self.group)  # (p, local): per source
        sizes = torch.stack([counts.view(size, local).sum(1), received.sum(1)]).tolist()
        send, receive = sizes  # one host sync: the exchange's sizes
        k = top_k_index.shape[1]
        pairs = hidden[order // k]  # (T·k, H) by destination rank, then expert
        got = _Exchange.apply(pairs, send, receive, self.group)  # (N, H) by source, then expert
        out = _compute(module, got, received, gate_up, down)
        back = _Exchange.apply(out, receive, send, self.group)  # (T·k, H) in `pairs`' order
        weights = top_k_weights.reshape(-1)[order].to(back.dtype)
        result = torch.zeros_like(hidden)
        return result.index_add(0, order // k, (back * weights[:, None]).to(hidden.dtype))


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if hasattr(param, "to_local") else param


def _compute(module: torch.nn.Module, rows: torch.Tensor, received: torch.Tensor,
             gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The local experts on the received rows ((p, local) counts: by source rank, then expert):
    regrouped by expert, one grouped matmul per projection, put back in the received order."""
    local = received.shape[1]
    expert_of_row = torch.arange(local, device=rows.device).repeat(received.shape[0])
    expert_of_row = torch.repeat_interleave(expert_of_row, received.reshape(-1),
                                            output_size=rows.shape[0])
    by_expert = torch.argsort(expert_of_row, stable=True)
    offsets = torch.cumsum(received.sum(0), 0).to(torch.int32)
    x = rows[by_expert]
    gate, up = grouped_linear(x, gate_up, offsets).chunk(2, dim=-1)
    y = grouped_linear(module.act_fn(gate) * up, down, offsets)
    return torch.empty_like(y).index_copy(0, by_expert, y)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows [offsets[e-1], offsets[e]) of `x` (N, in) times expert e's `weight` (E, out, in)
    transposed: one grouped matmul where the device has the kernel (CUDA, CPU) and the widths
    suit it (rows of a multiple of 16 bytes), else a loop over the experts."""
    w = weight.transpose(-2, -1)
    grouped = getattr(F, "grouped_mm", None)
    aligned = all(size * w.element_size() % 16 == 0 for size in weight.shape[1:])
    if grouped is not None and aligned and x.device.type in ("cpu", "cuda"):
        return grouped(x.to(w.dtype).contiguous(), w, offs=offsets)
    starts = [0, *offsets.tolist()]
    return torch.cat([x[a:b] @ w[e] for e, (a, b) in enumerate(zip(starts, starts[1:]))])


class _Exchange(torch.autograd.Function):
    """`all_to_all_rows` with its gradient: backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, send: list[int], receive: list[int],
                group: Any) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group = send, receive, group
        return all_to_all_rows(rows, send, receive, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return all_to_all_rows(grad.contiguous(), ctx.receive, ctx.send, ctx.group), None, \
            None, None
