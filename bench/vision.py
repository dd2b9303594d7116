"""Vision-language rollout and update against text only, at the same sequence length: what the
pictures cost.

    python bench/vision.py [--rows 32] [--pixels 112] [--new-tokens 32] [--repeats 3] [--threads 2]

`tiny:vl` (tiny:small's text model under a two-block vision tower) on `--rows` prompts, each a
`--pixels` square picture (112: 64 patches, 16 image tokens) and a question, against tiny:small on
text prompts of the same token count. Reported for each: the native engine's greedy generation
of `--new-tokens` tokens a row (response tokens/s, the engine's plain steps: a vision-language
model generates through its own forward, so the text model is timed through it too, `fast=False`)
and one update of the rows with their responses (tokens/s over prompt and response tokens;
medians of `--repeats`). The ratio is text / vision: what a picture's vision tower and 3-D
positions add per token. Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.data.batch import PromptIds  # noqa: E402
from rl_core.data.prompts import response_batch  # noqa: E402
from rl_core.engines.train import TrainEngine  # noqa: E402
from rl_core.models.tiny import build_tiny  # noqa: E402
from rl_core.models.vision import build_tiny_vl  # noqa: E402
from rl_core.rollout.native import NativeRolloutEngine  # noqa: E402
from rl_core.rollout.sampling import SamplingParams  # noqa: E402

QUESTION = "How many squares are in the picture?"


def vision_prompts(rows: int, pixels: int) -> tuple[torch.nn.Module, list[PromptIds]]:
    from PIL import Image

    model, prompter = build_tiny_vl("vl", seed=0)
    rng = np.random.default_rng(0)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": QUESTION}]}]
    text = prompter.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
    out = []
    for _ in range(rows):
        picture = Image.fromarray(rng.integers(0, 255, (pixels, pixels, 3), dtype=np.uint8))
        prompt = prompter(text, [picture])
        out.append(PromptIds(prompt.ids, prompt))
    return model, out


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for repeat in range(repeats + 1):
        start = time.perf_counter()
        result = fn()
        if repeat:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure(model: torch.nn.Module, prompts: list, args: argparse.Namespace) -> dict[str, float]:
    engine = NativeRolloutEngine(model, [10**6], 256, fast=False)  # no eos: every row runs
    params = SamplingParams(max_new_tokens=args.new_tokens, do_sample=False)
    seconds, batch = timed(lambda: engine.generate(prompts, params), args.repeats)
    responses = [row[:args.new_tokens] for row in batch["response_ids"].tolist()]
    data = response_batch(prompts, responses, 256).with_sequences()
    width = args.new_tokens
    columns = {**data.to_dict(), "advantages": torch.ones(len(prompts), width)}
    trainer = TrainEngine(model, lr=1e-5, micro_batch_size=args.rows)

    def loss_fn(micro, logprobs, _entropy):
        return -(logprobs * micro["advantages"]).mean(), {}

    update, _ = timed(lambda: trainer.train_step(columns, loss_fn), args.repeats)
    tokens = int(data["attention_mask"].sum())
    return {"prompt_tokens": len(prompts[0]), "rollout_tokens_per_s": len(prompts) * width / seconds,
            "update_tokens_per_s": tokens / update}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--pixels", type=int, default=112, help="side of each square picture")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    vl_model, vl_prompts = vision_prompts(args.rows, args.pixels)
    vision = measure(vl_model, vl_prompts, args)
    text_model, tokenizer = build_tiny("small", seed=0)
    length = vision["prompt_tokens"]
    filler = tokenizer.encode("x" * length, add_special_tokens=False)[:length]
    text = measure(text_model, [list(filler) for _ in range(args.rows)], args)
    print(f"vision-language against text only: {args.rows} rows, {args.pixels}-pixel pictures "
          f"({vision['prompt_tokens']}-token prompts), {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), torch {torch.__version__}")
    print("| model | rollout (response tokens/s) | update (tokens/s) |")
    print("| --- | --- | --- |")
    for name, row in (("tiny:small, text", text), ("tiny:vl, a picture a prompt", vision)):
        print(f"| {name} | {row['rollout_tokens_per_s']:.0f} | {row['update_tokens_per_s']:.0f} |")
    print(f"| text / vision | {text['rollout_tokens_per_s'] / vision['rollout_tokens_per_s']:.2f} "
          f"| {text['update_tokens_per_s'] / vision['update_tokens_per_s']:.2f} |")


if __name__ == "__main__":
    main()
