"""Remove padding: packed micro-batches give the padded path's log-probs, entropy, values,
losses and gradients (policy, reference, critic), under sdpa and eager attention; attention
that cannot be confined to each row is refused naming the field."""

from __future__ import annotations

import copy

import pytest
import torch
from test_train_engine import (
    R,
    assert_same_step,
    fresh,
    make_batch,
    ppo_loss_fn,
    reference_logprobs,
    rl_batch,
    step_with_grads,
)

from rl_core.engines.packing import pack
from rl_core.engines.train import TrainEngine, ValueHead
from rl_core.errors import InputError
from rl_core.models.tiny import build_tiny
from rl_core.roles.actors import sequence_logprobs


@pytest.fixture(scope="module")
def nano():
    model, tokenizer = build_tiny("nano", seed=1)
    return model, tokenizer.pad_token_id


def columns(batch):
    return batch["input_ids"], batch["attention_mask"], batch["position_ids"]


def test_packing_keeps_only_real_tokens_and_restarts_positions(nano):
    batch = make_batch(nano[1], seed=2)
    packed = pack(*columns(batch), R)
    n = int(batch["attention_mask"].sum())
    assert packed.input_ids.shape == packed.position_ids.shape == (1, n)
    assert torch.equal(packed.input_ids[0], batch["input_ids"][batch["attention_mask"].bool()])
    assert (packed.position_ids[0] == 0).sum() == len(batch["input_ids"])  # one start per row
    lengths = batch["attention_mask"].sum(1)
    assert packed.attention_mask is None
    assert packed.attention["cu_seq_lens_q"].tolist() == [0, *lengths.cumsum(0).tolist()]
    assert packed.attention["max_length_q"] == int(lengths.max())
    additive = pack(*columns(batch), R, attention="eager").attention_mask[0, 0]
    above = torch.ones(n, n, dtype=torch.bool).triu(1)
    assert additive.shape == (n, n) and (additive[above] < 0).all()  # causal
    first = int(lengths[0])
    assert (additive[first:, :first] < 0).all()  # row 1 never sees row 0
    assert packed.where.sum() == len(packed.keep) == int(batch["response_mask"].sum())
    assert torch.equal(packed.labels, batch["input_ids"][:, -R:][packed.where])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packing_plans_on_the_host_and_the_device_only_gathers(nano, attention):
    """With the mask on the host, nothing of the device tensors is read back: on the `meta`
    device, which has no values to read, packing still builds every tensor, and unpacking
    scatters by index, not by a mask (a device-to-host wait per micro-batch on a GPU)."""
    batch = make_batch(nano[1], seed=2)
    ids, mask, positions = columns(batch)
    on_host = pack(ids, mask, positions, R, attention=attention)
    packed = pack(ids.to("meta"), mask, positions.to("meta"), R, attention=attention)
    for name in ("input_ids", "position_ids", "keep", "labels", "where", "slots"):
        tensor, reference = getattr(packed, name), getattr(on_host, name)
        assert tensor.device.type == "meta" and tensor.shape == reference.shape, name
    assert packed.attention.keys() == on_host.attention.keys()
    values = torch.arange(len(on_host.keep), dtype=torch.float32)
    assert packed.unpack(values.to("meta")).shape == on_host.where.shape
    unpacked = on_host.unpack(values)
    assert torch.equal(unpacked[on_host.where], values) and not unpacked[~on_host.where].any()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_and_entropy_equal_a_full_forward(nano, attention):
    model = fresh(nano)
    model.config._attn_implementation = attention
    engine = TrainEngine(model, lr=1e-3, remove_padding=True, micro_batch_size=3)
    batch = make_batch(nano[1], seed=3)
    want_lp, want_ent = reference_logprobs(model, batch, 0.7)
    lp, ent = engine.forward_logprobs(*columns(batch), R, temperature=0.7, with_entropy=True)
    mask = batch["response_mask"].bool()
    assert torch.allclose(lp[mask], want_lp[mask], atol=1e-5)
    assert torch.allclose(ent[mask], want_ent[mask], atol=1e-5)
    assert not lp[~mask].any() and not ent[~mask].any()  # 0 in the response's padding


@pytest.mark.parametrize("options", [
    {"micro_batch_size": 3},
    {"max_token_len": 24},  # Karmarkar–Karp micro-batches: rows out of order
])
def test_a_packed_step_equals_the_padded_step(nano, options):
    padded = TrainEngine(fresh(nano), lr=1e-4, micro_batch_size=8)
    packed = TrainEngine(fresh(nano), lr=1e-4, remove_padding=True, **options)
    batch = rl_batch(padded, nano[1], seed=4)
    want, grads_padded = step_with_grads(padded, batch, ppo_loss_fn(), with_entropy=True)
    got, grads_packed = step_with_grads(packed, batch, ppo_loss_fn(), with_entropy=True)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert_same_step(padded, packed, grads_padded, grads_packed)


def test_the_reference_pass_packed_equals_padded(nano):
    model = fresh(nano).eval().requires_grad_(False)
    batch = make_batch(nano[1], seed=5)
    plain = sequence_logprobs(model, batch, 1.0, micro_batch_size=4)
    packed = sequence_logprobs(model, batch, 1.0, max_token_len=30, remove_padding=True)
    mask = batch["response_mask"].bool()
    assert torch.allclose(plain[mask], packed[mask], atol=1e-5)


def test_the_critic_packed_equals_padded(nano, tmp_path):
    from transformers import AutoModelForTokenClassification

    from rl_core.algos import value_loss

    nano[0].save_pretrained(tmp_path)
    value_model = AutoModelForTokenClassification.from_pretrained(tmp_path, num_labels=1)
    for module in value_model.modules():  # no dropout, as the critic: its values repeat
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    batch = make_batch(nano[1], seed=6)
    mask = batch["response_mask"].float()
    g = torch.Generator().manual_seed(6)
    batch["values"] = torch.randn(mask.shape, generator=g) * mask
    batch["returns"] = torch.randn(mask.shape, generator=g) * mask

    def loss_fn(micro, values, _):
        loss, _ = value_loss(values, micro["values"], micro["returns"], micro["response_mask"],
                             0.5)
        return loss, {}

    options = {"lr": 1e-4, "head": ValueHead(), "metric_prefix": "critic/"}
    padded = TrainEngine(copy.deepcopy(value_model), micro_batch_size=8, **options)
    packed = TrainEngine(copy.deepcopy(value_model), remove_padding=True, max_token_len=30,
                         **options)
    v_padded, _ = padded.forward_logprobs(*columns(batch), R)
    v_packed, _ = packed.forward_logprobs(*columns(batch), R)
    assert torch.allclose(v_padded * mask, v_packed, atol=1e-5)
    _, grads_padded = step_with_grads(padded, batch, loss_fn)
    _, grads_packed = step_with_grads(packed, batch, loss_fn)
    assert_same_step(padded, packed, grads_padded, grads_packed)


def test_attention_that_cannot_be_confined_is_refused_naming_the_field(nano):
    model = fresh(nano)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(InputError, match="actor.use_remove_padding.*flex_attention"):
        TrainEngine(model, lr=1e-3, remove_padding=True)


def test_the_row_by_row_sdpa_leaves_unpacked_calls_and_saved_folders_as_they_were(nano, tmp_path):
    from rl_core.engines.packing import VARLEN_SDPA, prepare_packing

    model = fresh(nano).eval()
    batch = make_batch(nano[1], seed=8)
    with torch.no_grad():
        before = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")})
        prepare_packing(model)
        assert model.config._attn_implementation == VARLEN_SDPA
        after = model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")})
        generated = model.generate(batch["input_ids"][:2, :4], max_new_tokens=3, do_sample=False)
    assert torch.equal(before.logits, after.logits)
    assert generated.shape == (2, 7)
    model.save_pretrained(tmp_path)
    assert VARLEN_SDPA not in (tmp_path / "config.json").read_text()


# --------------------------------------------------------------------------- one-call kernels


@pytest.mark.parametrize(("device", "dtype", "installed", "expected"), [
    ("cuda", torch.bfloat16, {"varlen_attn", "flash_attn"}, "varlen_attn"),
    ("cuda", torch.float16, {"flash_attn"}, "flash_attn"),
    ("cuda", torch.bfloat16, set(), "row_groups"),
    ("cuda", torch.float32, {"varlen_attn", "flash_attn"}, "row_groups"),  # flash: 16-bit only
    ("npu", torch.bfloat16, {"torch_npu"}, "npu_fusion_attention"),
    ("npu", torch.float32, {"torch_npu"}, "row_groups"),
    ("cpu", torch.bfloat16, {"varlen_attn", "flash_attn", "torch_npu"}, "row_groups"),
])
def test_each_accelerator_gets_its_one_call_kernel(device, dtype, installed, expected):
    from rl_core.engines.packing import KERNELS, kernel_name

    name = kernel_name(device, dtype, frozenset(installed))
    assert name == expected
    assert name == "row_groups" or name in KERNELS


def test_torchs_varlen_attention_is_called_causal_in_either_of_its_signatures():
    from rl_core.engines.packing import _varlen_options

    # torch 2.10-2.11: is_causal, no grouped-query switch (kv heads are repeated)
    assert _varlen_options(("query", "key", "is_causal", "scale")) == {"is_causal": True}
    # torch >= 2.12: a (left, right) window, (-1, 0) = causal; grouped-query attention built in
    assert _varlen_options(("query", "window_size", "enable_gqa", "scale")) == {
        "window_size": (-1, 0), "enable_gqa": True}


def _reference_kernel(calls):
    """What a variable-length causal kernel computes, written out row by row on the CPU: it
    stands in for the accelerator's kernel so the layouts around the call are checked here."""

    def kernel(q, k, v, cu, bounds, longest, scale):  # (N, H, D), (N, Hkv, D)
        calls.append((tuple(q.shape), cu.tolist(), list(bounds), longest, scale))
        groups = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for a, b in zip(bounds, bounds[1:]):
            rows = [x[a:b].transpose(0, 1) for x in (q, k.repeat_interleave(groups, 1),
                                                    v.repeat_interleave(groups, 1))]
            out[a:b] = torch.nn.functional.scaled_dot_product_attention(
                *rows, is_causal=True, scale=scale).transpose(0, 1)
        return out

    return kernel


def test_a_one_call_kernel_gets_the_packed_sequence_once_per_layer_and_matches(nano,
                                                                              monkeypatch):
    from rl_core.engines import packing

    model = fresh(nano)
    engine = TrainEngine(model, lr=1e-3, remove_padding=True, micro_batch_size=8)
    batch = make_batch(nano[1], seed=3)
    want_lp, _ = engine.forward_logprobs(*columns(batch), R)  # the row groups
    calls = []
    monkeypatch.setattr(packing, "packed_kernel", lambda device, dtype: _reference_kernel(calls))

    lp, _ = engine.forward_logprobs(*columns(batch), R)

    mask = batch["response_mask"].bool()
    assert torch.allclose(lp[mask], want_lp[mask], atol=1e-5)
    lengths = batch["attention_mask"].sum(1)
    bounds = [0, *lengths.cumsum(0).tolist()]
    heads = model.config.num_attention_heads
    assert len(calls) == model.config.num_hidden_layers  # one call per layer, every row in it
    for shape, cu, host, longest, scale in calls:
        assert shape == (int(lengths.sum()), heads, model.config.hidden_size // heads)
        assert cu == host == bounds and longest == int(lengths.max())
        assert scale == pytest.approx(shape[-1] ** -0.5)
