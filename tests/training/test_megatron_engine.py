"""The Megatron engine (`actor.strategy: megatron`) end to end on gloo ranks, its Megatron-Core
computing on the CPU (tests/megatron_cpu.py): on every layout the response log-probs, two PPO
updates (micro-batches, clipping, weight decay) and the weights they leave equal the plain
engine's on one rank with every row, in float32; a distributed checkpoint taken after the first
update resumes to the same second one; the rollout's buckets are the Hugging Face weights; the
frozen reference and the value model equal the plain engine's; the roles of a PPO run train,
sync and save with it."""

from __future__ import annotations

import pytest
import torch
from ranks import spawn

from rl_core.models.tiny import save_tiny

P, R, ROWS = 6, 5, 8
OPTIONS = {"lr": 1e-3, "micro_batch_size": 2, "grad_clip": 1.0, "weight_decay": 0.01}


def make_batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of uneven lengths, old log-probs off the
    policy and advantages, as an update reads them."""
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, P + 1, (ROWS,), generator=g).tolist()
    responses = torch.randint(1, R + 1, (ROWS,), generator=g).tolist()
    ids = torch.zeros(ROWS, P + R, dtype=torch.long)
    mask = torch.zeros(ROWS, P + R, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        ids[row, P - p:P + r] = torch.randint(1, 256, (p + r,), generator=g)
        mask[row, P - p:P + r] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "response_mask": mask[:, P:],
            "old_logprobs": -3 - torch.rand(ROWS, R, generator=g),
            "advantages": torch.randn(ROWS, 1, generator=g).expand(ROWS, R).clone()}


def loss_fn(micro, logprobs, entropy):
    from rl_core.algos import get_policy_loss

    loss, metrics = get_policy_loss("vanilla")(micro["old_logprobs"], logprobs,
                                               micro["advantages"], micro["response_mask"])
    return loss, {f"actor/{k}": v for k, v in metrics.items()}


def _rows(rank: int, layout: dict, world: int) -> list[int]:
    """This rank's rows: those of its data-parallel index in Megatron's order (tp fastest,
    then data, then pipeline), as the controller hands them (`RunSpec.data_rank`)."""
    tp, pp = layout.get("tp", 1), layout.get("pp", 1)
    dp = world // (tp * pp)
    return list(range((rank // tp) % dp, ROWS, dp))


def _megatron(rank: int, folder: str, layout: dict, world: int, out: str) -> None:
    from megatron_cpu import on_cpu

    on_cpu()
    from rl_core.engines.mcore import MegatronLayout
    from rl_core.engines.megatron import MegatronEngine

    rows = _rows(rank, layout, world)
    batch = {k: v[rows] for k, v in make_batch().items()}
    columns = batch["input_ids"], batch["attention_mask"], batch["position_ids"], R
    engine = MegatronEngine(folder, layout=MegatronLayout(**layout), param_dtype="float32",
                            **OPTIONS)
    logprobs, entropy = engine.forward_logprobs(*columns, with_entropy=True)
    first = engine.train_step(batch, loss_fn)
    engine.save_sharded(f"{out}/checkpoint")
    state = engine.state_dict()
    second = engine.train_step(batch, loss_fn)
    weights = engine.full_state_dict()
    buckets = [[name for name, _ in bucket] for bucket in engine.weight_buckets(1 << 12)]
    resumed = MegatronEngine(folder, layout=MegatronLayout(**layout), param_dtype="float32",
                             **OPTIONS)
    resumed.load_sharded(f"{out}/checkpoint")
    resumed.load_state_dict(state)
    again = resumed.train_step(batch, loss_fn)
    torch.save({"rows": rows, "logprobs": logprobs, "entropy": entropy, "metrics": [first, second],
                "weights": weights, "buckets": buckets, "again": again,
                "resumed_weights": resumed.full_state_dict()}, f"{out}/{rank}.pt")


def untied(folder, out):
    """The folder's model with an output layer of its own (pipeline stages: the spec refuses
    tied embeddings over them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_core.models.tiny import write_tiny

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach() * 0.5)
    return write_tiny(model, AutoTokenizer.from_pretrained(folder), out)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron-engine")
    tied = save_tiny(root / "nano", "nano", seed=4)
    return {"tied": tied, "untied": untied(tied, root / "untied"),
            "four": untied(save_tiny(root / "nano4", "nano", seed=4, num_hidden_layers=4),
                           root / "four")}


@pytest.fixture(scope="module")
def plain(folders):
    """The plain engine on one rank with every row: log-probs, two updates, the weights."""
    from transformers import AutoModelForCausalLM

    from rl_core.engines.train import TrainEngine

    out = {}
    for name, folder in folders.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        engine = TrainEngine(model, param_dtype="float32", **OPTIONS)
        batch = make_batch()
        logprobs, entropy = engine.forward_logprobs(
            batch["input_ids"], batch["attention_mask"], batch["position_ids"], R,
            with_entropy=True)
        metrics = [engine.train_step(batch, loss_fn) for _ in range(2)]
        tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
        weights = {k: v.detach().clone() for k, v in model.state_dict().items() if k not in tied}
        out[name] = {"logprobs": logprobs, "entropy": entropy, "metrics": metrics,
                     "weights": weights}
    return out


LAYOUTS = [  # (world, layout, model)
    (1, {}, "tied"),
    (2, {"tp": 2}, "tied"),
    (2, {}, "tied"),  # two data-parallel ranks, each half the rows
    (2, {"pp": 2}, "untied"),
    (2, {"pp": 2, "vpp": 2}, "four"),  # interleaved: two chunks of one layer a rank
]


@pytest.mark.parametrize(("world", "layout", "name"), LAYOUTS,
                         ids=["one-rank", "tp2", "dp2", "pp2", "pp2-vpp2"])
def test_megatron_equals_the_plain_engine_on_every_layout(tmp_path, folders, plain, world,
                                                          layout, name):
    spawn(_megatron, world, tmp_path, str(folders[name]), layout, world, str(tmp_path))
    want = plain[name]
    mask = make_batch()["response_mask"].bool()
    for rank in range(world):
        got = torch.load(tmp_path / f"{rank}.pt")
        rows = got["rows"]
        torch.testing.assert_close(got["logprobs"][mask[rows]],
                                   want["logprobs"][rows][mask[rows]], rtol=0, atol=2e-5)
        torch.testing.assert_close(got["entropy"][mask[rows]],
                                   want["entropy"][rows][mask[rows]], rtol=0, atol=2e-5)
        for step, (mine, theirs) in enumerate(zip(got["metrics"], want["metrics"])):
            for name in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/lr"):
                assert mine[name] == pytest.approx(theirs[name], rel=1e-4, abs=1e-6), (step, name)
        assert sorted(got["weights"]) == sorted(want["weights"])
        for name, tensor in want["weights"].items():
            torch.testing.assert_close(got["weights"][name], tensor, rtol=0, atol=5e-5)
        # resumed from the checkpoint after the first update: the same second update
        assert got["again"]["actor/loss"] == pytest.approx(got["metrics"][1]["actor/loss"],
                                                           abs=1e-6)
        for name, tensor in got["weights"].items():
            torch.testing.assert_close(got["resumed_weights"][name], tensor, rtol=0, atol=1e-6)
        names = [name for bucket in got["buckets"] for name in bucket]
        assert sorted(names) == sorted(want["weights"]) and len(got["buckets"]) > 1


def _critic_and_reference(rank: int, folder: str, out: str) -> None:
    from megatron_cpu import on_cpu

    on_cpu()
    from rl_core.engines.mcore import MegatronLayout
    from rl_core.engines.megatron import MegatronEngine
    from rl_core.roles.actors import save_value_model

    batch = make_batch()
    columns = batch["input_ids"], batch["attention_mask"], batch["position_ids"], R
    reference = MegatronEngine(folder, layout=MegatronLayout(tp=2), param_dtype="float32",
                               lr=0.0, train=False)
    logprobs, _ = reference.forward_logprobs(*columns)
    critic = MegatronEngine(folder, layout=MegatronLayout(tp=2), param_dtype="float32",
                            value=True, **OPTIONS)
    start = critic.full_state_dict()
    if rank == 0:  # the critic as it starts, as the roles save it: a token classifier
        save_value_model(folder, start, f"{out}/critic")
    values, _ = critic.forward_logprobs(*columns)
    metrics = critic.train_step({**batch, "returns": batch["advantages"]}, value_loss)
    torch.save({"logprobs": logprobs, "values": values, "metrics": metrics,
                "weights": critic.full_state_dict()}, f"{out}/{rank}.pt")


def value_loss(micro, values, _entropy):
    from rl_core.algos import masked_mean

    loss = masked_mean((values - micro["returns"]) ** 2, micro["response_mask"])
    return loss, {"critic/vf_loss": loss.detach()}


def test_the_frozen_reference_and_the_value_model_equal_the_plain_engines(tmp_path, folders,
                                                                          plain):
    from transformers import AutoModelForTokenClassification

    from rl_core.engines.train import TrainEngine, ValueHead

    spawn(_critic_and_reference, 2, tmp_path, str(folders["tied"]), str(tmp_path))
    mask = make_batch()["response_mask"].bool()
    got = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    for rank in got:
        torch.testing.assert_close(rank["logprobs"][mask], plain["tied"]["logprobs"][mask],
                                   rtol=0, atol=2e-5)
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic",
                                                            dtype=torch.float32)
    assert model.config.classifier_dropout == 0.0  # as the critic role loads one
    assert model.config.num_labels == 1 and model.score.weight.shape == (1, 32)
    engine = TrainEngine(model, param_dtype="float32", head=ValueHead(), **OPTIONS)
    batch = make_batch()
    values, _ = engine.forward_logprobs(batch["input_ids"], batch["attention_mask"],
                                        batch["position_ids"], R)
    metrics = engine.train_step({**batch, "returns": batch["advantages"]}, value_loss)
    for rank in got:
        torch.testing.assert_close(rank["values"][mask], values[mask], rtol=0, atol=2e-5)
        assert rank["metrics"]["actor/loss"] == pytest.approx(metrics["actor/loss"], rel=1e-5)
        assert rank["metrics"]["actor/grad_norm"] == pytest.approx(metrics["actor/grad_norm"],
                                                                   rel=1e-4)
        state = model.state_dict()
        for name, tensor in rank["weights"].items():
            torch.testing.assert_close(tensor, state[name], rtol=0, atol=5e-5)


def _roles(rank: int, folder: str, out: str) -> None:
    """The roles of a PPO run with actor.strategy: megatron, in this one-rank process."""
    from megatron_cpu import on_cpu

    on_cpu()
    from rl_core.roles.actors import ActorWorker, CriticWorker, ReferenceWorker
    from rl_core.rollout.sampling import SamplingParams
    from rl_core.spec import resolve_spec

    spec = resolve_spec({
        "algorithm": "ppo", "model": {"path": folder, "dtype": "float32"},
        "data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
        "resources": {"device_type": "gpu"}, "rollout": {"engine": "native"},
        "actor": {"strategy": "megatron", "ppo_mini_batch_size": 4, "use_kl_loss": False,
                  "lr": OPTIONS["lr"], "ppo_micro_batch_size": OPTIONS["micro_batch_size"]},
        "trainer": {"output_dir": out}})
    sampling = SamplingParams.from_config(spec.rollout)
    actor = ActorWorker(spec, model_path=folder, total_steps=4, sampling=sampling,
                        device="cpu")
    reference = ReferenceWorker(spec, sampling=sampling, device="cpu")
    critic = CriticWorker(spec, total_steps=4, device="cpu")
    batch = make_batch()
    columns = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids",
                                     "response_mask")}
    old = actor.old_logprobs(columns)
    ref = reference.ref_logprobs(columns)
    values = critic.values(columns)
    mini = {**batch, "old_logprobs": old, "returns": batch["advantages"], "values": values}
    [metrics] = actor.update([mini], step=1)
    [critic_metrics] = critic.update([mini], step=1)
    trained = actor.engine.full_state_dict()  # the rollout's own copy is synced to it
    synced = {k: v for k, v in actor.model.state_dict().items() if k in trained}
    actor.save_model(f"{out}/step_1")
    critic.save_model(f"{out}/step_1/critic")
    torch.save({"old": old, "ref": ref, "metrics": metrics, "critic": critic_metrics,
                "trained": trained, "synced": synced, "state": actor.state()},
               f"{out}/{rank}.pt")


def test_the_roles_train_save_and_sync_with_the_megatron_engine(tmp_path, folders, plain):
    from transformers import AutoModelForCausalLM

    from rl_core.checkpoint import SHARDED_DIRS

    spawn(_roles, 1, tmp_path, str(folders["tied"]), str(tmp_path))
    got = torch.load(tmp_path / "0.pt", weights_only=False)
    mask = make_batch()["response_mask"].bool()
    want = plain["tied"]["logprobs"][mask]  # before any update: the folder's policy
    torch.testing.assert_close(got["old"][mask], want, rtol=0, atol=2e-5)
    torch.testing.assert_close(got["ref"][mask], want, rtol=0, atol=2e-5)
    assert got["metrics"]["actor/grad_norm"] > 0 and "critic/vf_loss" in got["critic"]
    for name, tensor in got["trained"].items():  # the native rollout generates from these
        assert torch.equal(got["synced"][name], tensor), name
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "step_1", dtype=torch.float32)
    for name, tensor in got["trained"].items():
        assert torch.equal(saved.state_dict()[name], tensor), name
    assert (tmp_path / "step_1" / SHARDED_DIRS["actor"] / "metadata.json").is_file()
    assert (tmp_path / "step_1" / "critic" / "model.safetensors").is_file()
    assert got["state"]["engine"]["strategy"] == "megatron"
