"""The two making commands end to end: what they write loads back with plain transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rl_core(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "rl_core", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_tiny_model_and_a_dataset_made_by_the_commands_load_with_plain_transformers(tmp_path):
    made = rl_core("make-tiny", "--size", "nano", "--out", str(tmp_path / "model"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert "parameters:" in made.stdout
    data = rl_core("make-data", "--task", "addition", "--digits", "2", "--num-train", "50",
                   "--num-val", "10", "--seed", "3", "--out", str(tmp_path / "data"), cwd=tmp_path)
    assert data.returncode == 0, data.stderr

    rows = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 50
    check = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1]); model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "prompt = json.loads(open(sys.argv[2]).readline())['prompt']\n"
        "ids = tok(prompt, return_tensors='pt').input_ids\n"
        "assert tok.decode(ids[0]) == prompt\n"
        "out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)\n"
        "print(type(model).__name__, out.shape[1] > ids.shape[1])\n"
    )
    loaded = subprocess.run([sys.executable, "-c", check, str(tmp_path / "model"),
                             str(tmp_path / "data" / "train.jsonl")],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["Qwen2ForCausalLM", "True"]


def test_bad_input_exits_2_with_one_line(tmp_path):
    result = rl_core("make-data", "--task", "sorting", "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "sorting" in result.stderr


def test_every_example_spec_is_valid():
    from rl_core.spec import load_spec

    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert {p.name for p in examples} >= {"grpo_tiny.yaml", "dapo_tiny.yaml", "sft_tiny.yaml",
                                          "grpo_qwen25_7b.yaml"}
    for path in examples:
        load_spec(path)


def test_every_accelerator_example_fits_the_devices_it_names():
    from rl_core import memory_plan as mp
    from rl_core.spec import load_spec

    named = [load_spec(p) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    accelerated = [s for s in named if s.resources.device_type == "npu"]
    assert {s.model.path for s in accelerated} >= {"/models/Qwen2.5-7B-Instruct",
                                                   "/models/Qwen3-8B"}
    for spec in accelerated:
        result = mp.plan(spec, mp.shape_of(spec))
        assert result.fits, (spec.name, mp.format_table(result))


def test_sigterm_stops_the_work_through_its_clean_up_without_a_traceback(capsys):
    import os
    import signal

    from rl_core.cli.run import run_guarded

    cleaned = []

    def work():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # the handler raises before this returns
        finally:
            cleaned.append(True)

    before = signal.getsignal(signal.SIGTERM)
    assert run_guarded(work) == 143 and cleaned == [True]
    err = capsys.readouterr().err
    assert "stopped: asked to stop (SIGTERM" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_training_run_stops_after_the_step_in_progress_and_a_second_sigterm_at_once(capsys):
    import os
    import signal

    from rl_core import stopping
    from rl_core.cli.run import run_guarded

    steps = []

    def train():  # a loop that checks between steps, as Controller.fit does
        for step in range(1, 100):
            if stopping.requested():
                raise stopping.Stopped(step - 1, f"out/checkpoints/step_{step - 1}")
            steps.append(step)
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # arrives during step 3, which finishes

    assert run_guarded(train, at_step_boundary=True) == 143
    assert steps == [1, 2, 3]
    err = capsys.readouterr().err
    assert "stopping: asked to stop (SIGTERM): the step in progress ends" in err
    assert ("stopped: asked to stop (SIGTERM), stopped at step 3: checkpoint "
            "out/checkpoints/step_3 saved; a restart resumes from it") in err

    def stuck():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # a second one raises at once
        signal.pause()

    assert run_guarded(stuck, at_step_boundary=True) == 143
    assert "a cancelled run is stopped so" in capsys.readouterr().err
    assert run_guarded(lambda: None) == 0  # a new run starts with no stop asked
