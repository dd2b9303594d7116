"""LoRA (`actor.lora`, PEFT) on the nano model: only the adapters train, the adapters-off forward
is the base, the rollout's weights are the base plus (alpha / rank) · B A under the base's names,
the state resumes exactly, FSDP2 on two ranks equals the plain engine, and the spec refuses what
it cannot train, naming the field."""

from __future__ import annotations

import copy

import pytest
import torch
from test_fsdp_engine import OPTIONS, batches
from test_train_engine import R, make_batch, ppo_loss_fn

from tests.ranks import spawn

from rl_core.engines.lora import adapter_names, save_adapters
from rl_core.engines.train import TrainEngine
from rl_core.errors import InputError
from rl_core.models.tiny import build_tiny
from rl_core.spec import LORA_TARGETS, LoraConfig, SpecError, resolve_spec

LORA = LoraConfig(rank=4, alpha=8.0)
SCALE = LORA.alpha / LORA.rank


@pytest.fixture(scope="module")
def nano():
    model, tokenizer = build_tiny("nano", seed=1)
    return model, tokenizer.pad_token_id


def adapted(nano, **options) -> TrainEngine:
    """An engine with adapters whose B is nonzero (PEFT starts it at 0: the base exactly)."""
    engine = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2, lora=LORA, **options)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in engine.model.named_parameters():
            if ".lora_B." in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=g))
    return engine


def logprobs(engine, batch):
    out, _ = engine.forward_logprobs(batch["input_ids"], batch["attention_mask"],
                                     batch["position_ids"], R)
    return out


def rl_batch(engine, pad_id, seed=0):
    batch = make_batch(pad_id, seed, 8)
    batch["old_logprobs"] = logprobs(engine, batch) + 0.05
    g = torch.Generator().manual_seed(seed + 100)
    batch["advantages"] = torch.randn(8, 1, generator=g).expand(8, R).clone()
    return batch


def test_the_merged_weights_are_the_base_plus_scaled_b_a_under_the_base_names(nano):
    engine = adapted(nano)
    base = nano[0].state_dict()
    merged = {name: t for bucket in engine.weight_buckets(bucket_bytes=4096) for name, t in bucket}
    assert list(merged) == list(base)  # the base's own names, in order: no adapter entries
    layers = dict(engine.model.get_base_model().named_modules())
    merged_names = set()
    for name, weight in base.items():
        owner, _, leaf = name.rpartition(".")
        if owner.rsplit(".", 1)[-1] in LORA_TARGETS and leaf == "weight":
            layer = layers[owner]
            a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
            assert b.abs().sum() > 0
            expected = weight + SCALE * (b @ a)
            torch.testing.assert_close(merged[name], expected, rtol=0, atol=1e-7)
            assert not torch.equal(merged[name], weight), name
            merged_names.add(name)
        else:
            assert torch.equal(merged[name], weight), name
    assert len(merged_names) == len(LORA_TARGETS) * nano[0].config.num_hidden_layers


def test_the_merged_model_computes_as_the_adapted_one(nano):
    engine = adapted(nano)
    batch = make_batch(nano[1], 1, 8)
    model = copy.deepcopy(nano[0])
    model.load_state_dict(engine.full_state_dict())
    torch.testing.assert_close(logprobs(TrainEngine(model, lr=0.0), batch),
                               logprobs(engine, batch), rtol=0, atol=1e-5)


def test_only_the_adapters_train_and_the_base_stays_as_loaded(nano):
    engine = adapted(nano)
    names = adapter_names(engine.model)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    stepped = [p for group in engine.optimizer.param_groups for p in group["params"]]
    assert len(stepped) == len(names) == len(engine.params)
    assert sum(p.numel() for p in stepped) < sum(p.numel() for p in nano[0].parameters()) / 4
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    metrics = engine.train_step(rl_batch(engine, nano[1]), ppo_loss_fn())
    assert metrics["actor/grad_norm"] > 0
    for name, param in engine.model.named_parameters():
        assert torch.equal(param, before[name]) != (name in names), name


def test_the_adapters_off_forward_is_the_base_model(nano):
    engine = adapted(nano)
    engine.train_step(rl_batch(engine, nano[1]), ppo_loss_fn())
    batch = make_batch(nano[1], 2, 8)
    base = logprobs(TrainEngine(copy.deepcopy(nano[0]), lr=0.0), batch)
    with engine.adapters_off():
        off = logprobs(engine, batch)
    assert torch.equal(off, base)
    assert (logprobs(engine, batch) - base).abs().max() > 1e-3  # the adapters are back on


def test_packing_and_checkpointing_give_the_same_step(nano):
    plain = adapted(nano)
    batch = rl_batch(plain, nano[1])
    model = copy.deepcopy(nano[0])
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    packed = TrainEngine(model, lr=1e-2, lora=LORA, remove_padding=True)
    with torch.no_grad():  # the same adapters
        for (name, param), (_, same) in zip(packed.model.named_parameters(),
                                            plain.model.named_parameters()):
            param.copy_(same)
    want = plain.train_step(batch, ppo_loss_fn())
    got = packed.train_step(batch, ppo_loss_fn())
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    for (name, a), (_, b) in zip(packed.full_state_dict().items(),
                                 plain.full_state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=name)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU has no bfloat16 support in oneDNN")
def test_bfloat16_keeps_float32_masters_of_the_adapters_only(nano):
    engine = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2, lora=LORA, param_dtype="bfloat16")
    assert len(engine.masters) == len(adapter_names(engine.model))
    assert all(m.dtype == torch.float32 for m in engine.masters)
    engine.train_step(rl_batch(engine, nano[1]), ppo_loss_fn())
    assert all(t.dtype == torch.bfloat16 for b in engine.weight_buckets() for _, t in b
               if t.is_floating_point() and "rotary" not in _)


def test_the_state_resumes_exactly_and_refuses_a_full_fine_tuning_one(nano, tmp_path):
    engine = adapted(nano)
    data = [rl_batch(engine, nano[1], seed) for seed in range(3)]
    engine.train_step(data[0], ppo_loss_fn())
    torch.save(engine.state_dict(), tmp_path / "state.pt")
    resumed = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2, lora=LORA)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    for batch in data[1:]:
        assert resumed.train_step(batch, ppo_loss_fn()) == engine.train_step(batch, ppo_loss_fn())
    for (name, a), (_, b) in zip(resumed.full_state_dict().items(),
                                 engine.full_state_dict().items()):
        assert torch.equal(a, b), name
    full = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2)
    with pytest.raises(InputError, match="actor.lora: the checkpoint was saved with LoRA"):
        full.load_state_dict(engine.state_dict())
    with pytest.raises(InputError, match="actor.lora: the checkpoint was saved by full"):
        resumed.load_state_dict(full.state_dict())


def test_saved_adapters_load_with_peft(nano, tmp_path):
    from peft import PeftModel

    engine = adapted(nano)
    save_adapters(engine.model, tmp_path / "adapter", engine.adapter_state())
    loaded = PeftModel.from_pretrained(copy.deepcopy(nano[0]), tmp_path / "adapter")
    batch = make_batch(nano[1], 4, 8)
    assert torch.equal(logprobs(TrainEngine(loaded, lr=0.0), batch), logprobs(engine, batch))


def test_target_modules_that_match_nothing_are_refused(nano):
    lora = LoraConfig(target_modules=["qkv_proj"])
    with pytest.raises(InputError, match=r"actor.lora.target_modules: \['qkv_proj'\] matches no "
                       r"linear layer .* q_proj"):
        TrainEngine(copy.deepcopy(nano[0]), lr=1e-2, lora=lora)
    engine = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2,
                         lora=LoraConfig(target_modules="all-linear"))
    assert len(adapter_names(engine.model)) == 2 * 7 * nano[0].config.num_hidden_layers


SPEC = {"data": {"synthetic": {"task": "addition"}}, "actor": {"lora": {"rank": 8}}}


@pytest.mark.parametrize("changes,field,words", [
    ({"actor": {"strategy": "megatron", "lora": {}}, "resources": {"device_type": "gpu"}},
     "actor.lora", "actor.strategy: megatron"),
    ({"actor": {"strategy": "fsdp2", "lora": {}}, "parallel": {"tensor_parallel_size": 2},
      "resources": {"devices_per_node": 2}}, "parallel.tensor_parallel_size", "actor.lora"),
    ({"actor": {"strategy": "fsdp2", "lora": {}}, "parallel": {"expert_parallel_size": 2},
      "resources": {"devices_per_node": 2}}, "parallel.expert_parallel_size", "actor.lora"),
    ({"actor": {"lora": {}}, "reference": {"offload": True}, "resources": {"device_type": "gpu"}},
     "reference.offload", "no reference model"),
    ({"actor": {"lora": {"target_modules": ["q proj"]}}}, "actor.lora.target_modules", "pattern"),
    ({"actor": {"lora": {"rank": 0}}}, "actor.lora.rank", "greater than 0"),
])
def test_the_spec_refuses_what_lora_cannot_train(changes, field, words):
    with pytest.raises(SpecError) as refused:
        resolve_spec({**SPEC, **changes})
    lines = [line for line in str(refused.value).splitlines() if line.startswith(field)]
    assert lines and any(words in line for line in lines), str(refused.value)


def test_the_spec_takes_lora_with_its_defaults():
    lora = resolve_spec(SPEC).actor.lora
    assert (lora.rank, lora.alpha, lora.dropout) == (8, 32.0, 0.0)
    assert tuple(lora.target_modules) == LORA_TARGETS
    assert resolve_spec({**SPEC, "actor": {"lora": {"target_modules": "all-linear"}}}
                        ).actor.lora.target_modules == "all-linear"
    assert resolve_spec({"data": SPEC["data"]}).actor.lora is None


# --------------------------------------------------------------------------- FSDP2


def _sharded(rank: int, out: str) -> None:
    """Adapters on two FSDP2 ranks, each half of every mini-batch; the adapters' sharded
    checkpoint reloaded; the merged weights gathered."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine

    model, tokenizer = build_tiny("nano", seed=1)
    data = batches(tokenizer.pad_token_id, model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)  # PEFT draws A from the global generator
    engine = FSDP2Engine(model, mesh=mesh, lora=LORA, **OPTIONS)
    rows = slice(4 * rank, 4 * rank + 4)
    metrics = [engine.train_step({k: v[rows] for k, v in b.items()}, ppo_loss_fn())
               for b in data]
    weights = engine.full_state_dict()
    engine.save_sharded(f"{out}.dcp")
    adapters = engine.adapter_state()
    with torch.no_grad():
        for param in engine.inner.params:  # spoil them, then reload the saved ones
            param.zero_()
    engine.load_sharded(f"{out}.dcp")
    reloaded = engine.adapter_state()
    if rank == 0:
        torch.save({"metrics": metrics, "weights": weights, "adapters": adapters,
                    "reloaded": reloaded}, out)


def test_two_sharded_ranks_with_adapters_equal_one_plain_rank(tmp_path):
    out = tmp_path / "lora.pt"
    spawn(_sharded, 2, tmp_path, str(out))
    sharded = torch.load(out, weights_only=False)

    model, tokenizer = build_tiny("nano", seed=1)
    data = batches(tokenizer.pad_token_id, model)
    torch.manual_seed(0)
    plain = TrainEngine(model, lora=LORA, **OPTIONS)
    expected = [plain.train_step(b, ppo_loss_fn()) for b in data]
    assert all(m["actor/grad_norm"] > 0 for m in expected[1:])
    for got, want in zip(sharded["metrics"], expected):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    weights = plain.full_state_dict()
    assert list(sharded["weights"]) == list(weights)
    for name, value in weights.items():
        torch.testing.assert_close(sharded["weights"][name], value, rtol=0, atol=1e-5, msg=name)
    for name, value in sharded["adapters"].items():
        assert torch.equal(sharded["reloaded"][name], value), name
    assert len(sharded["adapters"]) == len(adapter_names(plain.model))
    assert len(list((tmp_path / "lora.pt.dcp").glob("*.distcp"))) == 2


# --------------------------------------------------------------------------- memory plan


def test_the_memory_plan_counts_adapter_state_only_and_no_reference():
    import dataclasses

    from rl_core import memory_plan as mp

    # h=8, I=16, 2 layers, q 8 wide, k/v 4 (test_memory_plan's SMALL: 1272 parameters). Rank 2
    # on the seven projections, per layer: q 2·(8+8)=32, k and v 2·(8+4)=24 each, o 32,
    # gate and up 2·(8+16)=48 each, down 48: 256; two layers 512.
    small = mp.ModelShape(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, vocab_size=10,
                          tie_word_embeddings=True)
    assert mp.lora_parameters(small, 2, LORA_TARGETS) == 512
    assert mp.lora_parameters(small, 2, "all-linear") == 512
    assert mp.lora_parameters(small, 2, ("q_proj", "v_proj")) == 2 * (32 + 24)
    spec = resolve_spec({"data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
                         "model": {"dtype": "bfloat16"}, "resources": {"devices_per_node": 2},
                         "actor": {"lora": {"rank": 2}}})
    parts = {c.name: c for c in mp.plan(spec, small).components}
    assert parts["actor parameters"].bytes == (1272 + 512) * 2  # base and adapters, bfloat16
    assert parts["actor master weights"].bytes == 512 * 4  # the adapters' float32 masters
    assert parts["actor gradients"].bytes == 512 * 4
    assert parts["actor AdamW moments"].bytes == 2 * 512 * 4
    assert parts["actor gradient all-reduce"].bytes == 512 * 4
    assert parts["rollout full weights"].bytes == 1272 * 2  # the rollout's merged copy
    assert not [name for name in parts if name.startswith("reference")]
    assert "actor reference log-probs forward" in parts
    full = {c.name: c for c in mp.plan(resolve_spec({**spec.model_dump(mode="json"), "actor": {
        **spec.actor.model_dump(mode="json"), "lora": None}}), small).components}
    assert full["reference parameters"].bytes == 1272 * 2
    assert full["actor AdamW moments"].bytes == 2 * 1272 * 4

    fsdp2 = {c.name: c for c in mp.plan_setup(dataclasses.replace(
        mp.setup_of(spec), strategy="fsdp2", devices=4), small, None).components}
    assert fsdp2["actor parameter shards"].bytes == 446 * 4  # ceil(1784 / 4) float32 masters
    assert fsdp2["actor gradient shards"].bytes == 128 * 4  # the adapters' 512 / 4
    assert fsdp2["actor AdamW moments"].bytes == 2 * 128 * 4
    assert "actor root gradient reduce" not in fsdp2  # the root has no adapters
    assert fsdp2["actor unsharded gradients"].bytes == 256 * (2 + 4)


def test_the_planned_adapters_are_the_engines(nano):
    from rl_core import memory_plan as mp

    engine = TrainEngine(copy.deepcopy(nano[0]), lr=1e-2, lora=LORA)
    shape = mp.shape_from_config(nano[0].config.to_dict())
    assert mp.lora_parameters(shape, LORA.rank, LORA.target_modules) == sum(
        p.numel() for p in engine.params)


def _context_parallel(rank: int, out: str) -> None:
    """Adapters on two context-parallel ranks (Ulysses): both hold every row, each half of the
    packed tokens."""
    import torch.distributed as dist

    model, tokenizer = build_tiny("nano", seed=1)
    data = batches(tokenizer.pad_token_id, model)
    torch.manual_seed(0)
    engine = TrainEngine(model, cp_group=dist.group.WORLD, lora=LORA, remove_padding=True,
                         **OPTIONS)
    metrics = [engine.train_step(b, ppo_loss_fn()) for b in data]
    if rank == 0:
        torch.save({"metrics": metrics, "weights": engine.full_state_dict()}, out)


def test_two_context_parallel_ranks_with_adapters_equal_one_rank(tmp_path):
    out = tmp_path / "cp.pt"
    spawn(_context_parallel, 2, tmp_path, str(out))
    got = torch.load(out, weights_only=False)
    model, tokenizer = build_tiny("nano", seed=1)
    data = batches(tokenizer.pad_token_id, model)
    torch.manual_seed(0)
    plain = TrainEngine(model, lora=LORA, remove_padding=True, **OPTIONS)
    expected = [plain.train_step(b, ppo_loss_fn()) for b in data]
    for metrics, want in zip(got["metrics"], expected):
        assert metrics == pytest.approx(want, rel=1e-4, abs=1e-6)
    for name, value in plain.full_state_dict().items():
        torch.testing.assert_close(got["weights"][name], value, rtol=0, atol=5e-5, msg=name)
