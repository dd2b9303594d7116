"""TrainEngine on the nano model: log-probs, accumulation equivalence, clipping, checkpoints."""

import copy

import pytest
import torch

from rl_core.algos import entropy_from_logits, get_policy_loss
from rl_core.algos.sft import sft_loss_fn
from rl_core.engines.balance import token_micro_batches
from rl_core.engines.train import NonFiniteError, TrainEngine
from rl_core.models.tiny import build_tiny
from rl_core.spec import ActorConfig

P, R = 6, 5  # prompt and response columns

BF16 = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="this CPU has no bfloat16 support in oneDNN",
)


@pytest.fixture(scope="module")
def nano():
    model, tokenizer = build_tiny("nano", seed=1)
    return model, tokenizer.pad_token_id


def fresh(nano):
    return copy.deepcopy(nano[0])


def make_batch(pad_id, seed=0, n=8, min_response=1):
    """Left-padded prompts, right-padded responses of uneven lengths, as the rollout lays out."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(1, P + 1, (n,), generator=g).tolist()
    response_lens = torch.randint(min_response, R + 1, (n,), generator=g).tolist()
    ids = torch.full((n, P + R), pad_id)
    mask = torch.zeros((n, P + R), dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[row, P - p : P + r] = torch.randint(0, 256, (p + r,), generator=g)
        mask[row, P - p : P + r] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": mask[:, P:],
    }


def reference_logprobs(model, batch, temperature=1.0):
    """Full forward over every column, then log_softmax(logits / t) gathered at the response."""
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits  # (B, T, V)
    logits = logits[:, P - 1 : -1] / temperature  # (B, R, V): positions predicting the response
    logp = torch.log_softmax(logits, -1)
    labels = batch["input_ids"][:, P:]
    return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy_from_logits(logits)


def ppo_loss_fn(mode="token-mean"):
    ppo = get_policy_loss("vanilla")

    def loss_fn(micro, logprobs, entropy):
        loss, metrics = ppo(
            micro["old_logprobs"], logprobs, micro["advantages"], micro["response_mask"],
            loss_agg_mode=mode,
        )
        return loss, {f"actor/{k}": v for k, v in metrics.items()}

    return loss_fn


def rl_batch(engine, pad_id, seed=0, n=8):
    batch = make_batch(pad_id, seed, n)
    old, _ = engine.forward_logprobs(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], R
    )
    g = torch.Generator().manual_seed(seed + 100)
    batch["old_logprobs"] = old + 0.05 * torch.randn(old.shape, generator=g)  # ratios != 1
    batch["advantages"] = torch.randn(n, 1, generator=g).expand(n, R).clone()
    return batch


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def max_diff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))


def step_with_grads(engine, batch, loss_fn, **kwargs):
    """train_step, also returning the (clipped) gradients the optimizer stepped with."""
    grads = []
    hook = engine.optimizer.register_step_pre_hook(
        lambda opt, args, kw: grads.extend(p.grad.clone() for p in engine.params)
    )
    metrics = engine.train_step(batch, loss_fn, **kwargs)
    hook.remove()
    return metrics, grads


def assert_same_step(big, small, grads_big, grads_small):
    """Gradients equal to float32 rounding, weights within 1e-6.

    Adam's first update is about lr·g/(|g| + eps): an entry with |g| near eps (1e-8) turns
    rounding noise into an update difference of up to lr·1e-2, hence the small lr of these
    tests; the gradient check is the strict one.
    """
    scale = max(g.abs().max().item() for g in grads_big)
    assert max_diff(grads_big, grads_small) < 1e-5 * scale
    assert max_diff(params_of(big.model), params_of(small.model)) < 1e-6


# --------------------------------------------------------------------------- forward


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_logprobs_match_a_full_forward(nano, temperature):
    model = fresh(nano)
    engine = TrainEngine(model, lr=1e-3)
    batch = make_batch(nano[1], seed=3)
    ref_lp, ref_ent = reference_logprobs(model, batch, temperature)
    mask = batch["response_mask"].bool()

    lp, ent = engine.forward_logprobs(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], R,
        temperature=temperature, micro_batch_size=3, with_entropy=True,
    )

    assert lp.shape == ent.shape == (8, R) and lp.dtype == torch.float32
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-5, rtol=1e-5)
    assert not lp.requires_grad


def test_trimming_padding_changes_nothing_and_zeroes_dropped_columns(nano):
    batch = make_batch(nano[1], seed=4)
    batch["input_ids"][:, -1] = nano[1]  # the last column is padding in every row
    batch["attention_mask"][:, -1] = 0
    args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], R)

    trimmed, _ = TrainEngine(fresh(nano), lr=1e-3).forward_logprobs(*args)
    full, _ = TrainEngine(fresh(nano), lr=1e-3, trim_padding=False).forward_logprobs(*args)

    mask = batch["attention_mask"][:, P:].bool()
    torch.testing.assert_close(trimmed[mask], full[mask], atol=1e-5, rtol=1e-5)
    assert (trimmed[:, -1] == 0).all()


def test_forward_with_grad_keeps_the_graph(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3)
    batch = make_batch(nano[1])
    lp, _ = engine.forward_logprobs(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], R, grad=True
    )
    assert lp.requires_grad
    assert not engine.model.training  # the model's mode is left as it was


# --------------------------------------------------------------------------- train step


def test_a_step_changes_every_parameter_and_reports_metrics(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3)
    before = params_of(engine.model)

    metrics = engine.train_step(rl_batch(engine, nano[1]), ppo_loss_fn(), micro_batch_size=4)

    assert all(not torch.equal(b, a) for b, a in zip(before, engine.model.parameters()))
    assert {"actor/loss", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert engine.step == 1


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batches_give_the_same_step_as_one_batch(nano, mode):
    model = fresh(nano)
    big = TrainEngine(model, lr=1e-4, weight_decay=0.01)
    small = TrainEngine(copy.deepcopy(model), lr=1e-4, weight_decay=0.01)
    batch = rl_batch(big, nano[1], seed=5)
    tokens = [int(batch["response_mask"][i : i + 2].sum()) for i in range(0, 8, 2)]
    assert len(set(tokens)) > 1  # uneven micro-batches: a plain 1/4 scale would be wrong

    loss_fn = ppo_loss_fn(mode)
    m_big, g_big = step_with_grads(big, batch, loss_fn, micro_batch_size=8, loss_agg_mode=mode)
    m_small, g_small = step_with_grads(
        small, batch, loss_fn, micro_batch_size=2, loss_agg_mode=mode
    )

    assert_same_step(big, small, g_big, g_small)
    assert m_small["actor/loss"] == pytest.approx(m_big["actor/loss"], abs=1e-6)
    assert m_small["actor/grad_norm"] == pytest.approx(m_big["actor/grad_norm"], rel=1e-5)
    assert m_small["actor/pg_clipfrac"] == pytest.approx(m_big["actor/pg_clipfrac"], abs=1e-6)


def test_a_token_budget_gives_the_same_step_as_one_batch(nano):
    model = fresh(nano)
    big = TrainEngine(model, lr=1e-4)
    dynamic = TrainEngine(copy.deepcopy(model), lr=1e-4, max_token_len=20)
    batch = rl_batch(big, nano[1], seed=6)

    _, g_big = step_with_grads(big, batch, ppo_loss_fn(), micro_batch_size=8)
    _, g_dynamic = step_with_grads(dynamic, batch, ppo_loss_fn())

    assert_same_step(big, dynamic, g_big, g_dynamic)


def test_a_configured_token_budget_overrides_row_counts(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3, max_token_len=20)
    batch = make_batch(nano[1], seed=6)
    sizes = []

    def counting(micro, logprobs, entropy):
        sizes.append(logprobs.shape[0])
        return sft_loss_fn(micro, logprobs, entropy)

    engine.train_step(batch, counting, micro_batch_size=8)

    lengths = batch["attention_mask"].sum(1).tolist()
    assert sizes == [len(rows) for rows in token_micro_batches(lengths, 20)]
    assert len(sizes) > 1


def test_sum_mode_adds_micro_losses_the_caller_normalised(nano):
    model = fresh(nano)
    batch = make_batch(nano[1], seed=7)
    total = batch["response_mask"].sum()

    def summed(micro, logprobs, entropy):  # the caller's own normaliser: the batch's tokens
        return -(logprobs * micro["response_mask"]).sum() / total, {}

    by_sum = TrainEngine(model, lr=1e-4)
    by_mean = TrainEngine(copy.deepcopy(model), lr=1e-4)
    m_sum, g_sum = step_with_grads(by_sum, batch, summed, micro_batch_size=2, loss_agg_mode="sum")
    m_mean, g_mean = step_with_grads(by_mean, batch, sft_loss_fn, micro_batch_size=8)

    assert_same_step(by_mean, by_sum, g_mean, g_sum)
    assert m_sum["actor/loss"] == pytest.approx(m_mean["actor/loss"], abs=1e-6)


def test_clipping_caps_the_norm_and_reports_the_norm_before_it(nano):
    model = fresh(nano)
    batch = make_batch(nano[1], seed=8)
    probe = copy.deepcopy(model).train()
    lp, _ = TrainEngine(probe, lr=1e-3).forward_logprobs(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], R, grad=True
    )
    sft_loss_fn(batch, lp, None)[0].backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in probe.parameters()]).item()

    engine = TrainEngine(model, lr=1e-3, grad_clip=0.1)
    seen = []
    engine.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in engine.params]).item()
        )
    )
    metrics = engine.train_step(batch, sft_loss_fn, micro_batch_size=3)

    assert expected > 0.1
    assert metrics["actor/grad_norm"] == pytest.approx(expected, rel=1e-4)
    assert seen == [pytest.approx(0.1, rel=1e-4)]


def test_no_clipping_with_grad_clip_zero(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3, grad_clip=0.0)
    seen = []
    engine.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            torch.nn.utils.get_total_norm([p.grad for p in engine.params]).item()
        )
    )
    metrics = engine.train_step(make_batch(nano[1]), sft_loss_fn)
    assert seen == [pytest.approx(metrics["actor/grad_norm"], rel=1e-5)]


def test_the_lr_follows_warmup_then_the_schedule(nano):
    engine = TrainEngine(
        fresh(nano), lr=0.01, warmup_steps=2, lr_scheduler="linear", total_steps=6
    )
    batch = make_batch(nano[1])
    lrs = [engine.train_step(batch, sft_loss_fn)["actor/lr"] for _ in range(6)]
    # warmup 1/2, 2/2; then 1 - p with p = 0/4, 1/4, 2/4, 3/4
    assert lrs == pytest.approx([0.005, 0.01, 0.01, 0.0075, 0.005, 0.0025])
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)


# --------------------------------------------------------------------------- failures


def test_a_non_finite_loss_raises_and_leaves_the_weights(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3)
    before = params_of(engine.model)

    def nan_loss(micro, logprobs, entropy):
        return logprobs.sum() * float("nan"), {"actor/probe": 1.0}

    with pytest.raises(NonFiniteError, match="non-finite loss") as err:
        engine.train_step(make_batch(nano[1]), nan_loss, micro_batch_size=4)

    assert err.value.metrics["actor/probe"] == 1.0
    assert max_diff(before, params_of(engine.model)) == 0
    assert engine.step == 0 and not engine.optimizer.state
    assert all(p.grad is None for p in engine.params)


def test_a_non_finite_gradient_raises_and_the_next_step_works(nano):
    engine = TrainEngine(fresh(nano), lr=1e-3)
    before = params_of(engine.model)

    def nan_grad(micro, logprobs, entropy):  # value 0, gradient 0 * inf = nan
        return torch.sqrt(0 * logprobs.sum()), {}

    with pytest.raises(NonFiniteError, match="non-finite gradient norm"):
        engine.train_step(make_batch(nano[1]), nan_grad)
    assert max_diff(before, params_of(engine.model)) == 0

    metrics = engine.train_step(make_batch(nano[1]), sft_loss_fn)
    assert engine.step == 1 and torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))


def test_float16_is_refused():
    with pytest.raises(ValueError, match="float16"):
        TrainEngine(torch.nn.Linear(2, 2), lr=1e-3, param_dtype="float16")


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=BF16)])
def test_a_restored_engine_takes_the_same_next_step(nano, dtype):
    """bfloat16: from its float32 master weights, saved with the optimizer's state."""
    kwargs = dict(lr=1e-2, warmup_steps=3, lr_scheduler="cosine", total_steps=5,
                  param_dtype=dtype)
    engine = TrainEngine(fresh(nano), **kwargs)
    batches = [rl_batch(engine, nano[1], seed=s) for s in (10, 11)]
    engine.train_step(batches[0], ppo_loss_fn(), micro_batch_size=4)
    saved_model = copy.deepcopy(engine.model.state_dict())
    saved_engine = copy.deepcopy(engine.state_dict())

    continued = engine.train_step(batches[1], ppo_loss_fn(), micro_batch_size=4)

    model = fresh(nano)
    model.load_state_dict(saved_model)
    restored = TrainEngine(model, **kwargs)
    restored.load_state_dict(saved_engine)
    resumed = restored.train_step(batches[1], ppo_loss_fn(), micro_batch_size=4)

    assert restored.step == engine.step == 2
    assert resumed == continued
    assert max_diff(params_of(engine.model), params_of(restored.model)) == 0
    assert ("master_weights" in saved_engine) == (dtype == "bfloat16")
    assert len(restored.masters) == len(engine.masters)
    if engine.masters:
        assert max_diff(engine.masters, restored.masters) == 0


def test_from_spec_reads_the_actor_section(nano):
    actor = ActorConfig(
        lr=3e-4, weight_decay=0.1, warmup_steps=2, lr_scheduler="cosine", grad_clip=0.5,
        ppo_micro_batch_size=3, use_dynamic_bsz=True, max_token_len_per_gpu=64,
        loss_agg_mode="seq-mean-token-mean",
    )
    engine = TrainEngine.from_spec(
        fresh(nano), actor, total_steps=10, dtype="float32", device="cpu"
    )

    assert (engine.lr, engine.warmup_steps, engine.total_steps) == (3e-4, 2, 10)
    assert (engine.lr_scheduler, engine.grad_clip) == ("cosine", 0.5)
    assert (engine.micro_batch_size, engine.max_token_len) == (3, 64)
    assert engine.loss_agg_mode == "seq-mean-token-mean"
    assert engine.optimizer.param_groups[0]["weight_decay"] == 0.1


# --------------------------------------------------------------------------- dtypes, learning


@BF16
def test_bfloat16_parameters_train(nano):
    engine = TrainEngine(fresh(nano), lr=1e-2, param_dtype="bfloat16")
    before = params_of(engine.model)
    batch = make_batch(nano[1])

    metrics = engine.train_step(batch, sft_loss_fn, micro_batch_size=4)
    lp, _ = engine.forward_logprobs(
        batch["input_ids"], batch["attention_mask"], batch["position_ids"], R
    )

    assert all(p.dtype == torch.bfloat16 for p in engine.model.parameters())
    assert engine.model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    assert torch.isfinite(torch.tensor(list(metrics.values()))).all()
    assert max_diff(before, params_of(engine.model)) > 0


def test_sft_loss_decreases(nano):
    engine = TrainEngine(fresh(nano), lr=1e-2)
    batch = make_batch(nano[1], seed=12, min_response=3)
    losses = [engine.train_step(batch, sft_loss_fn)["actor/sft_loss"] for _ in range(15)]
    assert losses[-1] < 0.8 * losses[0]


@BF16
def test_bfloat16_steps_float32_masters_and_computes_in_their_copy(nano):
    engine = TrainEngine(fresh(nano), lr=1e-2, param_dtype="bfloat16")
    start = [m.detach().clone() for m in engine.masters]

    engine.train_step(make_batch(nano[1]), sft_loss_fn, micro_batch_size=4)

    assert len(engine.masters) == len(engine.params) > 0
    assert all(m.dtype == torch.float32 for m in engine.masters)
    moments = [s["exp_avg"] for s in engine.optimizer.state.values()]
    assert len(moments) == len(engine.masters) and all(m.dtype == torch.float32 for m in moments)
    assert max_diff(start, engine.masters) > 0
    for param, master in zip(engine.params, engine.masters):  # the model: the masters, rounded
        assert param.dtype == torch.bfloat16 and torch.equal(param, master.to(torch.bfloat16))
        assert param.grad is None  # each bfloat16 gradient went into its master's and was freed


@BF16
def test_master_weights_keep_updates_below_bfloat16_resolution(nano):
    """AdamW's first step moves every weight by about lr; at lr 1e-6 that is below a bfloat16
    weight's resolution (2**-8 of it, 4e-3 relative) for all weights above about 5e-4 (most of
    them, at an init std of 0.02). Pure bfloat16 loses those updates; the masters keep all."""
    batch = make_batch(nano[1])
    masters = TrainEngine(fresh(nano), lr=1e-6, param_dtype="bfloat16", grad_clip=0)
    pure = TrainEngine(fresh(nano), lr=1e-6, param_dtype="bfloat16", grad_clip=0,
                       master_weights=False)
    before = params_of(pure.model)
    start = [m.detach().clone() for m in masters.masters]

    masters.train_step(batch, sft_loss_fn)
    pure.train_step(batch, sft_loss_fn)

    moved = [(m - s).abs() for m, s in zip(masters.masters, start)]
    got_grad = [(m.abs() > 0) for m in moved]
    kept = sum(int(g.sum()) for g in got_grad)
    changed = sum(int((p != b).sum()) for p, b in zip(params_of(pure.model), before))
    assert pure.masters == [] and kept > 0
    assert changed < 0.1 * kept  # pure bfloat16 lost most of the step
    assert all(p.dtype == torch.bfloat16 for p in pure.optimizer.state[pure.params[0]].values()
               if p.dim())


def test_pure_bfloat16_is_refused_for_fsdp2_by_name():
    from rl_core.spec import SpecError, resolve_spec

    with pytest.raises(SpecError, match="actor.master_weights: fsdp2 always keeps float32"):
        resolve_spec({"data": {"synthetic": {"task": "addition"}},
                      "actor": {"strategy": "fsdp2", "master_weights": False}})
