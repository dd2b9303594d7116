"""Context parallelism on two CPU ranks (gloo) equals one rank: the packed tokens of each
micro-batch split over the ranks, attention exchanged by all-to-all (Ulysses) or by passing the
keys and values around the ring, give the log-probs, entropy, values, metrics and weights of
the plain engine on one rank, with the plain engine and with FSDP2 sharding over the same
ranks; key/value heads too few to split are repeated; heads that Ulysses cannot split are
refused naming both numbers."""

from __future__ import annotations

import copy

import pytest
import torch
from test_fsdp_engine import OPTIONS, batches, spawn
from test_train_engine import R, ppo_loss_fn

from rl_core.engines.packing import pack
from rl_core.engines.train import TrainEngine, ValueHead
from rl_core.models.tiny import build_tiny

PACKED = {**OPTIONS, "remove_padding": True}
SHAPES = {"gqa": {}, "one-kv-head": {"num_key_value_heads": 1}}


def nano(shape: str, seed: int = 1):
    return build_tiny("nano", seed=seed, **SHAPES[shape])


def forward(engine, batch, **options):
    return engine.forward_logprobs(batch["input_ids"], batch["attention_mask"],
                                   batch["position_ids"], R, **options)


# (shape, strategy, algorithm) of the training cases, all run by one pair of ranks
CASES = [("gqa", "torch", "ulysses"), ("one-kv-head", "torch", "ulysses"),
         ("gqa", "fsdp2", "ulysses"), ("gqa", "torch", "ring"), ("one-kv-head", "fsdp2", "ring")]
ALGORITHMS = ("ulysses", "ring")
# a different weight for every response column: each token's value matters to the loss
WEIGHTS = torch.linspace(-1.0, 2.0, R)


def _steps(shape: str, strategy: str, algorithm: str) -> dict:
    """Both ranks hold every row: the context-parallel group is the whole world."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine

    model, tokenizer = nano(shape)
    data = batches(tokenizer.pad_token_id, model)
    world = dist.group.WORLD
    if strategy == "fsdp2":
        engine = FSDP2Engine(model, mesh=init_device_mesh("cpu", (2,)), cp_group=world,
                             dp_group=None, cp_algorithm=algorithm, **PACKED)
    else:
        engine = TrainEngine(model, cp_group=world, cp_algorithm=algorithm, **PACKED)
    with torch.no_grad():
        before = forward(engine, data[0], temperature=0.7, with_entropy=True)
    metrics = [engine.train_step(b, ppo_loss_fn(), with_entropy=True) for b in data]
    weights = (engine.full_state_dict() if strategy == "fsdp2"
               else {k: v.clone() for k, v in engine.model.state_dict().items()})
    return {"before": before, "metrics": metrics, "weights": weights}


def _values(algorithm: str) -> dict:
    """A critic's values, and its gradients summed over the ranks' parts."""
    import torch.distributed as dist

    engine = TrainEngine(_critic(), cp_group=dist.group.WORLD, cp_algorithm=algorithm,
                         head=ValueHead(), **PACKED)
    values, _ = forward(engine, batches(256, build_tiny("nano", seed=1)[0])[1], grad=True)
    (values * WEIGHTS).sum().backward()
    grads = {}
    for name, param in engine.model.named_parameters():
        grads[name] = param.grad.clone()
        dist.all_reduce(grads[name])
    return {"values": values.detach(), "grads": grads}


def _indivisible() -> str:
    import torch.distributed as dist

    from rl_core.engines.context import context_parallel, ulysses_attention

    q = torch.zeros(1, 3, 4, 8)
    try:
        with context_parallel(dist.group.WORLD):
            ulysses_attention(lambda *a, **k: None, torch.nn.Module(), q, q, q, dist.group.WORLD)
    except ValueError as exc:
        return str(exc)
    return "accepted"


def _every_case(rank: int, out: str) -> None:
    """Every two-rank case of this module in one group (one start of two processes)."""
    results = {"steps": {case: _steps(*case) for case in CASES},
               "values": {algorithm: _values(algorithm) for algorithm in ALGORITHMS},
               "indivisible": _indivisible()}
    if rank == 0:
        torch.save(results, out)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("context-parallel")
    out = folder / "results.pt"
    spawn(_every_case, 2, folder, str(out))
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("case", CASES, ids=["-".join(case) for case in CASES])
def test_two_context_parallel_ranks_equal_one_rank(two_ranks, case):
    got = two_ranks["steps"][case]
    model, tokenizer = nano(case[0])
    data = batches(tokenizer.pad_token_id, model)
    plain = TrainEngine(model, **PACKED)
    with torch.no_grad():
        lp, ent = forward(plain, data[0], temperature=0.7, with_entropy=True)
    torch.testing.assert_close(got["before"][0], lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["before"][1], ent, rtol=1e-5, atol=1e-5)
    expected = [plain.train_step(b, ppo_loss_fn(), with_entropy=True) for b in data]
    assert any(m["actor/grad_norm"] > 0 for m in expected), "the comparison needs real updates"
    for metrics, want in zip(got["metrics"], expected):
        assert metrics == pytest.approx(want, rel=1e-4, abs=1e-6)
    for name, value in plain.model.state_dict().items():
        # AdamW turns the rounding noise of a gradient entry near 0 into a step of up to lr:
        # 1e-5 here after 3 steps at lr 1e-2 (weights of about 0.1); a key bias gets none
        if not name.endswith("k_proj.bias"):
            difference = (got["weights"][name] - value).abs().max().item()
            assert difference < 5e-5, (name, difference)


def _critic():
    from transformers import AutoModelForTokenClassification

    model, _ = build_tiny("nano", seed=1)
    config = copy.deepcopy(model.config)
    config.num_labels = 1
    torch.manual_seed(0)
    return AutoModelForTokenClassification.from_config(config).eval()  # no dropout


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_critics_values_and_their_gradients_equal_one_ranks(two_ranks, algorithm):
    """The gradient of each rank's share flows back through the exchanges; the ranks' partial
    gradients (here of a forward outside train_step) sum to one rank's."""
    got = two_ranks["values"][algorithm]
    engine = TrainEngine(_critic(), head=ValueHead(), **PACKED)
    values, _ = forward(engine, batches(256, build_tiny("nano", seed=1)[0])[1], grad=True)
    torch.testing.assert_close(got["values"], values.detach(), rtol=1e-5, atol=1e-5)
    (values * WEIGHTS).sum().backward()
    for name, param in engine.model.named_parameters():
        assert param.grad.abs().sum() > 0, name
        torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6)


def test_heads_that_do_not_divide_by_the_group_are_refused_naming_both(two_ranks):
    assert "3 heads do not divide by 2 ranks" in two_ranks["indivisible"]


def test_a_packed_sequence_is_padded_to_equal_shares_that_keep_every_response_token():
    model, tokenizer = nano("gqa")
    batch = batches(tokenizer.pad_token_id, model)[0]
    ids, mask, positions = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    whole = pack(ids, mask, positions, R)
    n = int(mask.sum())
    size = next(m for m in (3, 5, 7) if n % m)  # shares that need filler tokens
    packed = pack(ids, mask, positions, R, multiple_of=size)
    assert packed.input_ids.shape[1] == n + (-n % size) > n
    bounds = packed.attention["rl_core_cu_seq_lens"]
    assert bounds[:-1] == whole.attention["rl_core_cu_seq_lens"]  # the filler: a row of its own
    assert bounds[-1] == packed.input_ids.shape[1]
    shares = [packed.shard(rank, size) for rank in range(size)]
    assert shares[0].counts == shares[-1].counts and sum(shares[0].counts) == len(whole.keep)
    keep = torch.cat([s.keep + rank * (packed.input_ids.shape[1] // size)
                      for rank, s in enumerate(shares)])
    assert torch.equal(keep, whole.keep)
    assert torch.equal(torch.cat([s.labels for s in shares]), whole.labels)
    with pytest.raises(ValueError, match=f"cannot be shared by {size + 1} ranks"):
        packed.shard(0, size + 1)


def test_context_parallelism_needs_packing():
    with pytest.raises(ValueError, match="set remove_padding"):
        TrainEngine(nano("gqa")[0], cp_group=object(), **OPTIONS)


# --------------------------------------------------------------------------- the spec and plan


def cp_spec(size: int = 2, **actor):
    from rl_core.spec import resolve_spec

    return resolve_spec({
        "data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
        "model": {"path": "tiny:nano"}, "resources": {"devices_per_node": 4},
        "actor": {"use_remove_padding": True, "ppo_mini_batch_size": 2, **actor},
        "parallel": {"context_parallel_size": size}, "trainer": {"logger": []}})


def test_the_spec_takes_context_parallelism_with_packing_and_refuses_it_without():
    from rl_core.spec import SpecError, resolve_spec

    spec = cp_spec(2)
    assert (spec.world_size, spec.data_parallel_size, spec.model_parallel_size) == (4, 2, 2)
    with pytest.raises(SpecError, match=r"parallel.context_parallel_size: 2 splits each packed "
                                        r".*set actor.use_remove_padding: true"):
        cp_spec(2, use_remove_padding=False)
    assert cp_spec(2).parallel.context_parallel_algo == "ulysses"  # the default
    ring = resolve_spec({**cp_spec(2).model_dump(mode="json"),
                         "parallel": {"context_parallel_size": 2, "context_parallel_algo": "ring"}})
    assert ring.parallel.context_parallel_algo == "ring"


def test_the_plan_shares_activations_and_shards_over_the_context_group():
    from rl_core import memory_plan as mp

    def parts(size: int, strategy: str = "fsdp2") -> dict[str, int]:
        plan = mp.plan(cp_spec(size, strategy=strategy), mp.tiny_shape("nano"), 80 * mp.GIB)
        return {c.name: c.bytes for c in plan.components}

    one, two = parts(1), parts(2)
    assert two["actor activations"] == one["actor activations"] // 2
    assert two["actor logits"] == pytest.approx(one["actor logits"] / 2, abs=1)
    # fsdp2 shards over data- x context-parallel ranks: all 4 devices either way, not the 2
    # data-parallel ranks
    assert two["actor parameter shards"] == one["actor parameter shards"] == 27_136 // 4 * 4
    assert "actor ring attention blocks" not in two
    plan = mp.plan(cp_spec(2), mp.tiny_shape("nano"), 80 * mp.GIB)
    ring_spec = cp_spec(2).model_copy(update={"parallel": cp_spec(2).parallel.model_copy(
        update={"context_parallel_algo": "ring"})})
    ring = {c.name: c.bytes for c in mp.plan(ring_spec, mp.tiny_shape("nano"),
                                              80 * mp.GIB).components}
    # micro-batches of 2 rows x (128 + 64) tokens, 192 a device: in each of 2 layers, 2 blocks
    # x 4 heads x 192 tokens x (head_dim 8 x (2 float32 keys/values + 1 float32 output) + a
    # float32 log-sum-exp), and one step's float32 scores and weights, 2 x 4 x 4 x 192 x 192
    assert ring["actor ring attention blocks"] == (2 * 2 * 4 * 192 * (8 * 12 + 4)
                                                   + 2 * 4 * 4 * 192 * 192)
    assert plan.total_bytes < mp.plan(ring_spec, mp.tiny_shape("nano"), 80 * mp.GIB).total_bytes


def test_heads_the_group_cannot_share_are_refused_naming_the_field():
    from rl_core.engines.context import check_heads
    from rl_core.errors import InputError

    config = nano("gqa")[0].config
    check_heads(config, 2)
    with pytest.raises(InputError, match=r"parallel.context_parallel_size: 3 does not divide the "
                                         r"model's 4 attention heads.*context_parallel_algo: ring"):
        check_heads(config, 3)
    check_heads(config, 3, "ring")  # ring attention splits tokens, not heads


def test_the_long_response_example_fits_only_with_context_parallelism():
    """32k-token sequences, two to a micro-batch: split over 8 NPUs the update fits a 910B;
    on one it would need more than the device."""
    from pathlib import Path

    from rl_core import memory_plan as mp
    from rl_core.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "examples" / "grpo_qwen3_8b_long.yaml")
    assert spec.parallel.context_parallel_size == 8 and spec.world_size == 16
    split = mp.plan(spec, mp.shape_of(spec))
    alone = spec.model_copy(update={"parallel": spec.parallel.model_copy(
        update={"context_parallel_size": 1})})
    whole = mp.plan(alone, mp.shape_of(alone))
    assert split.fits and not whole.fits
    assert split.phase_bytes()["backward"] < whole.phase_bytes()["backward"] / 4
