"""Prompt and pair datasets: key mapping, nested keys, chat prompts, and every loading error."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rl_core.data import (
    DataError,
    get_field,
    load_pair_files,
    load_pairs,
    load_prompt_files,
    load_prompts,
    write_rows,
)
from rl_core.data.datasets import MAX_REPORTED


def write_jsonl(path: Path, lines: list) -> Path:
    """Objects become JSON lines; strings are written verbatim (for malformed lines)."""
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


MATH = [
    {"problem": "1+1?", "answer": "2", "level": 1},
    {"problem": "2*3?", "answer": "6", "level": 2},
]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_key_mapping_reads_prompt_answer_extra_and_location(tmp_path, suffix):
    path = write_rows(MATH, tmp_path / f"math.{suffix}")
    records = load_prompts(path, prompt_key="problem", answer_key="answer")
    assert [r.prompt for r in records] == ["1+1?", "2*3?"]
    assert [r.ground_truth for r in records] == ["2", "6"]
    assert records[1].extra == {"level": 2}
    assert records[1].source == str(path)
    # jsonl: 1-based line numbers; parquet: 0-based row indices.
    assert [r.row for r in records] == ([1, 2] if suffix == "jsonl" else [0, 1])
    assert records[0].where == (f"{path} line 1" if suffix == "jsonl" else f"{path} row 0")


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["", MATH[0], "   ", MATH[1]])
    assert [r.row for r in load_prompts(path, prompt_key="problem")] == [2, 4]


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_nested_keys_follow_dots_into_objects_and_lists(tmp_path, suffix):
    rows = [
        {
            "messages": [{"role": "user", "content": "hi"}],
            "reward_model": {"ground_truth": "42", "style": "rule"},
        }
    ]
    path = write_rows(rows, tmp_path / f"verl.{suffix}")
    (record,) = load_prompts(
        path, prompt_key="messages.0.content", answer_key="reward_model.ground_truth"
    )
    assert record.prompt == "hi"
    assert record.ground_truth == "42"


def test_a_field_named_with_a_dot_wins_over_the_path():
    assert get_field({"a.b": 1, "a": {"b": 2}}, "a.b") == 1
    assert get_field({"a": {"b": 2}}, "a.b") == 2
    with pytest.raises(KeyError):
        get_field({"a": {"b": 2}}, "a.c")
    with pytest.raises(KeyError):
        get_field({"a": [1]}, "a.1")


def test_chat_message_prompts_are_kept_as_messages(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    path = write_rows([{"prompt": chat, "answer": 4}], tmp_path / "chat.parquet")
    (record,) = load_prompts(path)
    assert record.prompt == chat
    assert record.ground_truth == 4  # the answer keeps its type


def test_prompts_without_answers(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}])
    assert load_prompts(path, answer_key=None)[0].ground_truth is None


def test_several_files_are_concatenated_in_order(tmp_path):
    a = write_rows(MATH[:1], tmp_path / "a.jsonl")
    b = write_rows(MATH[1:], tmp_path / "b.parquet")
    records = load_prompt_files([a, b], prompt_key="problem")
    assert [(r.prompt, Path(r.source).name) for r in records] == [
        ("1+1?", "a.jsonl"),
        ("2*3?", "b.parquet"),
    ]


# --------------------------------------------------------------------------- errors


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_prompts(tmp_path / "nope.jsonl")


def test_unsupported_extension_names_the_file_and_the_supported_types(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("prompt,answer\n")
    with pytest.raises(
        DataError, match=r"data\.csv: unsupported file type '\.csv'.*\.jsonl, \.parquet"
    ):
        load_prompts(path)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_empty_dataset(tmp_path, suffix):
    path = tmp_path / f"empty.{suffix}"
    if suffix == "jsonl":
        path.write_text("\n\n")
    else:
        pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match=rf"empty\.{suffix}: no records"):
        load_prompts(path)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_missing_key_names_the_file_key_role_count_first_row_and_fields(tmp_path, suffix):
    path = write_rows(MATH, tmp_path / f"math.{suffix}")
    with pytest.raises(DataError) as err:
        load_prompts(path, prompt_key="question", answer_key="solution")
    text = str(err.value)
    first = "line 1" if suffix == "jsonl" else "row 0"
    assert str(path) in text.splitlines()[0]
    assert f"field 'question' (prompt_key) missing in 2 of 2 records (first at {first})" in text
    assert "field 'solution' (answer_key) missing in 2 of 2" in text
    assert "fields present there: answer, level, problem" in text


def test_key_missing_in_some_rows_only(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [MATH[0], {"problem": "x"}, MATH[1]])
    with pytest.raises(
        DataError, match=r"'answer' \(answer_key\) missing in 1 of 3 records \(first at line 2\)"
    ):
        load_prompts(path, prompt_key="problem")


def test_malformed_lines_are_all_reported_with_line_numbers(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [MATH[0], "{not json", MATH[1], "[1, 2]", '"text"', MATH[0]],
    )
    with pytest.raises(DataError) as err:
        load_prompts(path, prompt_key="problem")
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: unusable records"
    assert lines[1].startswith("  line 2: invalid JSON")
    assert lines[2] == "  line 4: expected a JSON object, got list"
    assert lines[3] == "  line 5: expected a JSON object, got str"
    assert len(lines) == 4


def test_non_utf8_line_is_reported(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"line 2: not UTF-8 text"):
        load_prompts(path)


def test_bad_lines_are_listed_up_to_a_cap_and_the_rest_counted(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", ["{"] * (MAX_REPORTED + 5))
    with pytest.raises(DataError) as err:
        load_prompts(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 1 + MAX_REPORTED + 1
    assert lines[MAX_REPORTED].startswith(f"  line {MAX_REPORTED}: invalid JSON")
    assert lines[-1] == "  ... and 5 more bad records"


def test_prompt_of_the_wrong_type_names_the_line_and_key(tmp_path):
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"q": 7, "a": "7"}, {"q": [{"role": "user"}], "a": "1"}, {"q": "ok", "a": "1"}],
    )
    with pytest.raises(DataError) as err:
        load_prompts(path, prompt_key="q", answer_key="a")
    text = str(err.value)
    assert (
        "line 1: field 'q' (prompt_key) must be text or a list of {role, content} messages, got int"
        in text
    )
    assert "line 2: field 'q' (prompt_key) must be text" in text
    assert "line 3" not in text


def test_unreadable_parquet_names_the_file(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"broken\.parquet: not a readable parquet file"):
        load_prompts(path)


def test_no_files(tmp_path):
    with pytest.raises(DataError, match="no data files"):
        load_prompt_files([])


# --------------------------------------------------------------------------- pairs


PAIRS = [
    {"question": "2+2?", "good": "4", "bad": "5", "id": 7},
    {
        "question": "hi",
        "good": [{"role": "assistant", "content": "hello"}],
        "bad": [{"role": "assistant", "content": "go away"}],
        "id": 8,
    },
]


KEYS = {"prompt_key": "question", "chosen_key": "good", "rejected_key": "bad"}


def test_pairs_map_prompt_chosen_and_rejected(tmp_path):
    path = write_rows(PAIRS, tmp_path / "prefs.jsonl")
    pairs = load_pairs(path, **KEYS)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs[:1]] == [("2+2?", "4", "5")]
    assert pairs[1].chosen == [{"role": "assistant", "content": "hello"}]
    assert [p.extra for p in pairs] == [{"id": 7}, {"id": 8}]
    assert [p.row for p in pairs] == [1, 2]
    assert load_pair_files([path, path], **KEYS)[2] == pairs[0]


def test_pairs_from_parquet(tmp_path):
    # A parquet column has one type: text responses here, messages in the next file.
    text = write_rows(PAIRS[:1], tmp_path / "text.parquet")
    chat = write_rows(PAIRS[1:], tmp_path / "chat.parquet")
    first, second = load_pair_files([text, chat], **KEYS)
    assert (first.prompt, first.chosen, first.rejected, first.row) == ("2+2?", "4", "5", 0)
    assert second.rejected == [{"role": "assistant", "content": "go away"}]


def test_writing_mixed_types_to_parquet_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"mixed\.parquet: records do not fit one parquet schema"):
        write_rows(PAIRS, tmp_path / "mixed.parquet")


def test_pairs_missing_the_rejected_key(tmp_path):
    path = write_rows(PAIRS, tmp_path / "prefs.jsonl")
    with pytest.raises(
        DataError, match=r"prefs\.jsonl.*\n.*field 'rejected' \(rejected_key\) missing in 2 of 2"
    ):
        load_pairs(path, prompt_key="question", chosen_key="good")


def test_pair_response_of_the_wrong_type(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x", "chosen": None, "rejected": "y"}])
    with pytest.raises(
        DataError, match=r"line 1: field 'chosen' \(chosen_key\) must be text .* got NoneType"
    ):
        load_pairs(path)
