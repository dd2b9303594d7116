"""The Megatron engine's loss side on given logits (`rl_core.engines.megatron`), on two
tensor-parallel gloo ranks each holding half of a padded vocabulary: its log-probs, entropy,
values, loss and gradients equal those the plain engine computes from the full logits, for
padded and packed micro-batches. (Megatron-Core's forward needs an accelerator:
bench/device_check.py runs the engine end to end.)"""

from __future__ import annotations

import pytest
import torch
from ranks import spawn
from test_train_engine import P, R, make_batch, ppo_loss_fn

from rl_core.engines.train import token_logprobs

VOCAB = 261  # padded to 262 over two ranks: the last rank's last column is padding
PART = 131
TEMPERATURE = 0.7


def _engine(packed: bool):
    """A MegatronEngine's loss side in this process's Megatron parallel state (no model)."""
    from megatron.core import parallel_state as mpu

    from rl_core.engines.mcore import MegatronLayout
    from rl_core.engines.megatron import MegatronEngine

    engine = MegatronEngine.__new__(MegatronEngine)
    engine.mpu, engine.value, engine.vocab = mpu, False, VOCAB
    engine.device, engine.layout = torch.device("cpu"), MegatronLayout(tp=2)
    engine.tp_group = mpu.get_tensor_model_parallel_group()
    engine.remove_padding, engine.metric_prefix = packed, "actor/"
    return engine


def _case(rank: int, out: str) -> None:
    from rl_core.engines.mcore import MegatronLayout, init_parallel
    from rl_core.engines.train import Extents

    init_parallel(MegatronLayout(tp=2))
    batch = make_batch(0, seed=3, n=6)
    g = torch.Generator().manual_seed(7)
    batch["old_logprobs"] = -torch.rand(6, R, generator=g)
    batch["advantages"] = torch.randn(6, 1, generator=g).expand(6, R).clone()
    logits = torch.randn(6, P + R, 2 * PART, generator=g) * 3
    logits[..., VOCAB:] = 50.0  # padding rows of the output layer: never part of the softmax
    results = {}
    for packed in (False, True):
        engine = _engine(packed)
        rows = list(range(6))
        micro = engine._micro(batch, Extents.of(batch["attention_mask"]), rows, R)
        local = logits[..., rank * PART:(rank + 1) * PART].clone().requires_grad_(True)
        if packed:  # the model's output: the valid tokens' logits in packed order, then filler
            valid = batch["attention_mask"].flatten().bool()
            tokens = local.reshape(-1, PART)[valid]
            filler = micro["_packed"].input_ids.shape[1] - tokens.shape[0]
            output = torch.cat([tokens, tokens.new_zeros(filler, PART)])[None]
        else:  # each row's valid tokens first, as `_micro` laid them out
            valid = batch["attention_mask"].bool()
            order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)
            order = order[:, :micro["_inputs"]["input_ids"].shape[1]]
            output = local.gather(1, order[..., None].expand(-1, -1, PART))
            assert torch.equal(micro["_inputs"]["input_ids"], batch["input_ids"].gather(1, order))
        logprobs, entropy = engine.head_outputs(output, micro, R, TEMPERATURE, True)
        loss, count, report = engine._loss(micro, 0.25, False, R, TEMPERATURE, True,
                                           ppo_loss_fn(), output)
        loss.backward()
        results[packed] = {"logprobs": logprobs.detach(), "entropy": entropy.detach(),
                           "loss": loss.detach(), "grad": local.grad, "report": report}
    torch.save(results, f"{out}/{rank}.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron-loss")
    spawn(_case, 2, out, str(out))
    return [torch.load(out / f"{rank}.pt") for rank in (0, 1)]


@pytest.fixture(scope="module")
def dense():
    """The plain engine's side: the full logits (no padding column)."""
    batch = make_batch(0, seed=3, n=6)
    g = torch.Generator().manual_seed(7)
    batch["old_logprobs"] = -torch.rand(6, R, generator=g)
    batch["advantages"] = torch.randn(6, 1, generator=g).expand(6, R).clone()
    logits = (torch.randn(6, P + R, 2 * PART, generator=g) * 3)[..., :VOCAB]
    logits.requires_grad_(True)
    logprobs, entropy = token_logprobs(logits[:, P - 1:-1], batch["input_ids"][:, P:],
                                       TEMPERATURE, True)
    loss, metrics = ppo_loss_fn()(batch, logprobs, entropy)
    (loss * 0.25).backward()
    return {"batch": batch, "logprobs": logprobs.detach(), "entropy": entropy.detach(),
            "loss": loss.detach(), "metrics": metrics, "grad": logits.grad}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_log_probs_entropy_and_loss_equal_the_full_logits_ones_on_both_ranks(
        two_ranks, dense, packed):
    mask = dense["batch"]["response_mask"].bool()
    for rank in two_ranks:
        got = rank[packed]
        torch.testing.assert_close(got["logprobs"][mask], dense["logprobs"][mask])
        torch.testing.assert_close(got["entropy"][mask], dense["entropy"][mask])
        torch.testing.assert_close(got["loss"], dense["loss"] * 0.25)
        torch.testing.assert_close(got["report"]["metrics"]["actor/loss"], dense["loss"])
        assert got["report"]["share"] == 0.25
        if packed:  # the response's padding is 0, as the plain engine's packed path gives it
            assert not got["logprobs"][~mask].any()


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_each_rank_gets_the_gradient_of_its_half_and_none_for_the_padding(two_ranks, dense,
                                                                        packed):
    whole = torch.cat([two_ranks[0][packed]["grad"], two_ranks[1][packed]["grad"]], dim=-1)
    torch.testing.assert_close(whole[..., :VOCAB], dense["grad"])
    assert not whole[..., VOCAB:].any()
