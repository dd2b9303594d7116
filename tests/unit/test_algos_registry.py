"""The algos registries: names match the run spec's vocabulary; bad names list valid ones."""

import ast
from pathlib import Path
from typing import get_args

import pytest

import rl_core.algos as algos
from rl_core import spec

ALGOS_DIR = Path(algos.__file__).parent


def choices(model, field):
    """The values of a Literal-typed spec field."""
    return set(get_args(model.model_fields[field].annotation))


@pytest.mark.parametrize(
    "registry, expected",
    [
        (algos.ADVANTAGE_ESTIMATORS, set(get_args(spec.AdvEstimator))),
        (algos.LOSS_AGG_MODES, set(get_args(spec.LossAggMode))),
        (algos.KL_ESTIMATORS, set(get_args(spec.KLType))),
        (algos.POLICY_LOSSES, choices(spec.ActorConfig, "policy_loss")),
        (algos.DPO_LOSSES, choices(spec.DPOConfig, "loss_type")),
        (algos.KL_CONTROLLERS, choices(spec.AdvantageConfig, "kl_ctrl")),
    ],
)
def test_registry_names_are_the_spec_vocabulary(registry, expected):
    assert set(registry) == expected


@pytest.mark.parametrize(
    "get, registry",
    [
        (algos.get_advantage_estimator, algos.ADVANTAGE_ESTIMATORS),
        (algos.get_loss_agg_mode, algos.LOSS_AGG_MODES),
        (algos.get_kl_estimator, algos.KL_ESTIMATORS),
        (algos.get_policy_loss, algos.POLICY_LOSSES),
        (algos.get_dpo_loss, algos.DPO_LOSSES),
    ],
)
def test_lookup_and_bad_name_lists_valid_names(get, registry):
    for name, fn in registry.items():
        assert get(name) is fn
    for bad in ("nope", None):
        with pytest.raises(KeyError) as caught:
            get(bad)
        assert isinstance(caught.value, ValueError)
        message = str(caught.value)
        assert repr(bad) in message and all(name in message for name in registry)
        assert not message.startswith('"')  # not KeyError's quoted repr


def test_make_kl_controller_bad_kind():
    with pytest.raises(ValueError, match="unknown kl_ctrl 'pid': choose one of adaptive, fixed"):
        algos.make_kl_controller("pid", 0.1)


def test_aliases_share_one_function():
    assert algos.KL_ESTIMATORS["mse"] is algos.KL_ESTIMATORS["k2"]
    assert algos.KL_ESTIMATORS["low_var_kl"] is algos.KL_ESTIMATORS["k3"]


@pytest.mark.parametrize("path", sorted(ALGOS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_modules_are_pure_and_documented(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc and doc.splitlines()[0].strip(), f"{path.name} needs a one-line module docstring"
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    roots = {name.split(".")[0] for name in imported}
    assert not roots & {"ray", "django", "os", "io", "pathlib", "logging", "numpy"}
    assert not any(name.startswith("torch.distributed") for name in imported)
    assert "rl_core.spec" not in imported  # no config objects
