"""Training engine on PyTorch FSDP2: the model, its gradients and AdamW state sharded over the
data-parallel ranks instead of copied on each.

    mesh = init_device_mesh("cpu", (world_size,))          # gloo on CPU, nccl / hccl elsewhere
    engine = FSDP2Engine(model, mesh=mesh, lr=1e-5, ...)    # the options of TrainEngine
    metrics = engine.train_step(shard, loss_fn)             # each rank its rows, as the plain engine

Give the model on the host (CPU): `fully_shard` moves each unit to the mesh's device as it shards
it, so the full model never sits on the device in float32. `fully_shard` wraps each decoder layer (`model.model.layers`, as Hugging Face decoders lay them
out) and then the root, over `mesh` (its device type is always passed explicitly). Parameters stay
in float32 (the master weights) and compute in `param_dtype` through a `MixedPrecisionPolicy`
whose gradient reduction is float32. FSDP2 reduce-scatters the gradients with a divide factor of
1, so they are summed over the ranks as in the plain engine (which also keeps clear of AVG
reductions on gloo, pytorch#162338); everything else — micro-batches, the loss shares over the
whole mini-batch, clipping the global norm (over DTensors), the lr schedule and the metrics — is
`TrainEngine`'s own code, composed here. `weight_buckets` gathers each tensor in full, bucket by
bucket, for a rollout engine: every rank must iterate it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rl_core.engines.base import LossFn, WeightBucket
from rl_core.engines.train import PARAM_DTYPES, TrainEngine, engine_options
from rl_core.errors import InputError


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers to shard one by one (`model.model.layers` of a Hugging Face causal LM
    or token classifier); an InputError when the model has none there."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise InputError(f"model: cannot find the decoder layers of {type(model).__name__} to "
                         "shard with FSDP2 (expected model.model.layers); use actor.strategy=torch")
    return list(layers)


def shard_model(model: torch.nn.Module, mesh: Any, param_dtype: str = "float32",
                reshard_after_forward: bool = True) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (in place); gradients summed, in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[param_dtype], reduce_dtype=torch.float32)
    units = [*decoder_layers(model), model]  # the root last: it takes what the layers leave
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    for unit in units:  # summed gradients, with plain SUM collectives (gloo has no PREMUL_SUM)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


class FSDP2Engine:
    """A `TrainEngine` over an FSDP2-sharded model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, *, mesh: Any, param_dtype: str = "float32",
                 reshard_after_forward: bool = True, **options: Any) -> None:
        if param_dtype not in PARAM_DTYPES:
            raise ValueError(f"param_dtype {param_dtype!r} is not supported; use float32 or bfloat16")
        self.mesh = mesh
        device = torch.device("cpu") if mesh.device_type == "cpu" else \
            torch.device(mesh.device_type, torch.accelerator.current_device_index())
        # float32 master weights; fully_shard moves each unit to the mesh's device as it shards
        # it, so a model given on the host reaches the device one layer at a time
        model = model.to(dtype=torch.float32)
        shard_model(model, mesh, param_dtype, reshard_after_forward)
        self.inner = TrainEngine(model, device=device, dp_group=mesh.get_group(), sharded=True,
                                 **options)

    @classmethod
    def from_spec(cls, model: torch.nn.Module, actor: Any, total_steps: int, dtype: str,
                  mesh: Any) -> FSDP2Engine:
        """An engine configured by the spec's `actor` section over `mesh` (`dtype`: compute)."""
        return cls(model, mesh=mesh, param_dtype=dtype, **engine_options(actor, total_steps))

    model = property(lambda self: self.inner.model)
    step = property(lambda self: self.inner.step)

    @property
    def dp_group(self) -> Any:
        return self.inner.dp_group

    def forward_logprobs(self, *args: Any, **kwargs: Any):
        return self.inner.forward_logprobs(*args, **kwargs)

    def train_step(self, batch: Mapping[str, Any], loss_fn: LossFn, **options: Any) -> dict[str, float]:
        return self.inner.train_step(batch, loss_fn, **options)

    def weight_buckets(self, bucket_bytes: int = 512 << 20) -> Iterator[WeightBucket]:
        return self.inner.weight_buckets(bucket_bytes)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight in full on the CPU, on every rank (for a Hugging Face export)."""
        return {name: tensor.cpu() for bucket in self.weight_buckets() for name, tensor in bucket}

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state in full on rank 0 (empty on the others; any number of ranks can
        load it), the schedule and the step. A collective: every rank calls it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        state = self.inner.state_dict()
        state["optimizer"] = get_optimizer_state_dict(
            self.model, self.inner.optimizer,
            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # rank 0 holds the full state (`state_dict` gathers it there); it is sent to the others
        set_optimizer_state_dict(self.model, self.inner.optimizer, state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True,
                                                          broadcast_from_rank0=True))
        self.inner.step = int(state["step"])

    def offload(self) -> None:
        raise NotImplementedError("actor.offload with fsdp2 is not built yet")

    def reload(self) -> None:
        raise NotImplementedError("actor.offload with fsdp2 is not built yet")
