"""Tensor parallelism on four CPU ranks (gloo) equals the plain engine on one: the decoder's
matrices split over two ranks, with FSDP2 over the other two (each pair its half of the rows)
or with context parallelism over them (Ulysses and ring: every rank all rows), packed and
padded, for a Qwen2-shaped and a Qwen3-shaped model and a critic, give the same metrics and
weights after optimizer steps; the vocabulary-parallel log-probs equal the dense ones with their
gradients; a checkpoint written at TP 2 loads at TP 1 exactly; layouts the model cannot split
are refused naming the field."""

from __future__ import annotations

import copy

import pytest
import torch
from test_fsdp_engine import OPTIONS, batches, full_optimizer_state, spawn
from test_train_engine import R, ppo_loss_fn

from rl_core.engines.train import TrainEngine, ValueHead
from rl_core.models.tiny import build_tiny

PACKED = {**OPTIONS, "remove_padding": True}
QWEN3_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
              "pad_token_id", "eos_token_id", "bos_token_id", "tie_word_embeddings")


def qwen3():
    """nano's sizes in Qwen3's layout: per-head q/k norms, heads × head_dim ≠ hidden size."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base, tokenizer = build_tiny("nano", seed=1)
    config = Qwen3Config(**{k: v for k, v in base.config.to_dict().items() if k in QWEN3_KEYS},
                         head_dim=12)
    torch.manual_seed(3)
    return Qwen3ForCausalLM(config).eval(), tokenizer


def nano():
    return build_tiny("nano", seed=1)


def critic():
    from transformers import AutoModelForTokenClassification

    config = copy.deepcopy(nano()[0].config)
    config.num_labels, config.classifier_dropout = 1, 0.0
    torch.manual_seed(0)
    return AutoModelForTokenClassification.from_config(config).eval(), nano()[1]


def value_loss_fn():
    def loss_fn(micro, values, _entropy):
        mask = micro["response_mask"]
        loss = ((values - micro["advantages"]) ** 2 * mask).sum() / mask.sum()
        return loss, {"critic/vf_loss": loss.detach()}

    return loss_fn


MODELS = {"qwen3": qwen3, "nano": nano, "critic": critic}
# a different weight for every row and response column: each output matters to the gradient
WEIGHTS = torch.linspace(-1.0, 2.0, 8 * R).view(8, R)
# name -> (model, context parallelism (None: FSDP2 over the other pair, rows split), packed)
CASES = {
    "qwen3-fsdp2-packed": ("qwen3", None, True),
    "nano-fsdp2-padded": ("nano", None, False),
    "nano-ulysses": ("nano", "ulysses", True),
    "nano-ring": ("nano", "ring", True),
    "critic-fsdp2-packed": ("critic", None, True),
}


def _options(model: str, packed: bool) -> dict:
    options = dict(PACKED if packed else OPTIONS)
    if model == "critic":
        options.update(head=ValueHead(), metric_prefix="critic/")
    return options


def _loss(model: str):
    return value_loss_fn() if model == "critic" else ppo_loss_fn()


def _case(name: str, mesh, folder: str) -> dict:
    """Steps on one case; rank = (pair × 2) + tensor-parallel index."""
    import torch.distributed as dist

    from rl_core.engines.context import context_groups
    from rl_core.engines.fsdp import FSDP2Engine

    model_name, algorithm, packed = CASES[name]
    model, tokenizer = MODELS[model_name]()
    data = batches(tokenizer.pad_token_id, nano()[0])
    options = _options(model_name, packed)
    if algorithm is None:  # the pairs hold different rows
        rows = slice(0, 4) if dist.get_rank() < 2 else slice(4, 8)
        engine = FSDP2Engine(model, mesh=mesh, **options)
    else:  # every rank all rows, tokens split over the pairs
        rows = slice(None)
        _, cp_group = context_groups(4, 2, 2)
        engine = FSDP2Engine(model, mesh=mesh, cp_group=cp_group, dp_group=None,
                             cp_algorithm=algorithm, **options)
    grads = _gradients(engine, data[0], rows)
    metrics = [engine.train_step({k: v[rows] for k, v in b.items()}, _loss(model_name))
               for b in data]
    out = {"grads": grads, "metrics": metrics, "weights": engine.full_state_dict()}
    if name == "qwen3-fsdp2-packed":
        engine.save_sharded(folder)
        out["optimizer"] = full_optimizer_state(engine)
    return out


def _gradients(engine, batch: dict, rows: slice) -> dict[str, torch.Tensor]:
    """Each parameter's gradient, in full, of a weighted sum of the outputs of `rows` (the
    ranks' sums add up to the whole batch's)."""
    outputs, _ = engine.forward_logprobs(batch["input_ids"][rows], batch["attention_mask"][rows],
                                         batch["position_ids"][rows], R, grad=True)
    (outputs * WEIGHTS[rows]).sum().backward()
    grads = {name: getattr(param.grad, "full_tensor", lambda g=param.grad: g)()
             for name, param in engine.model.named_parameters()}
    engine.model.zero_grad(set_to_none=True)
    return grads


def _resumed_at_tp1(folder: str) -> dict:
    """The TP 2 checkpoint loaded into FSDP2 alone over the four ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine

    engine = FSDP2Engine(qwen3()[0], mesh=init_device_mesh("cpu", (4,)), **PACKED)
    engine.load_sharded(folder)
    return {"weights": engine.full_state_dict(), "optimizer": full_optimizer_state(engine)}


def _vocab_parallel(mesh) -> dict:
    """Log-probs and entropy of logits over an uneven split of 263 tokens (132 + 131), and the
    gradient of each rank's part, gathered."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from rl_core.engines.tensor import vocab_parallel_logprobs

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 263, generator=generator) * 4
    labels = torch.randint(0, 263, (3, 5), generator=generator)
    weights = torch.randn(2, 3, 5, generator=generator)
    split = distribute_tensor(logits, mesh, [Shard(2)]).requires_grad_()
    # chunks of 2 positions: the chunked path on every rank
    logprobs, entropy = vocab_parallel_logprobs(split, labels, 0.7, True, chunk_bytes=2 * 132 * 8)
    (logprobs * weights[0] + entropy * weights[1]).sum().backward()
    return {"logprobs": logprobs.detach(), "entropy": entropy.detach(),
            "grad": split.grad.full_tensor()}


def _every_case(rank: int, folder: str, out: str) -> None:
    """Every four-rank case of this module in one group (one start of four processes)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tp"))
    checkpoint = f"{folder}/tp2.dcp"
    results = {"cases": {name: _case(name, mesh, checkpoint) for name in CASES},
               "resumed": _resumed_at_tp1(checkpoint), "vocab": _vocab_parallel(mesh["tp"])}
    if rank == 0:
        torch.save(results, out)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tensor-parallel")
    out = folder / "results.pt"
    spawn(_every_case, 4, folder, str(folder), str(out))
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("name", list(CASES))
def test_two_tensor_parallel_ranks_equal_one_rank(four_ranks, name):
    got = four_ranks["cases"][name]
    model_name, _, packed = CASES[name]
    model, tokenizer = MODELS[model_name]()
    plain = TrainEngine(model, **_options(model_name, packed))
    data = batches(tokenizer.pad_token_id, nano()[0])
    grads = _gradients(plain, data[0], slice(None))
    assert grads.keys() == got["grads"].keys()
    for name_, grad in grads.items():
        assert grad.abs().sum() > 0, name_
        torch.testing.assert_close(got["grads"][name_], grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m, n=name_: f"{n}: {m}")
    expected = [plain.train_step(b, _loss(model_name)) for b in data]
    assert any(m[f"{plain.metric_prefix}grad_norm"] > 0 for m in expected)
    for metrics, want in zip(got["metrics"], expected):
        assert metrics == pytest.approx(want, rel=1e-4, abs=1e-6)
    for name_, value in plain.model.state_dict().items():
        # AdamW turns the rounding noise of a gradient entry near 0 into a step of up to lr
        # each step (lr 1e-2 here; the gradients themselves agree above): a few such entries
        # may differ by that much, the rest agree closely
        difference = (got["weights"][name_] - value).abs()
        assert difference.max() <= OPTIONS["lr"] * len(data) * 1.01, name_
        assert (difference > 5e-5).float().mean() <= 0.01, (name_, difference.max())


def test_a_checkpoint_written_at_tp2_loads_at_tp1_exactly(four_ranks):
    saved = four_ranks["cases"]["qwen3-fsdp2-packed"]
    resumed = four_ranks["resumed"]
    assert saved["weights"].keys() == resumed["weights"].keys()
    for name, value in saved["weights"].items():
        assert torch.equal(resumed["weights"][name], value), name
    assert saved["optimizer"].keys() == resumed["optimizer"].keys()
    for name, state in saved["optimizer"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(resumed["optimizer"][name][key], state[key]), (name, key)


def test_vocabulary_parallel_logprobs_equal_the_dense_ones_with_their_gradients(four_ranks):
    from rl_core.algos.entropy import chunked_logprobs

    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 263, generator=generator) * 4).requires_grad_()
    labels = torch.randint(0, 263, (3, 5), generator=generator)
    weights = torch.randn(2, 3, 5, generator=generator)
    logprobs, entropy = chunked_logprobs(logits, labels, 0.7, True)
    (logprobs * weights[0] + entropy * weights[1]).sum().backward()
    got = four_ranks["vocab"]
    torch.testing.assert_close(got["logprobs"], logprobs.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["entropy"], entropy.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["grad"], logits.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- refusals


def test_heads_and_widths_the_group_cannot_split_are_refused_naming_the_field():
    from rl_core.engines.context import check_heads
    from rl_core.engines.tensor import check_tensor_parallel
    from rl_core.errors import InputError

    config = nano()[0].config  # 4 heads, 2 key/value heads, intermediate size 64
    check_tensor_parallel(config, 2)
    with pytest.raises(InputError, match=r"parallel.tensor_parallel_size: 4 does not divide the "
                                         r"model's 2 key/value heads.*pick a divisor of 2"):
        check_tensor_parallel(config, 4)
    with pytest.raises(InputError, match=r"3 does not divide the model's 4 attention heads"):
        check_tensor_parallel(config, 3)
    check_heads(config, 2, tensor=2)  # 2 heads a tensor-parallel rank, 1 a context rank
    with pytest.raises(InputError, match=r"parallel.context_parallel_size: 4 does not divide the "
                                         r"model's 2 attention heads of a tensor-parallel rank"):
        check_heads(config, 4, tensor=2)


def test_a_model_without_the_known_layout_is_refused_naming_the_field():
    from rl_core.engines.tensor import tensor_plan
    from rl_core.errors import InputError

    model = nano()[0]
    del model.model.layers[0].mlp.gate_proj
    with pytest.raises(InputError, match=r"parallel.tensor_parallel_size: Qwen2ForCausalLM's "
                                         r"decoder layers lack mlp.gate_proj"):
        tensor_plan(model)


# --------------------------------------------------------------------------- the spec and plan


def tp_spec(size: int = 2, strategy: str = "fsdp2", **parallel):
    from rl_core.spec import resolve_spec

    return resolve_spec({
        "data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
        "model": {"path": "tiny:nano"}, "resources": {"devices_per_node": 4},
        "actor": {"strategy": strategy, "use_remove_padding": True, "ppo_mini_batch_size": 2},
        "parallel": {"tensor_parallel_size": size, **parallel}, "trainer": {"logger": []}})


def test_the_spec_takes_tensor_parallelism_with_fsdp2_and_counts_its_devices():
    from rl_core.spec import SpecError

    spec = tp_spec(2, context_parallel_size=2)
    assert (spec.world_size, spec.data_parallel_size, spec.model_parallel_size) == (4, 1, 4)
    with pytest.raises(SpecError, match=r"parallel.tensor_parallel_size: 2 splits the model's "
                                        r"matrices .*set actor.strategy: fsdp2"):
        tp_spec(2, "torch")


def test_the_plan_splits_what_a_device_gathers_and_computes_over_the_group():
    from rl_core import memory_plan as mp

    def parts(size: int) -> dict[str, int]:
        plan = mp.plan(tp_spec(size), mp.tiny_shape("nano"), 80 * mp.GIB)
        return {c.name: c.bytes for c in plan.components}

    one, two = parts(1), parts(2)
    # the training state is sharded over all 4 devices either way
    assert two["actor parameter shards"] == one["actor parameter shards"]
    for name in ("actor gathered layers", "actor unsharded gradients",
                 "reference gathered layers"):
        assert two[name] == pytest.approx(one[name] / 2, abs=2), name
    assert two["actor logits"] < one["actor logits"] * 0.6
    assert two["actor activations"] < one["actor activations"]
    text = mp.format_table(mp.plan(tp_spec(2), mp.tiny_shape("nano"), 80 * mp.GIB))
    assert "over 4 device(s), 2 to a layer" in text.splitlines()[0]
