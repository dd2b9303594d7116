"""Multi-turn rollouts with tools (`rollout.multi_turn`): the model's turn may call a tool, the
tool's answer is appended as tokens, and the model's next turn is generated from there.

    turns = MultiTurn.from_spec(spec, tokenizer)      # None when rollout.multi_turn is null
    batch = turns.generate(generate, prompt_ids, params, seed, version)
    batch["tool_mask"]     # (B, R) 1 on the tokens the tools wrote: they carry no loss
    turns.metrics()        # rollout/turns/*, rollout/tools/* since the last call

`generate(contexts, params, seed)` is any rollout (`Controller.generate` over the actor's
ranks, a `RolloutEngine`): each call is one turn of every response still going, with n = 1 over
its prompt and its tokens so far. The responses live in the partial-rollout buffer
(`rl_core.data.partial`, split 1 here), which also lets partial rollout go on across steps
with turns: `PartialRollouts.record` hands every turn that ended (an eos token) to `answer`.

Token in, token out. The trained sequence is exactly the tokens the model generated and the
tokens of the tools' answers, in order: a turn is decoded only to find its tool calls, never
encoded again, and an answer is encoded once, in its ChatML wrapper, and appended. A new turn
is a new rollout call whose prompt is the whole sequence so far: the native engine prefills it
again, vLLM reuses its cached prefix (prefix caching) where it is on.

The `hermes` format (Qwen2.5, Qwen3, Hermes): a call is
`<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>` in the
model's turn (which ends with its eos, `<|im_end|>`); the answers to a turn's calls follow as one
user turn, then the model's next turn:

    <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n408\\n</tool_response><|im_end|>\\n
    <|im_start|>assistant\\n

A malformed call (not JSON, no name, an unknown tool, arguments that
are not an object, an unclosed tag) is answered with an error text the model reads, as is a
tool that fails, overruns its limits or floods its output (`rl_core.tools`): the rollout goes
on and the counts appear in the metrics. A turn without a call ends the response, as does a
call in the `max_turns`-th turn (unanswered), or an answer that would leave the response no
room (cut, `finished` false).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from rl_core.data.batch import Batch
from rl_core.data.partial import CUT, RUNNING, PartialRollouts, Sample, contexts, rollout_batch
from rl_core.errors import InputError

FIELD = "rollout.multi_turn"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ANSWERED = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# The answers to one turn's calls, as the user turn that follows it in ChatML (`hermes`).
ANSWERS_START = "\n<|im_start|>user\n"
ANSWER = "<tool_response>\n{}\n</tool_response>"
ANSWERS_END = "<|im_end|>\n<|im_start|>assistant\n"
CUT_MARK = " ...(cut)"


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from a turn: a tool name and its arguments, or why it is malformed."""

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None


def hermes_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A tool call as a model writes it in the `hermes` format (compact JSON)."""
    body = json.dumps({"name": name, "arguments": dict(arguments)}, separators=(",", ":"))
    return f"{OPEN_TAG}{body}{CLOSE_TAG}"


def parse_calls(text: str) -> list[ToolCall]:
    """The tool calls of one model turn in the `hermes` format, in order; an unclosed
    `<tool_call>` after the last closed one counts as a malformed call."""
    calls = [_parse_call(body) for body in CALL.findall(text)]
    closed = text.rfind(CLOSE_TAG)
    tail = text[closed + len(CLOSE_TAG):] if closed >= 0 else text
    if OPEN_TAG in tail:
        calls.append(ToolCall(None, None, "the <tool_call> is not closed with </tool_call>"))
    return calls


def _parse_call(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except ValueError as exc:
        return ToolCall(None, None, f"the tool call is not JSON ({exc.msg} at character "
                                    f"{exc.pos}): write {{\"name\": ..., \"arguments\": {{...}}}}")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ToolCall(None, None, "the tool call has no \"name\": write "
                                    "{\"name\": ..., \"arguments\": {...}}")
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(value["name"], None, "the tool call's \"arguments\" is not an object")
    return ToolCall(value["name"], arguments)


class MultiTurn:
    """The tools of a run and the rules of its turns; answers the turns that ended."""

    def __init__(self, tokenizer: Any, tools: Mapping[str, Any], *, max_turns: int = 4,
                 max_calls_per_turn: int = 4, max_tool_response_tokens: int = 256,
                 tool_concurrency: int = 8) -> None:
        self.tokenizer, self.tools = tokenizer, dict(tools)
        self.max_turns, self.max_calls_per_turn = max_turns, max_calls_per_turn
        self.max_tool_response_tokens = max_tool_response_tokens
        self.tool_concurrency = tool_concurrency
        self._start = self._encode(ANSWERS_START)
        self._end = self._encode(ANSWERS_END)
        self.counts: Counter[str] = Counter()
        self.latencies: list[float] = []

    @classmethod
    def from_spec(cls, spec: Any, tokenizer: Any) -> MultiTurn | None:
        """The multi-turn settings of `spec.rollout.multi_turn` with its tools built (None when
        it is null); an InputError naming the field for an unknown tool or a tokenizer
        without the ChatML tokens."""
        multi_turn = spec.rollout.multi_turn
        if multi_turn is None:
            return None
        if multi_turn.format != "hermes":
            raise InputError(f"{FIELD}.format: {multi_turn.format!r} is not a tool-call format: "
                             "use hermes")
        from rl_core.tools import SandboxLimits, get_tool

        sandbox = multi_turn.sandbox
        limits = SandboxLimits(cpu_time_s=sandbox.cpu_time_s, memory_mb=sandbox.memory_mb,
                               wall_time_s=sandbox.wall_time_s,
                               output_bytes=sandbox.output_bytes)
        tools: dict[str, Any] = {}
        for tool in multi_turn.tools:  # their names distinct (a spec rule)
            try:
                tools[tool.name] = get_tool(tool.name, tool.kwargs, limits)
            except (InputError, TypeError, ValueError) as exc:
                raise InputError(f"{FIELD}.tools.{len(tools)}: {exc}") from None
        missing = [t for t in ("<|im_start|>", "<|im_end|>")
                   if tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id)]
        if missing:
            raise InputError(f"{FIELD}.format: hermes writes the tools' answers as ChatML turns "
                             f"and the tokenizer has no {' or '.join(missing)} token: use a "
                             "ChatML model (Qwen2.5, Qwen3) or remove rollout.multi_turn")
        return cls(tokenizer, tools, max_turns=multi_turn.max_turns,
                   max_calls_per_turn=multi_turn.max_calls_per_turn,
                   max_tool_response_tokens=multi_turn.max_tool_response_tokens,
                   tool_concurrency=multi_turn.tool_concurrency)

    # ----------------------------------------------------------------------- rollout

    def generate(self, generate: Callable[[list[list[int]], Any, int], Batch],
                 prompts: Sequence[Sequence[int]], params: Any, seed: int = 0,
                 version: int = 0) -> Batch:
        """`params.n` multi-turn responses to each prompt (a prompt's rows adjacent, as any
        rollout), by rollout calls of every response still going until none is; the batch has
        `tool_mask`, `turns` and `tool_calls` beside the rollout columns."""
        for prompt in prompts:
            if getattr(prompt, "image", None) is not None:
                raise InputError(f"{FIELD}: multi-turn rollouts of prompts with images are not "
                                 "built yet: remove rollout.multi_turn or the images")
        buffer = PartialRollouts(params.n, params.max_new_tokens, 1, turns=self)
        buffer.add(range(len(prompts)), prompts)
        call = 0
        while rows := buffer.running():
            room = max(params.max_new_tokens - len(s.tokens) for _, s in rows)
            piece = replace(params, n=1, max_new_tokens=room)
            buffer.record(rows, generate(contexts(rows), piece, call_seed(seed, call)), version)
            call += 1
        batch = rollout_batch(buffer.pop(len(prompts)), self.tokenizer.pad_token_id)
        self.counts["responses"] += len(batch)
        self.counts["responses_calling"] += int((batch["tool_calls"] > 0).sum())
        return batch

    def answer(self, samples: Sequence[Sample], limit: int) -> None:
        """Samples whose turn just ended (status stopped): run the turn's tool calls (at most
        `tool_concurrency` at once) and append their answers, so the sample goes on; a turn
        without calls, or the `max_turns`-th, ends its sample; an answer that would reach
        `limit` tokens cuts it."""
        turns = []
        for sample in samples:
            sample.turns += 1
            text = self.tokenizer.decode(sample.tokens[sample.turn_start:],
                                         skip_special_tokens=False)
            calls = parse_calls(text)
            self.counts["turns"] += 1
            if not calls:
                continue
            self.counts["turns_with_calls"] += 1
            if sample.turns >= self.max_turns:
                self.counts["max_turns_reached"] += 1
                continue
            turns.append((sample, calls))
        jobs = [call for _, calls in turns for call in calls[:self.max_calls_per_turn]]
        if not jobs:
            return
        with ThreadPoolExecutor(min(self.tool_concurrency, len(jobs))) as pool:
            results = list(pool.map(self._run, jobs))
        for _, status, seconds in results:
            self.counts["tool_calls"] += 1
            self.counts[f"status/{status}"] += 1
            if seconds is not None:
                self.latencies.append(seconds)
        texts = iter(text for text, _, _ in results)
        for sample, calls in turns:
            answers = [next(texts) for _ in calls[:self.max_calls_per_turn]]
            answers += [f"error: at most {self.max_calls_per_turn} tool calls are answered in "
                        "one turn" for _ in calls[self.max_calls_per_turn:]]
            tokens = self._answer_tokens(answers)
            sample.tool_calls += len(calls)
            if len(sample.tokens) + len(tokens) >= limit:  # no room for the next turn
                sample.status = CUT
                self.counts["cut_by_answers"] += 1
                continue
            sample.tokens += tokens
            sample.logprobs += [0.0] * len(tokens)
            sample.tools += [1] * len(tokens)
            sample.turn_start, sample.status = len(sample.tokens), RUNNING

    def _run(self, call: ToolCall) -> tuple[str, str, float | None]:
        """(the answer text, its status, the tool's seconds) of one call (in a pool thread)."""
        if call.error is not None:
            return f"error: {call.error}", "malformed", None
        tool = self.tools.get(call.name or "")
        if tool is None:
            return (f"error: there is no tool {call.name!r}: the tools are "
                    f"{', '.join(sorted(self.tools))}", "unknown_tool", None)
        started = time.perf_counter()
        try:
            result = tool(call.arguments or {})
            text, status = result.text, result.status
        except Exception as exc:  # noqa: BLE001 - a tool's bug is the model's error text
            text, status = f"error: the tool failed ({type(exc).__name__}: {exc})", "error"
        return text, status, time.perf_counter() - started

    def _answer_tokens(self, answers: Sequence[str]) -> list[int]:
        """The user turn answering one model turn: each answer cut to
        `max_tool_response_tokens` tokens, in its ChatML wrapper."""
        tokens = list(self._start)
        for text in answers:
            body = self._encode(text)
            if len(body) > self.max_tool_response_tokens:
                mark = self._encode(CUT_MARK)
                body = body[:max(self.max_tool_response_tokens - len(mark), 0)] + mark
                self.counts["answers_cut"] += 1
            head, tail = ANSWER.split("{}")
            tokens += self._encode(head) + body + self._encode(tail)
        return tokens + list(self._end)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ----------------------------------------------------------------------- metrics

    def metrics(self, batch: Batch | None = None) -> dict[str, float]:
        """`rollout/turns/*` and `rollout/tools/*` of the calls since the last read (then
        reset; `call_rate` over the responses `generate` made), and of `batch` (a multi-turn
        rollout batch) where given: turns per response, the share of responses that called a
        tool, the tool tokens' share."""
        counts, self.counts = self.counts, Counter()
        latencies, self.latencies = self.latencies, []
        out = {f"rollout/tools/{key}": float(value) for key, value in counts.items()
               if key.startswith("status/")}
        out.update({
            "rollout/tools/calls": float(counts["tool_calls"]),
            "rollout/tools/latency_mean_s": sum(latencies) / max(len(latencies), 1),
            "rollout/tools/latency_max_s": max(latencies, default=0.0),
            "rollout/tools/answers_cut": float(counts["answers_cut"]),
            "rollout/turns/max_turns_reached": float(counts["max_turns_reached"]),
            "rollout/turns/cut_by_answers": float(counts["cut_by_answers"]),
        })
        if counts["responses"]:  # those of `generate` (validation's, say)
            out["rollout/tools/call_rate"] = counts["responses_calling"] / counts["responses"]
        if batch is not None and "tool_mask" in batch:
            mask = batch.response_mask.float()
            out["rollout/turns/mean"] = float(batch["turns"].float().mean())
            out["rollout/tools/call_rate"] = float((batch["tool_calls"] > 0).float().mean())
            out["rollout/tools/calls_per_response"] = float(batch["tool_calls"].float().mean())
            out["rollout/tools/token_frac"] = float(
                (batch["tool_mask"].float() * mask).sum() / mask.sum().clamp(min=1))
        return out


class MultiTurnRollout:
    """A rollout engine (`generate(prompts, params, generator)`) whose responses are
    multi-turn: `turns.generate` over `engine`, each call seeded from `generator` (the
    `python -m rl_core eval --tools` path)."""

    def __init__(self, engine: Any, turns: MultiTurn) -> None:
        self.engine, self.turns = engine, turns

    def generate(self, prompts: Sequence[Sequence[int]], params: Any,
                 generator: Any = None) -> Batch:
        import torch

        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if params.do_sample else 0

        def call(ids: list[list[int]], piece: Any, seed: int) -> Batch:
            return self.engine.generate(ids, piece, torch.Generator().manual_seed(seed))

        return self.turns.generate(call, prompts, params, seed)


def call_seed(seed: int, call: int) -> int:
    """The seed of rollout call `call` of a multi-turn rollout seeded `seed`: the first call
    takes `seed` itself, each later one its own."""
    if call == 0:
        return seed
    import hashlib

    digest = hashlib.blake2b(f"{seed}:turn:{call}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def loss_mask(response_mask: Any, tool_mask: Any | None) -> Any:
    """The tokens that carry a loss: the response's, less the tools' (`tool_mask`)."""
    return response_mask if tool_mask is None else response_mask * (1 - tool_mask)


def turn_parts(tokenizer: Any, response_ids: Any, response_mask: Any, tool_mask: Any
               ) -> list[dict[str, str]]:
    """A multi-turn response as its parts in order, `{"role": "model" | "tool", "text": ...}`:
    the runs of the model's tokens and of the tools' (`tool_mask`), each decoded without
    special tokens (the sample viewer's `turns`)."""
    ids = response_ids[response_mask.bool()].tolist()
    tools = tool_mask[response_mask.bool()].tolist()
    parts: list[dict[str, str]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or tools[end] != tools[start]:
            text = tokenizer.decode(ids[start:end], skip_special_tokens=True).strip()
            if tools[start]:  # the answers without their ChatML wrapper
                text = "\n".join(ANSWERED.findall(text)) or text
            parts.append({"role": "tool" if tools[start] else "model", "text": text})
            start = end
    return parts
