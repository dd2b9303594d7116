"""Training engine on PyTorch FSDP2: the model, its gradients and AdamW state sharded over the
data-parallel ranks instead of copied on each.

    mesh = init_device_mesh("cpu", (world_size,))          # gloo on CPU, nccl / hccl elsewhere
    engine = FSDP2Engine(model, mesh=mesh, lr=1e-5, ...)    # the options of TrainEngine
    metrics = engine.train_step(shard, loss_fn)             # each rank its rows, as the plain engine

With a two-dimensional mesh named ("shard", "tp") each unit is first split by tensor
parallelism over "tp" (`rl_core.engines.tensor`: the ranks of a "tp" block hold the same rows)
and then sharded over "shard"; parameters are then DTensors over both dimensions, and a
sharded checkpoint written on one layout loads on another. With a mesh named ("edp", "ep") the
experts of a mixture of experts are split over "ep" and each share sharded over "edp"
(`rl_core.engines.experts`); every other weight is sharded over all the ranks, which all hold
rows of their own.

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
from pathlib import Path
from typing import Any

import torch

from rl_core.engines.base import LossFn, WeightBucket, decoder_layers
from rl_core.engines.lora import adapter_names, check_resumed, with_adapters
from rl_core.engines.train import PARAM_DTYPES, TrainEngine, engine_options
from rl_core.errors import InputError


_MESH = object()  # FSDP2Engine's default data-parallel group: the mesh's


def shard_model(model: torch.nn.Module, mesh: Any, param_dtype: str = "float32",
                reshard_after_forward: bool = True, offload: bool = False) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (in place); gradients summed, in float32.
    `offload`: the shards live in host memory (FSDP2's CPUOffloadPolicy, pinned), each unit
    copied to the device for its forward and backward. A `mesh` with a "tp" dimension: each
    unit is first split by tensor parallelism over it (`rl_core.engines.tensor`), then sharded
    over its "shard" dimension."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    from rl_core.engines.experts import EDP_DIM, EP_DIM, expert_modules, shard_experts
    from rl_core.engines.tensor import TP_DIM, parallelize

    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[param_dtype], reduce_dtype=torch.float32)
    pin = mesh.device_type != "cpu"  # page-locked host memory exists beside an accelerator only
    extra = {"offload_policy": CPUOffloadPolicy(pin_memory=pin)} if offload else {}
    units = [*decoder_layers(model), model]  # the root last: it takes what the layers leave
    shard_mesh = _shard_mesh(mesh)

    def shard(unit: torch.nn.Module, over: Any = shard_mesh) -> None:
        fully_shard(unit, mesh=over, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward, **extra)

    names = mesh.mesh_dim_names or ()
    if TP_DIM in names:  # tensor parallelism over the rest of the mesh
        parallelize(model, mesh[TP_DIM], each=shard)
    elif EP_DIM in names:  # experts split over "ep", each share sharded over "edp"
        shard_experts(model, mesh[EP_DIM])
        experts = expert_modules(model)
        for unit in experts:
            shard(unit, mesh[EDP_DIM])
        for unit in units:
            shard(unit)
        units = experts + units
    else:
        for unit in units:
            shard(unit)
    for unit in units:  # summed gradients, with plain SUM collectives (gloo has no PREMUL_SUM)
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def _shard_mesh(mesh: Any) -> Any:
    """The mesh FSDP2 shards over: `mesh`'s "shard" dimension beside tensor parallelism, all
    its ranks beside expert parallelism (the experts' own shards aside), or all of it."""
    from rl_core.engines.experts import EP_DIM
    from rl_core.engines.tensor import SHARD_DIM, TP_DIM

    names = mesh.mesh_dim_names or ()
    if TP_DIM in names:
        return mesh[SHARD_DIM]
    if EP_DIM in names:
        return mesh._flatten("dp")  # the same mesh on every call
    return mesh


class FSDP2Engine:
    """A `TrainEngine` over an FSDP2-sharded model (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, *, mesh: Any, param_dtype: str = "float32",
                 reshard_after_forward: bool = True, offload_param: bool = False,
                 cp_group: Any = None, dp_group: Any = _MESH, lora: Any = None,
                 **options: Any) -> None:
        """`offload_param`: parameter, gradient and optimizer-state shards live in host memory
        and AdamW steps there (FSDP2's CPUOffloadPolicy); each unit comes to the device for its
        forward and backward. `cp_group`: context parallelism (`TrainEngine`'s) over some of
        the mesh's ranks, which then hold the same rows: `dp_group` is the group of the ranks
        with different rows (None: one), by default the whole mesh. `lora`: the spec's
        `actor.lora`, the model wrapped with PEFT's adapters before it is sharded (frozen base
        and adapters sharded alike; gradients and AdamW state for the adapters only).
        `options`: those of `TrainEngine`."""
        if param_dtype not in PARAM_DTYPES:
            raise ValueError(f"param_dtype {param_dtype!r} is not supported; use float32 or bfloat16")
        self.mesh = mesh
        device = _mesh_device(mesh)
        # float32 master weights; fully_shard moves each unit to the mesh's device as it shards
        # it, so a model given on the host reaches the device one layer at a time
        if lora is not None:
            model = with_adapters(model, lora)
        model = model.to(dtype=torch.float32)
        shard_model(model, mesh, param_dtype, reshard_after_forward, offload=offload_param)
        shard_mesh = _shard_mesh(mesh)
        if offload_param:  # the moments are already in host memory, next to the shards
            options["offload_optimizer"] = False
        if dp_group is _MESH:
            dp_group = shard_mesh.get_group()
        self.inner = TrainEngine(model, device=device, dp_group=dp_group, cp_group=cp_group,
                                 sharded=True, **options)

    @classmethod
    def frozen(cls, model: torch.nn.Module, *, mesh: Any, param_dtype: str = "float32",
               offload: bool = False, cp_group: Any = None, dp_group: Any = _MESH,
               **batching: Any) -> FSDP2Engine:
        """A forward-only engine (the reference): parameters sharded in `param_dtype` itself,
        without float32 masters, gradients or optimizer state; `offload` keeps the shards in
        host memory. `cp_group`, `dp_group`: as in `__init__`. `batching`: `max_token_len`,
        `remove_padding` (see `TrainEngine`)."""
        engine = cls.__new__(cls)
        engine.mesh = mesh
        model = model.to(dtype=PARAM_DTYPES[param_dtype]).requires_grad_(False)
        shard_model(model, mesh, param_dtype, offload=offload)
        shard_mesh = _shard_mesh(mesh)
        engine.inner = TrainEngine(model, device=_mesh_device(mesh),
                                   dp_group=shard_mesh.get_group() if dp_group is _MESH
                                   else dp_group,
                                   cp_group=cp_group, sharded=True, param_dtype=param_dtype,
                                   lr=0.0, **batching)
        return engine

    @classmethod
    def from_spec(cls, model: torch.nn.Module, actor: Any, total_steps: int, dtype: str,
                  mesh: Any, **groups: Any) -> FSDP2Engine:
        """An engine configured by the spec's `actor` section over `mesh` (`dtype`: compute;
        `groups`: `cp_group` and `dp_group`, see `__init__`)."""
        return cls(model, mesh=mesh, param_dtype=dtype, offload_param=actor.offload.param,
                   lora=actor.lora, **engine_options(actor, total_steps), **groups)

    model = property(lambda self: self.inner.model)
    step = property(lambda self: self.inner.step)

    @property
    def dp_group(self) -> Any:
        return self.inner.dp_group

    def forward_logprobs(self, *args: Any, **kwargs: Any):
        return self.inner.forward_logprobs(*args, **kwargs)

    def train_step(self, batch: Mapping[str, Any], loss_fn: LossFn, **options: Any) -> dict[str, float]:
        return self.inner.train_step(batch, loss_fn, **options)

    def weight_buckets(self, bucket_bytes: int = 512 << 20,
                       keep_split: Any = None) -> Iterator[WeightBucket]:
        return self.inner.weight_buckets(bucket_bytes, keep_split)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every weight in full on the CPU, on every rank (for a Hugging Face export; LoRA:
        merged)."""
        return self.inner.full_state_dict()

    @property
    def adapted(self) -> bool:
        return self.inner.adapted

    def adapters_off(self) -> Any:
        return self.inner.adapters_off()

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.inner.adapter_state()

    def state_dict(self) -> dict[str, Any]:
        """The schedule and the step (small, the same on every rank); the weights and the
        optimizer state are sharded: `save_sharded` writes them."""
        state = self.inner.state_dict()
        del state["optimizer"]
        return {**state, "sharded": True}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The step of `state_dict()` (load the shards with `load_sharded`)."""
        check_resumed(state, self.adapted)
        self.inner.step = int(state["step"])

    def save_sharded(self, folder: str | Path) -> None:
        """The float32 master weights and the AdamW state into a `torch.distributed.checkpoint`
        folder, each rank writing its own shards (LoRA: the adapters' only, the frozen base is
        the model's folder). A collective: every rank calls it."""
        from torch.distributed import checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.inner.optimizer,
                                          options=self._dcp_options())
        dcp.save({"model": model, "optimizer": optimizer}, checkpoint_id=str(folder),
                 process_group=None)  # every rank of the role

    def load_sharded(self, folder: str | Path) -> None:
        """Weights and optimizer state from a `save_sharded` folder, written by any number of
        ranks (DCP reshards them); an InputError naming the folder when it holds another
        model's state. A collective: every rank calls it."""
        from torch.distributed import checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        folder = Path(folder)
        if not (folder / ".metadata").is_file():
            raise InputError(f"{folder}: not a sharded checkpoint (no .metadata); it was saved "
                             "with another actor.strategy, or is incomplete")
        check_sharded_keys(folder, self.model, trained_only=self.adapted)
        model, optimizer = get_state_dict(self.model, self.inner.optimizer,
                                          options=self._dcp_options())
        state = {"model": model, "optimizer": optimizer}
        try:
            dcp.load(state, checkpoint_id=str(folder), process_group=None)  # every rank of the role
        except Exception as exc:  # DCP wraps every rank's failure in a CheckpointException
            raise InputError(f"{folder}: cannot load this sharded checkpoint into "
                             f"{type(self.model).__name__}: {_first_line(exc)}") from exc
        set_state_dict(self.model, self.inner.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"], options=self._dcp_options())

    def _dcp_options(self) -> Any:
        """What the sharded checkpoint holds: every weight, or (LoRA) the adapters only."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.adapted, strict=not self.adapted)

    def offload(self) -> None:
        """The optimizer state to host memory (the parameter shards move only with
        `offload_param`, which keeps them there throughout)."""
        self.inner._move_optimizer(torch.device("cpu"))

    def reload(self) -> None:
        self.inner._move_optimizer(self.inner.device)


def sharded_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """The full shape of every model tensor of a `save_sharded` folder (its metadata only)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(folder)).read_metadata()
    return {key.removeprefix("model."): tuple(item.size)
            for key, item in meta.state_dict_metadata.items()
            if key.startswith("model.") and isinstance(item, TensorStorageMetadata)}


def check_sharded_keys(folder: str | Path, model: torch.nn.Module,
                       trained_only: bool = False) -> None:
    """An InputError naming `folder` when its weights are not `model`'s: names or shapes differ
    (`trained_only`: of the trained parameters only, a LoRA model's adapters)."""
    saved = sharded_shapes(folder)
    want = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if trained_only:
        want = {name: want[name] for name in adapter_names(model)}
    missing = sorted(set(want) - set(saved))
    wrong = sorted(n for n in set(want) & set(saved) if want[n] != saved[n])
    if missing or wrong:
        shown = [f"{n} (missing)" for n in missing[:3]] + \
            [f"{n} {list(saved[n])} != {list(want[n])}" for n in wrong[:3]]
        raise InputError(f"{folder}: this checkpoint holds another model's weights "
                         f"({len(missing)} missing, {len(wrong)} of another shape: "
                         f"{', '.join(shown)}); resume it with the model it was saved from, "
                         "or start afresh (trainer.resume_mode: disable)")


def _mesh_device(mesh: Any) -> torch.device:
    """This rank's device of `mesh` (its current accelerator; the CPU for a CPU mesh)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.accelerator.current_device_index())


def _first_line(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
