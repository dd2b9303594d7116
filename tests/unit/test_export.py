"""`python -m rl_core export`: a model folder re-saved in another dtype, and its bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.errors import InputError
from rl_core.export import export_checkpoint
from rl_core.models.tiny import save_tiny


@pytest.fixture
def folder(tmp_path):
    return save_tiny(tmp_path / "model", "nano", seed=3)


def test_a_plain_checkpoint_is_resaved_in_the_dtype_asked_for(folder, tmp_path):
    done = export_checkpoint(folder, tmp_path / "out", dtype="bfloat16")
    assert done == {"out": str(tmp_path / "out"), "dtype": "bfloat16",
                    "weights": "checkpoint weights"}
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    want = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert got.dtype == torch.bfloat16
    for name, value in want.state_dict().items():
        assert torch.equal(got.state_dict()[name], value.to(torch.bfloat16)), name
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    assert not list(tmp_path.glob(".tmp-*"))


def test_an_occupied_folder_and_an_unknown_dtype_are_refused(folder, tmp_path):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="busy: exists and is not an empty folder"):
        export_checkpoint(folder, tmp_path / "busy")
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    with pytest.raises(InputError, match="--dtype: 'fp8' is not a dtype"):
        export_checkpoint(folder, tmp_path / "out", dtype="fp8")
    with pytest.raises(InputError, match="no such folder"):
        export_checkpoint(tmp_path / "missing", tmp_path / "out")


def test_a_megatron_checkpoint_exports_its_hugging_face_weights(folder, tmp_path):
    # Megatron's distributed checkpoint beside them is its engine's to read: left alone
    (folder / "spec.yaml").write_text("actor:\n  strategy: megatron\nmodel:\n  dtype: bfloat16\n")
    (folder / "dcp" / "actor").mkdir(parents=True)
    (folder / "dcp" / "actor" / ".metadata").write_bytes(b"Megatron's, not a model's")
    done = export_checkpoint(folder, tmp_path / "out")
    assert (done["dtype"], done["weights"]) == ("bfloat16", "checkpoint weights")
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    want = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    for name, value in want.state_dict().items():
        assert torch.equal(got.state_dict()[name], value.to(torch.bfloat16)), name
