"""Errors that decide how a run ends: bad input (exit 2, a retry cannot fix it) or a stop."""

from __future__ import annotations


class InputError(ValueError):
    """The spec or its inputs cannot run here; message names the field, file or key."""


class TrainingStopped(RuntimeError):
    """Training stopped on purpose (a non-finite loss or reward, nothing left to learn from)."""

    def __init__(self, step: int, reason: str, metrics: dict | None = None):
        self.step, self.reason, self.metrics = step, reason, dict(metrics or {})
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(self.metrics.items())[:12])
        super().__init__(f"stopped at step {step}: {reason}" + (f" (last metrics: {shown})" if shown else ""))


def _fmt(value) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)
