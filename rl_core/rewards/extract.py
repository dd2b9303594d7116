"""Finding the final answer in a response: after the reasoning, in a tag, a box, a `####` line.

Every function is linear in the text length (no backtracking regular expressions over the whole
response), so a megabyte of output costs milliseconds, not minutes.

    extract_answer("<think>2+2 is 4</think><answer>The answer is \\boxed{4}.</answer>")  # "4"
    extract_answer("... so she pays $1,000.\\n#### 1,000")                                # "1,000"
    extract_answer("<think>unfinished")                                                 # None
"""

from __future__ import annotations

import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

# A plain number: thousands-grouped or not, optional decimals, optional "/ denominator" and "%".
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(
    r"(?P<sign>-\s?)?(?:"
    r"\\[dt]?frac\{\s*-?\d+\s*\}\{\s*\d+\s*\}"  # \frac{1}{2}, \dfrac{-3}{4}
    rf"|{_UNSIGNED}(?:\s*/\s*\d+)?(?:\s*\\?%)?"  # 1,000.5  3/4  50%  50\%
    r")"
)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*(?:(\{)|\s([^\s${}]+))")
_PROSE_RE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}")
_LEAD_IN_RE = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", re.IGNORECASE)


def strip_reasoning(text: str) -> str | None:
    """The text after the last `</think>`; the whole text when there is no think block; None when
    a `<think>` is never closed (the response was cut off while reasoning)."""
    end = text.rfind(THINK_CLOSE)
    if end >= 0:
        return text[end + len(THINK_CLOSE) :]
    return None if THINK_OPEN in text else text


def answer_tag(text: str) -> str | None:
    """The content of the last closed `<answer>…</answer>`, or None."""
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    return None if start < 0 else text[start + len(ANSWER_OPEN) : end]


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each `{` -> index of its `}`; escaped braces (`\\{`) are text, not structure."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(text):
        if ch not in "{}" or (i and text[i - 1] == "\\"):
            continue
        if ch == "{":
            stack.append(i)
        elif stack:
            pairs[stack.pop()] = i
    return pairs


def last_boxed(text: str) -> str | None:
    """The content of the last well-formed `\\boxed{…}` (or `\\fbox{…}`, `\\boxed 5`), nested
    braces included; a box whose braces never close is skipped."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    pairs: dict[int, int] | None = None
    found = None
    for m in _BOX_RE.finditer(text):
        if m.group(2) is not None:
            found = m.group(2)
            continue
        pairs = _matching_braces(text) if pairs is None else pairs
        close = pairs.get(m.start(1))
        if close is not None:
            found = text[m.start(1) + 1 : close]
    return found


def gsm8k_answer(text: str) -> str | None:
    """What follows the last `####` (GSM8K style) on its line: its first number if it has one."""
    at = text.rfind("####")
    if at < 0:
        return None
    line = text[at + 4 :].split("\n", 1)[0].strip()
    number = _NUMBER_RE.search(line)
    return _clean_number(number.group(0)) if number else (line or None)


def last_number(text: str) -> str | None:
    """The last number in the text: `-3`, `1,000`, `2.5`, `3/4`, `50%`, `\\frac{1}{2}`.

    A minus sign counts only when it is not a binary minus (`5-3` ends with `3`, not `-3`)."""
    found = None
    for m in _NUMBER_RE.finditer(text):
        found = m
    if found is None:
        return None
    value = _clean_number(found.group(0))
    if found.group("sign") and found.start() > 0 and (text[found.start() - 1].isalnum()
                                                       or text[found.start() - 1] in ")]}"):
        value = value.lstrip("-").lstrip()
    return value


def _clean_number(s: str) -> str:
    return s.replace(" ", "")


def _tag_answer(content: str) -> str:
    """The answer written inside an answer tag: a box, a `####` line, the content itself when it
    reads as a formula, else (prose such as "The total is 42 apples") its last number."""
    inner = last_boxed(content) or gsm8k_answer(content)
    if inner is not None:
        return inner
    content = _LEAD_IN_RE.sub("", content.strip()).rstrip(".").strip()
    if _PROSE_RE.search(_strip_text_macros(content)):
        return last_number(content) or content
    return content


def _strip_text_macros(s: str) -> str:
    """Drop `\\text{…}` / `\\mathrm{…}` contents (units) before looking for prose."""
    return re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}", "", s)


def extract_answer(completion: str, *, ignore_think: bool = True) -> str | None:
    """The final answer of a response, in this order of preference:

    1. with `ignore_think`, only the text after the last `</think>` counts (an unclosed `<think>`
       has no answer): numbers in the reasoning are not the answer;
    2. the last `<answer>…</answer>` (and within it a box, a `####` line or the content);
    3. the last `\\boxed{…}`;
    4. the last `#### …` line;
    5. the last number.
    """
    text = strip_reasoning(completion) if ignore_think else completion
    if not text:
        return None
    tagged = answer_tag(text)
    if tagged is not None:
        return _tag_answer(tagged) or None
    return last_boxed(text) or gsm8k_answer(text) or last_number(text)
