"""The training tracker's resource samples on a real NVIDIA GPU: utilisation and memory of each
GPU (MLflow's system metrics, through NVIDIA's management library from the `cuda` extra) while
the GPU works. Skipped without a CUDA GPU.

With ASCENT_RECORD_DIR set it also writes what it recorded as `h200_system_metrics.json` there:
the browser tests replay that file (tests/browser/recorded/) to chart GPU samples on machines
without a GPU. Run on a GPU host:

    MLFLOW_ALLOW_FILE_STORE=true ASCENT_RECORD_DIR=/tmp/out \\
        python -m pytest --noconftest -p no:cacheprovider tests/training/test_gpu_metrics.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.hardware,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this host has none"),
]
BUSY_S = 6.0
INTERVAL_S = 0.5


def keep_the_gpu_busy(seconds: float) -> int:
    """Matrix products on the GPU for about `seconds`; returns how many."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
        done += 20
    return done


def test_gpu_utilisation_and_memory_are_sampled_while_the_gpu_works(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from rl_core.spec import resolve_spec
    from rl_core.tracking import make_tracker

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    spec = resolve_spec({"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                         "tools": {"monitor": {"system_metrics_interval": INTERVAL_S}}})
    tracker = make_tracker(spec, tmp_path / "out", environ={"MLFLOW_TRACKING_URI": uri})
    started = time.time()
    time.sleep(2 * INTERVAL_S)  # idle first
    products = keep_the_gpu_busy(BUSY_S)
    tracker.finish()

    client = MlflowClient(uri)
    run_id = tracker.mlflow_run_id
    keys = sorted(k for k in client.get_run(run_id).data.metrics if k.startswith("system/"))
    history = {key: [(m.step, m.value, m.timestamp - int(started * 1000))
                     for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
               for key in keys}
    utilisation = [value for _, value, _ in history["system/gpu_0_utilization_percentage"]]
    memory = [value for _, value, _ in history["system/gpu_0_memory_usage_percentage"]]
    assert len(utilisation) >= BUSY_S / INTERVAL_S / 2, utilisation
    assert max(utilisation) >= 50 and memory[-1] > 0, (utilisation, memory)
    assert "system/cpu_utilization_percentage" in history

    folder = os.environ.get("ASCENT_RECORD_DIR")
    if folder:
        recording = {
            "machine": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "interval_s": INTERVAL_S, "busy_s": BUSY_S, "matrix_products": products,
            "recorded_at": time.strftime("%Y-%m-%d"),
            "metrics": {key: [list(p) for p in points] for key, points in history.items()},
        }
        Path(folder, "h200_system_metrics.json").write_text(json.dumps(recording, indent=1))
