"""Native rollout: batched sampling with a KV cache from the training weights, in the same process.

    engine = NativeRolloutEngine(model, eos_token_ids=[258, 256], pad_token_id=256)
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=128, n=4), generator=g)
    input_ids, attention_mask, position_ids = batch.to_sequences()
    engine.free_cache()                     # before the training update

The engine holds a reference to the training model, never a copy: every `generate` reads the
current weights, so rollout is colocated with training by construction.

Two decoders share one sampling loop:

- the fast decoder, for Llama-style decoders (Qwen2, Qwen3, Llama, Mistral without a sliding
  window in reach): it runs the model's own weights through a short hand-written forward with a
  preallocated (static) KV cache, fused q/k/v and gate/up projections, one rotary table per call,
  logits for the last position only, and no per-step bookkeeping beyond the sampled tokens; it
  can compute in another dtype than the model's (`dtype=torch.bfloat16` for float32 weights);
- the Hugging Face decoder, for any other causal LM: the model's own `forward` with a
  `DynamicCache`.

On CUDA (and Ascend with torch_npu's graph capture) the fast decoder's decode step is replayed
from a device graph (`rl_core.rollout.decoder.StepGraphs`): rows in power-of-two buckets at the
front of the static cache, keys read in spans of 128 columns; the tokens are the plain steps'.

Prompts are left-padded, so every response starts in the same column; position ids are
`cumsum(mask) - 1`, as in Hugging Face `generate` and verl. Each prompt is prefilled once and
its cache copied to its `n` sample rows. Rows stop on any eos id; generation stops when every
row has stopped or after `max_new_tokens`, and once a quarter of the rows have stopped the
batch is compacted to those still running. Sampling draws from the `generator` passed in
(on the engine's device), so a seed reproduces a rollout.

Log-probs are those of the sampled token under softmax(logits / temperature), before top-k,
top-p and min-p filtering (what verl's `old_log_prob` recomputes); with `do_sample=False` the
temperature is 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from rl_core.data.batch import IMAGE_COLUMNS, Batch, image_columns_of, left_pad
from rl_core.errors import InputError
from rl_core.rollout.decoder import (
    EagerGraphs,
    FastDecoder,
    GraphBackend,
    HFDecoder,
    StaticCache,
    StepGraphs,
    fast_path_reason,
    graph_backend,
)
from rl_core.rollout.parts import is_split, part_of
from rl_core.rollout.sampling import SamplingParams, draw_uniforms, sample_tokens

# Compact the batch once 1/COMPACT_FRACTION of its rows have stopped.
COMPACT_FRACTION = 4


# --------------------------------------------------------------------------- engine


class NativeRolloutEngine:
    """Generates responses with `model`'s current weights, batched, with a KV cache.

    `eos_token_ids`: any of them ends a response (it is kept, inside the response mask).
    `pad_token_id`: fills the prompts' left and the responses' right padding.
    `fast`: use the hand-written decoder where the architecture allows (default); False always
    goes through the model's own forward.
    `dtype`: compute dtype of the layers, e.g. torch.bfloat16 to roll out a float32 model in
    bfloat16 (weights cast once per call; logits and log-probs stay float32); default the
    model's. Needs the fast decoder.
    `check_every`: how many steps between checks that every row has stopped (each check waits
    for the device); default 1 on CPU, 8 elsewhere.
    `graphs`: replay the fast decoder's decode step from device graphs (`StepGraphs`): None
    (default) where the device has them (CUDA; Ascend with torch_npu's NPUGraph), True to
    insist (an error where there are none), False never; `EagerGraphs()` runs the same
    bucketed steps without graphs (what CPUs can check).
    `group`: a rollout group whose ranks each hold their part of `model`'s layers
    (`rl_core.rollout.parts.split_layers`) and generate together, the same prompts and draws
    on every rank; `load_weights` then keeps each full weight's part. Needs the fast decoder.
    `park`: the model is the engine's own copy, synced by `load_weights` (not the training
    model): `sleep` parks it in host memory and `wake_up` (or the next `generate` or
    `load_weights`) brings it back, so it takes no device memory during the update; on cpu
    nothing moves.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        device: str | torch.device = "cpu",
        *,
        fast: bool = True,
        dtype: torch.dtype | None = None,
        check_every: int | None = None,
        graphs: bool | GraphBackend | EagerGraphs | None = None,
        group: Any = None,
        park: bool = False,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids is empty: responses could only stop at max_new_tokens")
        self.model = model
        self.group = group
        self.park, self.parked = park, False
        self.device = torch.device(device)
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.pad_token_id = int(pad_token_id)
        self.fast = fast
        self.dtype = dtype
        self.check_every = check_every or (1 if self.device.type == "cpu" else 8)
        self._cache = StaticCache()
        self.graphs = self._graphs(graphs)
        self.captures = 0  # device graphs captured so far (a few per `generate`)

    # it reads the model it was given: over the training model, no sync is ever needed
    shares_weights = True

    @classmethod
    def from_spec(cls, model: torch.nn.Module, tokenizer: Any, spec: Any,
                  device: str | torch.device = "cpu", *, group: Any = None, park: bool = False,
                  **_: Any) -> NativeRolloutEngine:
        """The engine over `model` (the training weights, or a copy of them with `park`, or a
        rollout group's parts of them with `group`); it needs nothing else of the spec."""
        return cls(model, eos_token_ids=eos_ids(tokenizer, model),
                   pad_token_id=tokenizer.pad_token_id, device=device, group=group, park=park)

    def load_weights(self, buckets: Iterable[list[tuple[str, torch.Tensor]]],
                     version: int | None = None) -> None:
        """Copy weights by name into the model (from a training engine's `weight_buckets`).

        The native engine usually holds the training model itself and needs no copy; this is
        for an engine over a model of its own (a sharded actor's full copy). An unknown name is
        an error. `version` is the policy's; the model is read live, so it needs no record.
        In a rollout group each rank copies its part of each full weight (`part_of`); a weight
        of its part's shape (`parallel.resharding: none`) is copied as it comes."""
        self.wake_up()
        own = self.model.state_dict()
        rank, size = ((dist.get_rank(self.group), dist.get_world_size(self.group))
                      if self.group is not None else (0, 1))
        with torch.no_grad():
            for bucket in buckets:
                for name, tensor in bucket:
                    if name not in own:
                        raise KeyError(f"the rollout model has no weight named {name!r}")
                    if own[name].data_ptr() == tensor.data_ptr():
                        continue
                    if size > 1 and (not is_split(name) or tensor.shape != own[name].shape):
                        tensor = part_of(name, tensor, rank, size)  # a full weight
                    own[name].copy_(tensor)
        self._cache.free()

    def sleep(self) -> None:
        """Free the KV cache; with `park`, move the engine's own weights to host memory (the
        training model's stay where training puts them)."""
        self._cache.free()
        if self.park and not self.parked and self.device.type != "cpu":
            self.model.to("cpu")
            self.parked = True

    def wake_up(self) -> None:
        """Parked weights back on the device; the cache is allocated again by the next
        `generate`."""
        if self.parked:
            self.model.to(self.device)
            self.parked = False

    @property
    def cache_nbytes(self) -> int:
        """Bytes held by the KV cache between calls (0 after `free_cache`)."""
        return self._cache.nbytes

    def free_cache(self) -> None:
        """Drop the KV-cache buffers (before a training update, when memory is shared)."""
        self._cache.free()

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        uniforms: torch.Tensor | None = None,
    ) -> Batch:
        """Sample `params.n` responses to each prompt (token ids, no padding).

        The draws come from `uniforms` (rows = len(prompts) × n, max_new_tokens), see
        `draw_uniforms`, or are drawn from `generator` as one such table. A prompt with images
        (`rl_core.data.prompts.PromptIds`) is generated from them (a vision-language model),
        and the batch carries its rows' image columns (`IMAGE_COLUMNS`)."""
        self.wake_up()
        ids, mask = left_pad(prompts, self.pad_token_id, self.device)
        images = image_columns_of(prompts)
        rows = ids.shape[0] * params.n
        if params.do_sample and uniforms is None:
            uniforms = draw_uniforms(rows, params.max_new_tokens, generator, device=self.device)
        if uniforms is not None and tuple(uniforms.shape) != (rows, params.max_new_tokens):
            raise ValueError(f"uniforms must be ({rows}, {params.max_new_tokens}) for "
                             f"{ids.shape[0]} prompts x n={params.n}, got {tuple(uniforms.shape)}")
        with torch.inference_mode(), _eval_mode(self.model):
            decoder = self._decoder(ids.shape[1] + params.max_new_tokens, ids, images)
            tokens, logprobs, alive = self._loop(decoder, ids, mask, params, uniforms)
            if isinstance(decoder, HFDecoder):
                decoder.close()
        # Outside inference mode: the batch feeds autograd-tracked training code.
        outputs = (t.clone() for t in (ids, mask, tokens, logprobs, alive))
        batch = self._batch(*outputs, params.n)
        for name, column in (images or {}).items():  # each response row its prompt's images
            batch[name] = column.repeat_interleave(params.n, 0)
        return batch

    def _graphs(self, graphs: bool | GraphBackend | EagerGraphs | None
                ) -> GraphBackend | EagerGraphs | None:
        if graphs is None or graphs is True:
            backend = graph_backend(self.device)
            if backend is None and graphs is True:
                raise ValueError(f"graphs=True: {self.device.type} has no device graphs here")
            return backend
        return graphs or None

    def _decoder(self, length: int, ids: torch.Tensor,
                 images: dict[str, torch.Tensor] | None) -> FastDecoder | HFDecoder:
        model_dtype = self.model.get_input_embeddings().weight.dtype
        if images is not None:  # a vision-language model, through its own forward
            if self.group is not None:
                raise InputError("rollout.tensor_parallel_size: a rollout group cannot "
                                 "generate from images; set it to 1")
            from rl_core.models.vision import image_inputs

            return HFDecoder(self.model, image_inputs(self.model, ids, *(
                images[name].to(self.device) for name in IMAGE_COLUMNS)))
        reason = fast_path_reason(self.model, length) if self.fast else "fast=False"
        if reason is None:
            return FastDecoder(self.model, self._cache, self.dtype or model_dtype, self.group)
        if self.group is not None:
            raise InputError(f"rollout.tensor_parallel_size: the native engine splits only the "
                             f"layers its fast decoder runs, and it cannot run this model: "
                             f"{reason}; set rollout.tensor_parallel_size: 1")
        if self.dtype not in (None, model_dtype):
            raise ValueError(
                f"dtype {self.dtype} differs from the model's {model_dtype}, which only the "
                f"fast decoder can do, and it cannot run this model: {reason}"
            )
        return HFDecoder(self.model)

    def _loop(
        self,
        decoder: FastDecoder | HFDecoder,
        ids: torch.Tensor,
        mask: torch.Tensor,
        params: SamplingParams,
        uniforms: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode; returns tokens, logprobs and the alive mask, each (B, steps taken).

        Stopped rows keep being computed (their tokens are ignored) until a quarter of the
        batch has stopped (with device graphs: until the rows running fit a smaller bucket);
        then the batch is compacted to the rows still running.
        """
        rows, width, limit = ids.shape[0] * params.n, ids.shape[1], params.max_new_tokens
        out = _Responses(rows, limit, self.pad_token_id, self.device)
        active = torch.arange(rows, device=self.device)  # batch row -> output row
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        eos = torch.tensor(self.eos_token_ids, device=self.device)
        positions = mask.sum(1).repeat_interleave(params.n)  # (B,) position of response token 0
        logits = decoder.prefill(ids, mask, params.n, limit)
        steps: FastDecoder | HFDecoder | StepGraphs = decoder
        if isinstance(decoder, FastDecoder) and self.graphs is not None:
            steps = StepGraphs(decoder, rows, self.graphs)
        for step in range(limit):
            uniform = uniforms[active, step] if uniforms is not None else None
            token, logprob = sample_tokens(logits, params, uniform=uniform)
            out.record(step, active, token, logprob, done)
            done |= torch.isin(token, eos)
            if step + 1 == limit:
                break
            if (step + 1) % self.check_every == 0:
                stopped = int(done.sum())
                if stopped == done.shape[0]:
                    break
                if _compacts(steps, done.shape[0], done.shape[0] - stopped):
                    keep = (~done).nonzero().squeeze(1)
                    steps.select(keep, width + step)
                    active, done, positions, token = (
                        active[keep], done[keep], positions[keep], token[keep]
                    )
            logits = steps.decode(token, positions + step, width + step)
        self.captures += getattr(steps, "captures", 0)
        return out.first(step + 1)

    def _batch(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        alive: torch.Tensor,
        n: int,
    ) -> Batch:
        lengths = alive.sum(1)  # (B,)
        width = int(lengths.max())
        last = tokens.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        eos = torch.tensor(self.eos_token_ids, device=tokens.device)
        return Batch({
            "prompt_ids": ids.repeat_interleave(n, 0),
            "prompt_mask": mask.repeat_interleave(n, 0),
            "response_ids": tokens[:, :width].contiguous(),
            "response_mask": alive[:, :width].long(),
            "logprobs": logprobs[:, :width].contiguous(),
            "prompt_index": torch.arange(ids.shape[0], device=ids.device).repeat_interleave(n),
            "response_lengths": lengths,
            "finished": torch.isin(last, eos),
        })


def _compacts(decoder: FastDecoder | HFDecoder | StepGraphs, batch: int, running: int) -> bool:
    """Whether to drop the stopped rows now: once a quarter of the batch has stopped, or with
    device graphs when the rows running fit a smaller bucket."""
    if isinstance(decoder, StepGraphs):
        return decoder.compacts(batch, running)
    return batch - running >= max(1, batch // COMPACT_FRACTION)


class _Responses:
    """Output buffers (rows, max_new_tokens): tokens (pad-filled), log-probs, alive mask."""

    def __init__(self, rows: int, limit: int, pad: int, device: torch.device) -> None:
        self.pad = pad
        self.tokens = torch.full((rows, limit), pad, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((rows, limit), dtype=torch.float32, device=device)
        self.alive = torch.zeros((rows, limit), dtype=torch.bool, device=device)

    def record(
        self,
        step: int,
        rows: torch.Tensor,
        token: torch.Tensor,
        logprob: torch.Tensor,
        done: torch.Tensor,
    ) -> None:
        """Store step `step` of output `rows`; rows already `done` get padding."""
        self.tokens[rows, step] = token.masked_fill(done, self.pad)
        self.logprobs[rows, step] = logprob.masked_fill(done, 0.0)
        self.alive[rows, step] = ~done

    def first(self, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.tokens[:, :steps], self.logprobs[:, :steps], self.alive[:, :steps]


def eos_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    """Every token id that ends a response: the tokenizer's eos and the generation config's."""
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) while generating; every module's own mode restored afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
