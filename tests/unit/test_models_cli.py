"""The `make-tiny` command, called through its parser as `python -m rl_core` would."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_core.cli.models import add_parser
from rl_core.models.loading import load_model_and_tokenizer

REPO = Path(__file__).resolve().parents[2]


def run(argv):
    parser = argparse.ArgumentParser(prog="python -m rl_core")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_make_tiny_writes_a_loadable_folder_and_reports_it(tmp_path, capsys):
    out = tmp_path / "nano"
    assert run(["make-tiny", "--size", "nano", "--out", str(out), "--seed", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [str(out), "parameters: 27136", "vocab_size: 263"]
    model, tokenizer = load_model_and_tokenizer(out)
    assert model.config.hidden_size == 32 and len(tokenizer) == 263


def test_shape_options_override_the_preset(tmp_path, capsys):
    out = tmp_path / "wide"
    argv = ["make-tiny", "--size", "nano", "--out", str(out), "--hidden-size", "64",
            "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "96",
            "--max-positions", "64"]
    assert run(argv) == 0
    config = load_model_and_tokenizer(out)[0].config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size,
            config.max_position_embeddings) == (64, 1, 2, 1, 96, 64)


def test_an_existing_folder_is_exit_2_unless_forced(tmp_path, capsys):
    out = tmp_path / "m"
    assert run(["make-tiny", "--size", "nano", "--out", str(out)]) == 0
    before = load_model_and_tokenizer(out)[0].lm_head.weight.clone()
    capsys.readouterr()
    assert run(["make-tiny", "--size", "nano", "--out", str(out), "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out}: already exists" in err
    assert run(["make-tiny", "--size", "nano", "--out", str(out), "--seed", "5", "--force"]) == 0
    assert not torch.equal(load_model_and_tokenizer(out)[0].lm_head.weight, before)


def test_an_impossible_shape_is_exit_2_with_the_reason(tmp_path, capsys):
    out = tmp_path / "bad"
    assert run(["make-tiny", "--size", "nano", "--out", str(out), "--heads", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "hidden_size 32 is not divisible by num_attention_heads 3" in err
    assert not out.exists()


def test_an_unknown_size_is_an_argparse_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        run(["make-tiny", "--size", "huge", "--out", str(tmp_path)])
    assert info.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err


def test_registering_the_command_does_not_import_torch():
    code = "import sys, rl_core.cli.models; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
