"""One error hierarchy for rl_core; each error knows the exit status of the command it ends.

    RLCoreError            exit 1: the run failed
    ├── InputError         exit 2: the spec or its inputs cannot run here (a retry cannot fix it);
    │                      spec, data, model-folder, reward-name and device errors derive from it
    ├── TrainingStopped    exit 1: training stopped on purpose (non-finite numbers, nothing to learn)
    ├── RoleFailed         exit 1: a role's rank raised or its process died
    ├── StaleWeightsError  exit 1: a rollout engine held weights of another policy version
    └── NonFiniteError     exit 1: a train step's loss or gradient norm was NaN or infinite

The command line maps any exception to its status with `exit_code`; an exception from outside
this hierarchy is a failure (1). This module imports only the standard library (the web process
imports the spec, whose errors derive from these).
"""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_INPUT = 2


class RLCoreError(Exception):
    """Base of rl_core's errors."""

    exit_code = EXIT_FAILURE


class InputError(RLCoreError, ValueError):
    """The spec or its inputs cannot run here; message names the field, file or key."""

    exit_code = EXIT_INPUT


class TrainingStopped(RLCoreError, RuntimeError):
    """Training stopped on purpose (a non-finite loss or reward, nothing left to learn from)."""

    def __init__(self, step: int, reason: str, metrics: dict | None = None):
        self.step, self.reason, self.metrics = step, reason, dict(metrics or {})
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(self.metrics.items())[:12])
        super().__init__(f"stopped at step {step}: {reason}" + (f" (last metrics: {shown})" if shown else ""))


class RoleFailed(RLCoreError, RuntimeError):
    """A role's rank raised or died; the message names the role, the rank and the reason."""

    def __init__(self, role: str, rank: int, reason: str) -> None:
        self.role, self.rank, self.reason = role, rank, reason
        super().__init__(f"role {role} (rank {rank}) failed: {reason}")


class StaleWeightsError(RLCoreError, RuntimeError):
    """A rollout was asked of an inference engine holding another policy version's weights
    (a weight sync was skipped): it would train on samples of a stale policy."""


class NonFiniteError(RLCoreError, FloatingPointError):
    """A train step whose loss or gradient norm is NaN or infinite; the optimizer did not step.

    `metrics` holds the step's averaged metrics, the loss and the gradient norm.
    """

    def __init__(self, what: str, step: int, metrics: dict[str, float]) -> None:
        self.metrics = metrics
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
        super().__init__(
            f"non-finite {what} at optimizer step {step + 1}; the step was skipped and the "
            f"weights are unchanged (lower the lr, check the inputs or use float32): {shown}"
        )


def exit_code(exc: BaseException) -> int:
    """The command's exit status for `exc`: its own for rl_core errors, else a failure (1)."""
    return exc.exit_code if isinstance(exc, RLCoreError) else EXIT_FAILURE


def is_input_error(exc: BaseException) -> bool:
    return exit_code(exc) == EXIT_INPUT


def _fmt(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)
