"""rl_core's device paths on whatever accelerator this host has, checked and timed in one table.

    python bench/device_check.py            # on a GPU or NPU host: a few minutes
    python bench/device_check.py --smoke    # every line on the CPU at a tiny size (CI runs it)
    python bench/device_check.py --only collectives,packing --json out.json

It imports nothing beyond torch, transformers, safetensors, tokenizers, pydantic, math-verify and
numpy (with rl_core itself; the vision line pillow too, skipped without it), what a bare
accelerator host has or what travels as wheels (docs/operations.md says how). The lines, each `ok`, `FAIL` (with the error) or `skip` (with why):

- collectives: counts and sums reduced through rl_core.collectives on the device's backend (nccl,
  hccl; gloo on CPU), one rank: integers come back exact, on the device they were made for.
- fsdp2 step: one FSDP2 AdamW step of the model on one rank of that backend.
- packed = padded: the same micro-batches' log-probs packed (remove padding, one variable-length
  kernel call per layer where the device has one) and padded agree; each update's time, and
  padded/packed (the aim on an H200: at least 1.5).
- bf16 masters: a bfloat16 engine's float32 master weights keep an update below bfloat16's
  resolution that pure bfloat16 loses.
- logprobs: response log-probs and entropy of 16,384 positions of bfloat16 logits over a 151,936
  vocabulary, forward and backward: the chunked function the engines use against the whole
  float32 log-softmax; values alike, the chunked peak memory below the dense one.
- update MFU: 6 x parameters x real tokens over the packed update's time, against the matmul
  peak measured here (a large bf16 matmul).
- rollout: the native engine's response tokens/s with its decode step replayed from device
  graphs (the default where the device has them) and with plain steps, against the floor set
  by the memory bandwidth measured here (every decode step reads the weights and the KV cache
  once); both must generate the same number of tokens (the same draws).
- moe: a mixture of experts: the experts' grouped matmul (one kernel call for all experts where
  the device has it) against one matmul per expert, and an update of tiny:moe (smoke:
  tiny:moe-nano) with the routers' load-balancing loss; its time.
- vision: a vision-language model (tiny:vl, Qwen2.5-VL's layout): 8 prompts with pictures of
  three sizes, their log-probs packed and padded agree; each update's time.
- megatron: the Megatron-Core engine (`actor.strategy: megatron`, one rank, no parallelism)
  against the FSDP2 engine on the same model (the nano preset; on a device Qwen2.5-0.5B's
  shape), bfloat16: response log-probs, the loss and the gradient norm of one update agree
  within bfloat16's tolerance; each update's time. Skipped without the megatron extra
  (megatron-core and mbridge, which travel as wheels). On the CPU (smoke) only the weights'
  conversion runs, Hugging Face -> Megatron-Core -> Hugging Face, every tensor equal: the
  model's forward needs an accelerator.
- demo: the demo recipe (the tiny:small-addition warm start, then GRPO on two-digit addition,
  float32; 60 steps, 2 with --smoke): the warm start's SFT accuracy and GRPO's last validation
  accuracy (the CPU reaches about 47 % and 80 %).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core import device as devices  # noqa: E402
from rl_core.collectives import all_reduce, reduce_numbers  # noqa: E402

# Qwen2.5-0.5B's layout on rl_core's byte vocabulary (358M parameters); smoke: the nano preset.
FULL_SHAPE = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864,
              "max_position_embeddings": 2048}
LINES = ("collectives", "fsdp2", "packing", "masters", "logprobs", "mfu", "rollout", "moe",
         "vision", "megatron", "demo")


class Check:
    """The machine under test and the sizes of one run of the table."""

    def __init__(self, smoke: bool, work: Path) -> None:
        self.smoke, self.work = smoke, work
        self.kind = devices.CPU if smoke else devices.detect()
        self.device = devices.torch_device(self.kind, 0)
        self.dtype = torch.float32 if self.kind.name == "cpu" else torch.bfloat16
        self.shape = {} if smoke else FULL_SHAPE
        # rows x (prompt + response): 32 prompts x 8 samples, <= 256 new tokens (smoke: 8 x 16)
        self.rows, self.prompt, self.response = (8, 8, 16) if smoke else (256, 32, 256)
        self.results: dict[str, dict] = {}

    def model(self, seed: int = 0):
        from rl_core.models.tiny import build_tiny

        model, tokenizer = build_tiny("nano" if self.smoke else "small", seed=seed, **self.shape)
        return model, tokenizer

    def sync(self) -> None:
        devices.synchronize(self.device)


def _group(check: Check) -> None:
    """A one-rank process group of the device's backend (once)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.FileStore(str(check.work / "rendezvous"), 1)
        dist.init_process_group(check.kind.backend, store=store, rank=0, world_size=1)


def line_collectives(check: Check) -> dict:
    import torch.distributed as dist

    _group(check)
    counts = reduce_numbers([7, 2**40 + 1], op=dist.ReduceOp.MAX, device=check.device)
    values = torch.tensor([0.5, 1.5], dtype=torch.float64)  # on the host, in float64
    summed = all_reduce(values)
    ok = counts == [7, 2**40 + 1] and summed.tolist() == [0.5, 1.5]
    ok = ok and summed.device.type == "cpu" and summed.dtype == torch.float64
    return {"ok": ok, "backend": dist.get_backend(), "counts": counts}


def _batch(check: Check, seed: int = 0) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses with a long tail of response lengths (about
    half the longest on average, as random weights generate)."""
    g = torch.Generator().manual_seed(seed)
    p, r, n = check.prompt, check.response, check.rows
    prompt_lens = torch.randint(p // 2, p + 1, (n,), generator=g)
    response_lens = (torch.rand(n, generator=g) ** 1.5 * r).long().clamp(min=1)
    ids = torch.randint(0, 256, (n, p + r), generator=g)
    mask = torch.zeros(n, p + r, dtype=torch.long)
    for row, (a, b) in enumerate(zip(prompt_lens.tolist(), response_lens.tolist())):
        mask[row, p - a:p + b] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "response_mask": mask[:, p:],
            "old_logprobs": torch.zeros(n, r), "advantages": torch.randn(n, generator=g)[:, None]
            .expand(n, r).contiguous()}


def _loss(micro, logprobs, _entropy):
    from rl_core.algos import get_policy_loss

    return get_policy_loss("vanilla")(micro["old_logprobs"], logprobs, micro["advantages"],
                                      micro["response_mask"])


def _engine(check: Check, model, packed: bool, **options):
    from rl_core.engines.train import TrainEngine

    budget = {"max_token_len": 16384 if not check.smoke else 64} if packed else {
        "micro_batch_size": 32 if not check.smoke else 4}
    dtype = "bfloat16" if check.dtype == torch.bfloat16 else "float32"
    return TrainEngine(model, lr=1e-6, param_dtype=dtype, device=check.device,
                       remove_padding=packed, **budget, **options)


def _timed(check: Check, run: Callable[[], object], repeats: int = 2) -> float:
    """The best of `repeats` timed calls, after one untimed warm-up call."""
    run()
    best = float("inf")
    for _ in range(repeats):
        check.sync()
        start = time.perf_counter()
        run()
        check.sync()
        best = min(best, time.perf_counter() - start)
    return best


def line_fsdp2(check: Check) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine

    _group(check)
    model, _ = check.model()
    mesh = init_device_mesh(check.device.type, (1,))
    dtype = "bfloat16" if check.dtype == torch.bfloat16 else "float32"
    engine = FSDP2Engine(model, mesh=mesh, lr=1e-6, param_dtype=dtype, micro_batch_size=8)
    batch = _batch(check)
    seconds = _timed(check, lambda: engine.train_step(batch, _loss), repeats=1)
    return {"ok": engine.step == 2, "step_s": round(seconds, 3)}


def line_packing(check: Check) -> dict:
    from rl_core.engines.packing import installed_kernels, kernel_name

    model, _ = check.model()
    padded = _engine(check, copy.deepcopy(model), packed=False)
    packed = _engine(check, model, packed=True)
    batch = _batch(check)
    columns = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], check.response)
    want, _ = padded.forward_logprobs(*columns)
    got, _ = packed.forward_logprobs(*columns)
    mask = batch["response_mask"].bool()
    diff = (want[mask] - got[mask]).abs().max().item()
    tolerance = 1e-4 if check.dtype == torch.float32 else 5e-2
    padded_s = _timed(check, lambda: padded.train_step(batch, _loss))
    packed_s = _timed(check, lambda: packed.train_step(batch, _loss))
    check.results["_update"] = {"packed_s": packed_s, "tokens": int(batch["attention_mask"].sum()),
                                "parameters": sum(p.numel() for p in model.parameters())}
    return {"ok": diff <= tolerance, "max_logprob_diff": round(diff, 6),
            "kernel": kernel_name(check.device.type, check.dtype, installed_kernels()),
            "padded_s": round(padded_s, 3), "packed_s": round(packed_s, 3),
            "padded/packed": round(padded_s / packed_s, 2)}


def line_masters(check: Check) -> dict:
    from rl_core.engines.train import TrainEngine

    if check.kind.name == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return {"skip": "this CPU has no bfloat16 in oneDNN"}
    model, _ = check.model(seed=1)
    batch = _batch(check, seed=1)
    moved = {}
    for masters in (True, False):
        engine = TrainEngine(copy.deepcopy(model), lr=1e-6, param_dtype="bfloat16", grad_clip=0,
                             device=check.device, micro_batch_size=8, master_weights=masters)
        before = [p.detach().float().clone() for p in (engine.masters or engine.params)]
        engine.train_step(batch, _loss)
        after = engine.masters or engine.params
        moved[masters] = sum(int((a.float() != b).sum()) for a, b in zip(after, before))
    ok = moved[True] > 0 and moved[False] < 0.1 * moved[True]
    return {"ok": ok, "entries_moved_with_masters": moved[True], "without": moved[False]}


def line_logprobs(check: Check) -> dict:
    """Response log-probs and entropy of bfloat16 logits on the device, forward and backward:
    the chunked function the engines use against the whole float32 log-softmax it replaced."""
    from rl_core.engines.train import token_logprobs

    tokens, vocab = (512, 4096) if check.smoke else (16384, 151936)  # Qwen's vocabulary
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, tokens, vocab, generator=g).to(check.device, check.dtype)
    labels = torch.randint(0, vocab, (1, tokens), generator=g).to(check.device)
    results = {}

    def dense(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = x.float().log_softmax(-1)
        return logp.gather(-1, labels[..., None])[..., 0], -(logp.exp() * logp).sum(-1)

    def chunked(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs, entropy = token_logprobs(x, labels, with_entropy=True)
        assert entropy is not None
        return logprobs, entropy

    for name, run in (("dense", dense), ("chunked", chunked)):
        x = logits.detach().requires_grad_()
        check.sync()
        devices.reset_peak(check.device)
        base = devices.memory_stats(check.device).get("allocated_bytes", 0.0)
        start = time.perf_counter()
        logprobs, entropy = run(x)
        (logprobs.sum() + entropy.sum()).backward()
        check.sync()
        seconds = time.perf_counter() - start
        peak = devices.memory_stats(check.device)["peak_bytes"] - base
        results[name] = (logprobs.detach().float(), entropy.detach().float(), peak, seconds)
    (lp_d, ent_d, peak_d, s_d), (lp_c, ent_c, peak_c, s_c) = results["dense"], results["chunked"]
    same = bool(torch.allclose(lp_c, lp_d, atol=1e-3) and torch.allclose(ent_c, ent_d, atol=1e-2))
    accelerator = check.kind.name != "cpu"  # a CPU's peak is the process's resident set
    out = {"ok": same and (peak_c < peak_d or not accelerator),
           "max_logprob_diff": float((lp_c - lp_d).abs().max()),
           "seconds": round(s_c, 3), "dense_seconds": round(s_d, 3)}
    if accelerator:
        out.update(peak_gb=round(peak_c / 2**30, 2), dense_peak_gb=round(peak_d / 2**30, 2))
    return out


def _matmul_peak(check: Check) -> float:
    """FLOP/s of a large matmul in the compute dtype (the chip's practical peak)."""
    n = 512 if check.smoke else 8192
    a = torch.randn(n, n, device=check.device, dtype=check.dtype)
    b = torch.randn(n, n, device=check.device, dtype=check.dtype)
    seconds = _timed(check, lambda: a @ b, repeats=5)
    return 2 * n**3 / seconds


def line_mfu(check: Check) -> dict:
    update = check.results.get("_update")
    if update is None:
        return {"skip": "needs the packing line"}
    flops = 6 * update["parameters"] * update["tokens"]
    peak = _matmul_peak(check)
    mfu = flops / update["packed_s"] / peak
    return {"ok": True, "mfu": f"{mfu:.1%}", "tflops": round(flops / update["packed_s"] / 1e12, 1),
            "peak_tflops": round(peak / 1e12, 1)}


def _bandwidth(check: Check) -> float:
    """Bytes/s of a large device-to-device copy (read plus write)."""
    n = (8 if check.smoke else 1024) << 20
    src = torch.empty(n, dtype=torch.uint8, device=check.device)
    dst = torch.empty_like(src)
    seconds = _timed(check, lambda: dst.copy_(src), repeats=5)
    return 2 * n / seconds


def line_rollout(check: Check) -> dict:
    from rl_core.rollout.native import NativeRolloutEngine
    from rl_core.rollout.sampling import SamplingParams

    from rl_core.rollout.decoder import EagerGraphs

    model, tokenizer = check.model()
    model = model.to(check.device, check.dtype)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (check.prompt,), generator=g).tolist()
               for _ in range(check.rows)]
    new = check.response
    params = SamplingParams(max_new_tokens=new, temperature=1.0)
    tokens, seconds = {}, {}
    # the engine's default (device graphs where the device has them; on the CPU the same
    # bucketed steps without graphs), and plain steps, one kernel launch at a time
    for name, graphs in (("graphs", None), ("eager", False)):
        engine = NativeRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id,
                                     check.device, graphs=graphs)
        if name == "graphs" and engine.graphs is None:
            engine.graphs = EagerGraphs()

        def run(engine: NativeRolloutEngine = engine, name: str = name) -> None:
            batch = engine.generate(prompts, params, torch.Generator().manual_seed(1))
            tokens[name] = int(batch.response_mask.sum())

        seconds[name] = _timed(check, run, repeats=1)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * \
        torch.finfo(check.dtype).bits // 8
    # each step reads the weights once and the cache of every row so far (half full on average)
    step_bytes = weights + check.rows * (check.prompt + new / 2) * kv_per_token
    floor_s = new * step_bytes / _bandwidth(check)
    return {"ok": tokens["graphs"] == tokens["eager"] > 0,
            "tokens_per_s": round(tokens["graphs"] / seconds["graphs"]),
            "eager_tokens_per_s": round(tokens["eager"] / seconds["eager"]),
            "floor_tokens_per_s": round(tokens["graphs"] / floor_s),
            "seconds": round(seconds["graphs"], 3), "eager_seconds": round(seconds["eager"], 3)}


def line_demo(check: Check) -> dict:
    import yaml

    from rl_core.cli import main as cli

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
    from experiments.starter import starter_spec  # the demo's spec: plain Python, no Django

    spec = starter_spec("grpo")
    out = check.work / "demo"
    spec["resources"] = {"device_type": check.kind.name, "devices_per_node": 1}
    spec["rollout"]["engine"] = "native"  # as on the CPU it is compared with, vLLM or not here
    spec["trainer"].update(output_dir=str(out), logger=["console"],
                           total_steps=2 if check.smoke else 60, eval_every=2 if check.smoke else 10)
    path = check.work / "demo.yaml"
    path.write_text(yaml.safe_dump(spec))
    if cli(["train", str(path), "--backend", "local"]) != 0:
        return {"ok": False, "error": "the demo run failed (its log is above)"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    accuracy = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
    return {"ok": bool(accuracy), "val_accuracy": [round(a, 3) for a in accuracy]}


def line_moe(check: Check) -> dict:
    from rl_core.engines.experts import grouped_linear
    from rl_core.models.tiny import build_tiny

    experts, rows, width = (8, 64, 32) if check.smoke else (128, 16384, 2048)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=g).to(check.device, check.dtype)
    w = (torch.randn(experts, width // 2, width, generator=g) / width ** 0.5).to(
        check.device, check.dtype)
    cuts = torch.sort(torch.randint(0, rows + 1, (experts - 1,), generator=g)).values
    offsets = torch.cat([cuts, torch.tensor([rows])]).to(torch.int32)
    starts = [0, *offsets.tolist()]
    want = torch.cat([x[a:b] @ w[e].T for e, (a, b) in enumerate(zip(starts, starts[1:]))])
    got = grouped_linear(x, w, offsets.to(check.device))
    diff = ((got - want).abs().max() / want.abs().max()).item()
    grouped_s = _timed(check, lambda: grouped_linear(x, w, offsets.to(check.device)))
    model, _ = build_tiny("moe-nano" if check.smoke else "moe", seed=0)
    engine = _engine(check, model, packed=False, router_aux_loss_coef=0.001)
    batch = _batch(check)
    metrics = engine.train_step(batch, _loss)
    step_s = _timed(check, lambda: engine.train_step(batch, _loss), repeats=1)
    tolerance = 1e-4 if check.dtype == torch.float32 else 2e-2
    return {"ok": diff <= tolerance and metrics["actor/moe/aux_loss"] > 0,
            "grouped_rel_diff": round(diff, 6), "grouped_s": round(grouped_s, 4),
            "aux_loss": round(metrics["actor/moe/aux_loss"], 4), "step_s": round(step_s, 3)}


def line_megatron(check: Check) -> dict:
    from rl_core.engines.mcore import (MegatronLayout, build_model, hf_state_dict,
                                       init_parallel, make_bridge, megatron_missing)
    from rl_core.models.tiny import write_tiny

    missing = megatron_missing()
    if missing:
        return {"skip": f"{missing} is not installed (the megatron extra)"}
    _group(check)
    init_parallel(MegatronLayout())
    model, tokenizer = check.model()
    folder = str(write_tiny(model, tokenizer, check.work / "megatron-model", overwrite=True))
    if check.kind.name == "cpu":  # the conversion only: Megatron-Core computes on a device
        bridge = make_bridge(folder, "float32")
        exported = hf_state_dict(bridge, build_model(bridge, folder, train=False))
        original = {k: v for k, v in model.state_dict().items() if k in exported}
        same = len(original) == len(exported) and all(
            torch.equal(exported[k], original[k]) for k in exported)
        return {"ok": same, "tensors": len(exported), "forward": "needs an accelerator"}
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.engines.fsdp import FSDP2Engine
    from rl_core.engines.megatron import MegatronEngine

    options = {"lr": 1e-6, "micro_batch_size": 32, "grad_clip": 0.0}
    fsdp = FSDP2Engine(copy.deepcopy(model), mesh=init_device_mesh(check.device.type, (1,)),
                       param_dtype="bfloat16", **options)
    mega = MegatronEngine(folder, layout=MegatronLayout(), param_dtype="bfloat16", **options)
    batch = _batch(check)
    columns = (batch["input_ids"], batch["attention_mask"], batch["position_ids"],
               check.response)
    want, _ = fsdp.forward_logprobs(*columns)
    got, _ = mega.forward_logprobs(*columns)
    mask = batch["response_mask"].bool().to(got.device)
    logprob_diff = (got.float() - want.float().to(got.device))[mask].abs().max().item()
    a, b = fsdp.train_step(batch, _loss), mega.train_step(batch, _loss)
    loss_diff = abs(a["actor/loss"] - b["actor/loss"]) / max(abs(a["actor/loss"]), 1e-6)
    norm_diff = abs(a["actor/grad_norm"] - b["actor/grad_norm"]) / max(a["actor/grad_norm"],
                                                                       1e-12)
    megatron_s = _timed(check, lambda: mega.train_step(batch, _loss), repeats=1)
    fsdp2_s = _timed(check, lambda: fsdp.train_step(batch, _loss), repeats=1)
    return {"ok": logprob_diff <= 0.1 and loss_diff <= 2e-2 and norm_diff <= 5e-2,
            "logprob_max_diff": round(logprob_diff, 4), "loss_rel_diff": round(loss_diff, 5),
            "grad_norm_rel_diff": round(norm_diff, 5), "megatron_step_s": round(megatron_s, 3),
            "fsdp2_step_s": round(fsdp2_s, 3)}


def _picture_batch(prompter, pictures: int) -> dict[str, torch.Tensor]:
    """`pictures` chat prompts, each with one random picture of one of three sizes, and random
    responses of 4-12 tokens, as a rollout batch's columns."""
    import numpy as np
    from PIL import Image

    from rl_core.data.batch import PromptIds
    from rl_core.data.prompts import response_batch

    rng = np.random.default_rng(0)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "How many squares?"}]}]
    text = prompter.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
    prompts, responses = [], []
    for row in range(pictures):
        width, height = [(56, 56), (112, 56), (56, 84)][row % 3]
        picture = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        prompt = prompter(text, [picture])
        prompts.append(PromptIds(prompt.ids, prompt))
        responses.append(rng.integers(0, 256, int(rng.integers(4, 13))).tolist())
    data = response_batch(prompts, responses, prompter.tokenizer.pad_token_id).with_sequences()
    batch = data.to_dict()
    width = batch["response_mask"].shape[1]
    batch["old_logprobs"] = torch.zeros(pictures, width)
    batch["advantages"] = torch.randn(pictures, 1).expand(pictures, width).contiguous()
    return batch


def line_vision(check: Check) -> dict:
    import importlib.util

    if importlib.util.find_spec("PIL") is None:
        return {"skip": "pillow is not installed (the image processor needs it)"}
    from rl_core.models.vision import build_tiny_vl

    model, prompter = build_tiny_vl("vl", seed=0)
    batch = _picture_batch(prompter, 8)
    padded = _engine(check, copy.deepcopy(model), packed=False)
    packed = _engine(check, model, packed=True)
    columns = (batch["input_ids"], batch["attention_mask"], batch["position_ids"],
               batch["response_mask"].shape[1])
    images = (batch["pixel_values"], batch["image_grid_thw"])
    want, _ = padded.forward_logprobs(*columns, images=images)
    got, _ = packed.forward_logprobs(*columns, images=images)
    mask = batch["response_mask"].bool()
    diff = (want[mask] - got[mask]).abs().max().item()
    tolerance = 1e-4 if check.dtype == torch.float32 else 5e-2
    padded_s = _timed(check, lambda: padded.train_step(batch, _loss), repeats=1)
    packed_s = _timed(check, lambda: packed.train_step(batch, _loss), repeats=1)
    return {"ok": diff <= tolerance, "max_logprob_diff": round(diff, 6),
            "padded_s": round(padded_s, 3), "packed_s": round(packed_s, 3)}


CHECKS: dict[str, Callable[[Check], dict]] = {
    "collectives": line_collectives, "fsdp2": line_fsdp2, "packing": line_packing,
    "masters": line_masters, "logprobs": line_logprobs, "mfu": line_mfu,
    "rollout": line_rollout, "moe": line_moe, "vision": line_vision,
    "megatron": line_megatron, "demo": line_demo,
}


def run_line(check: Check, name: str) -> dict:
    start = time.perf_counter()
    try:
        result = CHECKS[name](check)
    except Exception as exc:  # noqa: BLE001 - one failing line must not hide the others
        traceback.print_exc()
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    result["seconds"] = result.get("seconds", round(time.perf_counter() - start, 1))
    return result


def status(result: dict) -> str:
    return "skip" if "skip" in result else "ok" if result.get("ok") else "FAIL"


def table(check: Check, results: dict[str, dict]) -> str:
    head = (f"device check: {check.kind.name} ({check.device}, {check.dtype}), torch "
            f"{torch.__version__}{', smoke' if check.smoke else ''}")
    lines = [head, "", "| line | status | figures |", "| --- | --- | --- |"]
    for name, result in results.items():
        figures = ", ".join(f"{k} {v}" for k, v in result.items() if k not in ("ok",))
        lines.append(f"| {name} | {status(result)} | {figures} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every line on the CPU, tiny sizes")
    parser.add_argument("--only", default=",".join(LINES), help=f"lines to run ({','.join(LINES)})")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in only if name not in CHECKS]
    if unknown:
        parser.error(f"unknown lines {unknown}; choose from {', '.join(LINES)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="device-check-") as work:
        check = Check(args.smoke, Path(work))
        results = {}
        for name in only:
            results[name] = run_line(check, name)
            print(f"{name}: {status(results[name])} {results[name]}", flush=True)
    print(table(check, results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(status(r) != "FAIL" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
