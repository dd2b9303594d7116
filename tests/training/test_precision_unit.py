"""`tools.precision`: msprobe module dumps of chosen stages and ranks, the stages' RL data, and
the first divergence between two runs (`rl_core.precision`), on tiny torch models on CPU."""

from __future__ import annotations

import csv
import json
import logging
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from rl_core import precision
from rl_core.cli import main as rl_core_main
from rl_core.errors import InputError
from rl_core.precision import PERTURB_ENV, PrecisionPlan, StageDumper, compare, perturb

# torch warns once per model that the first module's input (token ids) needs no gradient
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

VOCAB = 11


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class TinyLM(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.layers = nn.ModuleList([Block(d), Block(d)])
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def make_spec(out: Path, **precision_fields) -> SimpleNamespace:
    fields = {"enable": True, "steps": [1], "ranks": [0], "mode": "statistics", "modules": [],
              "output": "precision", **precision_fields}
    return SimpleNamespace(trainer=SimpleNamespace(output_dir=str(out)),
                           tools=SimpleNamespace(precision=SimpleNamespace(**fields)))


def rl_step(out: Path, *, perturbed: dict[str, tuple[str, float]] | None = None,
            order: tuple[str, ...] = ("old_logprob", "update"), dtype: torch.dtype = torch.float32,
            **precision_fields) -> Path:
    """One seeded RL-like step of a tiny LM on CPU, dumped: each stage of `order` but `update`
    a forward without grad (its log-probs as data), `update` forward and backward (its loss).
    `perturbed`: stage -> (module, scale) shifted during that stage. Returns the run's
    precision folder."""
    torch.manual_seed(0)
    model, ids = TinyLM().to(dtype), torch.randint(0, VOCAB, (2, 5))
    dumper = StageDumper("actor", 0)
    dumper.begin(PrecisionPlan.for_step(make_spec(out, **precision_fields), 1))
    for stage in order:
        handle = (perturb(model, *perturbed[stage]) if perturbed and stage in perturbed
                  else None)
        with dumper.stage(stage, model):
            if stage != "update":
                with torch.no_grad():
                    logprobs = model(ids).log_softmax(-1)
                dumper.data(stage, {"old_logprobs": logprobs, "responses": ids})
            else:
                loss = nn.functional.cross_entropy(model(ids).reshape(-1, VOCAB), ids.reshape(-1))
                loss.backward()
                dumper.data(stage, {"loss": loss.detach()})
        if handle is not None:
            handle.remove()
    dumper.begin(None)
    return out / "precision"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    return rl_step(tmp_path_factory.mktemp("baseline"))


def stage_dir(run: Path, stage: str, worker: str = "actor-rank0") -> Path:
    return run / "step_1" / worker / stage


def dump_data(run: Path, stage: str) -> dict:
    return json.loads((stage_dir(run, stage) / "dump.json").read_text())["data"]


# --------------------------------------------------------------------------- plan


def test_plan_of_a_chosen_step_and_none_otherwise(tmp_path):
    spec = make_spec(tmp_path, steps=[2], ranks=[0, 3], modules=["mlp"], mode="tensor")
    assert PrecisionPlan.for_step(spec, 1) is None
    plan = PrecisionPlan.for_step(spec, 2)
    assert plan == PrecisionPlan(step=2, folder=str(tmp_path / "precision" / "step_2"),
                                 ranks=(0, 3), mode="tensor", modules=("mlp",),
                                 stages=precision.DEFAULT_STAGES)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert PrecisionPlan.for_step(make_spec(tmp_path, stages=["update"]), 1).stages == ("update",)
    assert PrecisionPlan.for_step(make_spec(tmp_path, enable=False), 1) is None
    with pytest.raises(InputError, match="msprobe cannot write"):
        PrecisionPlan.for_step(make_spec(tmp_path / "a folder"), 1)


# --------------------------------------------------------------------------- dumps


def test_identical_seeded_runs_dump_identical_files_and_compare_clean(baseline, tmp_path):
    again = rl_step(tmp_path)
    for stage in ("old_logprob", "update"):
        for name in ("dump.json", "construct.json", "data.json"):
            assert ((stage_dir(again, stage) / name).read_bytes()
                    == (stage_dir(baseline, stage) / name).read_bytes()), (stage, name)
    report = compare(baseline, again)
    assert not report.diverged and report.first_divergence is None
    assert report.summary().startswith("no divergence")
    assert {r["stage"] for r in report.rows} == {"old_logprob", "update"}
    assert {r["kind"] for r in report.rows} == {"module", "data"}
    assert all(r["status"] == "ok" and r["max_abs_err"] == 0.0 for r in report.rows)


def test_forward_and_backward_statistics_of_each_module(baseline):
    update = dump_data(baseline, "update")
    for module in ("Module.layers.0.mlp.0.Linear", "Module.layers.1.Block", "Module.head.Linear"):
        assert f"{module}.forward.0" in update and f"{module}.backward.0" in update
    linear = update["Module.layers.0.mlp.0.Linear.forward.0"]
    stats = linear["output"][0]
    assert stats["shape"] == [2, 5, 16]
    assert stats["Min"] <= stats["Mean"] <= stats["Max"] and stats["Norm"] > 0
    assert set(linear["parameters"]) == {"weight", "bias"}
    assert "Module.layers.0.mlp.0.Linear.parameters_grad.0" in update
    backward = update["Module.layers.0.mlp.0.Linear.backward.0"]
    assert backward["input"][0]["shape"] == [2, 5, 16] and backward["output"][0]["Norm"] > 0
    # a forward under no_grad has no backward entries
    assert not [k for k in dump_data(baseline, "old_logprob") if ".backward." in k]
    assert not (stage_dir(baseline, "update") / ".msprobe").exists()


def test_dumped_model_is_left_unhooked(tmp_path):
    model = MLP()
    plain_forward = model.fc1.forward
    dumper = StageDumper("actor", 0)
    dumper.begin(PrecisionPlan.for_step(make_spec(tmp_path), 1))
    with dumper.stage("update", model):
        assert model.fc1._forward_pre_hooks  # msprobe's hooks while dumping
        model(torch.randn(3, 4)).sum().backward()
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks
        assert "forward" not in module.__dict__ and not hasattr(module, "msprobe_hook")
    assert model.fc1.forward == plain_forward
    pickle.dumps(model)  # msprobe's local hook functions would not pickle
    # hooked again for the next dump, its call counters restarted
    dumper.begin(PrecisionPlan.for_step(make_spec(tmp_path / "again"), 1))
    with dumper.stage("update", model):
        model(torch.randn(3, 4))
    again = json.loads((tmp_path / "again/precision/step_1/actor-rank0/update/dump.json")
                       .read_text())["data"]
    assert list(again) == ["Module.fc1.Linear.forward.0", "Module.act.ReLU.forward.0",
                           "Module.fc2.Linear.forward.0"]


def test_two_models_in_one_process_dump_to_their_own_folders(tmp_path):
    """msprobe's debugger is one per process: the actor's and the reference's stages of a step
    still dump their own model to their own folder."""
    plan = PrecisionPlan.for_step(make_spec(tmp_path), 1)
    actor, reference = StageDumper("actor", 0), StageDumper("reference", 0)
    actor.begin(plan)
    reference.begin(plan)
    lm, mlp = TinyLM(), MLP()
    with reference.stage("ref_logprob", mlp), torch.no_grad():
        mlp(torch.randn(3, 4))
    with actor.stage("old_logprob", lm), torch.no_grad():
        lm(torch.randint(0, VOCAB, (2, 5)))
    ref = json.loads((tmp_path / "precision/step_1/reference-rank0/ref_logprob/dump.json")
                     .read_text())["data"]
    act = json.loads((tmp_path / "precision/step_1/actor-rank0/old_logprob/dump.json")
                     .read_text())["data"]
    assert all(".fc" in k or ".act." in k for k in ref) and len(ref) == 3
    assert not any(".fc" in k for k in act) and "Module.head.Linear.forward.0" in act
    assert sorted(Path(p).name for p in actor.begin(None)) == sorted(precision.DUMP_FILES)


def test_modules_filter_dumps_only_matching_modules(baseline, tmp_path):
    run = rl_step(tmp_path, modules=["mlp"])
    update = dump_data(run, "update")
    assert update and all(".mlp." in name for name in update)
    assert any(".backward." in name for name in update)
    assert len(update) < len(dump_data(baseline, "update"))
    report = compare(baseline, run)  # the other modules: reported, not a divergence
    assert not report.diverged
    assert report.count("only_in_a") > 0 and report.count("only_in_b") == 0
    assert {r["status"] for r in report.rows if ".mlp." in r["tensor"]} == {"ok"}
    assert "only in A" in report.summary()
    reverse = compare(run, baseline)
    assert not reverse.diverged and reverse.count("only_in_b") == report.count("only_in_a")
    assert [r["tensor"] for r in reverse.rows if r["status"] == "ok"] == [
        r["tensor"] for r in report.rows if r["status"] == "ok"]


def test_nested_stage_is_skipped(tmp_path, caplog):
    model = MLP()
    dumper = StageDumper("actor", 0)
    dumper.begin(PrecisionPlan.for_step(make_spec(tmp_path), 1))
    with caplog.at_level(logging.INFO, logger="rl_core.precision"):
        with dumper.stage("update", model):
            with dumper.stage("old_logprob", model):
                model(torch.randn(3, 4))
    worker = tmp_path / "precision/step_1/actor-rank0"
    assert [p.name for p in worker.iterdir()] == ["update"]
    assert "old_logprob of actor rank 0 runs inside another dumped stage" in caplog.text


def test_a_rank_or_stage_not_chosen_writes_nothing(tmp_path):
    model = MLP()
    other_rank = StageDumper("actor", 1)
    other_rank.begin(PrecisionPlan.for_step(make_spec(tmp_path), 1))
    with other_rank.stage("update", model):
        model(torch.randn(3, 4))
    assert other_rank.data("update", {"loss": torch.ones(1)}) == []
    rank0 = StageDumper("actor", 0)
    rank0.begin(PrecisionPlan.for_step(make_spec(tmp_path, stages=["update"]), 1))
    with rank0.stage("old_logprob", model):
        model(torch.randn(3, 4))
    assert rank0.data("reward", {"rewards": torch.ones(2)}) == []
    assert not (tmp_path / "precision").exists()
    assert other_rank.begin(None) == [] and rank0.begin(None) == []
    assert not model.fc1._forward_pre_hooks


# --------------------------------------------------------------------------- RL data


def test_data_round_trip_and_statistics(tmp_path):
    dumper = StageDumper("actor", 0)
    dumper.begin(PrecisionPlan.for_step(make_spec(tmp_path), 1))
    rewards = torch.tensor([[1.0, -2.0], [3.0, 0.5]]).t()  # not contiguous
    tensors = {"rewards": rewards, "responses": torch.tensor([[3, 4], [5, 6]]),
               "mask": torch.tensor([True, False]), "ragged": [torch.ones(2), torch.zeros(3)],
               "kl_coef": 0.1, "note": object()}
    files = dumper.data("reward", tensors)
    folder = tmp_path / "precision/step_1/actor-rank0/reward"
    assert files == [str(folder / "data.safetensors"), str(folder / "data.json")]
    saved = load_file(folder / "data.safetensors")
    assert set(saved) == {"rewards", "responses", "mask", "ragged.0", "ragged.1", "kl_coef"}
    assert torch.equal(saved["rewards"], rewards) and torch.equal(saved["mask"], tensors["mask"])
    assert saved["responses"].dtype == torch.int64 and saved["ragged.1"].shape == (3,)
    stats = json.loads((folder / "data.json").read_text())
    assert stats["stage"] == "reward" and stats["step"] == 1
    assert list(stats["tensors"]) == ["rewards", "responses", "mask", "ragged.0", "ragged.1",
                                      "kl_coef"]
    assert stats["tensors"]["rewards"] == {"shape": [2, 2], "dtype": "torch.float32",
                                           "min": -2.0, "max": 3.0, "mean": 0.625,
                                           "norm": pytest.approx(14.25 ** 0.5)}
    assert stats["tensors"]["mask"]["mean"] == 0.5


def test_data_differences_are_found(tmp_path):
    def save(out: Path, responses, logprobs) -> Path:
        dumper = StageDumper("actor", 0)
        dumper.begin(PrecisionPlan.for_step(make_spec(out), 1))
        dumper.data("rollout", {"responses": responses, "logprobs": logprobs})
        return out / "precision"

    logprobs = -torch.rand(2, 6, generator=torch.Generator().manual_seed(1))
    a = save(tmp_path / "a", torch.tensor([[1, 2, 3]]), logprobs)
    tokens = compare(a, save(tmp_path / "b", torch.tensor([[1, 2, 4]]), logprobs))
    assert tokens.first_divergence["tensor"] == "responses"
    assert tokens.first_divergence["metric"] == "mismatched"
    assert tokens.first_divergence["value"] == 1
    assert [r["status"] for r in tokens.rows] == ["diverged", "ok"]
    longer = compare(a, save(tmp_path / "c", torch.tensor([[1, 2, 3, 5]]), logprobs * 1.01))
    assert [r["status"] for r in longer.rows] == ["shape_mismatch", "diverged"]
    assert longer.rows[1]["cosine"] == pytest.approx(1.0)
    assert longer.rows[1]["max_rel_err"] == pytest.approx(0.01, rel=1e-3)
    # a large relative error of a value near zero, absolutely tiny, passes (as allclose)
    near = torch.tensor([1e-9, 1.0, 2.0])
    tiny = compare(save(tmp_path / "d", torch.tensor([[1]]), near),
                   save(tmp_path / "e", torch.tensor([[1]]), near + torch.tensor([1e-9, 0, 0])))
    assert tiny.rows[1]["max_rel_err"] == pytest.approx(1.0) and not tiny.diverged
    assert compare(save(tmp_path / "f", torch.tensor([[1]]), near),
                   save(tmp_path / "g", torch.tensor([[1]]), near * 1.01)).diverged


def test_data_saved_before_its_stage_comes_before_its_modules(tmp_path):
    def run(out: Path, advantages: torch.Tensor) -> Path:
        torch.manual_seed(0)
        model, dumper = MLP(), StageDumper("actor", 0)
        dumper.begin(PrecisionPlan.for_step(make_spec(out), 1))
        dumper.data("update", {"advantages": advantages})  # the stage's input
        with dumper.stage("update", model):
            (model(torch.randn(3, 4)).sum(-1) * advantages).sum().backward()
        return out / "precision"

    a = run(tmp_path / "a", torch.tensor([1.0, -1.0, 0.5]))
    assert json.loads((stage_dir(a, "update") / "data.json").read_text())["order"] == (
        "before_modules")
    report = compare(a, run(tmp_path / "b", torch.tensor([1.0, -1.0, 0.6])))
    assert report.rows[0]["kind"] == "data" and report.first_divergence["order"] == 0
    assert report.first_divergence["tensor"] == "advantages"
    assert any(r["diverged"] and ".backward." in r["tensor"] for r in report.rows)
    with pytest.raises(ValueError, match=PERTURB_ENV):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(PERTURB_ENV, "layers.0")
            with StageDumper("actor", 0).stage("update", MLP()):
                pass


# --------------------------------------------------------------------------- divergence


def test_a_perturbed_layer_is_the_first_divergence_in_its_stage(baseline, tmp_path):
    run = rl_step(tmp_path, perturbed={"update": ("layers.1", 0.01)})
    report = compare(baseline, run)
    first = report.first_divergence
    assert report.diverged and first["stage"] == "update"
    assert first["module"] == "layers.1"  # not layers.0, nor the stage before
    assert first["tensor"] == "Module.layers.1.Block.forward.0.output.0"
    assert first["metric"] in precision.REL_COLUMNS and first["value"] > first["threshold"]
    before = report.rows[:first["order"]]
    assert before and all(not r["diverged"] for r in before)
    assert any(r["stage"] == "update" and "layers.0" in r["tensor"] for r in before)
    assert not any(r["diverged"] for r in report.rows if r["stage"] == "old_logprob")
    assert "first divergence: stage update" in report.summary()
    assert "module layers.1" in report.summary()


def test_first_divergence_follows_the_pipeline_not_the_dump_order(tmp_path, monkeypatch):
    """Stages dumped in another order than a step runs them, and a stage the pipeline does not
    know (last); the test hook's environment variable perturbs a leaf of layers.0 in
    ref_logprob only, old_logprob (before it by name, after it in a step) has layers.1
    perturbed."""
    order = ("custom", "update", "old_logprob", "ref_logprob")
    a = rl_step(tmp_path / "a", order=order, stages=list(order))
    monkeypatch.setenv(PERTURB_ENV, "ref_logprob:layers.0.mlp.2=0.05, custom:layers.0=0.05")
    b = rl_step(tmp_path / "b", perturbed={"old_logprob": ("layers.1", 0.05)}, order=order,
                stages=list(order))
    report = compare(a / "step_1", b / "step_1")
    assert [s for i, s in enumerate(r["stage"] for r in report.rows)
            if i == 0 or report.rows[i - 1]["stage"] != s] == [
        "ref_logprob", "old_logprob", "update", "custom"]
    first = report.first_divergence
    assert (first["stage"], first["module"]) == ("ref_logprob", "layers.0.mlp.2")
    assert first["tensor"] == "Module.layers.0.mlp.2.Linear.forward.0.output.0"
    first_old = next(r for r in report.rows if r["stage"] == "old_logprob" and r["diverged"])
    assert first_old["module"] == "layers.1"  # the variable left old_logprob alone
    assert not any(r["diverged"] for r in report.rows if r["stage"] == "update")
    first_custom = next(r for r in report.rows if r["stage"] == "custom" and r["diverged"])
    assert first_custom["module"] == "layers.0"


def test_tensor_mode_compares_by_cosine_similarity(baseline, tmp_path):
    a = rl_step(tmp_path / "a", mode="tensor", order=("update",))
    b = rl_step(tmp_path / "b", mode="tensor", order=("update",),
                perturbed={"update": ("layers.1.mlp", 0.05)})
    assert list((stage_dir(a, "update") / "dump_tensor_data").glob("*.pt"))
    same = compare(a, rl_step(tmp_path / "c", mode="tensor", order=("update",)))
    cosines = [r["cosine"] for r in same.rows if r["kind"] == "module"]
    assert cosines and all(c == 1.0 for c in cosines) and not same.diverged
    report = compare(a, b)
    first = report.first_divergence
    assert first["module"] == "layers.1.mlp" and first["metric"] == "cosine"
    assert first["cosine"] < 0.9999 and first["max_abs_err"] > 0
    # a statistics dump against a tensor one: compared by statistics; the stage one lacks
    mixed = compare(baseline, a)
    assert not mixed.diverged and all(r["status"] == "only_in_a" for r in mixed.rows
                                      if r["stage"] == "old_logprob")
    assert mixed.count("only_in_a") > 0 and mixed.count("ok") == len(same.rows)
    assert all(r["MaxRelativeErr"] == 0.0 for r in mixed.rows if r["status"] == "ok")
    # fp64 against fp32: msprobe compares tensors of two dtypes
    wide = compare(a, rl_step(tmp_path / "d", mode="tensor", order=("update",),
                              dtype=torch.float64))
    floats = [r for r in wide.rows if r["dtype_b"] == "torch.float64"]
    assert floats and all(r["dtype_a"] == "torch.float32" for r in floats)
    assert all(r["cosine"] > 0.99999 for r in floats if r["kind"] == "module")
    assert all(r["max_abs_err"] < 1e-5 for r in floats)  # the loss, 0-d, has no cosine
    assert any(r["max_abs_err"] > 0 for r in floats) and not wide.diverged


def test_nan_in_one_run_diverges_where_it_appears(tmp_path):
    for mode in ("statistics", "tensor"):
        a = rl_step(tmp_path / f"a_{mode}", mode=mode, order=("old_logprob",))
        b = rl_step(tmp_path / f"b_{mode}", mode=mode, order=("old_logprob",),
                    perturbed={"old_logprob": ("layers.1.mlp.2", float("nan"))})
        first = compare(a, b).first_divergence
        assert first["tensor"] == "Module.layers.1.mlp.2.Linear.forward.0.output.0", mode
        assert first["metric"] == ("nan_inf" if mode == "tensor" else "MaxRelativeErr"), mode


def test_report_files(baseline, tmp_path):
    run = rl_step(tmp_path, perturbed={"update": ("layers.0", 0.01)})
    report = compare(baseline, run)
    saved = json.loads(report.to_json(tmp_path / "report.json").read_text())
    assert saved["diverged"] is True and saved["summary"] == report.summary()
    assert saved["first_divergence"]["module"] == "layers.0"
    assert len(saved["rows"]) == len(report.rows)
    with report.to_csv(tmp_path / "report.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(precision.ROW_FIELDS) and len(rows) == len(report.rows)
    assert rows[first := report.first_divergence["order"]]["status"] == "diverged"
    assert rows[first]["tensor"] == report.first_divergence["tensor"]


# --------------------------------------------------------------------------- command line


def precision_cli(argv: list[str]) -> int:
    """`python -m rl_core precision ARGV...` in this process: its exit status."""
    return rl_core_main(["precision", *argv])


def test_cli_exit_codes_and_files(baseline, tmp_path, capsys):
    same = rl_step(tmp_path / "same")
    assert precision_cli(["compare", str(baseline), str(same)]) == 0
    assert "no divergence" in capsys.readouterr().out
    written = same / f"compare_{baseline.parent.name}_precision"
    assert {p.name for p in written.iterdir()} == {"report.json", "report.csv"}

    other = rl_step(tmp_path / "other", perturbed={"update": ("layers.1", 0.01)})
    out = tmp_path / "report"
    assert precision_cli(["compare", str(baseline), str(other), "--out", str(out)]) == 1
    assert "first divergence: stage update" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["diverged"] is True
    loose = ["--abs-max", "1", "--rel-max", "1", "--out", str(tmp_path / "loose")]
    assert precision_cli(["compare", str(baseline), str(other), *loose]) == 0

    empty = tmp_path / "empty"
    empty.mkdir()
    assert precision_cli(["compare", str(baseline), str(empty)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "dump.json" in err
    assert precision_cli(["compare", str(tmp_path / "missing"), str(baseline)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        precision_cli(["compare", str(baseline)])
    assert exit_info.value.code == 2


def test_a_stages_output_data_comes_after_the_modules_that_made_it(tmp_path, monkeypatch):
    """The controller saves a stage's output (`ref_logprobs`) after the reference's modules ran:
    when both part, the first divergence is the module, not the output it led to."""
    def run(out: Path, scale: float | None) -> Path:
        torch.manual_seed(0)
        model, ids = TinyLM(), torch.randint(0, VOCAB, (2, 5))
        plan = PrecisionPlan.for_step(make_spec(out), 1)
        reference, controller = StageDumper("reference", 0), StageDumper("controller", 0)
        reference.begin(plan)
        controller.begin(plan)
        handle = perturb(model, "layers.1.mlp", scale) if scale else None
        with reference.stage("ref_logprob", model), torch.no_grad():
            logprobs = model(ids).log_softmax(-1)
        controller.data("ref_logprob", {"ref_logprobs": logprobs})
        if handle is not None:
            handle.remove()
        return out / "precision"

    made = compare(run(tmp_path / "a", None), run(tmp_path / "b", 0.5))
    first = made.first_divergence
    assert first["worker"] == "reference-rank0" and "layers.1.mlp" in first["module"], first
    output = next(r for r in made.rows if r["tensor"] == "ref_logprobs")
    assert output["diverged"] and output["order"] > first["order"]
