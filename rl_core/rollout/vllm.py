"""vLLM rollout: an in-process `vllm.LLM` on each actor rank, colocated with training.

    engine = VLLMRolloutEngine(folder, eos_token_ids=[258], pad_token_id=256, device="cpu",
                               dtype=torch.float32, max_model_len=256)
    engine.load_weights(train_engine.weight_buckets(), version=0)   # before the first generate
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=128, n=4), seeds=[11, 12])
    engine.sleep(); ...training...; engine.wake_up()
    engine.load_weights(train_engine.weight_buckets(), version=1)

The same adapter serves vLLM on CUDA, vllm-ascend on Ascend (a plugin of the same API) and
vLLM's CPU build (`vllm-cpu`), on which the tests run.

- Weights: the engine starts from the model folder's config with dummy weights and takes the
  training engine's weights before its first rollout, through the path every later sync uses
  (`load_weights`), so a missing sync can never pass unnoticed. A sync streams the buckets into
  vLLM's in-place reload (`reload_weights`, which re-runs each layer's weight processing), then
  re-packs the CPU kernels that kept a private copy of a weight (the tied `lm_head`), and resets
  the prefix cache. Each sync carries the policy version it holds (`weight_version`); the actor
  refuses to roll out from weights of another version.
- Sampling: temperature, top-p, top-k, min-p, max new tokens, stop at any eos id, n samples per
  prompt, one seed per prompt (the caller derives them from the step seed, so a run is
  reproducible); `generate` returns the batch container exactly as the native engine does.
- Log-probs: those of the distribution each token was sampled from (vLLM's
  `processed_logprobs`: after temperature and top-k / top-p / min-p); with the filters off (the
  defaults) that is what the training engine computes, up to kernel rounding. The actor
  recomputes old log-probs with the training engine and can correct the rest (`actor.rollout_is`).
- Tensor parallelism (`rollout.tensor_parallel_size` t > 1): every block of t consecutive ranks
  of the actor's process group is one vLLM tensor-parallel group (vLLM's external-launcher
  mode: one engine per rank, joined to the process group that already exists); the ranks of a
  block are given the same prompts and seeds and return the same batch. Each rank's vLLM
  takes whole tensors bucket by bucket from any training layout and keeps its part (its heads,
  its share of the MLP width and of the vocabulary).
- Memory: on an accelerator vLLM takes `rollout.gpu_memory_utilization` of the device for its
  weights and KV cache, and `sleep` (level 1: weights to host, KV cache dropped) gives it back to
  training; on the CPU the KV cache is sized for `max_num_seqs` sequences of `max_model_len`
  tokens, and sleeping frees nothing (vLLM's CPU backend does not sleep).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from rl_core.data.batch import Batch, left_pad
from rl_core.engines.base import WeightBucket
from rl_core.errors import InputError, StaleWeightsError
from rl_core.memory_plan import VLLM_CPU_MAX_SEQS as CPU_MAX_SEQS
from rl_core.memory_plan import vllm_cpu_kv_tokens, vllm_max_model_len
from rl_core.rollout import vllm_available

# The engine runs in the calling process: weights stream into it without a copy per sync, and
# `apply_model` reaches the model object.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

INSTALL_HINT = ("install the vLLM extra of this platform: `pip install 'ascent[vllm]'` on CUDA, "
                "the Ascend image's vllm-ascend (deploy/ascend.Dockerfile) on Ascend, "
                "`make vllm-cpu` on a CPU machine")


def import_vllm() -> Any:
    """The vllm module, or an InputError naming the extra to install."""
    try:
        import vllm
    except ImportError as exc:
        raise InputError(f"rollout.engine: vllm needs vLLM, which is not importable here "
                         f"({exc}); {INSTALL_HINT}, or set rollout.engine: native") from None
    return vllm


class VLLMRolloutEngine:
    """Generates with vLLM from the weights the training engine last synced into it."""

    shares_weights = False  # the actor must sync after every update

    def __init__(
        self,
        model_path: str,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        max_model_len: int,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        max_num_seqs: int = CPU_MAX_SEQS,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: responses could only stop at max_new_tokens")
        vllm = import_vllm()
        self.device = torch.device(device)
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.max_model_len = int(max_model_len)
        self.weight_version: int | None = None  # dummy weights until the first sync
        self.asleep = False
        options: dict[str, Any] = {
            "model": str(model_path), "dtype": dtype, "max_model_len": self.max_model_len,
            "seed": seed, "load_format": "dummy", "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs", "max_num_seqs": max_num_seqs,
            "trust_remote_code": trust_remote_code, "enforce_eager": self.device.type == "cpu",
            "disable_log_stats": True,
        }
        if tensor_parallel_size > 1:
            options.update(join_tensor_parallel(model_path, tensor_parallel_size, self.device))
        if self.device.type == "cpu":
            options["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
                model_path, self.max_model_len, max_num_seqs, dtype, tensor_parallel_size)
            # whole prompts per step: vLLM's CPU build fails on a seeded request whose prefill
            # is split over steps (it rewinds the request's generator, which a CPU generator
            # cannot), as the long prompts of multi-turn and partial calls would be
            options.update(enable_chunked_prefill=False,
                           max_num_batched_tokens=max(self.max_model_len, 8192))
        else:
            options.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
        # vLLM's CPU worker sets this process's torch threads to 1 and disables
        # `torch.set_num_threads`: training shares the process, so both are restored
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            self.llm = vllm.LLM(**options)
        except (ValueError, NotImplementedError) as exc:
            raise InputError(f"rollout.engine: vllm cannot serve {model_path}: "
                             f"{_reason(exc)}; use rollout.engine: native") from exc
        finally:
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)
        self._params_class = vllm.SamplingParams

    @classmethod
    def from_spec(cls, model: torch.nn.Module, tokenizer: Any, spec: Any,
                  device: str | torch.device = "cpu", *, model_path: str) -> VLLMRolloutEngine:
        """The engine of the spec's `rollout` section for the model of `model_path` (its config;
        the weights come from the training engine)."""
        from rl_core.rollout.native import eos_ids
        from rl_core.models.loading import resolve_model_path

        dtype = next(model.parameters()).dtype
        return cls(str(resolve_model_path(model_path)), eos_token_ids=eos_ids(tokenizer, model),
                   pad_token_id=tokenizer.pad_token_id, device=device, dtype=dtype,
                   max_model_len=vllm_max_model_len(spec), seed=spec.seed,
                   gpu_memory_utilization=spec.rollout.gpu_memory_utilization,
                   trust_remote_code=spec.model.trust_remote_code,
                   tensor_parallel_size=spec.rollout.tensor_parallel_size)

    # ----------------------------------------------------------------------- weights

    def load_weights(self, buckets: Iterable[WeightBucket], version: int | None = None) -> None:
        """The training engine's weights, streamed bucket by bucket into the model in place
        (every rank must iterate alike: a sharded engine gathers each tensor as it is reached);
        then the weights are version `version`."""
        if self.asleep:
            self.wake_up()
        names = set()

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for bucket in buckets:
                for name, tensor in bucket:
                    names.add(name)
                    yield from checkpoint_names(name, tensor.detach())

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})
        if not names:
            raise ValueError("load_weights got no weights")
        if self.device.type == "cpu":
            self.llm.apply_model(_repack_cpu_kernels)
            if any(name.endswith(FUSED_EXPERTS) for name in names):
                self.llm.apply_model(_repack_cpu_experts)
        self.llm.reset_prefix_cache()
        self.weight_version = version

    def check_version(self, version: int) -> None:
        """Raise StaleWeightsError unless the engine holds policy version `version`."""
        if self.weight_version != version:
            held = "no synced weights" if self.weight_version is None else \
                f"weights of policy version {self.weight_version}"
            raise StaleWeightsError(
                f"the vLLM rollout holds {held}, the policy is at version {version}: a weight "
                "sync was skipped, so this rollout would sample from a stale policy")

    # ----------------------------------------------------------------------- memory

    def sleep(self) -> None:
        """Give the device back to training: weights to host memory, KV cache dropped (a
        no-op on the CPU, where vLLM does not sleep)."""
        if self.device.type != "cpu" and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def free_cache(self) -> None:
        """Before a training update on the same devices: the same as `sleep`."""
        self.sleep()

    def close(self) -> None:
        """Shut the engine down: its memory and its process groups (vLLM destroys this
        process's default group with its own, so the actor closes it before any role leaves
        the group)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            segment = _cpu_shm_segment() if self.device.type == "cpu" else None
            llm.llm_engine.engine_core.shutdown()
            if segment is not None:
                segment.unlink(missing_ok=True)

    # ----------------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[Sequence[int]], params: Any,
                 generator: torch.Generator | None = None, *,
                 uniforms: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> Batch:
        """`params.n` responses to each prompt, a prompt's rows adjacent. Prompt i samples with
        `seeds[i]` (drawn from `generator` when not given); `uniforms` is the native engine's
        draw table, which vLLM cannot use."""
        if uniforms is not None:
            raise ValueError("the vLLM engine samples from per-prompt seeds, not a draw table")
        if self.weight_version is None:
            raise StaleWeightsError("the vLLM rollout has no weights yet: load_weights first")
        if self.asleep:
            self.wake_up()
        # Each prompt's new tokens stop at max_model_len: a multi-turn or partial call's rows
        # (a prompt and the tokens so far) each need only the room their response has left,
        # which fits (prompt + max_new_tokens <= max_model_len is a spec rule).
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise InputError(f"rollout.max_model_len: {self.max_model_len} tokens is shorter than "
                             f"a prompt of {longest} tokens plus max_new_tokens "
                             f"{params.max_new_tokens}")
        if seeds is None:
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=generator).tolist()
        requests = [{"prompt_token_ids": list(map(int, p))} for p in prompts]
        sampling = [self._sampling(params, int(seed),
                                   min(params.max_new_tokens, self.max_model_len - len(p)))
                    for seed, p in zip(seeds, prompts)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return self._batch(prompts, outputs, params.n)

    def _sampling(self, params: Any, seed: int, max_tokens: int) -> Any:
        greedy = not params.do_sample
        return self._params_class(
            n=params.n, max_tokens=max_tokens, seed=None if greedy else seed,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p, top_k=0 if greedy else params.top_k,
            min_p=0.0 if greedy else params.min_p, stop_token_ids=self.eos_token_ids,
            logprobs=0, detokenize=False, skip_special_tokens=False)

    def _batch(self, prompts: Sequence[Sequence[int]], outputs: list[Any], n: int) -> Batch:
        ids, mask = left_pad(prompts, self.pad_token_id)
        samples = [sample for request in outputs for sample in request.outputs]
        if len(samples) != len(prompts) * n:
            raise RuntimeError(f"vLLM returned {len(samples)} samples for {len(prompts)} prompts "
                               f"x n={n}")
        lengths = torch.tensor([len(s.token_ids) for s in samples], dtype=torch.long)
        width = max(int(lengths.max()), 1)
        tokens = torch.full((len(samples), width), self.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros((len(samples), width), dtype=torch.float32)
        for row, sample in enumerate(samples):
            count = len(sample.token_ids)
            tokens[row, :count] = torch.tensor(sample.token_ids, dtype=torch.long)
            logprobs[row, :count] = torch.tensor(
                [step[token].logprob for step, token in zip(sample.logprobs, sample.token_ids)],
                dtype=torch.float32)
        alive = torch.arange(width)[None, :] < lengths[:, None]
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        finished = torch.isin(last, torch.tensor(self.eos_token_ids)) & (lengths > 0)
        return Batch({
            "prompt_ids": ids.repeat_interleave(n, 0),
            "prompt_mask": mask.repeat_interleave(n, 0),
            "response_ids": tokens,
            "response_mask": alive.long(),
            "logprobs": logprobs,
            "prompt_index": torch.arange(len(prompts)).repeat_interleave(n),
            "response_lengths": lengths,
            "finished": finished,
        })


def join_tensor_parallel(model_path: str, size: int, device: torch.device) -> dict[str, Any]:
    """vLLM's options for a tensor-parallel group of `size` ranks formed from the process
    group this rank is already in (consecutive ranks, as vLLM's external launcher cuts the
    world); an InputError naming `rollout.tensor_parallel_size` when the world or the model's
    attention heads cannot be split so."""
    import torch.distributed as dist

    field = "rollout.tensor_parallel_size"
    heads = _text_config(model_path)["num_attention_heads"]
    if heads % size:
        raise InputError(f"{field}: {size} does not divide {model_path}'s {heads} attention heads "
                         f"(each rank of a vLLM group serves an equal share): pick a divisor of "
                         f"{heads}")
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % size:
        raise InputError(f"{field}: {size} does not divide the actor's {world} ranks: vLLM's "
                         f"groups are blocks of consecutive ranks; pick a divisor of {world}")
    # the external launcher reads this rank's place from the environment, as torchrun sets it;
    # vLLM's world is the process group itself
    os.environ["RANK"] = str(dist.get_rank())
    os.environ["LOCAL_RANK"] = str(device.index or 0)
    return {"tensor_parallel_size": size, "distributed_executor_backend": "external_launcher"}


def cpu_kv_cache_bytes(model_path: str, length: int, sequences: int, dtype: torch.dtype,
                       tensor_parallel: int = 1) -> int:
    """Bytes of a KV cache holding `sequences` sequences of `length` tokens of the model (whole
    blocks, vLLM's reserved block included), so a full batch is never preempted, on each rank
    of a tensor-parallel group of `tensor_parallel` (its share of the key/value heads, at
    least one); an InputError for a head size vLLM's CPU attention has no kernel for."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = _text_config(model_path)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise InputError(f"rollout.engine: vllm on cpu has no attention kernel for {model_path}'s "
                         f"head size {head_dim} (it has {', '.join(map(str, supported))}); use "
                         "rollout.engine: native")
    kv_heads = -(-(config.get("num_key_value_heads") or heads) // tensor_parallel)
    per_token = 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype.itemsize
    return max(per_token * vllm_cpu_kv_tokens(length, sequences), 32 << 20)


def _cpu_shm_segment() -> Any:
    """The shared-memory file of this rank's part of vLLM's CPU all-reduce in a tensor-parallel
    group (None without one). vLLM removes it when the process exits normally; one that ends
    otherwise (a killed worker, `os._exit`) would leave it behind, and the next group of the
    same ranks on this host could not create its own."""
    from pathlib import Path

    from vllm.distributed import parallel_state

    group = parallel_state._TP
    name = getattr(getattr(getattr(group, "device_communicator", None), "dist_module", None),
                   "group_name", None)
    if group is None or group.world_size == 1 or name is None:
        return None
    return Path("/dev/shm") / f"{name.lstrip('/')}_{group.rank_in_group}"


def _text_config(model_path: str) -> dict[str, Any]:
    import json
    from pathlib import Path

    config = json.loads((Path(model_path) / "config.json").read_text())
    return config.get("text_config", config)


def _reason(exc: BaseException) -> str:
    """vLLM's error in one line: without pydantic's framing or the list of every supported
    architecture."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line.removeprefix("Value error, ") for line in lines
             if line and "validation error for" not in line and not line.startswith("For further")]
    text = " ".join(lines) or type(exc).__name__
    cut = text.find(" Supported architectures:")
    return text[:cut] + " (vLLM's supported models are listed in its documentation)" \
        if cut >= 0 else text


# A mixture of experts' tensors as transformers holds them (all experts of a layer fused) and as
# checkpoints name them, one tensor per expert (what vLLM's loaders map onto their kernels).
FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def checkpoint_names(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A trained tensor under the checkpoint names vLLM loads: a mixture of experts' fused
    `experts.gate_up_proj` (E, 2I, H) as each expert's `gate_proj` and `up_proj` (I, H) (the
    gate the first half, as transformers computes it) and `experts.down_proj` (E, H, I) as each
    expert's `down_proj`, views without a copy; any other tensor as it is."""
    if name.endswith(FUSED_EXPERTS[0]):
        prefix, half = name[:-len("gate_up_proj")], tensor.shape[1] // 2
        for expert, weight in enumerate(tensor):
            yield f"{prefix}{expert}.gate_proj.weight", weight[:half]
            yield f"{prefix}{expert}.up_proj.weight", weight[half:]
    elif name.endswith(FUSED_EXPERTS[1]):
        prefix = name[:-len("down_proj")]
        for expert, weight in enumerate(tensor):
            yield f"{prefix}{expert}.down_proj.weight", weight
    else:
        yield name, tensor


def _repack_cpu_experts(model: torch.nn.Module) -> int:
    """Re-pack every mixture-of-experts layer's weights into the CPU kernel's layout after an
    in-place reload: vLLM's reload writes them in checkpoint layout and re-runs the layer's
    weight processing, but skips the CPU kernel's own packing on an update (it packs on the
    first load only), which would leave the kernel reading unpacked weights. Returns the
    number of layers re-packed."""
    count = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
            count += 1
    return count


def _repack_cpu_kernels(model: torch.nn.Module) -> int:
    """Re-run the CPU GEMM dispatch of the layers that kept their weight beside a packed copy
    of it (vocabulary embeddings and a tied `lm_head`): the in-place reload refreshes the weight
    but not that copy. Layers whose weight was folded into the packed kernel were re-packed by
    the reload itself. Returns the number of layers re-packed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel():
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            count += 1
    return count


__all__ = ["StaleWeightsError", "VLLMRolloutEngine", "checkpoint_names", "cpu_kv_cache_bytes",
           "import_vllm",
           "join_tensor_parallel", "vllm_available"]
