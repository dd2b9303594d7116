"""Multi-turn rollouts (`rl_core.rollout.turns`): tool calls parsed from a turn, answers appended
as tokens (token in, token out), the tools' tokens out of the loss, the turn and length limits,
and the spec's refusals."""

import json
from dataclasses import dataclass

import pytest
import torch

from rl_core.data.partial import CUT, RUNNING, STOPPED, PartialRollouts, contexts, rollout_batch
from rl_core.data.prompts import response_batch
from rl_core.models.tokenizer import build_tiny_tokenizer
from rl_core.recipes.rl import token_level_rewards
from rl_core.rollout.turns import (
    ANSWERS_END,
    ANSWERS_START,
    MultiTurn,
    call_seed,
    hermes_call,
    loss_mask,
    parse_calls,
    turn_parts,
)
from rl_core.spec import SpecError, resolve_spec

TOKENIZER = build_tiny_tokenizer()
EOS = TOKENIZER.convert_tokens_to_ids("<|im_end|>")
PAD = TOKENIZER.pad_token_id


@dataclass(frozen=True)
class Answer:
    text: str
    status: str


class Reverse:
    """A user tool: answers its `text` argument reversed; `fail` raises."""

    name = "reverse"

    def schema(self):
        return {"type": "function", "function": {"name": "reverse", "parameters": {}}}

    def __call__(self, arguments):
        if arguments.get("fail"):
            raise RuntimeError("broken tool")
        return Answer(str(arguments.get("text", ""))[::-1], "ok")


def call(name="reverse", **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def encode(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def turn(text: str, eos: bool = True) -> list[int]:
    return encode(text) + ([EOS] if eos else [])


def pieces(tokens: list[list[int]]):
    """A rollout call's batch (n = 1): row i generated `tokens[i]`, log-prob -0.5 each;
    finished where the piece ends with eos."""
    batch = response_batch([[1]] * len(tokens), tokens, PAD)
    batch["logprobs"] = -0.5 * batch.response_mask.float()
    batch["finished"] = torch.tensor([bool(t) and t[-1] == EOS for t in tokens])
    return batch


def turns(**kw) -> MultiTurn:
    return MultiTurn(TOKENIZER, {"reverse": Reverse()}, **kw)


def buffer(turns_: MultiTurn, samples: int = 1, max_new_tokens: int = 400) -> PartialRollouts:
    buf = PartialRollouts(samples, max_new_tokens, 1, turns=turns_)
    buf.add([0], [[7, 8]])
    return buf


def test_tool_calls_are_parsed_from_a_turn_and_malformed_ones_named():
    assert hermes_call("calculator", {"expression": "12*34"}) == (
        '<tool_call>{"name":"calculator","arguments":{"expression":"12*34"}}</tool_call>')
    (written,) = parse_calls(hermes_call("calculator", {"expression": "12*34"}))
    assert (written.name, written.arguments) == ("calculator", {"expression": "12*34"})
    assert parse_calls("no call here") == []
    (one,) = parse_calls("let me see " + call(text="abc"))
    assert (one.name, one.arguments, one.error) == ("reverse", {"text": "abc"}, None)
    assert [c.arguments for c in parse_calls(call(text="a") + call(text="b"))] == [
        {"text": "a"}, {"text": "b"}]
    # arguments written as a JSON string are read as the object
    (stringy,) = parse_calls('<tool_call>{"name": "reverse", "arguments": "{\\"text\\": 1}"}'
                             "</tool_call>")
    assert stringy.arguments == {"text": 1}
    errors = [c.error for c in parse_calls("<tool_call>{oops}</tool_call>"
                                           '<tool_call>{"arguments": {}}</tool_call>'
                                           '<tool_call>{"name": "x", "arguments": 3}</tool_call>'
                                           "<tool_call>{")]
    assert "not JSON" in errors[0] and 'no "name"' in errors[1]
    assert '"arguments" is not an object' in errors[2] and "not closed" in errors[3]


def test_the_trained_tokens_are_the_generated_ones_and_the_answers_tokens_in_order():
    multi = turns()
    buf = buffer(multi)
    first, second = turn("I will ask. " + call(text="abc")), turn("<answer>cba</answer>")
    rows = buf.running()
    assert buf.record(rows, pieces([first]), 0) == (0, 0)  # answered: it goes on
    (sample,) = buf.groups[0].samples
    answer = encode(ANSWERS_START + "<tool_response>\ncba\n</tool_response>" + ANSWERS_END)
    assert sample.tokens == first + answer and sample.status == RUNNING
    assert sample.tools == [0] * len(first) + [1] * len(answer)
    assert contexts(buf.running()) == [[7, 8] + first + answer]  # the next turn's prompt
    assert buf.record(buf.running(), pieces([second]), 0) == (1, 0)
    assert sample.status == STOPPED and (sample.turns, sample.tool_calls) == (2, 1)

    batch = rollout_batch(buf.pop(1), PAD)
    length = len(first) + len(answer) + len(second)
    # exactly the generated tokens and the answer's tokens, never decoded and encoded again
    assert batch.response_ids[0, :length].tolist() == first + answer + second
    assert batch["tool_mask"][0].tolist() == [0] * len(first) + [1] * len(answer) + [0] * len(
        second)
    assert batch.logprobs[0].tolist() == [-0.5] * len(first) + [0.0] * len(answer) + [
        -0.5] * len(second)
    assert batch["turns"].tolist() == [2] and batch["tool_calls"].tolist() == [1]
    assert bool(batch.finished[0])
    assert turn_parts(TOKENIZER, batch.response_ids[0], batch.response_mask[0],
                      batch["tool_mask"][0]) == [
        {"role": "model", "text": "I will ask. " + call(text="abc")},
        {"role": "tool", "text": "cba"}, {"role": "model", "text": "<answer>cba</answer>"}]
    metrics = multi.metrics(batch)
    assert metrics["rollout/tools/calls"] == 1 and metrics["rollout/tools/status/ok"] == 1
    assert metrics["rollout/tools/call_rate"] == 1 and metrics["rollout/turns/mean"] == 2
    assert metrics["rollout/tools/token_frac"] == pytest.approx(len(answer) / length)


def test_the_tools_tokens_carry_no_loss_and_the_reward_sits_on_the_models_last_token():
    response_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    tool_mask = torch.tensor([[0, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    mask = loss_mask(response_mask, tool_mask)
    assert mask.tolist() == [[1, 0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]]
    assert loss_mask(response_mask, None) is response_mask
    rewards = token_level_rewards(torch.tensor([2.0, 3.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 0, 0, 2, 0], [0, 0, 3, 0, 0, 0, 0]]
    # a turn ending in an answer (its last token a tool's): the reward on the model's last
    ends_on_tool = torch.tensor([[1, 1, 0, 0]])
    assert token_level_rewards(torch.tensor([1.0]), ends_on_tool).tolist() == [[0, 1, 0, 0]]


def test_malformed_calls_unknown_tools_and_failing_tools_are_answered_and_the_rollout_goes_on():
    multi = turns()
    buf = PartialRollouts(1, 600, 1, turns=multi)
    buf.add([0, 1, 2], [[7], [8], [9]])
    calls = [turn("<tool_call>{not json}</tool_call>"), turn(call("search", q="x")),
             turn(call(fail=True))]
    buf.record(buf.running(), pieces(calls), 0)
    texts = [TOKENIZER.decode(s.tokens[len(c):]) for c, (_, s) in zip(calls, buf.running())]
    assert "not JSON" in texts[0]
    assert "there is no tool 'search': the tools are reverse" in texts[1]
    assert "the tool failed (RuntimeError: broken tool)" in texts[2]
    assert all(s.status == RUNNING for g in buf.groups for s in g.samples)
    metrics = multi.metrics()
    assert (metrics["rollout/tools/status/malformed"], metrics["rollout/tools/status/unknown_tool"],
            metrics["rollout/tools/status/error"]) == (1, 1, 1)


def test_the_last_turn_ends_the_response_and_answers_that_leave_no_room_cut_it():
    multi = turns(max_turns=2)
    buf = buffer(multi)
    buf.record(buf.running(), pieces([turn(call(text="a"))]), 0)
    buf.record(buf.running(), pieces([turn(call(text="b"))]), 0)  # the 2nd turn: unanswered
    (sample,) = buf.groups[0].samples
    assert sample.status == STOPPED and sample.tool_calls == 1 and sample.turns == 2
    assert multi.metrics()["rollout/turns/max_turns_reached"] == 1

    first = turn(call(text="a"))
    tight = buffer(turns(), max_new_tokens=len(first) + 10)  # the answer alone is longer
    tight.record(tight.running(), pieces([first]), 0)
    (cut,) = tight.groups[0].samples
    assert cut.status == CUT and cut.tokens == first  # no partial answer appended


def test_long_answers_are_cut_to_their_token_limit_and_pieces_to_the_room_left():
    multi = turns(max_tool_response_tokens=16)
    buf = buffer(multi, max_new_tokens=300)
    first = turn(call(text="x" * 100))
    buf.record(buf.running(), pieces([first]), 0)
    (sample,) = buf.groups[0].samples
    answer = TOKENIZER.decode(sample.tokens[len(first):])
    assert "x" * 7 + " ...(cut)" in answer and "x" * 17 not in answer
    assert multi.metrics()["rollout/tools/answers_cut"] == 1
    room = 300 - len(sample.tokens)
    buf.record(buf.running(), pieces([[65] * (room + 5)]), 0)  # longer than the room left
    assert sample.status == CUT and len(sample.tokens) == 300


def test_several_calls_in_one_turn_are_answered_in_order_up_to_the_limit():
    multi = turns(max_calls_per_turn=2)
    buf = buffer(multi)
    first = turn(call(text="ab") + call(text="cd") + call(text="ef"))
    buf.record(buf.running(), pieces([first]), 0)
    (sample,) = buf.groups[0].samples
    answer = TOKENIZER.decode(sample.tokens[len(first):])
    assert answer.index("ba") < answer.index("dc")
    assert "at most 2 tool calls are answered in one turn" in answer
    assert sample.tool_calls == 3


def test_a_multi_turn_rollout_calls_generate_for_the_responses_still_going():
    """`MultiTurn.generate` over a rollout function that answers each context: the first call
    has every sample, later calls only those whose turn called a tool, each its own seed."""
    multi = turns()
    seen = []

    def generate(ids, params, seed):
        seen.append((len(ids), params.n, params.max_new_tokens, seed))
        rows = []
        for context in ids:
            asked = TOKENIZER.decode(context)
            if "<tool_response>" in asked:
                rows.append(turn("<answer>done</answer>"))
            elif context[-1] == 7:  # the first prompt's samples call the tool
                rows.append(turn(call(text="hi")))
            else:
                rows.append(turn("<answer>no tool</answer>"))
        return pieces(rows)

    from rl_core.rollout.sampling import SamplingParams

    params = SamplingParams(n=2, max_new_tokens=200)
    batch = multi.generate(generate, [[5, 7], [5, 6]], params, seed=11)
    answer = encode(ANSWERS_START + "<tool_response>\nih\n</tool_response>" + ANSWERS_END)
    room = 200 - len(turn(call(text="hi"))) - len(answer)
    assert [s[:3] for s in seen] == [(4, 1, 200), (2, 1, room)]
    assert seen[0][3] == 11 and seen[1][3] == call_seed(11, 1) != 11
    assert batch.prompt_index.tolist() == [0, 0, 1, 1]
    assert batch["tool_calls"].tolist() == [1, 1, 0, 0]
    assert batch["tool_mask"][2:].sum() == 0 and batch["tool_mask"][:2].sum() > 0
    texts = TOKENIZER.batch_decode([batch.response_ids[i, :n] for i, n in
                                    enumerate(batch.response_lengths.tolist())],
                                   skip_special_tokens=True)
    assert texts[0].endswith("<answer>done</answer>") and "ih" in texts[0]
    assert texts[2] == "<answer>no tool</answer>"


def test_the_spec_refuses_multi_turn_where_it_cannot_run():
    tools = {"tools": [{"name": "calculator"}]}
    base = {"model": {"path": "tiny:small"}, "data": {"synthetic": {"task": "addition"}}}
    spec = resolve_spec({**base, "rollout": {"multi_turn": tools}})
    assert spec.rollout.multi_turn.max_turns == 4
    assert spec.rollout.multi_turn.sandbox.wall_time_s == 10.0
    for extra, field in (({"advantage": {"dynamic_sampling": {"enable": True}}},
                          "rollout.multi_turn"),
                         ({"trainer": {"max_staleness": 1}}, "rollout.multi_turn"),
                         ({"rollout": {"multi_turn": {"tools": [{"name": "calculator"}] * 2}}},
                          "rollout.multi_turn.tools.1.name")):
        with pytest.raises(SpecError) as err:
            resolve_spec({**base, "rollout": {"multi_turn": tools}, **extra})
        assert field in str(err.value)
    with pytest.raises(SpecError, match="rollout.multi_turn.tools"):
        resolve_spec({**base, "rollout": {"multi_turn": {"tools": []}}})


def test_the_calculator_transcripts_are_the_tokens_a_multi_turn_rollout_makes():
    """The warm start's supervised examples (`calculator_transcripts`) in the rollout's own
    tokens: the second turn's prompt is the first's, the call, eos and the answers' tokens as
    `MultiTurn` appends them; a `direct` share answers at once."""
    from rl_core.data.synthetic import arithmetic_problems, calculator_transcripts
    from rl_core.data.templates import render_prompt
    from rl_core.tools import get_tool

    problems = arithmetic_problems("*", 40, seed=3, digits=4, low=1000)
    rows = calculator_transcripts(problems, lambda q: render_prompt(q, "chat", TOKENIZER),
                                  direct=0.25, seed=2)
    direct = [r for r in rows if r["answer"].startswith("<answer>") and
              "<tool_response>" not in r["prompt"]]
    assert 0 < len(direct) < 20 and len(rows) == 2 * 40 - len(direct)
    multi = MultiTurn(TOKENIZER, {"calculator": get_tool("calculator")})
    first, second = next((a, b) for a, b in zip(rows, rows[1:])
                         if a["answer"].startswith("<tool_call>"))
    (call,) = parse_calls(first["answer"])
    answer = get_tool("calculator")(call.arguments).text
    assert encode(second["prompt"]) == (encode(first["prompt"]) + turn(first["answer"])
                                        + multi._answer_tokens([answer]))
    assert second["answer"] == f"<answer>{answer}</answer>"
