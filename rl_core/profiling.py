"""Profiler traces of chosen steps, stages and ranks (`tools.profiling`).

The controller tells every role's ranks, before each step, whether the step is profiled
(`ProfilePlan.for_step`, then `Worker.begin_profile`); each rank whose number is in
`tools.profiling.ranks` then traces each chosen stage it runs: the stages a role already times
and measures (`Worker.measured`: rollout, reward, ref_logprob, old_logprob, values, update,
weight_sync) are the units. One stage call gives one trace file,

    <trainer.output_dir>/<tools.profiling.output>/step_<N>/<role>-rank<R>-<stage>[-<k>].json

in the Chrome trace format the profiler itself writes (torch.profiler on cpu and cuda; on npu
torch_npu's profiler writes its own folder of that name, which its analysis tools read). The
controller then logs `step_<N>/` to MLflow as artifacts under `profiles/`.

Profiling only the chosen stage calls (rather than whole steps with a schedule) keeps the cost
to those calls: the profiler is off everywhere else, and a step that is not profiled pays one
flag check per stage. Only one trace runs per process at a time (the local backend keeps every
role in one process; a profiler cannot nest), so a stage inside another traced one is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

_ACTIVE = threading.Lock()  # one profiler per process


@dataclass(frozen=True)
class ProfilePlan:
    """What to trace in one profiled step (sent to every rank; plain data, picklable)."""

    step: int
    folder: str  # the step's folder of traces
    ranks: tuple[int, ...]
    stages: tuple[str, ...]
    level: int  # 0, 1 or 2
    with_stack: bool
    record_shapes: bool
    with_memory: bool

    @classmethod
    def for_step(cls, spec: Any, step: int) -> ProfilePlan | None:
        """The plan of `step` (1-based) under `spec.tools.profiling`; None when not profiled."""
        config = spec.tools.profiling
        if not config.enable or step not in config.steps:
            return None
        folder = Path(spec.trainer.output_dir) / config.output / f"step_{step}"
        return cls(step=step, folder=str(folder), ranks=tuple(config.ranks),
                   stages=tuple(config.stages), level=int(config.level.removeprefix("level")),
                   with_stack=config.with_stack or config.level == "level2",
                   record_shapes=config.record_shapes or config.level != "level0",
                   with_memory=config.with_memory or config.level == "level2")


class StageProfiler:
    """A rank's traces: `begin(plan)` before a step, `stage(name)` around each stage call."""

    def __init__(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank
        self.plan: ProfilePlan | None = None
        self.calls: Counter[str] = Counter()  # stage -> calls traced in this step
        self.written: list[str] = []  # trace paths of this step

    def begin(self, plan: ProfilePlan | None) -> list[str]:
        """Start a step under `plan` (None: not profiled); returns the traces of the last."""
        written, self.written = self.written, []
        self.plan = plan if plan is not None and self.rank in plan.ranks else None
        self.calls.clear()
        return written

    @contextlib.contextmanager
    def stage(self, name: str, device: Any = "cpu") -> Iterator[None]:
        """Trace the body when this step, rank and stage are chosen; a no-op otherwise."""
        plan = self.plan
        if plan is None or name not in plan.stages:
            yield
            return
        if not _ACTIVE.acquire(blocking=False):
            log.info("profiling: %s of %s rank %d runs inside another traced stage; not traced "
                     "on its own", name, self.role, self.rank)
            yield
            return
        try:
            self.calls[name] += 1
            count = self.calls[name]
            stem = f"{self.role}-rank{self.rank}-{name}" + (f"-{count}" if count > 1 else "")
            path = Path(plan.folder) / f"{stem}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            with _profile(plan, device, path) as record:
                with record(f"rl_core/{self.role}/{name}"):
                    yield
            self.written.append(str(path))
        finally:
            _ACTIVE.release()


@contextlib.contextmanager
def _profile(plan: ProfilePlan, device: Any, path: Path) -> Iterator[Any]:
    """One profiler session around the body, its trace written to `path`; yields the
    profiler's `record_function`."""
    from rl_core import device as devices

    profiler, kind = devices.profiler_for(device)
    options = {"record_shapes": plan.record_shapes, "with_stack": plan.with_stack,
               "profile_memory": plan.with_memory, "with_flops": plan.level >= 1}
    activities = [profiler.ProfilerActivity.CPU]
    if kind == "npu":
        levels = {0: profiler.ProfilerLevel.Level0, 1: profiler.ProfilerLevel.Level1,
                  2: profiler.ProfilerLevel.Level2}
        session = profiler.profile(
            activities=[*activities, profiler.ProfilerActivity.NPU], **options,
            experimental_config=profiler._ExperimentalConfig(profiler_level=levels[plan.level]),
            on_trace_ready=profiler.tensorboard_trace_handler(str(path)))
    else:
        if kind == "cuda":
            activities.append(profiler.ProfilerActivity.CUDA)
        session = profiler.profile(activities=activities, **options)
    import torch

    with session:
        yield torch.profiler.record_function
    if kind != "npu":
        session.export_chrome_trace(str(path))
