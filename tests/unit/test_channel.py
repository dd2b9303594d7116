"""The data channel: readiness, ordering, chunking, per-stage consumption, padding and errors."""

import random
import re
import threading

import pytest
import torch

from rl_core.data.channel import Chunk, DataChannel, drain, fetch, pad_stack


def channel(num_rows=6, *, ordered=True, **columns) -> DataChannel:
    ch = DataChannel(ordered=ordered)
    ch.new_batch(num_rows, columns or {"a": torch.arange(num_rows)})
    return ch


def put_b(ch: DataChannel, rows) -> None:
    ch.put(rows, {"b": torch.tensor([10 * r for r in rows])})


# ----------------------------------------------------------------------------- readiness


def test_a_row_is_ready_only_once_every_needed_column_is_written():
    ch = channel(4)
    assert ch.ready("s", ["a", "b"]) == 0
    assert ch.get("s", ["a", "b"], 4) is None
    put_b(ch, [0, 1])
    ch.put([0], {"c": ["x"]})
    assert ch.ready("s", ["a", "b"]) == 2
    assert ch.ready("s", ["a", "b", "c"]) == 1
    chunk = ch.get("s", ["a", "b", "c"], 4)
    assert chunk.rows == [0]
    assert chunk.columns["a"].tolist() == [0] and chunk.columns["b"].tolist() == [0]
    assert chunk.columns["c"] == ["x"]
    assert set(chunk.columns) == {"a", "b", "c"}


def test_a_column_nobody_wrote_yet_is_simply_not_ready():
    ch = channel(3)
    assert ch.ready("s", ["later"]) == 0
    assert ch.missing("s", ["a", "later"]) == {"a": 0, "later": 3}


# ------------------------------------------------------------------------------ ordering


def test_ordered_mode_never_hands_out_a_row_before_the_rows_below_it():
    ch = channel(6)
    put_b(ch, [3, 4, 5])  # the later rows are ready first
    assert ch.ready("s", ["b"]) == 0
    assert ch.get("s", ["b"], 6) is None
    put_b(ch, [1])
    assert ch.get("s", ["b"], 6) is None  # row 0 still missing
    put_b(ch, [0])
    assert ch.get("s", ["b"], 6).rows == [0, 1]  # 2 is not ready: stop before it
    put_b(ch, [2])
    chunk = ch.get("s", ["b"], 6)
    assert chunk.rows == [2, 3, 4, 5]
    assert chunk.columns["b"].tolist() == [20, 30, 40, 50]


def test_unordered_mode_hands_out_any_ready_rows_lowest_first():
    ch = channel(6, ordered=False)
    put_b(ch, [5, 3, 4])
    assert ch.ready("s", ["b"]) == 3
    assert ch.get("s", ["b"], 2).rows == [3, 4]
    put_b(ch, [0])
    assert ch.get("s", ["b"], 6).rows == [0, 5]


@pytest.mark.parametrize("seed", range(5))
def test_ordered_chunks_do_not_depend_on_the_order_rows_were_written(seed):
    # With min_rows == max_rows a stage always sees the same chunks: 0-2, 3-5, 6 (the tail).
    ch = channel(7)
    order = list(range(7))
    random.Random(seed).shuffle(order)
    seen = []
    for row in order:
        put_b(ch, [row])
        while (chunk := ch.get("s", ["b"], 3, min_rows=3)) is not None:
            seen.append(chunk.rows)
    assert seen == [[0, 1, 2], [3, 4, 5], [6]]


# ------------------------------------------------------------------------------ chunking


def test_chunks_are_at_most_max_rows_and_the_tail_is_shorter():
    ch = channel(7)
    sizes = []
    while (chunk := ch.get("s", ["a"], 3)) is not None:
        sizes.append(len(chunk))
    assert sizes == [3, 3, 1]
    assert ch.done("s")


def test_min_rows_waits_for_enough_rows_unless_they_are_all_that_remains():
    ch = channel(5)
    put_b(ch, [0, 1])
    assert ch.get("s", ["b"], 4, min_rows=3) is None
    put_b(ch, [2])
    assert ch.get("s", ["b"], 4, min_rows=3).rows == [0, 1, 2]
    put_b(ch, [3])
    assert ch.get("s", ["b"], 4, min_rows=3) is None  # row 4 is still to come
    put_b(ch, [4])
    assert ch.get("s", ["b"], 4, min_rows=3).rows == [3, 4]  # the tail: all that remains


@pytest.mark.parametrize("max_rows, min_rows", [(0, 1), (2, 3), (2, 0)])
def test_bad_chunk_sizes_are_refused(max_rows, min_rows):
    with pytest.raises(ValueError, match=f"min_rows={min_rows}, max_rows={max_rows}"):
        channel().get("s", ["a"], max_rows, min_rows=min_rows)


def test_needs_must_be_a_list_not_one_string():
    with pytest.raises(TypeError, match="list of column names"):
        channel().get("s", "a", 2)


# --------------------------------------------------------------------------- consumption


def test_each_stage_sees_each_row_exactly_once_and_stages_are_independent():
    ch = channel(5, ordered=False)
    seen = {"x": [], "y": []}
    for _ in range(4):  # interleaved: x in chunks of 2, y in chunks of 3, past the end
        for stage, size in (("x", 2), ("y", 3)):
            if (chunk := ch.get(stage, ["a"], size)) is not None:
                seen[stage].append(chunk.rows)
    assert seen == {"x": [[0, 1], [2, 3], [4]], "y": [[0, 1, 2], [3, 4]]}
    assert ch.done("x") and ch.done("y") and not ch.done("z")
    assert ch.remaining("z") == 5


def test_remaining_counts_down_as_a_stage_consumes():
    ch = channel(5)
    assert ch.remaining("s") == 5
    ch.get("s", ["a"], 2)
    assert (ch.remaining("s"), ch.remaining("other")) == (3, 5)
    assert ch.missing("s", ["a", "b"]) == {"a": 0, "b": 3}


# ------------------------------------------------------------------------------- values


def test_tensors_of_different_widths_are_right_padded_with_zeros():
    ch = channel(3)
    ch.put([0, 1], {"resp": torch.tensor([[1, 2], [3, 4]])})
    ch.put([2], {"resp": torch.tensor([[5, 6, 7, 8]])})
    expected = [[1, 2, 0, 0], [3, 4, 0, 0], [5, 6, 7, 8]]
    assert ch.get("s", ["resp"], 3).columns["resp"].tolist() == expected
    assert ch.column("resp").tolist() == expected
    assert ch.column("resp").dtype == torch.int64


def test_padding_applies_to_every_trailing_dimension():
    out = pad_stack([torch.ones(1, 3), torch.ones(2, 1)])
    # row 0: 1 row of 3 ones padded to (2, 3); row 1: 2 rows of 1 one padded to (2, 3)
    assert out.tolist() == [[[1, 1, 1], [0, 0, 0]], [[1, 0, 0], [1, 0, 0]]]


def test_the_channel_keeps_its_own_copy_of_written_tensors():
    values = torch.zeros(2)
    ch = channel(2, v=values)
    values += 5
    chunk = ch.get("s", ["v"], 2)
    chunk.columns["v"] += 1
    assert ch.column("v").tolist() == [0.0, 0.0]


def test_list_columns_come_back_as_lists_in_row_order():
    ch = channel(3, text=["x", "y", "z"])
    ch.put([2, 0, 1], {"score": [0.2, 0.0, 0.1]})
    assert ch.get("s", ["text", "score"], 3).columns == {
        "text": ["x", "y", "z"],
        "score": [0.0, 0.1, 0.2],
    }
    assert ch.column("score") == [0.0, 0.1, 0.2]
    assert ch.columns() == ["text", "score"]


def test_stats_count_rows_traffic_and_tensor_bytes():
    ch = channel(4, a=torch.zeros(4, 2), t=list("abcd"))  # 8 float32 values = 32 bytes
    ch.get("s", ["a"], 3)
    assert ch.stats() == {
        "rows": 4.0,
        "columns": 2.0,
        "puts": 1.0,
        "gets": 1.0,
        "rows_out": 3.0,
        "tensor_bytes": 32.0,
        "batches": 1.0,
    }


# ------------------------------------------------------------------------------- errors


def test_writing_a_value_twice_names_the_column_and_row_and_writes_nothing():
    ch = channel(3)
    put_b(ch, [1])
    with pytest.raises(ValueError, match=r"column 'b' already has a value for row 1"):
        ch.put([0, 1], {"c": [1, 2], "b": torch.tensor([0, 0])})
    assert ch.columns() == ["a", "b"]  # 'c' was not written either
    with pytest.raises(ValueError, match=r"column 'a' already has a value for row 2"):
        ch.put([2], {"a": torch.tensor([7])})


def test_an_unknown_row_is_named():
    ch = channel(3)
    with pytest.raises(ValueError, match=r"put \['b'\]: row 3 is not in the batch \(rows 0..2\)"):
        ch.put([0, 3], {"b": [1, 2]})
    with pytest.raises(ValueError, match="row -1 is not in the batch"):
        ch.put([-1], {"b": [1]})
    with pytest.raises(ValueError, match="call new_batch first"):
        DataChannel().put([0], {"b": [1]})


def test_a_row_listed_twice_in_one_put_is_refused():
    with pytest.raises(ValueError, match=r"rows \[1\] are listed more than once"):
        channel(3).put([1, 1], {"b": [1, 2]})


@pytest.mark.parametrize(
    "value, message",
    [
        (torch.zeros(3, 2), "column 'b': 3 values for 2 rows"),
        (["x"], "column 'b': 1 values for 2 rows"),
        (torch.tensor(1.0), "column 'b': a 0-d tensor for 2 rows"),
    ],
)
def test_a_length_mismatch_names_the_column(value, message):
    with pytest.raises(ValueError, match=message):
        channel(3).put([0, 1], {"b": value})


def test_a_column_keeps_its_kind_dtype_and_rank():
    ch = channel(3)
    ch.put([0], {"b": torch.zeros(1, 4)})
    with pytest.raises(
        ValueError,
        match=re.escape("column 'b' holds a tensor (torch.float32, 1-d rows), got a list"),
    ):
        ch.put([1], {"b": [[0.0] * 4]})
    with pytest.raises(ValueError, match=re.escape("got a tensor (torch.int64, 1-d rows)")):
        ch.put([1], {"b": torch.zeros(1, 4, dtype=torch.long)})
    with pytest.raises(TypeError, match="column 'b': values must be a tensor or a list, got dict"):
        ch.put([1], {"b": {"x": 1}})


def test_an_incomplete_or_unknown_column_is_an_error():
    ch = channel(4)
    put_b(ch, [0, 2])
    with pytest.raises(ValueError, match="column 'b' is incomplete: 2 of 4 rows have no value"):
        ch.column("b")
    with pytest.raises(KeyError, match=r"no column 'zz'; columns: \['a', 'b'\]"):
        ch.column("zz")


def test_new_batch_drops_the_columns_and_every_stage_state():
    ch = channel(3)
    put_b(ch, [0, 1, 2])
    ch.get("s", ["a"], 3)
    ch.new_batch(2, {"p": ["u", "v"]})
    assert ch.columns() == ["p"]
    assert ch.remaining("s") == 2 and ch.ready("s", ["p"]) == 2
    assert ch.get("s", ["p"], 5).rows == [0, 1]
    assert ch.stats()["puts"] == 1.0 and ch.stats()["batches"] == 2.0
    with pytest.raises(ValueError, match="num_rows must be a positive integer, got 0"):
        ch.new_batch(0)


# ------------------------------------------------------------------------- fetch, drain


def test_fetch_reports_no_wait_when_a_chunk_is_ready_and_none_once_done():
    ch = channel(2)
    chunk, waited = fetch(ch, "s", ["a"], 5, timeout_s=1.0)
    assert (chunk.rows, waited) == ([0, 1], 0.0)
    assert fetch(ch, "s", ["a"], 5, timeout_s=1.0) == (None, 0.0)


def test_fetch_times_out_naming_the_stage_and_what_it_waits_for():
    ch = channel(4)
    put_b(ch, [0])
    with pytest.raises(TimeoutError) as err:
        fetch(ch, "train", ["a", "b", "c"], 2, timeout_s=0.05)
    message = str(err.value)
    assert "stage 'train' waited" in message
    assert "for columns ['a', 'b', 'c']: 0 rows ready (wants 1), 4 not yet consumed" in message
    assert "missing values: 'b' on 3 rows, 'c' on 4 rows" in message


def test_drain_writes_a_stages_outputs_back_chunk_by_chunk():
    ch = channel(5)
    report = drain(ch, "double", ["a"], 2, lambda c: {"b": c.columns["a"] * 2}, timeout_s=1.0)
    assert report == {"wait_s": 0.0, "chunks": 3.0, "rows": 5.0}
    assert ch.column("b").tolist() == [0, 2, 4, 6, 8]
    assert drain(ch, "read-only", ["b"], 5, lambda c: None, timeout_s=1.0)["rows"] == 5.0


def test_two_stages_in_threads_form_a_pipeline_and_the_second_waits():
    ch = channel(6)

    def slow_double(chunk: Chunk):
        threading.Event().wait(0.02)
        return {"b": chunk.columns["a"] * 2}

    reports = {}
    first = threading.Thread(
        target=lambda: reports.update(a=drain(ch, "A", ["a"], 2, slow_double, timeout_s=5))
    )
    first.start()
    reports["b"] = drain(
        ch, "B", ["b"], 4, lambda c: {"c": [x + 1 for x in c.columns["b"].tolist()]}, timeout_s=5
    )
    first.join()
    assert ch.column("c") == [1, 3, 5, 7, 9, 11]
    assert reports["a"]["rows"] == reports["b"]["rows"] == 6.0
    assert reports["b"]["wait_s"] > 0.0


def test_fetch_refuses_anything_but_a_channel_or_its_actor():
    with pytest.raises(
        TypeError, match="expected a DataChannel or a Ray actor handle of one, got dict"
    ):
        fetch({}, "s", ["a"], 2, timeout_s=1.0)


def test_a_span_takes_only_its_rows_and_is_done_when_they_are():
    channel = DataChannel()
    channel.new_batch(6, {"x": torch.arange(6)})
    seen = {}
    # the second span's caller runs first: it still gets rows 3..5 and stops there
    for span in ((3, 6), (0, 3)):
        out = drain(channel, "double", ["x"], 2, lambda c: {"y": c.columns["x"] * 2},
                    timeout_s=5, span=span)
        seen[span] = out["rows"]
    assert seen == {(3, 6): 3.0, (0, 3): 3.0}
    assert channel.column("y").tolist() == [0, 2, 4, 6, 8, 10]
    chunk, done = channel.wait_get("other", ["x"], 10, wait_s=0, span=(4, 6))
    assert chunk.rows == [4, 5] and not done
    assert channel.wait_get("other", ["x"], 10, wait_s=0, span=(4, 6)) == (None, True)
    with pytest.raises(ValueError, match=r"span \(5, 9\) is not within the batch's 6 rows"):
        channel.get("other", ["x"], 1, span=(5, 9))
