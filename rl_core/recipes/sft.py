"""The SFT recipe: supervised fine-tuning on the spec's prompts and answers, the warm start
before RL.

    summary = SFTTrainer(spec).fit()

Each example is the rendered prompt followed by the answer and the end-of-turn token; the loss
is the token-mean negative log-likelihood of the answer tokens only. Checkpoints have the same
layout as RL checkpoints, so `model.path` of an RL spec can point at one. It runs in this
process on one device (no roles).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from rl_core import device as devices
from rl_core.algos.sft import sft_loss_fn
from rl_core.checkpoint import save_checkpoint
from rl_core.data.loader import ResumableLoader
from rl_core.data.prompts import response_batch, tokenize_prompts
from rl_core.data.run_data import load_prompt_data
from rl_core.determinism import process_report, record_determinism, seed_everything
from rl_core.engines import training_engine
from rl_core.engines.lora import ADAPTER_DIR, save_adapters
from rl_core.errors import InputError, NonFiniteError, TrainingStopped
from rl_core.evaluation import evaluate_prompts
from rl_core.lineage import record_lineage
from rl_core.models.loading import (copy_processor_files, is_vision_language, load_from_spec,
                                    load_image_processor)
from rl_core.models.registry import with_registered_models
from rl_core.precision import PrecisionPlan, StageDumper, update_data
from rl_core.profiling import ProfilePlan, StageProfiler
from rl_core.rewards import RewardComposer
from rl_core.rollout import rollout_engine, with_engine
from rl_core.rollout.sampling import SamplingParams
from rl_core.spec import RunSpec, has_images
from rl_core.tracking import Tracker, log_tool_files, make_tracker, memory_metrics

log = logging.getLogger("rl_core")


class SFTTrainer:
    def __init__(self, spec: RunSpec, *, device: str = "cpu", tracker: Tracker | None = None):
        if spec.rollout.engine == "vllm":
            raise InputError("rollout.engine: SFT validates with the native engine over the "
                             "model it trains; set rollout.engine: native or auto (not 'vllm') "
                             "for python -m rl_core sft")
        if spec.rollout.multi_turn is not None:
            raise InputError("rollout.multi_turn: SFT trains on the records' answers and "
                             "validates single responses; remove it for python -m rl_core sft "
                             "(a multi-turn transcript is a prompt and its last answer: see "
                             "rl_core.data.synthetic.calculator_transcripts)")
        spec = with_engine(spec, "native")  # auto too: SFT never generates with vLLM
        spec = with_registered_models(spec)  # models:/x/3: its local folder
        self.spec, self.device = spec, device
        self.output_dir = Path(spec.trainer.output_dir)
        seed_everything(spec.seed, spec.trainer.deterministic)
        self.model, self.tokenizer = load_from_spec(spec.model, device)
        train_records, val_records = load_prompt_data(spec, cache_dir=self.output_dir / "data")
        images = load_image_processor(spec.model.path, spec.model.trust_remote_code) \
            if has_images(spec) and is_vision_language(spec.model.path) else None
        self.train = tokenize_prompts(train_records, spec, self.tokenizer, "training", images)
        self.val = tokenize_prompts(val_records, spec, self.tokenizer, "validation",
                                    images) if val_records else None
        end = self.tokenizer.eos_token_id
        if any(t is None for t in self.train.truths):
            raise InputError(f"data.answer_key: SFT needs an answer for every prompt "
                             f"({spec.data.answer_key!r} is missing in some records)")
        self.targets = [self.tokenizer.encode(str(t), add_special_tokens=False) + [end]
                        for t in self.train.truths]
        self.loader = ResumableLoader(list(range(len(self.train))), spec.data.train_batch_size,
                                      epochs=None if spec.trainer.total_steps else spec.trainer.total_epochs,
                                      shuffle=spec.data.shuffle, seed=spec.seed)
        self.total_steps = spec.trainer.total_steps or self.loader.total_steps
        if spec.actor.strategy == "megatron":
            raise InputError("actor.strategy: the SFT recipe trains in one process, with torch "
                             "or fsdp2; megatron trains the RL algorithms")
        # LoRA (actor.lora): the engine wraps a copy with adapters; the rollout's model and the
        # saved folder take the merged weights (`_merge`)
        trained = copy.deepcopy(self.model) if spec.actor.lora is not None else self.model
        self.engine = training_engine(spec.actor.strategy).from_spec(
            trained, spec.actor, self.total_steps, spec.model.dtype, device)
        self.rollout = rollout_engine("native").from_spec(self.model, self.tokenizer, spec, device)
        self.sampling = SamplingParams.from_config(spec.rollout)
        self.rewards = RewardComposer.from_config(spec.reward)
        self.tracker = tracker or make_tracker(spec, self.output_dir)
        self.profiler = StageProfiler("sft", 0)  # tools.profiling: the update of chosen steps
        self.dumper = StageDumper("sft", 0)  # tools.precision: the same
        self.step = 0

    def batch(self, rows: list[int]) -> dict[str, torch.Tensor]:
        batch = response_batch([self.train.ids[i] for i in rows], [self.targets[i] for i in rows],
                               self.tokenizer.pad_token_id)
        data = batch.with_sequences()
        data["response_mask"] = batch.response_mask.float()
        return data.to_dict()

    def save(self) -> Path:
        self._merge()
        return save_checkpoint(self.output_dir, self.step, model=self.model, tokenizer=self.tokenizer,
                               state={"engine": self.engine.state_dict()}, spec_yaml=self.spec.to_yaml(),
                               write=self._write)

    def _write(self, folder: Path) -> None:
        copy_processor_files(self.spec.model.path, folder)
        if self.engine.adapted:  # LoRA: the adapters in PEFT's format too
            save_adapters(self.engine.model, folder / ADAPTER_DIR, self.engine.adapter_state())

    def _merge(self) -> None:
        """LoRA: the merged weights into the model the rollout generates from and the
        checkpoint saves (without adapters it is the trained model itself)."""
        if self.engine.adapted:
            self.rollout.load_weights(self.engine.weight_buckets())

    def validate(self) -> dict[str, float]:
        self._merge()
        return evaluate_prompts(self.rollout, self.tokenizer, self.rewards, self.val, self.sampling,
                                batch_size=self.spec.data.val_batch_size, seed=self.spec.seed)

    def fit(self, until: Callable[[dict[str, float]], bool] | None = None) -> dict[str, float]:
        """Train for `trainer.total_steps`, or (`until`) up to the first validated step whose
        metrics satisfy `until`; save the last step's checkpoint. Returns the last step's
        metrics and `checkpoint_step`."""
        metrics: dict[str, float] = {}
        status = "FAILED"
        try:
            self.tracker.log_params(self.spec.flat_params())
            record_lineage(self.spec, self.output_dir, self.tracker)
            record_determinism(self.spec, [process_report("sft", 0, self.device)],
                               self.output_dir, self.tracker)
            while self.step < self.total_steps:
                self.model.train()
                # tools.*: the update is SFT's one profiled and dumped stage
                profile = ProfilePlan.for_step(self.spec, self.step + 1)
                precision = PrecisionPlan.for_step(self.spec, self.step + 1)
                self.profiler.begin(profile)
                self.dumper.begin(precision)
                try:
                    with self.profiler.stage("update", self.device), \
                            self.dumper.stage("update", self.engine.model):
                        metrics = self.engine.train_step(
                            self.batch(next(self.loader)), sft_loss_fn,
                            micro_batch_size=self.spec.actor.ppo_micro_batch_size)
                except NonFiniteError as exc:
                    raise TrainingStopped(self.step + 1, str(exc), exc.metrics) from exc
                self.dumper.data("update", update_data(metrics))
                metrics.update(log_tool_files(self.tracker, profile, self.profiler.begin(None),
                                              precision, self.dumper.begin(None)))
                if self.spec.tools.monitor.log_memory:
                    metrics.update(memory_metrics([devices.memory_stats(self.device)]))
                self.step += 1
                every = self.spec.trainer.eval_every
                if self.val is not None and every and (self.step % every == 0 or self.step == self.total_steps):
                    metrics.update(self.validate())
                reached = until is not None and "val/accuracy" in metrics and until(metrics)
                if (self.step % self.spec.trainer.log_every == 0 or self.step == self.total_steps
                        or reached):
                    self.tracker.log_metrics(metrics, self.step)
                if reached:
                    break
                save_every = self.spec.trainer.save_every
                if save_every and self.step % save_every == 0 and self.step < self.total_steps:
                    self.save()
            path = self.save()
            self.tracker.log_artifacts(path, f"checkpoints/{path.name}")
            status = "FINISHED"
            return {**metrics, "checkpoint_step": float(self.step)}
        finally:
            try:
                self.rewards.close()
            finally:
                self.tracker.finish(status)
