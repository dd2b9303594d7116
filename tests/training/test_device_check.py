"""`bench/device_check.py --smoke`: every line of the accelerator check runs on the CPU at a tiny
size and passes (the device's own numbers come from running it on a GPU or NPU host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.stack import MACHINE_CACHE

ROOT = Path(__file__).resolve().parents[2]


def test_every_line_of_the_device_check_passes_on_the_cpu(tmp_path):
    out = tmp_path / "check.json"
    # the demo line's warm start from the machine's cache, which the service tier's runs build
    # too: one SFT for both
    env = {**os.environ, "ASCENT_CACHE_DIR": MACHINE_CACHE}
    result = subprocess.run(
        [sys.executable, "bench/device_check.py", "--smoke", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = json.loads(out.read_text())
    assert list(lines) == ["collectives", "fsdp2", "packing", "masters", "logprobs", "mfu",
                           "rollout", "moe", "vision", "megatron", "demo"]
    for name, line in lines.items():
        assert line.get("ok") or "skip" in line, (name, line)
    assert "skip" not in lines["collectives"] and lines["collectives"]["backend"] == "gloo"
    assert lines["packing"]["kernel"] == "row_groups"  # the CPU has no one-call kernel
    assert lines["packing"]["max_logprob_diff"] <= 1e-4
    assert lines["moe"]["grouped_rel_diff"] <= 1e-4 and lines["moe"]["aux_loss"] > 0
    assert lines["vision"]["max_logprob_diff"] <= 1e-4
    # the megatron extra is installed for the tests: its weights' round trip runs here
    assert lines["megatron"]["ok"] and lines["megatron"]["tensors"] > 0
    assert len(lines["demo"]["val_accuracy"]) >= 2  # validated before and during the run
    assert "| demo | ok |" in result.stdout  # the table
