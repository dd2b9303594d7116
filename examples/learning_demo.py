"""The learning demonstration: SFT a tiny model to a partial base, then GRPO and DAPO lift it.

    python examples/learning_demo.py [--out outputs/demo] [--plot docs/images/learning_curve.png]

1. SFT `tiny:small` on two-digit addition (examples/sft_tiny.yaml), saving every 50 steps;
2. pick the last SFT checkpoint whose greedy validation accuracy is between 20 % and 60 %;
3. train GRPO (examples/grpo_tiny.yaml) and DAPO (examples/dapo_tiny.yaml) from it;
4. print the accuracy before and after with the training time, and plot accuracy against
   training seconds for both.
Everything runs on the CPU; the data and the tiny model are made on first use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl_core.recipes.rl import RLTrainer
from rl_core.recipes.sft import SFTTrainer
from rl_core.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent


def metrics_of(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def pick_base(sft_dir: Path, low: float = 0.2, high: float = 0.6) -> tuple[Path, float]:
    """The last saved SFT checkpoint whose validation accuracy is in [low, high]."""
    accuracy = {m["step"]: m["val/accuracy"] for m in metrics_of(sft_dir) if "val/accuracy" in m}
    saved = sorted(int(p.name.split("_")[1]) for p in (sft_dir / "checkpoints").glob("step_*"))
    fitting = [s for s in saved if low <= accuracy.get(s, -1) <= high]
    if not fitting:
        raise SystemExit(f"no SFT checkpoint with validation accuracy in [{low}, {high}]: {accuracy}")
    return sft_dir / "checkpoints" / f"step_{fitting[-1]}", accuracy[fitting[-1]]


def curve(output_dir: Path) -> tuple[list[float], list[float]]:
    """(training seconds, validation accuracy) at each evaluation, starting at 0 s."""
    seconds, xs, ys = 0.0, [], []
    for m in metrics_of(output_dir):
        seconds += m.get("timing/step", 0.0)
        if "val/accuracy" in m:
            xs.append(seconds)
            ys.append(m["val/accuracy"])
    return xs, ys


def plot(curves: dict[str, tuple[list[float], list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, [100 * y for y in ys], marker="o", label=label)
    ax.axhline(80, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training time on 2 CPU cores (s)")
    ax.set_ylabel("greedy validation accuracy (%)")
    ax.set_title("tiny Qwen2 (1M parameters), two-digit addition, from an SFT base")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/demo"))
    parser.add_argument("--plot", type=Path, default=Path("docs/images/learning_curve.png"))
    args = parser.parse_args(argv)

    sft_dir = args.out / "sft"
    SFTTrainer(load_spec(EXAMPLES / "sft_tiny.yaml", [f"trainer.output_dir={sft_dir}",
                                                      "trainer.save_every=50"])).fit()
    base, base_accuracy = pick_base(sft_dir)
    print(f"SFT base: {base} (validation accuracy {base_accuracy:.0%})")
    curves = {}
    for algorithm in ("grpo", "dapo"):
        out = args.out / algorithm
        spec = load_spec(EXAMPLES / f"{algorithm}_tiny.yaml",
                         [f"model.path={base}", f"trainer.output_dir={out}", "trainer.resume_mode=disable"])
        RLTrainer(spec).fit()
        xs, ys = curve(out)
        curves[algorithm.upper()] = (xs, ys)
        best = max(range(len(ys)), key=ys.__getitem__)
        reached = next((x for x, y in zip(xs, ys) if y >= 0.8), None)
        print(f"{algorithm}: {ys[0]:.0%} -> {ys[-1]:.0%} (best {ys[best]:.0%} at {xs[best]:.0f} s; "
              f"80 % {'reached at %.0f s' % reached if reached is not None else 'not reached'})")
    plot(curves, args.plot)
    print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
