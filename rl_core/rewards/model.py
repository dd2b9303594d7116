"""A learned reward model (`reward.reward_model`): a Hugging Face sequence-classification model
with one label that scores a prompt and its response at the response's last token, as the
reward models of RLHF are trained (OpenRLHF's and verl's reward-model workers score the same way).

    model = RewardModel.load(folder, device="cuda", dtype="bfloat16", micro_batch_size=4,
                             policy_tokenizer=tokenizer)
    scores = model.score(input_ids, attention_mask, position_ids)   # float32, one per row

The rows are the rollout's sequences as the training engines see them (`Batch.with_sequences`:
prompt left-padded, response right-padded); each row is scored at its last real token. The
reward model reads the policy's token ids as they are, so its tokenizer must be the policy's
(same vocabulary; a folder without tokenizer files is taken to share it): one that differs is
refused naming the field (scoring would need the text re-tokenized under the reward model's
own chat template). Its score head must be the `score` layer Hugging Face's
`*ForSequenceClassification` models have (Qwen2/2.5/3, Llama, Mistral, Gemma, ...).

A tiny reward model for tests and demos: `rl_core.models.tiny.save_tiny_reward_model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rl_core.errors import InputError
from rl_core.models.loading import resolve_dtype

FIELD = "reward.reward_model"


class RewardModel:
    """Scores rows with a frozen sequence-classification model, `micro_batch_size` at a time."""

    def __init__(self, model: torch.nn.Module, micro_batch_size: int = 4) -> None:
        if not hasattr(model, "score") or not hasattr(model, "base_model"):
            raise InputError(f"{FIELD}: {type(model).__name__} has no `score` head over a base "
                             "model: give a Hugging Face *ForSequenceClassification folder")
        labels = getattr(model.config, "num_labels", None)
        if labels != 1:
            raise InputError(f"{FIELD}: the model has {labels} labels, a reward model one (a "
                             "scalar score): give a folder whose config.json has num_labels: 1")
        self.model = model.eval().requires_grad_(False)
        self.micro_batch_size = int(micro_batch_size)

    @classmethod
    def load(cls, path: str | Path, *, device: str | torch.device = "cpu",
             dtype: str | torch.dtype = "float32", micro_batch_size: int = 4,
             policy_tokenizer: Any = None, trust_remote_code: bool = False) -> RewardModel:
        """The reward model in folder `path`, on `device` in `dtype`; with `policy_tokenizer`,
        checked to read the policy's token ids."""
        from transformers import AutoConfig, AutoModelForSequenceClassification

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise InputError(f"{FIELD}: {folder} is not a model folder (no config.json)")
        config = AutoConfig.from_pretrained(folder, local_files_only=True,
                                            trust_remote_code=trust_remote_code)
        if policy_tokenizer is not None:
            check_tokenizer(folder, config, policy_tokenizer, trust_remote_code)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                folder, dtype=resolve_dtype(dtype), local_files_only=True,
                trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            reason = " ".join(str(exc).split())
            raise InputError(f"{FIELD}: cannot load {folder} as a sequence-classification "
                             f"model: {reason}") from exc
        return cls(model.to(device), micro_batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
              position_ids: torch.Tensor) -> torch.Tensor:
        """One float32 score per row: the score head at the row's last real token."""
        out = []
        for start in range(0, len(input_ids), self.micro_batch_size):
            rows = slice(start, start + self.micro_batch_size)
            mask = attention_mask[rows].to(self.device)
            hidden = self.model.base_model(
                input_ids=input_ids[rows].to(self.device), attention_mask=mask,
                position_ids=position_ids[rows].to(self.device)).last_hidden_state
            last = last_token(mask)
            picked = hidden[torch.arange(len(last), device=hidden.device), last]
            out.append(self.model.score(picked)[:, 0].float())
        return torch.cat(out).cpu() if out else torch.zeros(0)


def last_token(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token (the mask's last 1)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask.long()).argmax(dim=1)


def check_tokenizer(folder: Path, config: Any, policy_tokenizer: Any,
                    trust_remote_code: bool = False) -> None:
    """An InputError naming the field when the reward model cannot read the policy's ids: its
    tokenizer (if the folder has one) maps tokens to other ids, or its embedding is smaller
    than the policy's vocabulary."""
    vocab = len(policy_tokenizer)
    size = getattr(config.get_text_config(), "vocab_size", None)
    if size is not None and size < vocab:
        raise InputError(f"{FIELD}: its embedding has {size} tokens, the policy's tokenizer "
                         f"{vocab}: the reward model must read the policy's token ids")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                        trust_remote_code=trust_remote_code)
    if own.get_vocab() != policy_tokenizer.get_vocab():
        raise InputError(f"{FIELD}: {folder}'s tokenizer differs from the policy's: the reward "
                         "model scores the policy's token ids as they are, so it must share the "
                         "policy's tokenizer (re-tokenizing the text is not supported)")


__all__ = ["RewardModel", "check_tokenizer", "last_token"]
