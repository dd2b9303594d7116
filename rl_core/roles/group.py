"""Worker groups: one role's ranks, in this process or as Ray actors, called alike.

    group = LocalGroup("actor", [ActorWorker(spec)])                  # the single-process trainer
    group = RayGroup.start("actor", ActorWorker, spec, size=2, placement=placement)
    results = group.call("logprobs", data)                            # every rank, same arguments
    results = group.map("update", [(shard0,), (shard1,)])             # rank r gets its own
    outs = collect(actor.submit("drain", ...), ref.submit("drain", ...))  # stages at once

The controller never touches a role's device state: it calls a few coarse methods. A call that
fails on any rank — an exception inside it, or its process gone — raises `RoleFailed` naming the
role, the rank and the error as soon as Ray reports it, without waiting for the other ranks
(which may be blocked in a collective with the dead one). An `InputError` or `TrainingStopped`
raised inside a role keeps its type, so the command's exit code still tells a spec error from a
failure.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rl_core.errors import InputError, RoleFailed, TrainingStopped
from rl_core.precision import PrecisionPlan, StageDumper
from rl_core.profiling import ProfilePlan, StageProfiler

# The stages whose model's modules a precision dump records: the forwards and backwards of the
# training engine. The rollout's data is dumped (by the controller) but not its decoding steps'
# modules: thousands of forwards per response, and vLLM's model is not this one.
MODULE_STAGES = ("ref_logprob", "old_logprob", "values", "update")

# How long a rank waits in a collective before giving up; a dead peer is normally noticed by
# the controller long before (Ray reports a lost actor within seconds).
COLLECTIVE_TIMEOUT_S = float(os.environ.get("RL_CORE_COLLECTIVE_TIMEOUT_S", "600"))


class Worker:
    """Base of every role: its rank in the role's group and the group's process group."""

    role = "worker"

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self.dp_group = None
        # context and tensor parallelism: blocks of context × tensor ranks share rows
        # (`cp_group`: the block's ranks at one tensor-parallel index); then `dp_group` holds
        # the ranks with different rows
        self.context_parallel, self.tensor_parallel, self.cp_group = 1, 1, None
        # expert parallelism: blocks of this many ranks split the experts (rows their own)
        self.expert_parallel = 1
        # rollout groups (the actor's): blocks of this many consecutive ranks generate together
        self.rollout_parallel, self.rollout_group = 1, None
        self.stage_peaks: dict[str, float] = {}  # stage -> peak bytes (see `measured`)
        self.profiler = StageProfiler(self.role, rank)  # traces of chosen stages
        self.dumper = StageDumper(self.role, rank)  # precision dumps of chosen stages
        threads = os.environ.get("RL_CORE_THREADS")  # set per rank by the Ray placement
        if threads:
            import torch

            torch.set_num_threads(int(threads))

    @contextlib.contextmanager
    def measured(self, stage: str) -> Iterator[None]:
        """Record the device's peak memory during `stage` (on cpu the process's peak resident
        set); `memory()` reports it. In a profiled or dumped step the chosen stages are also
        traced and their model's modules dumped (`begin_tools`)."""
        from rl_core import device as devices

        device = getattr(self, "device", "cpu")
        model = getattr(self, "model", None) if stage in MODULE_STAGES else None
        dumped = self.dumper.stage(stage, model) if model is not None else contextlib.nullcontext()
        devices.reset_peak(device)
        try:
            with self.profiler.stage(stage, device), dumped:
                yield
        finally:
            peak = devices.memory_stats(device)["peak_bytes"]
            self.stage_peaks[stage] = max(self.stage_peaks.get(stage, 0.0), peak)

    def begin_tools(self, profile: ProfilePlan | None,
                    precision: PrecisionPlan | None) -> dict[str, list[str]]:
        """Trace and dump the next step's chosen stages under the plans (None: nothing);
        returns the files written in the step before: `{"traces": [...], "dumps": [...]}`
        (see `rl_core.profiling` and `rl_core.precision`)."""
        return {"traces": self.profiler.begin(profile), "dumps": self.dumper.begin(precision)}

    def determinism(self) -> dict[str, Any]:
        """What this rank's process has set for reproducible steps (`rl_core.determinism`)."""
        from rl_core.determinism import process_report

        return process_report(self.role, self.rank, getattr(self, "device", "cpu"))

    def memory(self) -> dict[str, float]:
        """Memory now (`allocated_bytes`), the peak since the last call (`peak_bytes`) and the
        peak of each stage measured since (`<stage>/peak_bytes`); then a new period starts."""
        from rl_core import device as devices

        device = getattr(self, "device", "cpu")
        stats = devices.memory_stats(device)
        out = {**{f"{stage}/peak_bytes": peak for stage, peak in self.stage_peaks.items()},
               "allocated_bytes": stats.get("allocated_bytes", 0.0),
               "peak_bytes": max([stats["peak_bytes"], *self.stage_peaks.values()])}
        self.stage_peaks = {}
        devices.reset_peak(device)
        return out

    def layout(self) -> dict[str, int]:
        """This rank's place: its rank, the role's size, the sizes of its data-, context- and
        tensor-parallel groups, and the context- and tensor-parallel groups its engine computes
        with (1: none)."""
        import torch.distributed as dist

        def size(group: Any) -> int:
            return dist.get_world_size(group) if group is not None and dist.is_initialized() else 1

        engine = getattr(self, "engine", None)
        inner = getattr(engine, "inner", engine)
        mesh = getattr(engine, "mesh", None)
        names = getattr(mesh, "mesh_dim_names", None) or ()
        return {"rank": self.rank, "world_size": self.world_size,
                "data_parallel": size(self.dp_group), "context_parallel": size(self.cp_group),
                "tensor_parallel": self.tensor_parallel, "rollout_parallel": self.rollout_parallel,
                "engine_context_parallel": size(getattr(inner, "cp_group", None)),
                "engine_tensor_parallel": mesh["tp"].size() if "tp" in names else 1,
                "engine_expert_parallel": mesh["ep"].size() if "ep" in names else 1}

    def ping(self) -> int:
        """The process id: proves the rank is up (and lets tests kill it)."""
        return os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """An address and a free port on this rank's host for the group's process group."""
        host = _node_address()
        with socket.socket() as sock:
            sock.bind(("", 0))
            return host, sock.getsockname()[1]

    def init_distributed(self, host: str, port: int, backend: str) -> None:
        """Join the role's process group (a role's ranks are processes of their own; in the
        local backend the roles share one process and its one-rank group), then
        `on_distributed`."""
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                    world_size=self.world_size,
                                    timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        elif dist.get_world_size() != self.world_size:
            raise RuntimeError(f"{self.role}: this process is in a group of "
                               f"{dist.get_world_size()} ranks, not {self.world_size}")
        self.dp_group = dist.group.WORLD
        if self.context_parallel > 1 or self.tensor_parallel > 1:
            from rl_core.engines.context import context_groups

            self.dp_group, self.cp_group = context_groups(
                self.world_size, self.context_parallel, self.tensor_parallel)
        if self.rollout_parallel > 1:
            size = self.rollout_parallel
            for first in range(0, self.world_size, size):  # every rank makes every group
                group = dist.new_group(list(range(first, first + size)))
                if first <= self.rank < first + size:
                    self.rollout_group = group
        self.on_distributed()

    def init_alone(self, backend: str) -> None:
        """A group of this one rank (FSDP2 shards over a process group, even of one rank)."""
        self.init_distributed(*self.rendezvous(), backend)

    def on_distributed(self) -> None:
        """What a role builds once its process group exists (a sharded engine)."""

    def drain(self, channel: Any, stage: str, needs: Sequence[str], chunk_size: int,
              timeout_s: float, span: tuple[int, int] | None = None) -> dict[str, float]:
        """Process `stage` from the data channel, chunk by chunk, until every row (of `span`)
        is done."""
        import time

        from rl_core.data.channel import drain

        started = time.perf_counter()
        out = drain(channel, stage, needs, chunk_size, lambda chunk: self.compute(stage, chunk),
                    timeout_s=timeout_s, span=span)
        return {**out, "seconds": time.perf_counter() - started}

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no stage {stage!r}")

    def shutdown(self) -> None:
        """Release what the role holds (collectives, worker processes)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _node_address() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return "127.0.0.1"


# --------------------------------------------------------------------------- pending calls


@dataclass
class Pending:
    """Calls in flight on a group's ranks (or, for a local group, their finished results)."""

    group: Any
    refs: list[Any]
    method: str


def collect(*pendings: Pending, timeout_s: float | None = None) -> list[list[Any]]:
    """The results of each pending call, per rank; the first failure on any rank raises."""
    remote = [p for p in pendings if isinstance(p.group, RayGroup)]
    if remote:
        _wait_remote(remote, timeout_s)
    return [p.refs if not isinstance(p.group, RayGroup) else p.group.results(p) for p in pendings]


def _wait_remote(pendings: list[Pending], timeout_s: float | None) -> None:
    import ray

    owner = {ref: (p.group, rank, p.method) for p in pendings for rank, ref in enumerate(p.refs)}
    waiting = list(owner)
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1, timeout=timeout_s)
        if not ready:
            group, rank, method = owner[waiting[0]]
            raise RoleFailed(group.name, rank, f"{method} did not return within {timeout_s:.0f} s")
        for ref in ready:  # raise now if this rank failed, whatever the others do
            group, rank, _ = owner[ref]
            group.check(ref, rank)


# --------------------------------------------------------------------------- groups


class LocalGroup:
    """A role's single rank in this process: calls run at once, in order."""

    def __init__(self, name: str, workers: Sequence[Worker]) -> None:
        self.name, self.workers = name, list(workers)

    @property
    def size(self) -> int:
        return len(self.workers)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        return Pending(self, [getattr(w, method)(*args, **kwargs) for w in self.workers], method)

    def submit_map(self, method: str, per_rank: Sequence[tuple]) -> Pending:
        return Pending(self, [getattr(w, method)(*a) for w, a in zip(self.workers, per_rank)],
                       method)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.submit(method, *args, **kwargs).refs

    def map(self, method: str, per_rank: Sequence[tuple]) -> list[Any]:
        return self.submit_map(method, per_rank).refs

    def shutdown(self) -> None:
        for worker in self.workers:
            worker.shutdown()


class RayGroup:
    """A role's ranks as Ray actors, one per bundle of a placement group; ranks > 1 are joined
    by a `torch.distributed` process group on `backend`."""

    def __init__(self, name: str, actors: list[Any]) -> None:
        self.name, self.actors = name, actors

    @classmethod
    def start(cls, name: str, worker_cls: type[Worker], *args: Any, size: int,
              options: list[dict[str, Any]], backend: str = "gloo",
              timeout_s: float | None = None, in_order: bool = False,
              **kwargs: Any) -> RayGroup:
        """Start `size` actors of `worker_cls(*args, rank=r, world_size=size, **kwargs)` with
        `options[r]` (Ray actor options: resources, scheduling strategy, runtime env). A rank
        runs two calls at once (one may wait in a collective while another reports), or, with
        `in_order`, one call after another in the order submitted."""
        import ray

        remote_cls = ray.remote(worker_cls)
        concurrency = 1 if in_order else 2
        actors = [
            remote_cls.options(max_restarts=0, max_concurrency=concurrency,
                               **options[rank]).remote(
                *args, rank=rank, world_size=size, **kwargs)
            for rank in range(size)
        ]
        group = cls(name, actors)
        try:
            group.call("ping", timeout_s=timeout_s)
            if size > 1:
                host, port = ray.get(group.actors[0].rendezvous.remote())
                group.call("init_distributed", host, port, backend, timeout_s=timeout_s)
        except BaseException:
            group.kill()
            raise
        return group

    @property
    def size(self) -> int:
        return len(self.actors)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        return Pending(self, [getattr(a, method).remote(*args, **kwargs) for a in self.actors],
                       method)

    def submit_map(self, method: str, per_rank: Sequence[tuple]) -> Pending:
        if len(per_rank) != self.size:
            raise ValueError(f"{self.name}: {len(per_rank)} argument sets for {self.size} ranks")
        return Pending(self, [getattr(a, method).remote(*args)
                              for a, args in zip(self.actors, per_rank)], method)

    def call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> list[Any]:
        return collect(self.submit(method, *args, **kwargs), timeout_s=timeout_s)[0]

    def map(self, method: str, per_rank: Sequence[tuple], timeout_s: float | None = None) -> list[Any]:
        return collect(self.submit_map(method, per_rank), timeout_s=timeout_s)[0]

    def check(self, ref: Any, rank: int) -> None:
        """Raise the failure behind a finished call, if any (typed for spec errors and stops)."""
        import ray

        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (TrainingStopped, InputError)):
                raise cause from None  # the same exit status as in one process
            raise RoleFailed(self.name, rank, _one_line(cause or exc)) from None
        except ray.exceptions.RayActorError as exc:
            raise RoleFailed(self.name, rank, "its process died: " + _one_line(exc)) from None

    def results(self, pending: Pending) -> list[Any]:
        import ray

        return ray.get(pending.refs)

    def shutdown(self) -> None:
        """Release collectives and processes; never raises (ranks may be dead already)."""
        import ray

        try:
            ray.get([a.shutdown.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 - best effort before the kill
            pass
        self.kill()

    def kill(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    last = text[-1] if text else ""
    return f"{type(exc).__name__}: {last}" if last else type(exc).__name__
