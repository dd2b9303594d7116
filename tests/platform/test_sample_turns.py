"""The sample viewer shows a multi-turn sample's turns: the model's and the tools' answers in
order, each labelled, the text escaped; a malformed `turns` cell shows nothing of itself."""

from __future__ import annotations

from types import SimpleNamespace

from django.template.loader import render_to_string

from frontend.views.runs import _turns


def viewer(columns: list[str], rows: list[list]) -> str:
    kinds = ["turns" if c == "turns" else "num" if c == "tool_calls" else "text" for c in columns]
    table = {"columns": list(zip(columns, kinds)),
             "rows": [[(_turns(cell) if kind == "turns" else cell, kind)
                       for cell, kind in zip(row, kinds)] for row in rows]}
    return render_to_string("frontend/_run_samples.html", {
        "run": SimpleNamespace(pk=1, algorithm="grpo"), "active": False, "following": False,
        "error": "", "steps": [1], "step": 1, "table": table})


def test_a_samples_turns_show_in_order_with_the_tools_answers_labelled():
    turns = [{"role": "model", "text": '<tool_call>{"name":"calculator"}</tool_call>'},
             {"role": "tool", "text": "7006652"},
             {"role": "model", "text": "<answer>7006652</answer>"}]
    html = viewer(["prompt", "turns", "tool_calls"], [["1234*5678=", turns, 1]])
    parts = html.split('data-testid="sample-turn"')[1:]
    assert len(parts) == 3
    assert "turn-model" in html.split('data-testid="sample-turn"')[0][-40:]
    assert "tool answer" in parts[1] and "7006652" in parts[1]
    assert "&lt;answer&gt;7006652&lt;/answer&gt;" in parts[2]  # escaped, never markup
    assert '<td class="num">1</td>' in html


def test_a_malformed_turns_cell_shows_nothing_of_itself():
    assert _turns("not a list") == []
    assert _turns([{"role": "system", "text": "x"}, "text", {"role": "tool"}]) == [("tool", "")]
    html = viewer(["turns"], [[[{"role": "<script>", "text": "x"}]]])
    assert 'data-testid="sample-turn"' not in html and "<script>" not in html
