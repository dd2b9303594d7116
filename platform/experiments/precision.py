"""The precision comparison of two runs (`tools.precision`): their dumps fetched from MLflow, compared
by `rl_core.precision.compare`, the report kept for the next look.

A run's dumps are MLflow artifacts under `precision/`; they are copied once into
`<ASCENT_VAR_DIR>/precision/<mlflow run id>/` when the run has ended (an active run's are read
fresh each time: more may come), and a report of two ended runs under given thresholds is kept
beside them, so a second look costs a file read.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from experiments.choices import TERMINAL_STATES
from experiments.models import Run
from ascent.errors import DomainError
from experiments.tracking import TrackingUnavailable, _tracking


class NoDumps(DomainError):
    """A run has no precision dumps (HTTP 409): the message names it and says how to make
    them."""


@dataclass(frozen=True)
class Thresholds:
    """When a tensor diverges (rl_core.precision.compare): cosine under `cosine_min`, or an
    error over both `abs_max` and `rel_max`."""

    cosine_min: float = 0.9999
    abs_max: float = 1e-5
    rel_max: float = 1e-3

    def key(self) -> str:
        return f"{self.cosine_min:g}-{self.abs_max:g}-{self.rel_max:g}"

    @classmethod
    def from_params(cls, params) -> tuple[Thresholds, dict[str, str]]:
        """The thresholds a query asks for (`cosine_min`, `abs_max`, `rel_max`; the defaults
        where absent) and an error per bad one, by name (its default is used meanwhile)."""
        errors: dict[str, str] = {}
        bounds = {"cosine_min": (0.0, 1.0), "abs_max": (0.0, 1e30), "rel_max": (0.0, 1e30)}
        values = {}
        for name, (low, high) in bounds.items():
            raw = str(params.get(name) or "").strip()
            if not raw:
                continue
            try:
                value = float(raw)
            except ValueError:
                errors[name] = f"{raw!r} is not a number"
                continue
            if not low <= value <= high:  # also refuses nan
                errors[name] = f"must be in [{low:g}, {high:g}]"
                continue
            values[name] = value
        return cls(**values), errors


def _folder() -> Path:
    return Path(settings.VAR_DIR) / "precision"


def _dumps(run: Run, into: Path) -> Path:
    """The run's `precision/` folder, copied from MLflow into `into` (once, for an ended run)."""
    if not run.mlflow_run_id:
        raise NoDumps(f"run {run.pk} has no MLflow run yet: it has not started")
    local = into / run.mlflow_run_id / "precision"
    ended = run.state in TERMINAL_STATES
    if ended and local.is_dir():
        return local
    client, error = _tracking()
    try:
        if not any(row["is_dir"] for row in client.list_artifacts(run.mlflow_run_id, "precision")):
            raise NoDumps(f"run {run.pk} ({run.name}) has no precision dumps: submit it with "
                          "tools.precision.enable: true (and the steps to dump)")
        staging = Path(tempfile.mkdtemp(dir=into))
        copied = Path(client.download(run.mlflow_run_id, "precision", staging))
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc
    if local.exists():
        shutil.rmtree(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    copied.rename(local)
    shutil.rmtree(staging, ignore_errors=True)
    return local


def compare_runs(a: Run, b: Run, thresholds: Thresholds = Thresholds()) -> dict:
    """The report (rl_core.precision.Report.to_dict) of run `b`'s dumps against run `a`'s;
    raises NoDumps when either has none, TrackingUnavailable when MLflow cannot be read."""
    from rl_core.precision import compare

    folder = _folder()
    folder.mkdir(parents=True, exist_ok=True)
    ended = a.state in TERMINAL_STATES and b.state in TERMINAL_STATES
    name = hashlib.sha256(f"{a.mlflow_run_id}:{b.mlflow_run_id}:{thresholds.key()}".encode())
    kept = folder / "reports" / f"{name.hexdigest()[:24]}.json"
    if ended and kept.is_file():
        return json.loads(kept.read_text())
    report = compare(_dumps(a, folder), _dumps(b, folder), cosine_min=thresholds.cosine_min,
                     abs_max=thresholds.abs_max, rel_max=thresholds.rel_max)
    kept.parent.mkdir(parents=True, exist_ok=True)
    report.to_json(kept)  # its JSON form (numbers that JSON cannot hold as strings)
    return json.loads(kept.read_text())
