"""The native rollout split over a rollout group of two CPU ranks (gloo) generates what one rank
generates: each rank holds its part of every layer (its heads and MLP width), the group sums the
row-split projections, and every rank samples the same tokens with the same log-probs, greedy
and sampled, for Qwen2-, Qwen3- and Llama-shaped models (with biases), with the bucketed steps
of device graphs too. Weights synced from a training engine at TP 2 land in each rank's parts
bit for bit; layouts the model cannot split are refused naming the field."""

from __future__ import annotations

import pytest
import torch
from test_rollout_engine import EOS, PAD, llama, make_prompts, nano, qwen3

from rl_core.rollout.decoder import EagerGraphs
from rl_core.rollout.native import NativeRolloutEngine
from rl_core.rollout.parts import is_split, part_of, split_layers
from rl_core.rollout.sampling import SamplingParams, draw_uniforms

def biased_llama():
    """Llama with attention and MLP biases, drawn (they start at 0): o's and down's must be
    added once over the group."""
    model = llama()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


MODELS = {"qwen2": nano, "qwen3": qwen3, "llama": biased_llama}
PARAMS = {"greedy": SamplingParams(max_new_tokens=12, do_sample=False),
          "sampled": SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, n=2)}


def generate(model, params: SamplingParams, group=None, graphs=False):
    engine = NativeRolloutEngine(model, eos_token_ids=[EOS], pad_token_id=PAD, group=group,
                                 graphs=graphs)
    prompts = make_prompts()
    uniforms = None
    if params.do_sample:
        uniforms = draw_uniforms(len(prompts) * params.n, params.max_new_tokens,
                                 torch.Generator().manual_seed(7))
    batch = engine.generate(prompts, params, uniforms=uniforms)
    return {k: batch[k] for k in ("response_ids", "response_mask", "logprobs")}


def _rollouts(rank: int) -> dict:
    import torch.distributed as dist

    out = {}
    for name, build in MODELS.items():
        for how, params in PARAMS.items():
            model = split_layers(build(), rank, 2)
            out[(name, how, "steps")] = generate(model, params, dist.group.WORLD)
            out[(name, how, "graphs")] = generate(model, params, dist.group.WORLD, EagerGraphs())
    return out


def _resharded(rank: int) -> dict:
    """A training engine at TP 2 (one FSDP2 shard) takes a step; the rollout group's parts are
    synced from its buckets."""
    from test_fsdp_engine import OPTIONS, batches
    from test_train_engine import ppo_loss_fn
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine
    from rl_core.models.tiny import build_tiny

    model, tokenizer = build_tiny("nano", seed=1)
    data = batches(tokenizer.pad_token_id, model)
    engine = FSDP2Engine(model, mesh=init_device_mesh("cpu", (1, 2), mesh_dim_names=(
        "shard", "tp")), **OPTIONS)
    engine.train_step(data[0], ppo_loss_fn())
    import torch.distributed as dist

    rollout = NativeRolloutEngine(split_layers(build_tiny("nano", seed=2)[0], rank, 2),
                                  eos_token_ids=[EOS], pad_token_id=PAD, group=dist.group.WORLD)
    rollout.load_weights(engine.weight_buckets())
    # parallel.resharding: none: the projections come as this rank's tensor-parallel part
    same = NativeRolloutEngine(split_layers(build_tiny("nano", seed=3)[0], rank, 2),
                               eos_token_ids=[EOS], pad_token_id=PAD, group=dist.group.WORLD)
    buckets = [[(name, tensor.clone()) for name, tensor in bucket]
               for bucket in engine.weight_buckets(keep_split=is_split)]
    same.load_weights(buckets)
    return {"trained": engine.full_state_dict(),
            "parts": {k: v.clone() for k, v in rollout.model.state_dict().items()},
            "same_layout": {k: v.clone() for k, v in same.model.state_dict().items()},
            "given": {name: tuple(t.shape) for bucket in buckets for name, t in bucket}}


def _every_case(rank: int, out: str) -> None:
    torch.save({"rollouts": _rollouts(rank), "resharded": _resharded(rank)}, f"{out}.{rank}")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from test_fsdp_engine import spawn

    folder = tmp_path_factory.mktemp("rollout-parallel")
    out = folder / "results.pt"
    spawn(_every_case, 2, folder, str(out))
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("how", list(PARAMS))
@pytest.mark.parametrize("steps", ["steps", "graphs"])
def test_a_rollout_group_of_two_generates_what_one_rank_generates(two_ranks, name, how, steps):
    want = generate(MODELS[name](), PARAMS[how])
    assert want["response_mask"].sum(1).float().mean() > 4, "the comparison needs long answers"
    for rank in range(2):
        got = two_ranks[rank]["rollouts"][(name, how, steps)]
        assert torch.equal(got["response_ids"], want["response_ids"]), (rank, name, how)
        assert torch.equal(got["response_mask"], want["response_mask"])
        torch.testing.assert_close(got["logprobs"], want["logprobs"],
                                   rtol=1e-4, atol=1e-5)


def test_synced_weights_land_in_each_ranks_parts_bit_for_bit(two_ranks):
    trained = two_ranks[0]["resharded"]["trained"]
    for rank in range(2):
        parts = two_ranks[rank]["resharded"]["parts"]
        assert parts.keys() == trained.keys()
        for name, full in trained.items():
            assert torch.equal(parts[name], part_of(name, full, rank, 2)), (rank, name)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert two_ranks[1]["resharded"]["parts"][q].shape[0] == trained[q].shape[0] // 2


def test_with_the_same_layout_the_parts_come_split_and_land_the_same(two_ranks):
    """parallel.resharding: none: the projections are gathered over the FSDP2 shards only,
    each rank's tensor-parallel part; the embedding, head and norms in full."""
    trained = two_ranks[0]["resharded"]["trained"]
    for rank in range(2):
        got = two_ranks[rank]["resharded"]
        for name, full in trained.items():
            assert torch.equal(got["same_layout"][name], got["parts"][name]), (rank, name)
            want = part_of(name, full, rank, 2) if is_split(name) else full
            assert got["given"][name] == tuple(want.shape), name
    assert is_split("model.layers.1.mlp.down_proj.weight")
    assert not is_split("model.layers.1.mlp.down_proj.bias")
    assert not is_split("model.embed_tokens.weight")


def test_a_layer_split_keeps_each_ranks_rows_and_columns():
    model = biased_llama()
    full = {k: v.clone() for k, v in model.state_dict().items()}
    split_layers(model, 1, 2)
    parts = model.state_dict()
    at = "model.layers.1."
    assert torch.equal(parts[at + "self_attn.k_proj.weight"], full[at + "self_attn.k_proj.weight"][8:])
    assert torch.equal(parts[at + "mlp.down_proj.weight"], full[at + "mlp.down_proj.weight"][:, 32:])
    assert full[at + "mlp.down_proj.bias"].all()
    assert not parts[at + "mlp.down_proj.bias"].any()  # added once, by the first rank
    assert torch.equal(parts["lm_head.weight"], full["lm_head.weight"])
    assert model.model.layers[1].self_attn.q_proj.out_features == 16


def test_heads_a_rollout_group_cannot_share_are_refused_naming_the_field():
    from rl_core.errors import InputError

    with pytest.raises(InputError, match=r"rollout.tensor_parallel_size: 4 does not divide the "
                                         r"model's 2 key/value heads"):
        split_layers(nano(), 0, 4)


def test_the_spec_takes_a_rollout_group_with_fsdp2_or_vllm():
    from rl_core.spec import SpecError, planned_engine, resolve_spec

    def spec(**sections):
        base = {"data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
                "model": {"path": "tiny:nano"}, "resources": {"devices_per_node": 2},
                "actor": {"strategy": "fsdp2", "ppo_mini_batch_size": 2},
                "rollout": {"tensor_parallel_size": 2}, "trainer": {"logger": []}}
        for key, value in sections.items():
            base[key] = {**base.get(key, {}), **value}
        return resolve_spec(base)

    assert spec().rollout.tensor_parallel_size == 2
    assert planned_engine(spec(resources={"device_type": "gpu"})) == "vllm"  # auto
    # vLLM splits its own copy whatever engine trains
    assert spec(actor={"strategy": "torch"}, rollout={"engine": "vllm"}).rollout.engine == "vllm"
    with pytest.raises(SpecError, match=r"rollout.tensor_parallel_size: 2 splits the rollout's "
                                        r"own copy .*set actor.strategy: fsdp2, rollout.engine: "
                                        r"vllm"):
        spec(actor={"strategy": "torch"})
    same = {"resharding": "none", "tensor_parallel_size": 2}
    with pytest.raises(SpecError, match=r"parallel.resharding: none sends each device its "
                                        r"tensor-parallel part.*rollout.engine: native"):
        spec(rollout={"engine": "vllm"}, parallel=same)
    assert spec(parallel=same).parallel.resharding == "none"  # native


def test_a_vllm_group_is_refused_naming_the_field_where_it_cannot_split(tmp_path):
    """Checked where vLLM is built, before it starts: the model's attention heads and the
    actor's ranks divide by the group."""
    from rl_core.errors import InputError
    from rl_core.models.tiny import save_tiny
    from rl_core.rollout.vllm import join_tensor_parallel

    folder = str(save_tiny(tmp_path / "nano", "nano"))  # 4 attention heads
    with pytest.raises(InputError, match=r"rollout.tensor_parallel_size: 3 does not divide "
                                         r".*'s 4 attention heads"):
        join_tensor_parallel(folder, 3, torch.device("cpu"))
    with pytest.raises(InputError, match=r"rollout.tensor_parallel_size: 2 does not divide the "
                                         r"actor's 1 ranks"):
        join_tensor_parallel(folder, 2, torch.device("cpu"))


def test_the_plan_gives_each_device_of_a_rollout_group_its_part():
    from rl_core import memory_plan as mp
    from rl_core.spec import resolve_spec

    def parts(size: int) -> dict[str, int]:
        spec = resolve_spec({"data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
                             "model": {"path": "tiny:nano"},
                             "resources": {"devices_per_node": 2},
                             "actor": {"strategy": "fsdp2", "ppo_mini_batch_size": 2},
                             "rollout": {"tensor_parallel_size": size},
                             "trainer": {"logger": []}})
        return {c.name: c.bytes for c in mp.plan(spec, mp.tiny_shape("nano")).components}

    one, two = parts(1), parts(2)
    # the group generates both devices' prompts: twice the rows, half the key/value heads
    assert two["rollout KV cache"] == one["rollout KV cache"]
    assert two["rollout full weights"] < one["rollout full weights"]
    assert two["rollout packed weights"] == pytest.approx(one["rollout packed weights"] / 2,
                                                          abs=1)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_plan_gives_each_device_of_a_vllm_group_its_part(device):
    from rl_core import memory_plan as mp
    from rl_core.spec import resolve_spec

    def parts(size: int) -> dict[str, int]:
        spec = resolve_spec({"data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
                             "model": {"path": "tiny:nano"},
                             "resources": {"devices_per_node": 2, "device_type": device},
                             "actor": {"strategy": "fsdp2", "ppo_mini_batch_size": 2},
                             "rollout": {"engine": "vllm", "tensor_parallel_size": size},
                             "trainer": {"logger": []}})
        plan = mp.plan(spec, mp.tiny_shape("nano"), device_memory_bytes=mp.GIB)
        return {c.name: c.bytes for c in plan.components}

    one, two = parts(1), parts(2)
    assert two["vLLM weights"] == pytest.approx(one["vLLM weights"] / 2, abs=1)
    assert two["actor full model (template)"] == one["actor full model (template)"]
    if device == "cpu":  # a fixed cache of half the key/value heads
        assert two["vLLM KV cache"] == pytest.approx(one["vLLM KV cache"] / 2, abs=1)
        assert two["vLLM packed projections"] == pytest.approx(
            one["vLLM packed projections"] / 2, abs=1)
    else:  # the rest of its share of the device, which half the weights leave larger
        assert two["vLLM KV cache"] > one["vLLM KV cache"]


def test_the_32b_example_fits_a_910b_only_with_rollout_groups():
    """Qwen3-32B on 16 NPUs of 64 GB: the rollout's parts fit beside training; a full copy a
    device (61 GiB in bfloat16) does not."""
    from pathlib import Path

    from rl_core import memory_plan as mp
    from rl_core.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "examples" / "grpo_qwen3_32b.yaml")
    assert (spec.rollout.tensor_parallel_size, spec.parallel.tensor_parallel_size,
            spec.world_size) == (8, 4, 16)
    split = mp.plan(spec, mp.shape_of(spec))
    whole_spec = spec.model_copy(update={"rollout": spec.rollout.model_copy(
        update={"tensor_parallel_size": 1})})
    whole = mp.plan(whole_spec, mp.shape_of(whole_spec))
    assert split.fits and not whole.fits
    weights = {p.setup.rollout_parallel: next(c.bytes for c in p.components
                                              if c.name == "rollout full weights")
               for p in (split, whole)}
    assert weights[1] / mp.GIB == pytest.approx(61.0, abs=0.1)
    assert weights[8] < weights[1] / 5  # the layers split 8 ways, embedding and head whole
