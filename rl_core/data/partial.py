"""Partial rollout: responses generated a piece at a time over several rollout calls, and the
buffer that holds them between calls and steps.

    buffer = PartialRollouts(n=8, max_new_tokens=512, split=4, max_age=4)
    while True:
        buffer.expire(version)                              # the age limit
        if buffer.ready >= groups:
            break
        items = buffer.draw(buffer.wanted(groups), loader)  # fewer new prompts while some wait
        buffer.add(items, [ids[i] for i in items])
        rows = buffer.running()                             # waiting samples first, in order
        ended, cut = buffer.record(rows, generate(contexts(rows), n=1, chunk tokens), version)
    batch = rollout_batch(buffer.pop(groups), pad_token_id)  # one rollout batch of whole groups

Each call generates at most `max_new_tokens / split` (`chunk`) new tokens per sample; the
input of a waiting sample is its prompt and the tokens it has so far, so the next piece is
sampled from the policy of that call. A sample ends when it stops (an eos token) or reaches
`max_new_tokens`, or when the age limit cuts it. The n samples of a prompt form a group, and a
group trains only once all of its samples have ended; `pop` hands out the first complete groups
in the order they were drawn.

The buffer lives beside the controller (in the recipe's process), not in the data channel: the
channel holds one step's batch for its stages, while this state outlives steps and goes into the
run's checkpoint (`state_dict`), so a run resumed in the middle of a partial batch continues
exactly. Everything in it is ordered (groups by draw, samples by index), so with the same seed
two runs roll out the same calls.

Age is counted in policy versions: a sample's age is the span of the versions its pieces were
sampled from, newest - oldest + 1 (1 for a response made within one step). With `max_age` a
sample still unfinished when its next piece would make its age larger is cut instead (ended,
`finished` false), so no response mixes more than `max_age` policies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rl_core.data.batch import Batch, left_pad
from rl_core.errors import InputError

RUNNING, STOPPED, CUT = "running", "stopped", "cut"


@dataclass(eq=False)  # each is its own response, however alike two are
class Sample:
    """One response in the making: its tokens and rollout log-probs so far."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tools: list[int] = field(default_factory=list)  # multi-turn: 1 for each tool token
    turn_start: int = 0  # multi-turn: where the model's current turn began in `tokens`
    turns: int = 0  # multi-turn: the model's turns ended so far
    tool_calls: int = 0  # multi-turn: tool calls answered
    first_version: int = -1  # the policy version of its first piece (-1: none yet)
    last_version: int = -1
    pieces: int = 0  # rollout calls it took part in
    status: str = RUNNING  # RUNNING, STOPPED (an eos token) or CUT (length or age limit)

    @property
    def age(self) -> int:
        """The span of policy versions its pieces were sampled from (newest - oldest + 1)."""
        return self.last_version - self.first_version + 1


@dataclass(eq=False)
class Group:
    """The n samples of one prompt; it trains once every sample has ended."""

    item: int  # the prompt's index in the training prompts
    prompt: list[int]
    samples: list[Sample]

    @property
    def complete(self) -> bool:
        return all(s.status != RUNNING for s in self.samples)


class PartialRollouts:
    """The groups in flight (in draw order) and the prompts drawn but not started yet."""

    def __init__(self, n: int, max_new_tokens: int, split: int, max_age: int | None = None,
                 turns: Any = None):
        if split < 1 or max_new_tokens % split or (split == 1 and turns is None):
            raise ValueError(f"split must be >= 2 (1 with multi-turn rollouts) and divide "
                             f"max_new_tokens ({max_new_tokens}), got {split}")
        self.n, self.max_new_tokens, self.split = n, max_new_tokens, split
        self.max_age = max_age or split
        self.turns = turns  # rl_core.rollout.turns.MultiTurn, or None: one turn
        self.chunk = max_new_tokens // split  # new tokens per sample per call
        self.groups: list[Group] = []
        self.queue: list[int] = []  # items drawn from the loader, not started

    @classmethod
    def from_spec(cls, spec: Any, turns: Any = None) -> PartialRollouts | None:
        """The buffer of the spec's `rollout` section; None when partial rollout is off and
        there are no `turns` (multi-turn rollouts take this buffer with split 1: a step's
        groups are all complete by its end)."""
        r = spec.rollout
        split = max(r.partial_rollout_max_split, 1)
        if split == 1 and turns is None:
            return None
        return cls(r.n_samples_per_prompt, r.max_new_tokens, split, r.partial_rollout_max_age,
                   turns)

    @property
    def partial(self) -> bool:
        """Whether responses are generated a piece at a time over steps (split > 1)."""
        return self.split > 1

    # ----------------------------------------------------------------------- counts

    @property
    def ready(self) -> int:
        """Complete groups: those that can train."""
        return sum(g.complete for g in self.groups)

    @property
    def pending(self) -> int:
        """Samples waiting for their next piece."""
        return len(self.running())

    # ----------------------------------------------------------------------- new prompts

    def wanted(self, groups: int) -> int:
        """New prompts for the next call: as many as bring its rows to about `groups` × n (the
        rollout of a step without partial rollout), the waiting samples counted first. With
        split 1 (multi-turn rollouts alone) only the groups missing: a step's groups are drawn
        at once and all finish in the step, so every response is of the step's policy."""
        if not self.partial:
            return max(0, groups - len(self.groups))
        return max(0, (groups * self.n - self.pending) // self.n)

    def draw(self, count: int, loader: Iterator[list[int]]) -> list[int]:
        """The next `count` items: those drawn before first, then batches from `loader` (fewer
        when it runs out); the rest of a loader batch waits for the next call."""
        while len(self.queue) < count:
            try:
                self.queue.extend(next(loader))
            except StopIteration:
                break
        items, self.queue = self.queue[:count], self.queue[count:]
        return items

    def add(self, items: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """A group of n new samples for each item (its prompt's token ids)."""
        for item, prompt in zip(items, prompts, strict=True):
            self.groups.append(Group(int(item), [int(t) for t in prompt],
                                     [Sample() for _ in range(self.n)]))

    # ----------------------------------------------------------------------- a call

    def expire(self, version: int) -> int:
        """Cut the waiting samples whose next piece, of policy `version`, would make them older
        than `max_age`; returns how many were cut."""
        cut = 0
        for _, sample in self.running():
            if sample.pieces and version - sample.first_version + 1 > self.max_age:
                sample.status = CUT
                cut += 1
        return cut

    def running(self) -> list[tuple[Group, Sample]]:
        """The samples of the next call, in order: older groups (the waiting ones) first."""
        return [(g, s) for g in self.groups for s in g.samples if s.status == RUNNING]

    def record(self, rows: Sequence[tuple[Group, Sample]], batch: Batch, version: int
               ) -> tuple[int, int]:
        """Append each row's piece (row i of `batch`, a rollout of `contexts(rows)` with n = 1)
        sampled from policy `version`; returns (samples that ended, of them cut at
        max_new_tokens). With multi-turn rollouts a turn that ends in a tool call gets the
        tools' answers appended (`MultiTurn.answer`) and its sample goes on."""
        if len(batch) != len(rows):
            raise ValueError(f"the rollout has {len(batch)} rows for {len(rows)} samples")
        lengths = batch.response_lengths.tolist()
        if max(lengths, default=0) > self.chunk:
            raise ValueError(f"a piece of {max(lengths)} tokens is longer than the chunk "
                             f"({self.chunk})")
        tokens, logprobs = batch.response_ids.tolist(), batch.logprobs.tolist()
        turned: list[Sample] = []  # samples whose turn ended: the tools may answer
        for (_, sample), length, ids, lps, stopped in zip(
                rows, lengths, tokens, logprobs, batch.finished.tolist()):
            room = self.max_new_tokens - len(sample.tokens)  # a tool's answer shifts pieces
            piece = ids[:min(length, room)]
            sample.tokens += piece
            sample.logprobs += lps[:len(piece)]
            if self.turns is not None:
                sample.tools += [0] * len(piece)
            if not sample.pieces:
                sample.first_version = version
            sample.last_version, sample.pieces = version, sample.pieces + 1
            if stopped and len(piece) == length:
                sample.status = STOPPED
                if self.turns is not None:
                    turned.append(sample)
            elif len(sample.tokens) >= self.max_new_tokens:
                sample.status = CUT
        if turned:
            self.turns.answer(turned, self.max_new_tokens)
        ended = sum(s.status != RUNNING for _, s in rows)
        return ended, sum(s.status == CUT for _, s in rows)

    # ----------------------------------------------------------------------- training

    def pop(self, count: int) -> list[Group]:
        """The first `count` complete groups in draw order, taken out of the buffer."""
        if self.ready < count:
            raise ValueError(f"{self.ready} complete groups, {count} wanted")
        taken: list[Group] = []
        kept: list[Group] = []
        for group in self.groups:
            (taken if group.complete and len(taken) < count else kept).append(group)
        self.groups = kept
        return taken

    # ----------------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on with the same calls (plain lists)."""
        return {"n": self.n, "max_new_tokens": self.max_new_tokens, "split": self.split,
                "queue": list(self.queue),
                "groups": [{"item": g.item, "prompt": list(g.prompt),
                            "samples": [asdict(s) for s in g.samples]} for g in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a `state_dict`; it must come from the same n, max_new_tokens and split."""
        for name, path in (("n", "n_samples_per_prompt"), ("max_new_tokens", "max_new_tokens"),
                           ("split", "partial_rollout_max_split")):
            if state[name] != getattr(self, name):
                raise InputError(
                    f"rollout.{path}: the checkpoint's waiting responses were made with "
                    f"{state[name]}, this run has {getattr(self, name)}; resume with "
                    f"{state[name]}, or start a new run from the checkpoint's weights")
        self.queue = list(state["queue"])
        self.groups = [Group(g["item"], list(g["prompt"]), [Sample(**s) for s in g["samples"]])
                       for g in state["groups"]]


def contexts(rows: Sequence[tuple[Group, Sample]]) -> list[list[int]]:
    """The input of each row's next piece: its prompt and the tokens it has so far."""
    return [group.prompt + sample.tokens for group, sample in rows]


def rollout_batch(groups: Sequence[Group], pad_token_id: int) -> Batch:
    """The groups' samples as one rollout batch (`ROLLOUT_COLUMNS`, a group's rows adjacent,
    `prompt_index` the group's position), with `weight_version`: the policy version of each
    response's newest piece."""
    samples = [s for g in groups for s in g.samples]
    prompt_ids, prompt_mask = left_pad([g.prompt for g in groups for _ in g.samples],
                                       pad_token_id)
    lengths = torch.tensor([len(s.tokens) for s in samples], dtype=torch.long)  # (B,)
    width = max(int(lengths.max()), 1)
    response_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((len(samples), width), dtype=torch.float32)
    for row, sample in enumerate(samples):
        response_ids[row, :len(sample.tokens)] = torch.tensor(sample.tokens, dtype=torch.long)
        logprobs[row, :len(sample.tokens)] = torch.tensor(sample.logprobs, dtype=torch.float32)
    batch = Batch({
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "response_ids": response_ids,
        "response_mask": (torch.arange(width)[None, :] < lengths[:, None]).long(),  # (B, R)
        "logprobs": logprobs,
        "prompt_index": torch.arange(len(groups)).repeat_interleave(
            torch.tensor([len(g.samples) for g in groups])),
        "response_lengths": lengths,
        "finished": torch.tensor([s.status == STOPPED for s in samples]),
        "weight_version": torch.tensor([s.last_version for s in samples], dtype=torch.long),
    })
    if any(s.tools for s in samples):  # multi-turn: which tokens the tools wrote
        tool_mask = torch.zeros((len(samples), width), dtype=torch.long)
        for row, sample in enumerate(samples):
            tool_mask[row, :len(sample.tools)] = torch.tensor(sample.tools, dtype=torch.long)
        batch["tool_mask"] = tool_mask
        batch["turns"] = torch.tensor([s.turns for s in samples], dtype=torch.long)
        batch["tool_calls"] = torch.tensor([s.tool_calls for s in samples], dtype=torch.long)
    return batch


@dataclass
class StepCounts:
    """What a step's rollout calls did: rows rolled out, samples that ended in them, of those
    cut at max_new_tokens, and samples the age limit cut before a call."""

    calls: int = 0
    rows: int = 0
    ended: int = 0
    cut: int = 0
    expired: int = 0

    def metrics(self, groups: Sequence[Group], pending: int) -> dict[str, float]:
        """`rollout/partial/*`: finished_frac (of the rows rolled out, the share that ended; 0
        in a step that made no call),
        truncated_frac (of the samples that ended this step, the share cut by max_new_tokens or
        the age limit), mean_age and max_age (policy versions, over the trained `groups`),
        pending (samples waiting after the step) and calls."""
        ages = [s.age for g in groups for s in g.samples]
        ended = self.ended + self.expired
        return {
            "rollout/partial/calls": float(self.calls),
            "rollout/partial/finished_frac": self.ended / max(self.rows, 1),
            "rollout/partial/truncated_frac": (self.cut + self.expired) / max(ended, 1),
            "rollout/partial/mean_age": sum(ages) / max(len(ages), 1),
            "rollout/partial/max_age": float(max(ages, default=0)),
            "rollout/partial/pending": float(pending),
        }
