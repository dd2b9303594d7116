"""Mixtures of experts: the tiny Qwen3-MoE presets, the routers' balancing loss against
transformers' own and as a gradient in the engine, expert parallelism on two CPU ranks equal to
FSDP2 without it (steps, metrics, weights, a checkpoint resharded), the native rollout's
generation, the memory plan's active parameters, and the refusals naming their field."""

from __future__ import annotations

import copy

import pytest
import torch
from test_fsdp_engine import batches
from test_train_engine import make_batch, ppo_loss_fn
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from tests.ranks import spawn

from rl_core.engines.experts import RouterRecorder, balance_loss, grouped_linear, num_experts
from rl_core.engines.train import TrainEngine
from rl_core.models.presets import TINY_SIZES
from rl_core.models.tiny import (build_tiny, count_active_parameters, count_parameters,
                                 tiny_cache_key, tiny_config)

STEPS = 2
COEF = 0.05  # large enough that the balancing loss moves the routers visibly
OPTIONS = {"lr": 1e-2, "grad_clip": 1.0, "micro_batch_size": 2, "total_steps": STEPS,
           "router_aux_loss_coef": COEF}


# --------------------------------------------------------------------------- presets


def test_the_moe_presets_are_qwen3_moe_models_with_fewer_active_parameters():
    model, tokenizer = build_tiny("moe")
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == 8 and model.config.num_experts_per_tok == 2
    assert count_parameters(model) == 3_381_504
    assert count_active_parameters(model) == 1_022_208  # two of eight experts a token
    nano, _ = build_tiny("moe-nano")
    assert (count_parameters(nano), count_active_parameters(nano)) == (39_584, 27_296)
    dense, _ = build_tiny("nano")
    assert count_active_parameters(dense) == count_parameters(dense)
    assert num_experts(model.config) == 8 and num_experts(dense.config) == 0
    with pytest.raises(ValueError, match="num_experts_per_tok 9 is more than num_experts 8"):
        tiny_config("moe", num_experts_per_tok=9)


def test_dense_presets_keep_their_cache_keys():
    """The expert fields of a dense preset do not enter its cache key: builds made before the
    mixtures of experts existed are still found."""
    import dataclasses

    fields = dataclasses.asdict(TINY_SIZES["small"])
    assert fields["num_experts"] == 0 and "num_experts" not in TINY_SIZES["small"].dense_fields()
    assert tiny_cache_key("small") != tiny_cache_key("moe")


# --------------------------------------------------------------------------- balancing loss


def test_the_balancing_loss_equals_transformers_own_with_and_without_padding():
    g = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(24, 8, generator=g) for _ in range(3))
    mask = (torch.rand(4, 6, generator=g) > 0.3).long()
    for m in (None, mask):
        ours, load = balance_loss(list(logits), 2, m)
        assert ours.item() == pytest.approx(load_balancing_loss_func(logits, 8, 2, m).item(),
                                            rel=1e-6)
        assert load.shape == (3, 8)
        valid = 24 if m is None else int(m.sum())
        assert load.sum(1).tolist() == pytest.approx([8.0] * 3)  # k·tokens over k·tokens/E each
        assert valid > 0


def test_the_recorded_routers_give_the_models_own_aux_loss():
    model, _ = build_tiny("moe", seed=3)
    recorder = RouterRecorder.attach(model)
    ids = torch.randint(0, 250, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with recorder.recording(mask.reshape(-1)):
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    loss, metrics = recorder.take()
    assert len(out.router_logits) == 4
    assert loss.item() == pytest.approx(out.aux_loss.item(), rel=1e-6)
    assert metrics["moe/aux_loss"].item() == pytest.approx(loss.item())
    assert 0 <= metrics["moe/load_min"] <= 1 <= metrics["moe/load_max"]
    assert RouterRecorder.attach(build_tiny("nano")[0]) is None


def test_the_engine_adds_the_balancing_loss_to_the_routers_gradient():
    """A loss function that gives nothing: the step's router gradient is exactly the
    coefficient times the balancing loss's gradient over the micro-batch's valid tokens."""
    model, tokenizer = build_tiny("moe", seed=2)
    batch = make_batch(tokenizer.pad_token_id, 0, 4)
    direct = copy.deepcopy(model).train()
    out = direct(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 position_ids=batch["position_ids"], output_router_logits=True)
    (COEF * out.aux_loss).backward()
    want = direct.model.layers[1].mlp.gate.weight.grad

    engine = TrainEngine(model, lr=0.0, grad_clip=0.0, trim_padding=False,
                         router_aux_loss_coef=COEF)
    grads = {}

    def keep(param: torch.Tensor) -> None:  # the step zeroes the gradients it took
        grads["gate"] = param.grad.clone()

    model.model.layers[1].mlp.gate.weight.register_post_accumulate_grad_hook(keep)
    metrics = engine.train_step(batch, lambda micro, lp, ent: ((lp * 0).sum(), {}))
    assert torch.allclose(grads["gate"], want, atol=1e-7)
    assert metrics["actor/moe/aux_loss"] == pytest.approx(out.aux_loss.item(), rel=1e-5)
    assert metrics["actor/loss"] == pytest.approx(COEF * out.aux_loss.item(), rel=1e-5)


def test_the_balancing_loss_is_refused_for_a_dense_model_and_taken_from_the_config():
    from rl_core.errors import InputError

    with pytest.raises(InputError, match="actor.router_aux_loss_coef: the model is not a mix"):
        TrainEngine(build_tiny("nano")[0], lr=1e-3, router_aux_loss_coef=0.01)
    assert TrainEngine(build_tiny("nano")[0], lr=1e-3,
                       router_aux_loss_coef=None).router_aux_loss_coef == 0.0
    assert TrainEngine(build_tiny("moe-nano")[0], lr=1e-3,
                       router_aux_loss_coef=None).router_aux_loss_coef == 0.001


@pytest.mark.parametrize("width", [8, 6])  # the grouped kernel's widths; a loop's
def test_grouped_linear_equals_one_matmul_per_expert(width):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(9, width, generator=g), torch.randn(3, 4, width, generator=g)
    offsets = torch.tensor([2, 2, 9], dtype=torch.int32)  # expert 1 gets no row
    want = torch.cat([x[:2] @ w[0].T, x[2:9] @ w[2].T])
    assert torch.allclose(grouped_linear(x, w, offsets), want, atol=1e-5)


# --------------------------------------------------------------------------- expert parallelism


def _ranks(rank: int, out: str, expert_parallel: int) -> None:
    import torch.distributed as dist

    from rl_core.device import device_mesh
    from rl_core.engines.fsdp import FSDP2Engine

    model, tokenizer = build_tiny("moe", seed=1)
    data = batches(tokenizer.pad_token_id, model)[:STEPS]
    mesh = device_mesh(torch.device("cpu"), dist.get_world_size(), expert_parallel=expert_parallel)
    engine = FSDP2Engine(model, mesh=mesh, **OPTIONS)
    grads: dict[str, torch.Tensor] = {}

    def first_gradients(optimizer, args, kwargs) -> None:  # every rank steps: gather them
        if not grads:
            grads.update({name: p.grad.full_tensor() for name, p in
                          engine.model.named_parameters() if p.grad is not None})

    engine.inner.optimizer.register_step_pre_hook(first_gradients)
    rows = slice(4 * rank, 4 * rank + 4)
    metrics = [engine.train_step({k: v[rows] for k, v in b.items()}, ppo_loss_fn())
               for b in data]
    local = engine.model.model.layers[0].mlp.experts.down_proj.device_mesh.mesh_dim_names
    weights = engine.full_state_dict()
    folder = f"{out}.dcp"
    engine.save_sharded(folder)
    if rank == 0:
        torch.save({"metrics": metrics, "weights": weights, "local_experts": local,
                    "grads": grads}, out)


def _reloaded(rank: int, folder: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine

    model, _ = build_tiny("moe", seed=5)  # other weights: the checkpoint's must replace them
    engine = FSDP2Engine(model, mesh=init_device_mesh("cpu", (1,)), **OPTIONS)
    engine.load_sharded(folder)
    torch.save(engine.full_state_dict(), out)


def test_two_expert_parallel_ranks_equal_two_sharded_ranks(tmp_path):
    """Each rank holds 4 of the 8 experts and its own 4 rows; tokens go to their experts and
    back by all-to-all. The steps (loss, balancing loss, router loads, gradient norm) and the
    weights equal FSDP2's over the same ranks without it, and its checkpoint reloads on one
    rank."""
    split, whole = tmp_path / "ep2.pt", tmp_path / "ep1.pt"
    spawn(_ranks, 2, tmp_path, str(split), 2)
    spawn(_ranks, 2, tmp_path, str(whole), 1)
    ep2, ep1 = torch.load(split, weights_only=False), torch.load(whole, weights_only=False)
    assert (ep2["local_experts"], ep1["local_experts"]) == (("edp", "ep"), None)
    assert any(m["actor/grad_norm"] > 0 for m in ep1["metrics"])
    for got, want in zip(ep2["metrics"], ep1["metrics"]):
        assert "actor/moe/aux_loss" in got and "actor/moe/load_max" in got
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert sorted(ep2["grads"]) == sorted(ep1["grads"]) and ep1["grads"]
    for name, value in ep1["grads"].items():  # the first step's gradients, summed over ranks
        assert torch.allclose(ep2["grads"][name], value, rtol=1e-4, atol=1e-7), name
    assert sorted(ep2["weights"]) == sorted(ep1["weights"])
    far = 0
    for name, value in ep1["weights"].items():
        # AdamW moves each element by about lr whatever its gradient's size, so an element
        # whose gradient is rounding noise (a rarely chosen expert's, or a norm's) may differ
        # by a part of lr (1e-2) after two steps: the weights agree to a tenth of it, almost
        # all of them (counted over the whole model) far closer
        got = ep2["weights"][name]
        assert got.shape == value.shape, name
        assert torch.allclose(got, value, atol=1e-3), name
        far += int(((got - value).abs() > 1e-5).sum())
    assert far < 1e-3 * sum(value.numel() for value in ep1["weights"].values()), far
    out = tmp_path / "one.pt"
    spawn(_reloaded, 1, tmp_path, f"{split}.dcp", str(out))
    for name, value in torch.load(out, weights_only=False).items():
        assert torch.equal(value, ep2["weights"][name]), name


# --------------------------------------------------------------------------- rollout


def test_the_native_engine_generates_a_mixture_of_experts_as_transformers_does():
    """The fast decoder covers dense layers only: a mixture of experts generates through the
    model's own forward, token for token transformers' greedy output (rows stopping early)."""
    from test_rollout_engine import assert_same_as_hf, make_prompts

    from rl_core.rollout.decoder import fast_path_reason

    model, _ = build_tiny("moe-nano", seed=4)
    assert "qwen3_moe" in fast_path_reason(model)
    assert_same_as_hf(model, make_prompts(), fast=True)


# --------------------------------------------------------------------------- spec and admission


def moe_spec(model: str = "tiny:moe", **sections) -> dict:
    spec = {"model": {"path": model}, "actor": {"strategy": "fsdp2"},
            "data": {"synthetic": {"task": "addition"}, "train_batch_size": 8},
            "resources": {"devices_per_node": 2}}
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


@pytest.mark.parametrize("sections,field,message", [
    ({"actor": {"strategy": "torch"}, "parallel": {"expert_parallel_size": 2}},
     "parallel.expert_parallel_size", "set actor.strategy: fsdp2"),
    ({"parallel": {"expert_parallel_size": 2, "tensor_parallel_size": 2},
      "resources": {"devices_per_node": 4}},
     "parallel.expert_parallel_size", "together with parallel.tensor_parallel_size 2"),
    ({"parallel": {"expert_parallel_size": 4}, "resources": {"devices_per_node": 2}},
     "parallel.expert_parallel_size", "does not divide the 2 training devices"),
])
def test_expert_parallel_layouts_the_engine_cannot_run_are_refused(sections, field, message):
    from rl_core.spec import SpecError, resolve_spec

    with pytest.raises(SpecError, match=rf"{field}: .*{message}"):
        resolve_spec(moe_spec(**sections))


@pytest.mark.parametrize("model,sections,field,message", [
    ("tiny:small", {"parallel": {"expert_parallel_size": 2}},
     "parallel.expert_parallel_size", "but the model (qwen2) is dense"),
    ("tiny:moe", {"parallel": {"expert_parallel_size": 3}, "resources": {"devices_per_node": 3},
                  "data": {"train_batch_size": 9}, "actor": {"ppo_mini_batch_size": 9}},
     "parallel.expert_parallel_size", "3 does not divide the model's 8 experts"),
    ("tiny:small", {"actor": {"router_aux_loss_coef": 0.01}},
     "actor.router_aux_loss_coef", "is dense, with no routers to balance"),
    ("tiny:moe", {"parallel": {"tensor_parallel_size": 2}},
     "parallel.tensor_parallel_size", "not supported for a mixture of experts (qwen3_moe)"),
    ("tiny:moe", {"parallel": {"context_parallel_size": 2}, "actor": {"use_remove_padding": True}},
     "parallel.context_parallel_size", "not supported for a mixture of experts"),
    ("tiny:moe", {"rollout": {"tensor_parallel_size": 2, "engine": "native"}},
     "rollout.tensor_parallel_size", "split dense layers only"),
    ("tiny:moe", {"rollout": {"tensor_parallel_size": 2, "engine": "vllm"}},
     "rollout.tensor_parallel_size", "verified for dense models only"),
])
def test_what_the_model_cannot_give_is_refused_at_admission_naming_the_field(model, sections,
                                                                              field, message):
    """The web process knows the model's shape (a tiny preset, a config.json, a known model):
    a dense model's expert parallelism or a MoE's unsupported layout is a refusal before the
    run is queued; the run itself refuses the same when the model loads."""
    from rl_core.admission import admit
    from rl_core.spec import model_violations, resolve_spec

    spec = resolve_spec(moe_spec(model, **sections))
    refusals = admit(spec).refusals
    assert {"field": field, "message": next(m for f, m in model_violations(
        spec, 0 if model == "tiny:small" else 8, "qwen2" if model == "tiny:small"
        else "qwen3_moe") if f == field)} in refusals
    assert any(r["field"] == field and message in r["message"] for r in refusals), refusals
    assert admit(resolve_spec(moe_spec(parallel={"expert_parallel_size": 2}))).admitted


def test_a_dense_model_with_expert_parallelism_fails_when_it_loads():
    from rl_core.errors import InputError
    from rl_core.roles.actors import join_layout
    from rl_core.roles.group import Worker
    from rl_core.spec import resolve_spec

    spec = resolve_spec(moe_spec("/models/dense", parallel={"expert_parallel_size": 2}))
    with pytest.raises(InputError, match="^parallel.expert_parallel_size: 2, but the model "
                                         r"\(qwen2\) is dense"):
        join_layout(Worker(), spec, build_tiny("nano")[0].config)


def test_the_qwen3_30b_a3b_example_plans_to_fit_on_its_devices():
    from pathlib import Path

    from rl_core import memory_plan as mp
    from rl_core.spec import load_spec

    spec = load_spec(Path(__file__).parents[2] / "examples" / "grpo_qwen3_30b_a3b.yaml")
    assert spec.parallel.expert_parallel_size > 1
    result = mp.plan(spec, device_memory_bytes=80 * mp.GIB)  # an H100
    assert result.parameters > 30e9 and result.active_parameters < 3.5e9
    assert result.fits, mp.format_table(result)
