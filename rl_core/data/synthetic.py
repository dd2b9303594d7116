"""Generated arithmetic tasks with exact answers, for tests, smoke runs and tiny models.

    train, val = synthetic_splits("addition", num_train=2000, num_val=200, seed=0, digits=3)
    train[0]  # {"prompt": "12+345=", "answer": "357", "task": "addition"}

Tasks (`TASKS`):
- `addition`, `multiplication`: "a+b=" / "a*b=", operands in [low, high] (default: up to
  `digits` digits); the answer is the exact result as text.
- `countdown`: reach a target from `num_count` numbers with + - * / (each number used once):
  prompt "3,7,8,2->24:"; the answer is {"target": 24, "numbers": [3, 7, 8, 2]}, the record also
  carries one `solution`; `verify_countdown` is the exact checker.
- `squares`: a picture and "How many squares are in the picture?" (`rl_core.data.visual`; the
  records name their pictures, written beside the jsonl files by `write_synthetic`).

Splits are drawn as one set of distinct problems (distinct up to the order of countdown numbers)
and cut in two, so train and validation never share a problem. Everything is seeded.
`materialize_synthetic` writes the dataset of a spec's `data.synthetic` section to a cache folder
and re-uses it when the parameters match.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from rl_core.data.datasets import DataError, write_rows

ARITHMETIC_TASKS = ("addition", "multiplication", "countdown")  # rows only (`generate`)
VISUAL_TASK = "squares"  # counting squares in pictures (rl_core.data.visual): records with images
TASKS = (*ARITHMETIC_TASKS, VISUAL_TASK)
IMAGE_FIELD = "images"  # the records' image field of the visual task
FORMATS = ("jsonl", "parquet")
# Bump when a generator's output changes, so cached datasets are rebuilt.
GENERATOR_VERSION = 1
MAX_DIGITS = 9  # as `data.synthetic.digits` in the run spec

Row = dict[str, Any]


# --------------------------------------------------------------------------- addition, product


def _operand_range(digits: int, low: int | None, high: int | None) -> tuple[int, int]:
    if not 1 <= digits <= MAX_DIGITS:
        raise DataError(f"digits must be between 1 and {MAX_DIGITS}, got {digits}")
    low = 0 if low is None else low
    high = 10**digits - 1 if high is None else high
    if not 0 <= low <= high:
        raise DataError(f"operand range [{low}, {high}] is empty or negative")
    return low, high


def arithmetic_problems(
    op: str,
    count: int,
    seed: int,
    *,
    digits: int = 2,
    low: int | None = None,
    high: int | None = None,
) -> list[Row]:
    """`count` distinct "a<op>b=" problems (op "+" or "*") with a, b in [low, high]."""
    low, high = _operand_range(digits, low, high)
    width = high - low + 1
    space = width * width
    if space > sys.maxsize:
        raise DataError(f"operand range [{low}, {high}] is too wide: at most {MAX_DIGITS} digits")
    if count > space:
        raise DataError(
            f"only {space} distinct problems have operands in [{low}, {high}], {count} requested: "
            "raise digits or lower num_train + num_val"
        )
    compute = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}[op]
    task = {"+": "addition", "*": "multiplication"}[op]
    rows = []
    for index in random.Random(f"{task}:{seed}").sample(range(space), count):
        a, b = low + index // width, low + index % width
        rows.append({"prompt": f"{a}{op}{b}=", "answer": str(compute(a, b)), "task": task})
    return rows


def calculator_transcripts(problems: Sequence[Row], render: Callable[[str], str], *,
                           direct: float = 0.0, seed: int = 0) -> list[Row]:
    """Supervised examples of using the calculator tool on "a*b=" `problems` (rows of
    `arithmetic_problems`), in the `hermes` format of multi-turn rollouts
    (`rl_core.rollout.turns`): per problem its first turn (the prompt `render`ed as a chat, the
    answer the tool call) and its last (the prompt followed by that call, its eos and the
    tool's answer; the answer `<answer>a*b</answer>`). For a `direct` share of the problems
    (drawn with `seed`) the first turn answers at once instead (`<answer>a*b</answer>`, which a
    small model can only guess). A model fine-tuned on them calls the tool most of the time
    and copies its answer."""
    from rl_core.rollout.turns import ANSWER, ANSWERS_END, ANSWERS_START, hermes_call

    rng = random.Random(f"calculator:{seed}")
    rows = []
    for problem in problems:
        prompt, expression = render(problem["prompt"]), problem["prompt"].rstrip("=")
        answer = f"<answer>{problem['answer']}</answer>"
        if rng.random() < direct:
            rows.append({"prompt": prompt, "answer": answer, "task": "calculator"})
            continue
        called = hermes_call("calculator", {"expression": expression})
        answered = (prompt + called + "<|im_end|>" + ANSWERS_START
                    + ANSWER.format(problem["answer"]) + ANSWERS_END)
        rows.append({"prompt": prompt, "answer": called, "task": "calculator"})
        rows.append({"prompt": answered, "answer": answer, "task": "calculator"})
    return rows


# --------------------------------------------------------------------------- countdown


def _combine(rng: random.Random, a: tuple[int, str], b: tuple[int, str]) -> tuple[int, str]:
    """One random operation on two (value, expression) pairs, keeping values positive integers."""
    (x, ex), (y, ey) = a, b
    options = [(x + y, f"{ex}+{ey}"), (x * y, f"{ex}*{ey}")]
    if x != y:
        big, small = (a, b) if x > y else (b, a)
        options.append((big[0] - small[0], f"{big[1]}-{small[1]}"))
    for (num, en), (den, ed) in ((a, b), (b, a)):
        if den > 1 and num % den == 0:
            options.append((num // den, f"{en}/{ed}"))
    value, expression = rng.choice(options)
    return value, f"({expression})"


def _countdown_problem(
    rng: random.Random, num_count: int, low: int, high: int
) -> tuple[list[int], int, str]:
    numbers = [rng.randint(low, high) for _ in range(num_count)]
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        i, j = sorted(rng.sample(range(len(pool)), 2))
        b, a = pool.pop(j), pool.pop(i)
        pool.append(_combine(rng, a, b))
    target, solution = pool[0]
    return numbers, target, solution[1:-1] if num_count > 1 else solution


def countdown_problems(
    count: int,
    seed: int,
    *,
    digits: int = 2,
    num_count: int = 4,
    low: int = 1,
    high: int | None = None,
    target_max: int | None = None,
) -> list[Row]:
    """`count` distinct countdown problems: `num_count` numbers in [low, high] (default: up to
    `digits` digits) and a reachable target in [1, target_max] (default: up to digits + 1
    digits)."""
    if not 2 <= num_count <= 8:
        raise DataError(f"num_count must be between 2 and 8, got {num_count}")
    low, high = _operand_range(digits, low, high)
    if low < 1:
        raise DataError(f"countdown numbers must be positive: low is {low}")
    target_max = 10 ** (digits + 1) - 1 if target_max is None else target_max
    rng = random.Random(f"countdown:{seed}")
    seen: set[tuple[tuple[int, ...], int]] = set()
    rows: list[Row] = []
    attempts = 0
    while len(rows) < count:
        attempts += 1
        if attempts > 100 * count + 10_000:
            raise DataError(
                f"found only {len(rows)} distinct countdown problems of the {count} requested: "
                "raise digits, num_count or target_max, or lower num_train + num_val"
            )
        numbers, target, solution = _countdown_problem(rng, num_count, low, high)
        key = (tuple(sorted(numbers)), target)
        if not 1 <= target <= target_max or key in seen:
            continue
        seen.add(key)
        rows.append(
            {
                "prompt": f"{','.join(map(str, numbers))}->{target}:",
                "answer": {"target": target, "numbers": numbers},
                "task": "countdown",
                "solution": solution,
            }
        )
    return rows


_OPS: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
MAX_EXPRESSION_LENGTH = 256


def _evaluate(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of a tree of + - * / over non-negative integer literals; ValueError otherwise."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left, used), _evaluate(node.right, used)
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError(f"not allowed in a countdown expression: {ast.dump(node)[:40]}")


def verify_countdown(
    expression: str, numbers: Sequence[int], target: int, *, use_all: bool = True
) -> bool:
    """True when `expression` uses + - * / and parentheses over `numbers`, each at most as often
    as given (exactly as often with `use_all`), and equals `target` exactly."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_LENGTH:
        return False
    used: list[int] = []
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree.body, used)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return False
    given, taken = Counter(numbers), Counter(used)
    fits = taken == given if use_all else taken <= given
    return fits and value == target


# --------------------------------------------------------------------------- splits and files


def generate(task: str, count: int, seed: int, **knobs: Any) -> list[Row]:
    """`count` distinct problems of `task`; `knobs` are the task generator's keyword arguments."""
    if task == "addition":
        return arithmetic_problems("+", count, seed, **knobs)
    if task == "multiplication":
        return arithmetic_problems("*", count, seed, **knobs)
    if task == "countdown":
        return countdown_problems(count, seed, **knobs)
    raise DataError(f"unknown synthetic task {task!r}: choose one of "
                    f"{', '.join(ARITHMETIC_TASKS)} (the pictures of {VISUAL_TASK!r} are written "
                    "by write_synthetic)")


def synthetic_splits(
    task: str, *, num_train: int, num_val: int, seed: int, **knobs: Any
) -> tuple[list[Row], list[Row]]:
    """Disjoint train and validation problems of `task`, deterministic for a seed."""
    if num_train <= 0 or num_val < 0:
        raise DataError(
            f"num_train must be positive and num_val non-negative, got {num_train} and {num_val}"
        )
    rows = generate(task, num_train + num_val, seed, **knobs)
    return rows[num_val:], rows[:num_val]


def write_synthetic(
    out_dir: str | Path,
    task: str,
    *,
    num_train: int,
    num_val: int,
    seed: int,
    fmt: str = "jsonl",
    **knobs: Any,
) -> tuple[Path, Path | None]:
    """Write `out_dir/train.<fmt>` and, when num_val > 0, `out_dir/val.<fmt>`. The visual task
    `squares` (`rl_core.data.visual`) writes jsonl with its pictures beside it."""
    if fmt not in FORMATS:
        raise DataError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if task == VISUAL_TASK:
        from rl_core.data.visual import write_squares

        return write_squares(out_dir, num_train=num_train, num_val=num_val, seed=seed)
    train, val = synthetic_splits(task, num_train=num_train, num_val=num_val, seed=seed, **knobs)
    out = Path(out_dir)
    train_path = write_rows(train, out / f"train.{fmt}")
    val_path = write_rows(val, out / f"val.{fmt}") if val else None
    return train_path, val_path


def materialize_synthetic(
    synthetic: Any, seed: int, cache_dir: str | Path, *, fmt: str = "jsonl"
) -> tuple[Path, Path | None]:
    """The train and validation files of a spec's `data.synthetic` section (a `SyntheticData`)
    under `cache_dir`, generated on first use and re-used while the parameters are the same.

    The folder is named by a hash of the parameters and written through a temporary folder
    renamed into place, so processes racing on the same cache agree on one copy.
    """
    params = {
        "task": synthetic.task,
        "digits": synthetic.digits,
        "num_train": synthetic.num_train,
        "num_val": synthetic.num_val,
        "seed": seed,
        "format": "jsonl" if synthetic.task == VISUAL_TASK else fmt,
        "generator_version": GENERATOR_VERSION,
    }
    blob = json.dumps(params, sort_keys=True)
    folder = Path(cache_dir) / f"{synthetic.task}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    if not _cached(folder, params):
        _build(folder, params)
    if synthetic.task == VISUAL_TASK:
        fmt = "jsonl"
    val = folder / f"val.{fmt}"
    return folder / f"train.{fmt}", val if val.exists() else None


def _cached(folder: Path, params: Mapping[str, Any]) -> bool:
    try:
        saved = json.loads((folder / "params.json").read_text())
    except (OSError, ValueError):
        return False
    return saved == params and (folder / f"train.{params['format']}").exists()


def _build(folder: Path, params: Mapping[str, Any]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; other users (Ray workers) must read it
    try:
        write_synthetic(
            staging,
            params["task"],
            num_train=params["num_train"],
            num_val=params["num_val"],
            seed=params["seed"],
            fmt=params["format"],
            digits=params["digits"],
        )
        (staging / "params.json").write_text(json.dumps(params, indent=2, sort_keys=True))
        if _cached(folder, params):  # another process finished first
            return
        if folder.exists():  # a broken copy
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rename(staging, folder)
        except OSError:
            if not _cached(folder, params):  # another process did not win the race either
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
