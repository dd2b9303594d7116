"""Precision dumps of chosen steps, stages and ranks, and the first divergence between two runs
(`tools.precision`).

The controller sends every role's ranks, before each step, the step's plan
(`PrecisionPlan.for_step`, then `StageDumper.begin`); a rank whose number is in
`tools.precision.ranks` then dumps each chosen stage it runs, as profiling traces them:

    <trainer.output_dir>/<tools.precision.output>/step_<N>/<role>-rank<R>/<stage>[-<k>]/
        dump.json construct.json stack.json   msprobe's module dump (`stage(name, model)`)
        dump_tensor_data/*.pt                 full tensors, in `tensor` mode
        data.safetensors data.json            the stage's RL data (`data(name, tensors)`)

and `compare(a, b)` (or `python -m rl_core precision compare A B`) aligns two such folders and
names the first tensor, in the order the pipeline computes them, where they part.

What msprobe (Huawei Ascend's precision tool, on PyPI as mindstudio-probe) does here, and why:

* The module dump is msprobe's own (`msprobe.pytorch.PrecisionDebugger`, level `L0`): the
  forward inputs, parameters and outputs and the backward gradients of every `nn.Module` below
  the model (the root itself is skipped), as `Module.<path>.<Class>.forward.<call>`,
  `....backward.<call>` and `....parameters_grad.<call>` entries with Max/Min/Mean/Norm
  (`statistics`) or, in `tensor` mode, a `.pt` file each. Its files are msprobe's unchanged, so
  msprobe's own tools (compare, visualization) read them; we only move them out of msprobe's
  `step0/rank<R>/` folder into the stage's (and, in tensor mode, point `dump_data_dir` there).
  `tools.precision.modules` is msprobe's `list`: an entry is dumped when one of the strings is
  part of its full name (module path or class).
* msprobe's debugger is one per process (`PrecisionDebugger()` returns the first instance and
  ignores later arguments), and it leaves its hooks on a model after `stop()`. So one debugger
  serves every stage of a process (the local backend runs every role in one): before each
  dumped stage it is pointed at the stage's folder (a new `DebuggerConfig` applied to its
  service, the base service's step that the hot reload uses, without re-creating its module
  processor, which would wrap torch's `BackwardHook` again each time), then started on the
  stage's model and stopped, and its hooks are taken off the model again (otherwise every later
  forward pays them and the model no longer pickles). Only one stage dumps at a time; a stage
  inside another dumped one is skipped. A model hooked earlier is unhooked, so it is not dumped
  when it runs inside another model's stage. (Creating the debugger wraps torch's
  `BackwardHook.setup_input_hook`/`setup_output_hook` for the rest of the process: msprobe's.)
* The module comparison is msprobe's compare (`msprobe.pytorch.compare.pt_compare.pt_compare`,
  which runs on CPU): in `statistics` mode its summary compare (`Max diff` ... `L2norm diff` =
  b - a of each statistic; `MaxRelativeErr` ... `NormRelativeErr` = |b - a| / |a|, which it
  writes as percent strings and we keep as fractions), in `tensor` mode its tensor compare
  (`Cosine`, `MaxAbsErr`, `MaxRelativeErr` per element: our `cosine`, `max_abs_err`,
  `max_rel_err`), tensors of two dtypes too (a bf16 run against an fp32 one; msprobe leaves
  Mean and Norm of float64 tensors out). A statistics dump against a tensor one is compared by
  statistics. We parse its CSV.

What msprobe lacks, so is ours: the RL data of a stage (prompts, responses, rewards,
advantages, log-probs, losses: not module tensors; saved as safetensors with their statistics,
compared with msprobe's cosine/abs/rel algorithms, integer data exactly); thresholds and the
first divergence: msprobe's summary compare marks no row (its `Result` is `pass` even for a
statistic off by 200%), and its first-diff analysis (`compare -da`, `find_first`) judges only
module outputs, by relative errors over 50% fixed in its package, across the ranks of one
dump, knowing no stages of an RL step. `compare` orders stages as the pipeline runs them (`PIPELINE_STAGES`; others
last, by name), entries by their place in dump.json (msprobe writes an entry when the module
returns, so a module's output comes after its children's and forward before backward), tensors
inside an entry as inputs, parameters, outputs; a tensor diverges when its cosine is under
`cosine_min` or its error is over both `abs_max` and `rel_max` (as `torch.allclose`: an error
passes when it is small absolutely or relatively, so a mean near zero does not flag a tiny
change); in statistics mode the test is on each statistic. A shape mismatch, or NaN/Inf in
different places, diverges too. Entries on one side only are reported (`only_in_a`,
`only_in_b`), not counted as divergence.

msprobe refuses paths with characters outside `[A-Za-z0-9_.:/-]`: `PrecisionPlan.for_step`
rejects such an output folder (InputError), and `compare` copies statistics dumps to a temporary
folder first (tensor dumps are read in place).

Test hook: `perturb(model, module_name, scale)` shifts one module's output by `scale` times its
standard deviation; the environment variable
`RL_CORE_PRECISION_PERTURB="[<stage>:]<module>=<scale>"` (comma-separated for several) makes
`StageDumper.stage` apply it to the stage's model, so a test can perturb a run in another
process. Not for training runs.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_core.errors import InputError

log = logging.getLogger(__name__)

_ACTIVE = threading.Lock()  # one msprobe dump per process

# The RL pipeline's stages in the order a step runs them; `compare` orders stages by this,
# others after, by name. `advantages` is the controller's (data only).
PIPELINE_STAGES = ("rollout", "reward", "ref_logprob", "old_logprob", "values", "advantages",
                   "update", "weight_sync")
DEFAULT_STAGES = PIPELINE_STAGES[:-1]  # weight_sync runs no forward: nothing to dump
PERTURB_ENV = "RL_CORE_PRECISION_PERTURB"
MSPROBE_PATH = re.compile(r"^[a-zA-Z0-9_.:/-]+$")  # msprobe's FileCheckConst.FILE_VALID_PATTERN
DUMP_FILES = ("dump.json", "construct.json", "stack.json")
STATS = ("Max", "Min", "Mean", "L2norm")  # msprobe's statistics; their compare columns:
DIFF_COLUMNS = tuple(f"{s} diff" for s in STATS)
REL_COLUMNS = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")


# --------------------------------------------------------------------------- plan and dumper


@dataclass(frozen=True)
class PrecisionPlan:
    """What to dump in one step (sent to every rank; plain data, picklable)."""

    step: int
    folder: str  # the step's folder of dumps
    ranks: tuple[int, ...]
    mode: str  # statistics | tensor
    modules: tuple[str, ...]  # dump entries whose name contains one of these; empty: all
    stages: tuple[str, ...]

    @classmethod
    def for_step(cls, spec: Any, step: int) -> PrecisionPlan | None:
        """The plan of `step` (1-based) under `spec.tools.precision`; None when not dumped.
        Raises InputError when dumps are on and the folder is one msprobe refuses."""
        config = spec.tools.precision
        if not config.enable:
            return None
        folder = Path(spec.trainer.output_dir) / config.output / f"step_{step}"
        real = os.path.realpath(folder)
        if not MSPROBE_PATH.match(real):
            raise InputError(f"tools.precision: msprobe cannot write to {real!r}: its path may "
                             "hold only letters, digits and _ . : / - (trainer.output_dir, "
                             "tools.precision.output)")
        if step not in config.steps:
            return None
        return cls(step=step, folder=str(folder), ranks=tuple(config.ranks),
                   mode=str(getattr(config, "mode", "statistics")),
                   modules=tuple(getattr(config, "modules", ()) or ()),
                   stages=tuple(getattr(config, "stages", None) or DEFAULT_STAGES))


class StageDumper:
    """A rank's dumps: `begin(plan)` before a step, `stage(name, model)` around each stage call,
    `data(name, tensors)` for the stage's RL data."""

    def __init__(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank
        self.plan: PrecisionPlan | None = None
        self.calls: Counter[str] = Counter()  # stage -> module dumps in this step
        self.data_calls: Counter[str] = Counter()  # stage -> data() calls in this step
        self.active: str | None = None  # folder of the stage dumping now
        self.written: list[str] = []  # files of this step

    def begin(self, plan: PrecisionPlan | None) -> list[str]:
        """Start a step under `plan` (None: not dumped); returns the files of the last one
        (a tensor dump's `dump_tensor_data` folder as one entry)."""
        written, self.written = self.written, []
        self.plan = plan if plan is not None and self.rank in plan.ranks else None
        self.calls.clear()
        self.data_calls.clear()
        if self.plan is not None and self.role != "controller":
            import msprobe.pytorch  # noqa: F401 - its import (seconds) before the step, not in it
        return written

    def folder(self, stage: str, call: int = 1) -> Path:
        """Where the `call`-th call of `stage` in this step goes (a plan must be set)."""
        assert self.plan is not None
        name = stage if call == 1 else f"{stage}-{call}"
        return Path(self.plan.folder) / f"{self.role}-rank{self.rank}" / name

    def chosen(self, stage: str) -> bool:
        return self.plan is not None and stage in self.plan.stages

    @contextlib.contextmanager
    def stage(self, name: str, model: Any = None) -> Iterator[None]:
        """Dump `model`'s modules (forward and backward) during the body when this step, rank
        and stage are chosen; a no-op otherwise (but for the test hook `PERTURB_ENV`)."""
        with _env_perturbation(name, model):
            plan = self.plan
            if plan is None or name not in plan.stages:
                yield
                return
            if not _ACTIVE.acquire(blocking=False):
                log.info("precision: %s of %s rank %d runs inside another dumped stage; not "
                         "dumped on its own", name, self.role, self.rank)
                yield
                return
            try:
                self.calls[name] += 1
                folder = self.folder(name, self.calls[name])
                folder.mkdir(parents=True, exist_ok=True)
                self.active = str(folder)
                if model is None:
                    yield
                else:
                    with _dump(model, folder, plan, self.rank):
                        yield
                    self.written.extend(_listing(folder, DUMP_FILES + ("dump_tensor_data",)))
            finally:
                self.active = None
                _ACTIVE.release()

    def data(self, name: str, tensors: Mapping[str, Any]) -> list[str]:
        """Save stage `name`'s RL data (any tensors the caller has: prompts, responses,
        rewards, advantages, log-probs, losses) as `data.safetensors` and their statistics as
        `data.json`, beside the stage's module dump; returns the files (none when not chosen).
        A list of tensors is saved as `<key>.0`, `<key>.1`, ...; numbers and lists become
        tensors; anything else is skipped with a warning."""
        if not self.chosen(name):
            return []
        import torch
        from safetensors.torch import save_file

        self.data_calls[name] += 1
        folder = self.folder(name, self.data_calls[name])
        # data saved before its stage's module dump ran is that stage's input; else its output
        before = str(folder) != self.active and not (folder / "dump.json").exists()
        flat: dict[str, torch.Tensor] = {}
        for key, value in tensors.items():
            for sub, tensor in _as_tensors(str(key), value):
                flat[sub] = tensor.detach().to("cpu").contiguous().clone()
        folder.mkdir(parents=True, exist_ok=True)
        save_file(flat, str(folder / "data.safetensors"))
        summary = {"stage": name, "role": self.role, "rank": self.rank,
                   "step": self.plan.step if self.plan else None,
                   "order": "before_modules" if before else "after_modules",
                   "tensors": {key: tensor_stats(t) for key, t in flat.items()}}
        (folder / "data.json").write_text(json.dumps(summary, indent=1) + "\n")
        files = [str(folder / "data.safetensors"), str(folder / "data.json")]
        self.written.extend(files)
        return files


def update_data(metrics: Mapping[str, float]) -> dict[str, float]:
    """What a dump keeps of an update's metrics: its losses and statistics (`actor/*`,
    `critic/*`), not the schedule's learning rates."""
    return {k: v for k, v in metrics.items()
            if k.startswith(("actor/", "critic/")) and not k.endswith("/lr")}


def tensor_stats(tensor: Any) -> dict[str, Any]:
    """shape, dtype, min, max, mean and L2 norm of a tensor (computed in float64; None when
    empty; non-finite values as "nan", "inf", "-inf")."""
    import torch

    values = tensor.detach().to("cpu")
    out: dict[str, Any] = {"shape": list(values.shape), "dtype": str(values.dtype)}
    if values.numel() == 0:
        return {**out, "min": None, "max": None, "mean": None, "norm": None}
    values = values.to(torch.float64)
    return {**out, **{k: _finite(float(v)) for k, v in (
        ("min", values.min()), ("max", values.max()), ("mean", values.mean()),
        ("norm", torch.linalg.vector_norm(values)))}}


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _as_tensors(key: str, value: Any) -> list[tuple[str, Any]]:
    import torch

    if isinstance(value, torch.Tensor):
        return [(key, value)]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor)
                                                           for v in value):
        return [(f"{key}.{i}", v) for i, v in enumerate(value)]
    try:
        return [(key, torch.as_tensor(value))]
    except (TypeError, ValueError, RuntimeError):
        log.warning("precision: %s is a %s, not a tensor; not saved", key, type(value).__name__)
        return []


def _listing(folder: Path, names: Sequence[str]) -> list[str]:
    return [str(folder / n) for n in names if (folder / n).exists()]


# --------------------------------------------------------------------------- msprobe dumping


def _msprobe_quiet() -> None:
    """msprobe prints its INFO lines to stdout on every start and stop; keep its warnings and
    errors (unless the user chose a level with MSPROBE_LOG_LEVEL)."""
    if os.environ.get("MSPROBE_LOG_LEVEL") is not None:
        return
    from msprobe.core.common.log import logger as core_logger
    from msprobe.pytorch.common.log import logger as torch_logger

    for logger in (core_logger, torch_logger):
        logger.level = max(logger.level, 2)  # WARNING


def _debugger(task: str, dump_path: str) -> Any:
    """The process's one msprobe debugger (created at the first dumped stage, level L0)."""
    from msprobe.pytorch import PrecisionDebugger

    _msprobe_quiet()
    debugger = PrecisionDebugger(task=task, dump_path=dump_path, level="L0")
    if debugger.service.config.level != "L0":
        raise RuntimeError("precision: this process's msprobe debugger was created at level "
                           f"{debugger.service.config.level}, not L0 (module dumps)")
    return debugger


def _retarget(debugger: Any, task: str, dump_path: str, modules: Sequence[str]) -> None:
    """Point the debugger at `dump_path` with `task` and `modules` (msprobe's `list`)."""
    from msprobe.core.dump.service import BaseService
    from msprobe.pytorch.dump.debugger.debugger_config import DebuggerConfig
    from msprobe.pytorch.dump.pt_config import parse_task_config

    task_config = parse_task_config(task, {})
    config = DebuggerConfig(debugger.common_config, task_config, task, dump_path, "L0")
    config.list, config.step, config.rank = list(modules), [], []
    debugger.config = config
    # the base service's step (as msprobe's hot reload): a new data collector for the new
    # folder; PytorchService's own would also re-create its module processor, which wraps
    # torch's BackwardHook once more on every call
    BaseService.apply_runtime_config(debugger.service, config)


@contextlib.contextmanager
def _dump(model: Any, folder: Path, plan: PrecisionPlan, rank: int) -> Iterator[None]:
    """msprobe's L0 dump of `model` during the body, its files moved into `folder`."""
    from msprobe.pytorch import PrecisionDebugger

    staging = folder / ".msprobe"
    shutil.rmtree(staging, ignore_errors=True)
    debugger = _debugger(plan.mode, str(staging))
    _retarget(debugger, plan.mode, str(staging), plan.modules)
    PrecisionDebugger.set_init_step(0)  # msprobe's step folder: always step0 (ours is above)
    try:
        PrecisionDebugger.start(model, rank_id=rank)
        yield
    finally:
        try:
            PrecisionDebugger.stop()
            PrecisionDebugger.step()  # resets msprobe's call counters for the next stage
        finally:
            service = debugger.service
            _unhook(model)
            service.hooked_modules = [m for m in service.hooked_modules if m is not model]
            service.model = None
            _collect(staging, folder)


def _collect(staging: Path, folder: Path) -> None:
    """Move msprobe's files from `<staging>/step0/<rank|proc>/` into `folder`."""
    dumped = [d for d in (staging / "step0").glob("*") if (d / "dump.json").exists()]
    for source in dumped[:1]:
        for entry in source.iterdir():
            target = folder / entry.name
            if target.is_dir():
                shutil.rmtree(target)
            shutil.move(str(entry), str(target))
        dump = folder / "dump.json"
        if (folder / "dump_tensor_data").is_dir():
            text = dump.read_text()
            old = json.dumps(str(source / "dump_tensor_data"))
            dump.write_text(text.replace(old, json.dumps(str(folder / "dump_tensor_data")), 1))
    shutil.rmtree(staging, ignore_errors=True)


def _unhook(model: Any) -> None:
    """Take msprobe's module hooks off `model` (its pre-hook, forward hook, forward wrapper and
    marks), leaving the model as it was before `start`."""
    roots = model if isinstance(model, (list, tuple)) else [model]
    for root in roots:
        for module in root.modules():
            for hooks, extra in ((module._forward_pre_hooks, module._forward_pre_hooks_with_kwargs),
                                 (module._forward_hooks, module._forward_hooks_with_kwargs)):
                for key, hook in list(hooks.items()):
                    if "ModuleProcessor.build_module_hook" in getattr(hook, "__qualname__", ""):
                        del hooks[key]
                        extra.pop(key, None)
                        module._forward_hooks_always_called.pop(key, None)
            forward = module.__dict__.get("forward")
            if forward is not None and getattr(forward, "__qualname__", "").startswith(
                    "wrap_forward_with_hook_safety"):
                original = _closure(forward, "original_forward")
                if getattr(original, "__self__", None) is module and getattr(
                        original, "__func__", None) is type(module).forward:
                    del module.forward
                elif original is not None:
                    module.forward = original
            for mark in ("msprobe_hook", "msprobe_forward_hook"):
                module.__dict__.pop(mark, None)


def _closure(function: Any, name: str) -> Any:
    names = function.__code__.co_freevars
    return function.__closure__[names.index(name)].cell_contents if name in names else None


# --------------------------------------------------------------------------- test hook


class Perturbation:
    """A perturbed module's handle: `remove()` ends the perturbation."""

    def __init__(self, module: Any, scale: float) -> None:
        self.module, self.scale, self.active = module, float(scale), True
        self.previous = module.__dict__.get("forward")  # an instance forward set before ours
        inner = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            return _shift(out, self.scale) if self.active else out

        self.forward = forward
        module.forward = forward

    def remove(self) -> None:
        self.active = False
        if self.module.__dict__.get("forward") is self.forward:
            if self.previous is None:
                del self.module.forward
            else:
                self.module.forward = self.previous


def perturb(model: Any, module_name: str, scale: float) -> Perturbation:
    """TEST HOOK: add `scale * output.std()` to the output of `model`'s module `module_name`
    (a name of `model.named_modules()`; the first floating tensor of a tuple or mapping
    output); returns the handle (`.remove()`). The module's forward is wrapped rather than
    hooked: msprobe puts its forward hook before any other, so a forward hook's change would
    only show in the next module's input."""
    modules = dict(model.named_modules())
    if module_name not in modules:
        near = [n for n in modules if n and (module_name in n or n in module_name)][:5]
        raise ValueError(f"perturb: no module {module_name!r} in {type(model).__name__}"
                         + (f" (did you mean {', '.join(near)}?)" if near else ""))
    return Perturbation(modules[module_name], scale)


def _shift(out: Any, scale: float) -> Any:
    import torch

    if isinstance(out, torch.Tensor) and out.is_floating_point():
        std = out.detach().float().std() if out.numel() > 1 else torch.tensor(float("nan"))
        noise = float(std) if math.isfinite(float(std)) and float(std) > 0 else 1.0
        return out + scale * noise
    if isinstance(out, (tuple, list)):
        items = list(out)
        for i, item in enumerate(items):
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                items[i] = _shift(item, scale)
                return type(out)(items) if not hasattr(out, "_fields") else type(out)(*items)
        return out
    if isinstance(out, Mapping):
        for key, item in out.items():
            if isinstance(item, torch.Tensor) and item.is_floating_point():
                out[key] = _shift(item, scale)  # type: ignore[index]
                break
    return out


def _perturb_requests(stage: str) -> list[tuple[str, float]]:
    """(module, scale) pairs of PERTURB_ENV for `stage`."""
    raw = os.environ.get(PERTURB_ENV, "").strip()
    pairs = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        target, sep, scale = item.rpartition("=")
        where, colon, module = target.rpartition(":")
        if not sep or not module:
            raise ValueError(f"{PERTURB_ENV}={raw!r}: expected [<stage>:]<module>=<scale>")
        if colon and where != stage:
            continue
        pairs.append((module, float(scale)))
    return pairs


@contextlib.contextmanager
def _env_perturbation(stage: str, model: Any) -> Iterator[None]:
    if model is None or PERTURB_ENV not in os.environ:
        yield
        return
    handles = []
    roots = model if isinstance(model, (list, tuple)) else [model]
    for module, scale in _perturb_requests(stage):
        for root in roots:
            if module in dict(root.named_modules()):
                handles.append(perturb(root, module, scale))
    try:
        yield
    finally:
        for handle in reversed(handles):
            handle.remove()


# --------------------------------------------------------------------------- compare


@dataclass
class Report:
    """The comparison of two dumps (`compare`); `rows` in pipeline and execution order."""

    a: str
    b: str
    thresholds: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None

    @property
    def diverged(self) -> bool:
        return self.first_divergence is not None

    def count(self, status: str) -> int:
        return sum(1 for row in self.rows if row["status"] == status)

    def summary(self) -> str:
        compared = [r for r in self.rows if r["status"] not in ("only_in_a", "only_in_b")]
        stages = len({(r["step"], r["worker"], r["stage"], r["call"]) for r in compared})
        t = self.thresholds
        rule = (f"cosine >= {t['cosine_min']:g}; abs <= {t['abs_max']:g} or rel <= "
                f"{t['rel_max']:g}")
        if self.first_divergence is None:
            text = (f"no divergence: {len(compared)} tensors in {stages} stage dumps within "
                    f"thresholds ({rule})")
        else:
            row = self.first_divergence
            where = ", ".join(x for x in (f"step {row['step']}" if row["step"] else "",
                                          row["worker"]) if x)
            value = row["value"]
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            over = sum(1 for r in self.rows if r["diverged"])
            text = (f"first divergence: stage {row['stage']}" + (f" ({where})" if where else "")
                    + f", module {row['module']}, tensor {row['tensor']} ({row['metric']}="
                    f"{shown}, threshold={row['threshold']}); {over} of {len(compared)} "
                    f"compared tensors diverge ({rule})")
        only_a, only_b = self.count("only_in_a"), self.count("only_in_b")
        if only_a or only_b:
            text += f"; {only_a} tensors only in A, {only_b} only in B"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "thresholds": self.thresholds,
                "diverged": self.diverged, "summary": self.summary(),
                "first_divergence": self.first_divergence,
                "only_in_a": self.count("only_in_a"), "only_in_b": self.count("only_in_b"),
                "rows": self.rows}

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(_jsonable(self.to_dict()), indent=1) + "\n")
        return path

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=ROW_FIELDS)
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: _cell(row.get(k)) for k in ROW_FIELDS})
        return path


ROW_FIELDS = ("order", "step", "worker", "stage", "call", "kind", "module", "tensor", "status",
              "diverged", "metric", "value", "threshold", "cosine", "max_abs_err",
              "max_rel_err", *DIFF_COLUMNS, *REL_COLUMNS, "dtype_a", "dtype_b", "shape_a",
              "shape_b", "message", "unit")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _cell(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, (list, dict)) else value


@dataclass(frozen=True)
class _Unit:
    """One stage call's dump folder."""

    path: Path
    step: int | None
    worker: str
    stage: str
    call: int

    @classmethod
    def of(cls, path: Path) -> _Unit:
        match = re.fullmatch(r"(.+?)(?:-(\d+))?", path.name)
        stage, call = match.group(1), int(match.group(2) or 1)
        worker = path.parent.name if re.fullmatch(r".+-rank\d+", path.parent.name) else ""
        step_match = re.fullmatch(r"step_(\d+)", path.parent.parent.name) if worker else None
        return cls(path, int(step_match.group(1)) if step_match else None, worker, stage, call)

    def sort_key(self) -> tuple:
        index = PIPELINE_STAGES.index(self.stage) if self.stage in PIPELINE_STAGES else len(
            PIPELINE_STAGES)
        role, _, rank = self.worker.rpartition("-rank")
        # the controller's data of a stage is its output: after the modules that made it
        return (self.step or 0, index, self.stage, self.call, role == "controller", role,
                int(rank or 0))


def find_dumps(root: str | Path) -> dict[str, _Unit]:
    """The stage dumps under `root` (a run's precision folder, a step's, a worker's or one
    stage's), by path relative to `root`. Raises InputError when there is none."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"precision compare: {root} is not a folder (expected a precision "
                         "dump: <output_dir>/<tools.precision.output>, one of its step_<N> "
                         "folders, a <role>-rank<R> folder or a stage folder)")
    found = {}
    for marker in ("dump.json", "data.json"):
        for file in sorted(root.rglob(marker)):
            if ".msprobe" in file.relative_to(root).parts:
                continue
            rel = file.parent.relative_to(root).as_posix()
            found.setdefault(rel, _Unit.of(file.parent.resolve()))
    if not found:
        raise InputError(f"precision compare: no dump under {root} (expected dump.json, "
                         "msprobe's module dump, or data.json, a stage's RL data, in a stage "
                         "folder <step_N>/<role>-rank<R>/<stage>/ below it)")
    return found


def _align(a: dict[str, _Unit], b: dict[str, _Unit]) -> list[tuple[_Unit | None, _Unit | None]]:
    """Pairs of stage dumps by relative path; when the two roots are at different levels
    (a run's folder against a step's), by the last 3, 2 or 1 parts of the path."""
    keys_a, keys_b = {k: k for k in a}, {k: k for k in b}
    if len(a) == 1 and len(b) == 1:
        keys_a, keys_b = {next(iter(a)): "."}, {next(iter(b)): "."}
    elif not set(a) & set(b):
        for n in (3, 2, 1):
            tail_a = {k: "/".join(k.split("/")[-n:]) for k in a}
            tail_b = {k: "/".join(k.split("/")[-n:]) for k in b}
            unique = (len(set(tail_a.values())) == len(a) and len(set(tail_b.values())) == len(b))
            if unique and set(tail_a.values()) & set(tail_b.values()):
                keys_a, keys_b = tail_a, tail_b
                break
    by_a = {keys_a[k]: unit for k, unit in a.items()}
    by_b = {keys_b[k]: unit for k, unit in b.items()}
    pairs = [(by_a.get(k), by_b.get(k)) for k in set(by_a) | set(by_b)]
    return sorted(pairs, key=lambda p: (p[0] or p[1]).sort_key())


def compare(a: str | Path, b: str | Path, *, cosine_min: float = 0.9999, abs_max: float = 1e-5,
            rel_max: float = 1e-3) -> Report:
    """Compare dump `b` against dump `a` (the reference): each stage dump both hold, tensor by
    tensor (module tensors by msprobe's compare, RL data by ours), in pipeline and execution
    order; the first tensor over the thresholds is `first_divergence`. `a` and `b` may each be
    a run's precision folder, a step's, a worker's or one stage's. Raises InputError when one
    holds no dump."""
    thresholds = {"cosine_min": cosine_min, "abs_max": abs_max, "rel_max": rel_max}
    report = Report(str(a), str(b), thresholds)
    for unit_a, unit_b in _align(find_dumps(a), find_dumps(b)):
        unit = unit_b or unit_a
        assert unit is not None
        base = {"step": unit.step, "worker": unit.worker, "stage": unit.stage,
                "call": unit.call}
        rows = _compare_unit(unit_a, unit_b, thresholds)
        for row in rows:
            row.update(base)
            row["unit"] = str(unit.path)
        report.rows.extend(rows)
    for i, row in enumerate(report.rows):
        row["order"] = i
        if row["diverged"] and report.first_divergence is None:
            report.first_divergence = row
    return report


def _compare_unit(a: _Unit | None, b: _Unit | None, t: dict[str, float]) -> list[dict]:
    """Rows of one stage dump: the data saved before the modules ran, the modules, the rest."""
    data = _compare_data(a and a.path / "data.json", b and b.path / "data.json", t)
    order = next((json.loads(p.read_text()).get("order") for p in
                  (x.path / "data.json" for x in (a, b) if x) if p.exists()), "after_modules")
    modules = _compare_modules(a and a.path / "dump.json", b and b.path / "dump.json", t)
    return data + modules if order == "before_modules" else modules + data


def _row(kind: str, module: str, tensor: str, **values: Any) -> dict[str, Any]:
    row = {k: None for k in ROW_FIELDS}
    row.update(kind=kind, module=module, tensor=tensor, status="ok", diverged=False)
    row.update(values)
    return row


def _flag(row: dict, metric: str, value: Any, threshold: Any, status: str = "diverged") -> None:
    row.update(status=status, diverged=True, metric=metric, value=value, threshold=threshold)


def _over(abs_err: float | None, rel_err: float | None, t: dict[str, float]) -> bool:
    """Whether an error fails: NaN, or over both abs_max and rel_max (a missing relative
    error, for a reference of 0, counts as over)."""
    if abs_err is None:
        return False
    if math.isnan(abs_err) or (rel_err is not None and math.isnan(rel_err)):
        return True
    return abs_err > t["abs_max"] and (rel_err is None or rel_err > t["rel_max"])


# ----------------------------------------------------------------- module tensors (msprobe)


def _entries(path: Path | None) -> tuple[str | None, list[tuple[str, str, dict]]]:
    """(task, [(entry, tensor name, msprobe's parsed item)]) of a dump.json, in execution
    order: entries as listed, inside one inputs, parameters, outputs, parameter gradients."""
    if path is None or not path.exists():
        return None, []
    from msprobe.core.compare.utils import read_op

    dump = json.loads(path.read_text())
    ranks = {"input": 0, "parameters": 1, "output": 2, "parameters_grad": 3}
    out = []
    for entry, data in (dump.get("data") or {}).items():
        items = [it for it in read_op(data, entry)
                 if str(it.get("dtype") or "").startswith("torch.")]
        items.sort(key=lambda it: ranks.get(it.get("state"), 4))  # stable: keeps msprobe's order
        out.extend((entry, it["full_op_name"], it) for it in items)
    return dump.get("task"), out


def _module_of(entry: str) -> str:
    """`Module.layers.1.Block.forward.0` -> `layers.1` (the path in named_modules)."""
    return ".".join(entry.split(".")[1:-3]) or entry  # also `....parameters_grad.0`


def _compare_modules(a: Path | None, b: Path | None, t: dict[str, float]) -> list[dict]:
    task_a, items_a = _entries(a)
    task_b, items_b = _entries(b)
    if not items_a and not items_b:
        return []
    names_b = {name for _, name, _ in items_b}
    names_a = {name for _, name, _ in items_a}
    # A's order, each B-only tensor after the tensor it follows in B
    merged: list[tuple[str, str]] = [(entry, name) for entry, name, _ in items_a]
    for i, (entry, name, _) in enumerate(items_b):
        if name in names_a:
            continue
        previous = next((items_b[j][1] for j in range(i - 1, -1, -1)
                         if items_b[j][1] in names_a), None)
        at = 0 if previous is None else [n for _, n in merged].index(previous) + 1
        while at < len(merged) and merged[at][1] not in names_a:
            at += 1  # after B-only tensors already placed there
        merged.insert(at, (entry, name))
    info_a = {name: it for _, name, it in items_a}
    info_b = {name: it for _, name, it in items_b}
    results = _msprobe_compare(a, b, task_a, task_b) if names_a & names_b else {}
    rows = []
    for entry, name in merged:
        ia, ib = info_a.get(name), info_b.get(name)
        row = _row("module", _module_of(entry), name, dtype_a=ia and ia.get("dtype"),
                   dtype_b=ib and ib.get("dtype"), shape_a=ia and ia.get("shape"),
                   shape_b=ib and ib.get("shape"))
        if ia is None or ib is None:
            row["status"] = "only_in_a" if ib is None else "only_in_b"
        elif ia.get("shape") != ib.get("shape"):
            _flag(row, "shape", f"{ib.get('shape')} vs {ia.get('shape')}", "equal",
                  "shape_mismatch")
        else:
            _module_metrics(row, results.get(name), t)
        rows.append(row)
    return rows


def _module_metrics(row: dict, result: dict | None, t: dict[str, float]) -> None:
    if result is None:
        row.update(status="error", message="msprobe's compare gave no result for this tensor")
        return
    row["message"] = (result.get("Err_message") or "").strip("[]' ") or None
    if "Cosine" in result:  # tensor mode
        cosine, abs_err, rel_err = (_number(result.get(k)) for k in
                                    ("Cosine", "MaxAbsErr", "MaxRelativeErr"))
        # msprobe gives no metric (N/A, Result "error") when one side holds NaN/Inf
        pairs = [(_number(result.get(f"NPU {s.lower()}")),
                  _number(result.get(f"Bench {s.lower()}"))) for s in STATS]
        nan_mismatch = "inf or nan" in (row["message"] or "") or any(
            x is not None and y is not None and not (math.isfinite(x) and math.isfinite(y))
            and str(x) != str(y) for x, y in pairs)
        row.update(cosine=cosine, max_abs_err=abs_err, max_rel_err=rel_err)
        _judge_tensor(row, cosine, abs_err, rel_err, nan_mismatch, t)
        return
    for diff_col, rel_col in zip(DIFF_COLUMNS, REL_COLUMNS):
        row[diff_col], row[rel_col] = _number(result.get(diff_col)), _percent(result.get(rel_col))
    diffs = [abs(row[c]) for c in DIFF_COLUMNS if row[c] is not None]
    rels = [row[c] for c in REL_COLUMNS if row[c] is not None]
    row["max_abs_err"] = max(diffs, default=None)
    row["max_rel_err"] = max(rels, default=None)
    for diff_col, rel_col in zip(DIFF_COLUMNS, REL_COLUMNS):
        diff, rel = row[diff_col], row[rel_col]
        if diff is not None and _over(abs(diff), rel, t):
            _flag(row, rel_col, rel if rel is not None else math.inf, t["rel_max"])
            row["message"] = ((row["message"] or "") + f" {diff_col}={diff:.6g} (abs_max "
                              f"{t['abs_max']:g})").strip()
            return


def _judge_tensor(row: dict, cosine: float | None, abs_err: float | None,
                  rel_err: float | None, nan_mismatch: bool, t: dict[str, float]) -> None:
    if nan_mismatch:
        _flag(row, "nan_inf", "at different places", "same places")
    elif cosine is not None and (math.isnan(cosine) or cosine < t["cosine_min"]):
        _flag(row, "cosine", cosine, t["cosine_min"])
    elif _over(abs_err, rel_err, t):
        _flag(row, "max_rel_err", rel_err, t["rel_max"])
        row["message"] = ((row["message"] or "") + f" max_abs_err={abs_err:.6g} (abs_max "
                          f"{t['abs_max']:g})").strip()


def _number(value: Any) -> float | None:
    if value is None:
        return None
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        return None  # N/A, unsupported, ...


def _percent(value: Any) -> float | None:
    text = str(value).strip() if value is not None else ""
    if text.endswith("%"):
        number = _number(text[:-1])
        return None if number is None else number / 100
    return _number(text)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """msprobe's compare prints its log and progress bars; keep them out of our output."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        yield buffer


def _msprobe_compare(a: Path | None, b: Path | None, task_a: str | None,
                     task_b: str | None) -> dict[str, dict[str, str]]:
    """msprobe's compare of dump `b` (its "NPU" side) against `a` (its "bench"), its CSV rows
    by tensor name."""
    assert a is not None and b is not None
    from msprobe.core.common.utils import CompareException
    from msprobe.core.common.file_utils import FileCheckException
    from msprobe.pytorch.compare.pt_compare import pt_compare

    _msprobe_quiet()
    with tempfile.TemporaryDirectory(prefix="rl_core_precision_") as tmp:
        tmp_path = Path(tmp)
        if task_a == task_b == "tensor":  # the .pt files beside dump.json are read in place
            for path in (a, b):
                if not MSPROBE_PATH.match(str(path.resolve())):
                    raise InputError(f"precision compare: msprobe cannot read {path.parent}: "
                                     "its path may hold only letters, digits and _ . : / -")
            paths = (str(a.resolve()), str(b.resolve()))
        else:  # statistics (or one of each: compared as statistics)
            paths = (_staged(a, tmp_path / "a", task_a != task_b),
                     _staged(b, tmp_path / "b", task_a != task_b))
        out = tmp_path / "out"
        with _quiet() as printed, warnings.catch_warnings():
            # msprobe 26.2.0 uses pandas APIs pandas 3 deprecates (`inplace=`, fillna)
            warnings.filterwarnings("ignore", module=r"msprobe\.")
            try:
                pt_compare({"npu_path": paths[1], "bench_path": paths[0],
                            "is_print_compare_log": False}, str(out))
            except (CompareException, FileCheckException) as exc:
                raise InputError(f"precision compare: msprobe's compare of {b} against {a} "
                                 f"failed ({exc}): {printed.getvalue()[-2000:]}") from exc
        files = sorted(out.glob("compare_result_*.csv"))
        if not files:
            return {}
        with files[-1].open(newline="") as handle:
            return {row["NPU Name"]: row for row in csv.DictReader(handle)}


def _staged(dump: Path, folder: Path, as_statistics: bool) -> str:
    folder.mkdir()
    target = folder / "dump.json"
    if as_statistics:
        data = json.loads(dump.read_text())
        data["task"] = "statistics"
        target.write_text(json.dumps(data))
    else:
        shutil.copyfile(dump, target)
    return str(target)


# ----------------------------------------------------------------- RL data (ours)


def _compare_data(a: Path | None, b: Path | None, t: dict[str, float]) -> list[dict]:
    stats_a = json.loads(a.read_text())["tensors"] if a is not None and a.exists() else {}
    stats_b = json.loads(b.read_text())["tensors"] if b is not None and b.exists() else {}
    if not stats_a and not stats_b:
        return []
    from safetensors.torch import load_file

    tensors_a = load_file(str(a.parent / "data.safetensors")) if stats_a else {}
    tensors_b = load_file(str(b.parent / "data.safetensors")) if stats_b else {}
    names = list(stats_a) + [n for n in stats_b if n not in stats_a]
    rows = []
    for name in names:
        sa, sb = stats_a.get(name), stats_b.get(name)
        row = _row("data", "data", name, dtype_a=sa and sa["dtype"], dtype_b=sb and sb["dtype"],
                   shape_a=sa and sa["shape"], shape_b=sb and sb["shape"])
        rows.append(row)
        if sa is None or sb is None:
            row["status"] = "only_in_a" if sb is None else "only_in_b"
            continue
        for stat, diff_col, rel_col in zip(("max", "min", "mean", "norm"), DIFF_COLUMNS,
                                           REL_COLUMNS):
            x, y = _number(sa[stat]), _number(sb[stat])
            if x is not None and y is not None:
                row[diff_col] = y - x if x != y else 0.0
                row[rel_col] = 0.0 if x == y else (abs((y - x) / x) if x else math.inf)
        if sa["shape"] != sb["shape"]:
            _flag(row, "shape", f"{sb['shape']} vs {sa['shape']}", "equal", "shape_mismatch")
            continue
        ta, tb = tensors_a[name], tensors_b[name]
        if not (ta.is_floating_point() or ta.is_complex()) or not (
                tb.is_floating_point() or tb.is_complex()):
            unequal = int((ta.to(tb.dtype) != tb).sum())
            difference = (ta.double() - tb.double()).abs()
            row["max_abs_err"] = float(difference.max()) if ta.numel() else 0.0
            if unequal:
                _flag(row, "mismatched", unequal, 0)
            continue
        cosine, abs_err, rel_err, nan_mismatch = _tensor_metrics(ta, tb)
        row.update(cosine=cosine, max_abs_err=abs_err, max_rel_err=rel_err)
        _judge_tensor(row, cosine, abs_err, rel_err, nan_mismatch, t)
    return rows


def _tensor_metrics(a: Any, b: Any) -> tuple[float | None, float | None, float | None, bool]:
    """msprobe's cosine, max absolute and max relative error of `b` against `a` (both cast to
    float64, as msprobe compares), and whether NaN/Inf sit at different places."""
    import numpy as np
    import torch
    from msprobe.core.compare.algorithm.builtin_algorithm import (
        alg_cosine_similarity,
        alg_max_absolute_error,
        alg_max_relative_error,
    )

    x = a.detach().to("cpu", torch.float64).numpy().copy()
    y = b.detach().to("cpu", torch.float64).numpy().copy()
    if x.size == 0:
        return None, None, None, False
    bad_x, bad_y = ~np.isfinite(x), ~np.isfinite(y)
    if bad_x.any() or bad_y.any():
        if not (np.array_equal(bad_x, bad_y) and np.array_equal(x[bad_x], y[bad_y],
                                                                equal_nan=True)):
            return None, None, None, True
        x[bad_x], y[bad_y] = 0, 0
    results = []
    for algorithm in (alg_cosine_similarity, alg_max_absolute_error, alg_max_relative_error):
        value, _ = algorithm.compare(y, x)  # msprobe's (npu, bench) order
        results.append(_number(value))
    return results[0], results[1], results[2], False
