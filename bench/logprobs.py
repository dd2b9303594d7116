"""Response log-probs and entropy from a micro-batch's logits: the whole (N, V) in float32 against
the chunked function, memory kept for backward, peak memory and time.

    python bench/logprobs.py [--tokens 2048] [--vocab 32768] [--dtype bfloat16] \
        [--device cpu] [--temperature 0.7] [--repeats 3] [--threads 2] [--chunk-mib 256]

Random logits (1, N, V) (`--tokens`, `--vocab`, `--dtype`) on `--device`, random labels, and a
forward and backward of log softmax(logits / T)[label] (and the entropy) into a random
weighting of the outputs, by two implementations:

- dense: the former `token_logprobs`, `logits.float() / T` then logsumexp, or log_softmax,
  exp and a product for the entropy, on the whole (N, V);
- chunked: `rl_core.algos.chunked_logprobs` (what `token_logprobs` calls), positions a chunk
  at a time (`--chunk-mib` of float32 working buffers, by default the library's budget),
  keeping the logits as they came and a few float32 numbers per position.

Reported per implementation, without and with the entropy: the bytes autograd keeps for backward
(every distinct tensor saved, the logits included where they are saved), the peak memory of the
forward and backward above the inputs (CUDA: `torch.cuda.max_memory_allocated`; CPU: the growth
of the resident set's high-water mark, VmHWM, in a fresh process, one per figure; other devices:
not measured), the median seconds of a forward and backward, and the largest difference from
dense of the log-probs, the entropy and the gradient (over the gradient's largest entry).
Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.algos.entropy import LOGPROB_CHUNK_BYTES, chunked_logprobs  # noqa: E402

MIB = 2**20


def dense(logits, labels, temperature, with_entropy, chunk_bytes):
    """The former token_logprobs: float32 (b, R, V) copies, kept by autograd."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if not with_entropy:
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1), None
    logp = torch.log_softmax(logits, dim=-1)  # (b, R, V)
    picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (b, R)
    return picked, -(logp.exp() * logp).sum(-1)


def chunked(logits, labels, temperature, with_entropy, chunk_bytes):
    return chunked_logprobs(logits, labels, temperature, with_entropy, chunk_bytes)


IMPLEMENTATIONS = {"dense": dense, "chunked": chunked}


def inputs(args):
    g = torch.Generator().manual_seed(0)
    logits = torch.empty(1, args.tokens, args.vocab, dtype=args.dtype)  # no float32 temporary
    logits.normal_(generator=g).mul_(3)
    labels = torch.randint(0, args.vocab, (1, args.tokens), generator=g)
    weights = torch.randn(2, 1, args.tokens, generator=g)
    return [t.to(args.device) for t in (logits, labels, weights)]


def step(fn, logits, labels, weights, args, with_entropy, pack=None):
    """One forward and backward; `pack` sees every tensor saved for backward."""
    x = logits.detach().requires_grad_(True)
    hooks = torch.autograd.graph.saved_tensors_hooks(pack or (lambda t: t), lambda t: t)
    with hooks:
        logp, ent = fn(x, labels, args.temperature, with_entropy, int(args.chunk_mib * MIB))
    loss = (logp * weights[0]).sum() + ((ent * weights[1]).sum() if with_entropy else 0)
    loss.backward()
    return logp.detach(), (ent.detach() if with_entropy else None), x.grad


def saved_bytes(fn, logits, labels, weights, args, with_entropy) -> int:
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    step(fn, logits, labels, weights, args, with_entropy, pack)
    return sum(storages.values())


def sync(device: str) -> None:
    kind = torch.device(device).type
    if kind in ("cuda", "npu"):
        getattr(torch, kind).synchronize()


def seconds(fn, logits, labels, weights, args, with_entropy) -> float:
    times = []
    for _ in range(args.repeats + 1):  # the first is a warmup
        sync(args.device)
        start = time.perf_counter()
        step(fn, logits, labels, weights, args, with_entropy)
        sync(args.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def peak_bytes(name, args, with_entropy) -> int | None:
    """Peak memory of one forward and backward above the inputs."""
    kind = torch.device(args.device).type
    if kind == "cuda":
        logits, labels, weights = inputs(args)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(IMPLEMENTATIONS[name], logits, labels, weights, args, with_entropy)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    if kind != "cpu":
        return None
    command = [sys.executable, __file__, *sys.argv[1:], "--peak-of", name]
    command += ["--entropy"] if with_entropy else []
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])["peak"]


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines()
                if x.startswith(field + ":"))
    return int(line.split()[1])


def child_peak(args) -> None:
    """In a fresh process: the resident high-water mark of one step over the resident set
    before it (Linux: the mark is reset through /proc/self/clear_refs first)."""
    logits, labels, weights = inputs(args)
    fn = IMPLEMENTATIONS[args.peak_of]
    step(fn, logits[:, :1], labels[:, :1], weights[..., :1], args, args.entropy)  # first calls
    Path("/proc/self/clear_refs").write_text("5")
    resident = _status_kib("VmRSS")
    step(fn, logits, labels, weights, args, args.entropy)
    print(json.dumps({"peak": (_status_kib("VmHWM") - resident) * 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk-mib", type=float, default=LOGPROB_CHUNK_BYTES / MIB,
                        help="working memory of a chunk (default: the library's)")
    parser.add_argument("--peak-of", choices=list(IMPLEMENTATIONS), help=argparse.SUPPRESS)
    parser.add_argument("--entropy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    if torch.device(args.device).type == "npu":
        import torch_npu  # noqa: F401  (registers the device)
    if args.peak_of:
        return child_peak(args)

    logits, labels, weights = inputs(args)
    n_v = args.tokens * args.vocab
    print(f"N={args.tokens} V={args.vocab} {str(args.dtype)[6:]} on {args.device}, "
          f"T={args.temperature}; N x V x 4 bytes = {n_v * 4 / MIB:,.0f} MiB; "
          f"chunks of {args.chunk_mib:g} MiB")
    print(f"{'':18} {'saved MiB':>10} {'peak MiB':>9} {'seconds':>8} "
          f"{'max|dlogp|':>10} {'max|dH|':>8} {'max|dgrad|/max|grad|':>20}")
    for with_entropy in (False, True):
        want = step(dense, logits, labels, weights, args, with_entropy)
        for name, fn in IMPLEMENTATIONS.items():
            got = step(fn, logits, labels, weights, args, with_entropy)
            diffs = [(a.float() - b.float()).abs().max().item() if a is not None else 0.0
                     for a, b in zip(got, want)]
            diffs[2] /= want[2].float().abs().max().item()
            saved = saved_bytes(fn, logits, labels, weights, args, with_entropy) / MIB
            peak = peak_bytes(name, args, with_entropy)
            peak_text = f"{peak / MIB:9,.0f}" if peak is not None else f"{'-':>9}"
            label = f"{name}{' +entropy' if with_entropy else ''}"
            print(f"{label:18} {saved:10,.0f} {peak_text} "
                  f"{seconds(fn, logits, labels, weights, args, with_entropy):8.3f} "
                  f"{diffs[0]:10.1e} {diffs[1]:8.1e} {diffs[2]:20.1e}")


if __name__ == "__main__":
    main()
