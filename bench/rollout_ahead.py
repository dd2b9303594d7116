"""Step throughput with a rollout pool of its own: synchronous against rollouts ahead of the update.

    python bench/rollout_ahead.py [--size small] [--prompts 4] [--n 8] [--new-tokens 256] \
        [--stop-tokens 2] [--staleness 0,1,2] [--ppo-epochs 1] [--steps 8] [--warmup 2]

GRPO on a local Ray with two devices: one trains, one is a rollout pool of its own
(`parallel.colocate_actor_rollout: false`, `parallel.rollout_devices: 1`), one CPU core each. One
trainer per `trainer.max_staleness` of `--staleness` (0: generate, then train; k: the pool
generates the next k batches while the actor trains), one after another on the same model and
prompts. The response lengths have a long tail on purpose (`bench/partial_rollout.py`'s model:
the seeded untrained tiny model ends a response at `--stop-tokens` byte ids besides eos, so
lengths are geometric, mean about 259 / 2 tokens by default, capped at `--new-tokens`), so some
batches take far longer to generate than others. The defaults make the update about as long as
the rollout on a CPU, where overlapping the two should pay most (twice at most: a step takes the
longer of the two instead of their sum); `--ppo-epochs` lengthens the update.

Prints per mode, over the `--steps` steps after `--warmup`: samples (responses) trained per
second and the speed-up against max_staleness 0, the busy fraction of each device (the pool: its
generation seconds, `timing/rollout_busy`; the trainer: its stages and update,
`timing/stages` + `timing/update`; each over the wall time) and the mean and largest staleness of
the trained batches. Figures only: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from partial_rollout import stop_model  # noqa: E402

from rl_core.recipes.rl import RLTrainer  # noqa: E402
from rl_core.spec import resolve_spec  # noqa: E402


def trainer(model: Path, out: Path, staleness: int, args: argparse.Namespace) -> RLTrainer:
    return RLTrainer(resolve_spec({
        "algorithm": "grpo", "seed": 1, "model": {"path": str(model)},
        "data": {"synthetic": {"task": "addition", "digits": 2, "num_train": 512, "num_val": 8},
                 "prompt_template": "plain", "train_batch_size": args.prompts},
        "rollout": {"n_samples_per_prompt": args.n, "max_new_tokens": args.new_tokens},
        "actor": {"use_kl_loss": False, "ppo_mini_batch_size": args.prompts,
                  "ppo_epochs": args.ppo_epochs, "rollout_is": "token"},
        "reference": {"enable": False},
        "reward": {"functions": [{"name": "exact_match"}]},
        "resources": {"devices_per_node": 2},
        "parallel": {"colocate_actor_rollout": False, "rollout_devices": 1},
        "trainer": {"total_steps": args.steps + args.warmup, "output_dir": str(out),
                    "max_staleness": staleness, "logger": []},
    }), backend="ray")


def run(t: RLTrainer, args: argparse.Namespace) -> tuple[float, list[dict[str, float]]]:
    """The counted steps' wall seconds and metrics (the steps are the trainer's own, as `fit`
    runs them, without its logging and checkpoints)."""
    for _ in range(args.warmup):
        t.train_step()
        t.step += 1
    started, metrics = time.perf_counter(), []
    for _ in range(args.steps):
        metrics.append(t.train_step())
        t.step += 1
    return time.perf_counter() - started, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--stop-tokens", type=int, default=2)
    parser.add_argument("--staleness", default="0,1,2")
    parser.add_argument("--ppo-epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = stop_model(Path(tmp) / "model", args.size, args.stop_tokens)
        for k in (int(s) for s in args.staleness.split(",")):
            t = trainer(model, Path(tmp) / f"run-{k}", k, args)
            try:
                results[k] = run(t, args)
            finally:
                t.close()
    report(results, args)


def report(results: dict[int, tuple[float, list[dict[str, float]]]],
           args: argparse.Namespace) -> None:
    rows = args.prompts * args.n
    print(f"size {args.size}, {args.prompts} prompts x {args.n}, up to {args.new_tokens} new "
          f"tokens, {args.stop_tokens} stop tokens, {args.ppo_epochs} ppo epochs, 1 device "
          f"training + 1 generating (Ray, one CPU each), {args.steps} steps (+{args.warmup} "
          "warm-up)")
    print(f"{'staleness':>9} {'samples/s':>10} {'speed-up':>9} {'pool busy':>10} "
          f"{'trainer busy':>13} {'rollout s':>10} {'train s':>8} {'mean stale':>11} "
          f"{'max stale':>10}")
    base = None
    for k, (seconds, metrics) in results.items():
        rate = rows * len(metrics) / seconds
        base = base or rate
        generating = sum(m.get("timing/rollout_busy", 0.0) for m in metrics)
        training = sum(m.get("timing/stages", 0.0) + m.get("timing/update", 0.0) for m in metrics)
        stale = [m.get("async/staleness", 0.0) for m in metrics]
        print(f"{k:>9} {rate:>10.1f} {rate / base:>8.2f}x {generating / seconds:>10.0%} "
              f"{training / seconds:>13.0%} {generating / len(metrics):>10.2f} "
              f"{training / len(metrics):>8.2f} {statistics.mean(stale):>11.2f} "
              f"{max(stale):>10.0f}")


if __name__ == "__main__":
    main()
