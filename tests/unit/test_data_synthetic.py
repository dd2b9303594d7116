"""Synthetic tasks: determinism, disjoint splits, exact answers, the countdown checker, the cache
of a spec's `data.synthetic` section and the `make-data` command."""

import argparse
import json

import pytest

from rl_core.data.synthetic import ARITHMETIC_TASKS

from rl_core.data import (
    DataError,
    arithmetic_problems,
    countdown_problems,
    data_files,
    generate,
    load_pair_data,
    load_prompt_data,
    load_prompts,
    materialize_synthetic,
    synthetic_splits,
    verify_countdown,
)
from rl_core.cli.data import add_parser
from rl_core.spec import resolve_spec


def key(row):
    """A problem's identity: countdown numbers in any order are the same problem."""
    if row["task"] == "countdown":
        return tuple(sorted(row["answer"]["numbers"])), row["answer"]["target"]
    return row["prompt"]


@pytest.mark.parametrize("task", ARITHMETIC_TASKS)
def test_generators_are_deterministic_and_seed_sensitive(task):
    assert generate(task, 50, seed=3) == generate(task, 50, seed=3)
    assert generate(task, 50, seed=3) != generate(task, 50, seed=4)


@pytest.mark.parametrize("task", ARITHMETIC_TASKS)
@pytest.mark.parametrize(("digits", "num_train", "num_val"), [(1, 70, 30), (2, 300, 60)])
def test_train_and_validation_never_share_a_problem(task, digits, num_train, num_val):
    # One digit, two operands: 100 problems, all used, some in each split.
    train, val = synthetic_splits(task, num_train=num_train, num_val=num_val, seed=0, digits=digits)
    assert (len(train), len(val)) == (num_train, num_val)
    train_keys, val_keys = {key(r) for r in train}, {key(r) for r in val}
    assert (len(train_keys), len(val_keys)) == (num_train, num_val)  # no duplicates in a split
    assert not train_keys & val_keys


def test_addition_prompts_are_short_with_exact_answers():
    rows = arithmetic_problems("+", 500, seed=1, digits=3)
    for row in rows:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert int(a) + int(b) == int(row["answer"])
        assert max(len(a), len(b)) <= 3 and row["prompt"].endswith("=")
    assert any(len(r["prompt"]) == 8 for r in rows)  # "123+456="
    assert rows[0].keys() == {"prompt", "answer", "task"}


def test_multiplication_answers_and_operand_range():
    rows = arithmetic_problems("*", 100, seed=1, digits=2, low=10, high=20)
    for row in rows:
        a, b = map(int, row["prompt"].removesuffix("=").split("*"))
        assert 10 <= a <= 20 and 10 <= b <= 20 and a * b == int(row["answer"])


def test_asking_for_more_problems_than_exist():
    # One-digit addition has 10 * 10 = 100 problems.
    assert len(generate("addition", 100, seed=0, digits=1)) == 100
    with pytest.raises(DataError, match="only 100 distinct problems .* 101 requested"):
        synthetic_splits("addition", num_train=91, num_val=10, seed=0, digits=1)
    with pytest.raises(DataError, match="found only .* distinct countdown problems"):
        countdown_problems(50, seed=0, digits=1, num_count=2, high=2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: generate("division", 5, 0),
            "unknown synthetic task 'division': choose one of addition, multiplication, countdown",
        ),
        (lambda: generate("addition", 5, 0, digits=10), "digits must be between 1 and 9"),
        (lambda: generate("countdown", 5, 0, num_count=1), "num_count must be between 2 and 8"),
        (
            lambda: synthetic_splits("addition", num_train=0, num_val=1, seed=0),
            "num_train must be positive",
        ),
    ],
)
def test_bad_generator_requests(call, message):
    with pytest.raises(DataError, match=message):
        call()


def test_countdown_knobs_and_solutions_check():
    rows = countdown_problems(300, seed=2, digits=2, num_count=3, target_max=200)
    for row in rows:
        numbers, target = row["answer"]["numbers"], row["answer"]["target"]
        assert len(numbers) == 3 and all(1 <= n <= 99 for n in numbers)
        assert 1 <= target <= 200
        assert row["prompt"] == f"{','.join(map(str, numbers))}->{target}:"
        assert verify_countdown(row["solution"], numbers, target)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("(8-4)*(7-1)", True),  # 4 * 6 = 24
        (" 8 * (7 - 4) * 1 ", True),  # whitespace is fine
        ("(7-(8/4))*... ", False),  # not an expression
        ("8*(7-4)", False),  # 1 unused: every number must be used
        ("8*(7-4)*1*1", False),  # 1 used twice
        ("8*3*1+0*(7-4)", False),  # 3 and 0 are not given
        ("-8*(4-7)*1", False),  # unary minus is not an operation of the game
        ("(8-4)**(7-1)", False),  # nor is a power
        ("8/(4-4)*7*1", False),  # division by zero
        ("24", False),
        ("__import__('os')", False),
        ("1" * 300, False),  # too long to parse
    ],
)
def test_countdown_verifier_target_24_from_1_4_7_8(expression, expected):
    assert verify_countdown(expression, [1, 4, 7, 8], 24) is expected


def test_countdown_verifier_is_exact_with_fractions_and_can_allow_subsets():
    # 8 / (3 - 8/3) = 8 / (1/3) = 24: exact only with rational arithmetic.
    assert verify_countdown("8/(3-8/3)", [3, 3, 8, 8], 24)
    assert not verify_countdown("8/(3-8/3)", [3, 3, 8, 8], 25)
    assert verify_countdown("8*3", [3, 8, 9], 24, use_all=False)
    assert not verify_countdown("8*3*3", [3, 8, 9], 72, use_all=False)  # 3 given once


# --------------------------------------------------------------------------- spec and cache


def synthetic_spec(tmp_path, **synthetic):
    synthetic = {"task": "addition", "digits": 2, "num_train": 40, "num_val": 8} | synthetic
    return resolve_spec(
        {
            "seed": 5,
            "data": {"synthetic": synthetic},
            "trainer": {"output_dir": str(tmp_path / "out")},
        }
    )


def test_spec_synthetic_section_is_materialised_once_and_reused(tmp_path):
    spec = synthetic_spec(tmp_path)
    train_files, val_files = data_files(spec)
    assert train_files[0].startswith(str(tmp_path / "out" / "data" / "addition-"))
    train, val = load_prompt_data(spec)
    assert (len(train), len(val)) == (40, 8)
    params = json.loads((tmp_path / train_files[0]).parent.joinpath("params.json").read_text())
    assert params["seed"] == 5 and params["num_train"] == 40
    mtime = (tmp_path / train_files[0]).stat().st_mtime_ns
    assert data_files(spec) == (train_files, val_files)
    assert (tmp_path / train_files[0]).stat().st_mtime_ns == mtime  # not rewritten


def test_changed_parameters_get_their_own_copy_and_match_a_direct_split(tmp_path):
    a, _ = data_files(synthetic_spec(tmp_path))
    b, _ = data_files(synthetic_spec(tmp_path, num_train=41))
    assert a != b
    train, val = synthetic_splits("addition", num_train=41, num_val=8, seed=5, digits=2)
    assert [r.prompt for r in load_prompts(b[0])] == [r["prompt"] for r in train]


def test_a_broken_cache_is_rebuilt_and_parquet_is_cached_too(tmp_path):
    spec = synthetic_spec(tmp_path, num_val=0)
    train, val = materialize_synthetic(spec.data.synthetic, 5, tmp_path / "cache", fmt="parquet")
    assert train.suffix == ".parquet" and val is None
    (train.parent / "params.json").write_text("{broken")
    again, _ = materialize_synthetic(spec.data.synthetic, 5, tmp_path / "cache", fmt="parquet")
    assert again == train and len(load_prompts(again)) == 40


def test_spec_with_files_uses_its_keys(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "1+1=", "solution": "2"}\n')
    spec = resolve_spec(
        {"data": {"train_files": [str(path)], "prompt_key": "question", "answer_key": "solution"}}
    )
    train, val = load_prompt_data(spec)
    assert (train[0].prompt, train[0].ground_truth, val) == ("1+1=", "2", [])
    with pytest.raises(DataError, match="preference pairs come from files"):
        load_pair_data(spec)


def test_dpo_spec_loads_pairs(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"q": "hi", "good": "hello", "bad": "go"}\n')
    spec = resolve_spec(
        {
            "algorithm": "dpo",
            "data": {
                "train_files": [str(path)],
                "prompt_key": "q",
                "chosen_key": "good",
                "rejected_key": "bad",
            },
        }
    )
    (pair,), val = load_pair_data(spec)
    assert (pair.prompt, pair.chosen, pair.rejected, val) == ("hi", "hello", "go", [])


# --------------------------------------------------------------------------- make-data


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="python -m rl_core")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["make-data", *argv])
    return args.handler(args)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_make_data_writes_train_and_val(tmp_path, capsys, fmt):
    out = tmp_path / "add3"
    argv = ["--task", "addition", "--digits", "3", "--num-train", "200", "--num-val", "20"]
    assert run_cli([*argv, "--seed", "0", "--out", str(out), "--format", fmt]) == 0
    train, val = load_prompts(out / f"train.{fmt}"), load_prompts(out / f"val.{fmt}")
    assert (len(train), len(val)) == (200, 20)
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    assert capsys.readouterr().out == (
        f"wrote {out / f'train.{fmt}'} (200 addition prompts)\n"
        f"wrote {out / f'val.{fmt}'} (20 addition prompts)\n"
    )


def test_make_data_countdown_knobs_and_no_val(tmp_path, capsys):
    out = tmp_path / "cd"
    argv = ["--task", "countdown", "--digits", "1", "--num-count", "3", "--num-train", "30"]
    assert run_cli([*argv, "--num-val", "0", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(len(r["answer"]["numbers"]) == 3 for r in rows)
    assert not (out / "val.jsonl").exists()
    assert capsys.readouterr().out.count("wrote") == 1


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--digits", "1", "--num-train", "100", "--num-val", "1"], "only 100 distinct problems"),
        (["--digits", "12"], "digits must be between 1 and 9"),
        (["--num-count", "3"], "--num-count applies to --task countdown only"),
    ],
)
def test_make_data_input_errors_exit_2_with_one_line(tmp_path, capsys, argv, reason):
    assert run_cli([*argv, "--out", str(tmp_path / "x")]) == 2
    captured = capsys.readouterr()
    assert reason in captured.err and captured.err.count("\n") == 1 and captured.out == ""
