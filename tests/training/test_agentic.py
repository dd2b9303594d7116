"""Multi-turn RL with tools on the CPU (`rollout.multi_turn`), from the calculator base
(golden/calculator): the warm start tiny:small-calculator as its recipe
(rl_core.recipes.warm) built it on a 2-core CPU, committed so the tests need no SFT: tiny:small
after SFT_STEPS SFT steps on `calculator_transcripts` of two-digit products, a quarter of them
answered at once, stopped when half of the validation turns were exactly right. It calls the
calculator and copies its answer on part of the products. The trained tokens are the generated
ones and the tools' answers, the answers without loss, from the native engine and from vLLM;
multi-turn rows pack as they pad; a step's samples show their turns; `python -m rl_core eval
--tools` rolls out with the tools; GRPO raises the share of products solved and the call
rate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from learning import rose, validation_gain

from rl_core.data.datasets import write_rows
from rl_core.data.synthetic import synthetic_splits
from rl_core.recipes.rl import RLTrainer
from rl_core.recipes.warm import RECIPES
from rl_core.rollout.turns import ANSWERED, parse_calls
from rl_core.rollout.vllm import vllm_available
from rl_core.spec import resolve_spec
from rl_core.tools import get_tool
from rl_core.tracking import stable_metrics

CALCULATOR_BASE = Path(__file__).parent / "golden" / "calculator"
LEARNING_STEPS = 15


@pytest.fixture(scope="session")
def calculator_base(tmp_path_factory, tiny_cache) -> Path:
    folder = tmp_path_factory.mktemp("calculator") / "base"
    shutil.copytree(CALCULATOR_BASE, folder)
    return folder


@pytest.fixture(scope="session")
def products(tmp_path_factory) -> tuple[str, str]:
    """The base's task, two-digit products: 400 of its SFT's training problems and 40 validation
    problems no SFT step saw, not even its stopping rule (which read the first 40)."""
    folder = tmp_path_factory.mktemp("products")
    problems = RECIPES["small-calculator"]["data"]["synthetic"]
    train, val = synthetic_splits("multiplication", num_train=problems["num_train"],
                                  num_val=problems["num_val"], seed=1,
                                  digits=problems["digits"])
    return (str(write_rows(train[:400], folder / "train.jsonl")),
            str(write_rows(val[40:80], folder / "val.jsonl")))


def agent_spec(base: Path, data: tuple[str, str], out: Path, steps: int, **sections) -> dict:
    spec = {
        "algorithm": "grpo", "seed": 1, "model": {"path": str(base)},
        "data": {"train_files": [data[0]], "val_files": [data[1]],
                 "prompt_template": "chat", "train_batch_size": 8, "val_batch_size": 40},
        "rollout": {"n_samples_per_prompt": 4, "max_new_tokens": 160,
                    "multi_turn": {"max_turns": 2, "tools": [{"name": "calculator"}]}},
        "actor": {"lr": 1e-4, "ppo_mini_batch_size": 8, "ppo_micro_batch_size": 32},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": steps, "eval_every": steps, "output_dir": str(out),
                    "logger": []},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("engine", ["native", pytest.param("vllm", marks=pytest.mark.skipif(
    not vllm_available(), reason="vLLM is not installed"))])
def test_the_trained_tokens_are_the_generated_ones_and_the_answers_carry_no_loss(
        engine, tmp_path, calculator_base, products):
    """One step's rollout as the update sees it, from the native engine and from vLLM: each
    row's response tokens are the model's turns exactly as generated and the calculator's
    answers encoded once, the answers' log-probs 0; the loss mask is the model's tokens only."""
    spec = agent_spec(calculator_base, products, tmp_path / "tokens", 1,
                      rollout={"engine": engine})
    trainer = RLTrainer(resolve_spec(spec))
    seen: list[torch.Tensor] = []
    generate = trainer.ctl.generate

    def recording(ids, params, seed=None):  # the rollout calls of the turns, as they return
        batch = generate(ids, params, seed)
        seen.append(batch)
        return batch

    trainer.ctl.generate = recording
    batch, _, columns = trainer.generate_batch(trainer_timer())
    data = trainer.prepare_update(batch, columns, trainer_timer(), {})
    trainer.ctl.close()
    tokenizer, calls = trainer.tokenizer, 0
    for row in range(len(batch)):
        length = int(batch.response_lengths[row])
        ids = batch.response_ids[row, :length].tolist()
        tools = batch["tool_mask"][row, :length].tolist()
        pieces = runs(ids, tools)
        answers = ANSWERED.findall(tokenizer.decode([t for t, tool in zip(ids, tools) if tool]))
        # each answer is the calculator's on the call of the turn before it, or an error text
        for piece, answer in zip(pieces, answers):
            (call,) = parse_calls(tokenizer.decode(piece))
            calls += 1
            expected = get_tool("calculator")(call.arguments).text if call.error is None and \
                call.name == "calculator" else None
            assert answer == expected if expected is not None else answer.startswith("error:")
        assert torch.equal(data["response_mask"][row, :length],
                           torch.tensor([0.0 if tool else 1.0 for tool in tools]))
        assert (batch.logprobs[row, :length][torch.tensor(tools).bool()] == 0).all()
    assert calls > 0, "the base should call the calculator"
    generated = [r[:n].tolist() for part in seen
                 for r, n in zip(part.response_ids, part.response_lengths)]
    assert len(seen) >= 2 and len(seen[0]) == len(batch)  # every group drawn in the first call
    for row in range(len(batch)):  # each model turn is one generated piece, token for token
        length = int(batch.response_lengths[row])
        ids, tools = batch.response_ids[row, :length], batch["tool_mask"][row, :length]
        pieces = runs(ids.tolist(), tools.tolist())
        for piece in pieces[:-1]:
            assert piece in generated
        # the last one cut where the response reached max_new_tokens, if it did
        last = pieces[-1]
        assert last in generated or (length == 160 and any(g[:len(last)] == last
                                                           for g in generated))


def runs(ids: list[int], tools: list[int]) -> list[list[int]]:
    """The model's runs of tokens between the tools' answers."""
    pieces, current = [], []
    for token, tool in zip(ids, tools):
        if tool:
            if current:
                pieces.append(current)
            current = []
        else:
            current.append(token)
    return pieces + ([current] if current else [])


def trainer_timer():
    from rl_core.tracking import Timer

    return Timer()


def test_multi_turn_rows_pack_as_they_pad(tmp_path, calculator_base, products):
    """Two steps with remove-padding equal two steps without: the tools' answers in the middle
    of a row (no loss, attended to) pack like any other tokens."""
    metrics = {}
    for packed in (False, True):
        out = tmp_path / f"packed-{packed}"
        spec = agent_spec(calculator_base, products, out, 2,
                          actor={"use_remove_padding": packed}, trainer={"eval_every": 0})
        RLTrainer(resolve_spec(spec)).fit()
        metrics[packed] = [stable_metrics(m) for m in read_metrics(out)]
    first = metrics[False][0]
    assert first["rollout/tools/calls"] > 0 and first["rollout/tools/status/ok"] > 0
    assert 0 < first["rollout/tools/call_rate"] <= 1 and first["rollout/tools/token_frac"] > 0
    assert "rollout/turns/mean" in first
    samples = json.loads((tmp_path / "packed-False" / "samples" / "step_1.json").read_text())
    turns = [row[samples["columns"].index("turns")] for row in samples["data"]]
    # the sample viewer's: the model's turns and the calculator's answers between them
    assert any([part["role"] for part in parts][:2] == ["model", "tool"] for parts in turns)
    for left, right in zip(metrics[False], metrics[True]):
        assert left.keys() == right.keys()
        for key in left:
            if isinstance(left[key], float):
                assert left[key] == pytest.approx(right[key], rel=1e-4, abs=1e-5), key


def evaluate(checkpoint: Path, data: str, *tools: str) -> subprocess.CompletedProcess:
    """`python -m rl_core eval` of a checkpoint on `data` with `tools` on offer."""
    command = [sys.executable, "-m", "rl_core", "eval", str(checkpoint), data,
               "--template", "chat", "--max-turns", "2", "--max-new-tokens", "160"]
    for tool in tools:
        command += ["--tools", tool]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def test_an_unknown_tool_is_refused_by_eval_in_one_line(calculator_base, products):
    refused = evaluate(calculator_base, products[1], "search")
    assert refused.returncode == 2 and "unknown tool 'search'" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_grpo_learns_to_solve_products_with_the_calculator(tmp_path, calculator_base, products):
    """The agentic task learns: the calculator base answers most products at once (a guess,
    rarely right) and calls the calculator on the rest; GRPO raises the share of sampled
    responses that call it and, as the calls win over the guesses, the share of unseen products
    solved (greedy, the calculator on offer) and the greedy call rate; `python -m rl_core eval
    --tools` of the trained checkpoint gives the run's last validation."""
    out = tmp_path / "learns"
    spec = agent_spec(calculator_base, products, out, LEARNING_STEPS,
                      rollout={"n_samples_per_prompt": 8},
                      actor={"lr": 1e-4, "ppo_micro_batch_size": 64})
    RLTrainer(resolve_spec(spec)).fit()
    before, after = validation_gain(out)
    assert rose(before, after, by=0.2), f"validation accuracy did not rise: {before} -> {after}"
    metrics = read_metrics(out)
    val_calls = [m["val/tools/call_rate"] for m in metrics if "val/tools/call_rate" in m]
    assert val_calls[-1] > val_calls[0], f"the greedy call rate did not rise: {val_calls}"
    rates = [m["rollout/tools/call_rate"] for m in metrics if "rollout/tools/call_rate" in m]
    first, last = sum(rates[:3]) / 3, sum(rates[-3:]) / 3
    assert last > first + 0.1, f"the sampled call rate did not rise: {rates}"

    # the trained checkpoint alone (`python -m rl_core eval --tools calculator`): the same
    # greedy responses as the run's last validation, with the tools' counts
    done = evaluate(out / "checkpoints" / f"step_{LEARNING_STEPS}", products[1], "calculator")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["prompts"] == 40 and result["eval/accuracy"] == pytest.approx(after)
    assert result["eval/tools/call_rate"] == pytest.approx(val_calls[-1])
    assert result["eval/tools/calls"] > 0 and result["eval/tools/status/ok"] > 0
