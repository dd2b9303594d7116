"""Partial rollout (`rollout.partial_rollout_max_split`) in the RL trainer, on tiny models whose
responses have a long tail of lengths: responses longer than a call's piece are the engine's
pieces joined, every sample of every group trains exactly once, groups go in draw order, two
runs with one seed are identical, a run resumed in the middle of a partial batch matches one
that was not, two Ray ranks equal one, and the vLLM engine continues responses as the native
one does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from test_trainer import read_metrics, tiny_spec

from rl_core.data.loader import ResumableLoader
from rl_core.models.tiny import build_tiny, write_tiny
from rl_core.recipes.rl import RLTrainer
from rl_core.rollout.vllm import vllm_available
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

CHUNK = 4  # max_new_tokens 12 in 3 pieces
STEPS = 3


def stop_heavy_model(out: Path, size: str) -> Path:
    """A tiny model whose generation config ends a response at every 8th byte as well as at
    eos: the untrained model stops after a few tokens or runs to max_new_tokens, a long tail."""
    model, tokenizer = build_tiny(size)
    config = model.generation_config
    config.eos_token_id = sorted({*config.eos_token_id, *range(3, 256, 8)})
    return write_tiny(model, tokenizer, out)


def partial_spec(model: Path, out: Path, steps: int = STEPS, **sections) -> dict:
    spec = tiny_spec(out, model={"path": str(model)},
                     rollout={"max_new_tokens": 3 * CHUNK, "partial_rollout_max_split": 3},
                     actor={"ppo_epochs": 1, "ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8},
                     trainer={"total_steps": steps, "logger": []})
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


class Recorder:
    """A trainer's rollout calls (inputs, output batch), the groups each call started and the
    batch each step trained, kept as the trainer's own methods run."""

    def __init__(self, trainer: RLTrainer) -> None:
        self.calls: list[tuple[list[list[int]], object]] = []
        self.started: list[list[int]] = []  # per call, the items of its new groups
        self.trained: list[object] = []
        ctl, buffer = trainer.ctl, trainer.partial
        generate, generate_partial, add = ctl.generate, ctl.generate_partial, buffer.add

        def record_generate(prompts, params, seed=None):
            batch = generate(prompts, params, seed)
            self.calls.append((prompts, batch))
            return batch

        def record_add(items, prompts):
            self.started.append(list(items))
            add(items, prompts)

        def record_partial(*args):
            out = generate_partial(*args)
            self.trained.append(out[0])
            return out

        ctl.generate, ctl.generate_partial, buffer.add = record_generate, record_partial, record_add

    def pieces(self) -> Counter:
        """Every (input, piece, log-probs) a call produced."""
        out: Counter = Counter()
        for prompts, batch in self.calls:
            for row, prompt in enumerate(prompts):
                n = int(batch.response_lengths[row])
                out[(tuple(prompt), tuple(batch.response_ids[row, :n].tolist()),
                     tuple(batch.logprobs[row, :n].tolist()))] += 1
        return out


def split_pieces(prompt: list[int], tokens: list[int], logprobs: list[float]) -> list[tuple]:
    """A response as the (input, piece, log-probs) of the calls that must have made it."""
    return [(tuple(prompt + tokens[:start]), tuple(tokens[start:start + CHUNK]),
             tuple(logprobs[start:start + CHUNK])) for start in range(0, len(tokens), CHUNK)]


def trained_rows(batch) -> list[tuple[list[int], list[int], list[float]]]:
    rows = []
    for row in range(len(batch)):
        n = int(batch.response_lengths[row])
        prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
        rows.append((prompt, batch.response_ids[row, :n].tolist(),
                     batch.logprobs[row, :n].tolist()))
    return rows


@pytest.fixture(scope="module")
def nano_model(tmp_path_factory, tiny_cache) -> Path:
    return stop_heavy_model(tmp_path_factory.mktemp("stops") / "nano", "nano")


@pytest.fixture(scope="module")
def straight(nano_model, tmp_path_factory):
    """An uninterrupted run of STEPS steps, recorded."""
    out = tmp_path_factory.mktemp("straight")
    trainer = RLTrainer(resolve_spec(partial_spec(nano_model, out)))
    recorder = Recorder(trainer)
    trainer.fit()
    return trainer, recorder, read_metrics(out)


def assert_trained_pieces_were_sampled(recorder) -> None:
    """Every trained response is pieces some rollout call made; some span several calls."""
    made, longer = recorder.pieces(), 0
    for batch in recorder.trained:
        for prompt, tokens, logprobs in trained_rows(batch):
            longer += len(tokens) > CHUNK
            for piece in split_pieces(prompt, tokens, logprobs):
                assert made[piece] > 0, f"no call made {piece}"
    assert longer, "no trained response was longer than one call's piece"


def test_long_responses_are_the_pieces_the_engine_sampled_across_calls(straight):
    trainer, recorder, metrics = straight
    assert_trained_pieces_were_sampled(recorder)
    assert max(m["rollout/partial/max_age"] for m in metrics) >= 2, \
        "no response went on under the updated policy"
    # the parts of older policies make the update recompute old log-probs
    assert all("timing/old_logprob" in m for m in metrics)


def test_every_sample_of_every_group_trains_exactly_once_in_draw_order(straight):
    trainer, recorder, _ = straight
    spec, n = trainer.spec, trainer.spec.rollout.n_samples_per_prompt
    left = recorder.pieces()
    for batch in recorder.trained:
        assert len(batch) == spec.data.train_batch_size * n
        assert batch.prompt_index.tolist() == [g for g in range(spec.data.train_batch_size)
                                               for _ in range(n)]
        for prompt, tokens, logprobs in trained_rows(batch):
            left.subtract(split_pieces(prompt, tokens, logprobs))
    for group in trainer.partial.groups:  # what still waits
        for sample in group.samples:
            left.subtract(split_pieces(group.prompt, sample.tokens, sample.logprobs))
    assert not +left and not -left, "pieces lost or trained twice"
    # new prompts in the loader's order, each call's waiting samples ahead of its new groups
    started = [item for items in recorder.started for item in items]
    loader = ResumableLoader(list(range(len(trainer.train))), spec.data.train_batch_size,
                             epochs=None, shuffle=spec.data.shuffle, seed=spec.seed)
    order = [item for _ in range(len(started)) for item in next(loader)][:len(started)]
    assert started == order
    for (prompts, _), items in zip(recorder.calls, recorder.started):
        fresh = [trainer.train.ids[i] for i in items for _ in range(n)]
        assert prompts[len(prompts) - len(fresh):] == fresh
    assert any(len(prompts) > len(items) * n  # some call continued earlier samples
               for (prompts, _), items in zip(recorder.calls, recorder.started))


def test_a_run_resumed_in_the_middle_of_a_partial_batch_matches_an_uninterrupted_one(
        straight, nano_model, tmp_path):
    _, recorder, expected = straight
    interrupted = RLTrainer(resolve_spec(partial_spec(nano_model, tmp_path)))
    again = Recorder(interrupted)
    interrupted.tracker.log_params(interrupted.spec.flat_params())
    for _ in range(2):
        metrics = interrupted.train_step()
        interrupted.step += 1
        interrupted.tracker.log_metrics(metrics, interrupted.step)
    waiting = interrupted.partial.pending
    assert waiting, "nothing waited at the checkpoint: the test would not test resume"
    interrupted.save()
    interrupted.close()
    # the same seed, the same calls: the first two steps equal the straight run's
    assert [(p, b.response_ids.tolist()) for p, b in again.calls] == \
        [(p, b.response_ids.tolist()) for p, b in recorder.calls[:len(again.calls)]]

    resumed = RLTrainer(resolve_spec(partial_spec(nano_model, tmp_path)))
    assert resumed.step == 2 and resumed.partial.pending == waiting
    resumed.fit()
    got = read_metrics(tmp_path)
    assert [m["step"] for m in got] == [m["step"] for m in expected] == list(range(1, STEPS + 1))
    for left, right in zip(expected, got):
        assert stable_metrics(left) == pytest.approx(stable_metrics(right), abs=1e-6), left["step"]


def test_two_ray_ranks_roll_out_the_same_partial_batches_as_one(straight, nano_model, tmp_path,
                                                                local_ray):
    _, recorder, one = straight
    spec = partial_spec(nano_model, tmp_path, resources={"devices_per_node": 2})
    trainer = RLTrainer(resolve_spec(spec), backend="ray")
    two_ranks = Recorder(trainer)
    trainer.fit()
    # each call's rows shard over the ranks and draw from the whole call's table: the same tokens
    assert [(p, b.response_ids.tolist()) for p, b in two_ranks.calls] == \
        [(p, b.response_ids.tolist()) for p, b in recorder.calls]
    two = read_metrics(tmp_path)
    assert [m["step"] for m in two] == list(range(1, STEPS + 1))
    # the gaps between rollout and training log-probs measure the policy's change, in which
    # Adam magnifies the layouts' rounding (of gradients near 0): not compared
    skipped = ("channel/", "rollout/logprob_diff/", "rollout/kl/")
    for left, right in zip(one, two):
        left, right = ({k: v for k, v in stable_metrics(m).items() if not k.startswith(skipped)}
                       for m in (left, right))
        assert left == pytest.approx(right, rel=1e-4, abs=1e-6), left["step"]


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_the_vllm_engine_continues_responses(tmp_path, tiny_cache):
    model = stop_heavy_model(tmp_path / "small", "small")
    trainer = RLTrainer(resolve_spec(partial_spec(model, tmp_path / "run", steps=2,
                                                  rollout={"engine": "vllm"})))
    recorder = Recorder(trainer)
    trainer.fit()
    assert_trained_pieces_were_sampled(recorder)
    # every call sampled from the policy of its step, synced after the update
    versions = [int(batch.weight_version[0]) for _, batch in recorder.calls]
    assert versions == sorted(versions) and set(versions) == {0, 1}
