"""The data channel as a Ray actor: two stage actors drain a pipeline from it concurrently."""

import time

import pytest
import torch

from rl_core.data.channel import drain, fetch, remote_channel

ray = pytest.importorskip("ray")

ROWS = 8


@pytest.fixture(scope="module")
def channel(local_ray):
    """One channel actor for the module (each test starts with new_batch, as each step does)."""
    return remote_channel(name="channel-under-test")


@ray.remote(num_cpus=0)
class StageWorker:
    """A stage: reads column `src`, writes `dst` = f(src), sleeping `sleep_s` per chunk."""

    def ping(self) -> bool:
        return True

    def run(self, channel, stage, src, dst, chunk_size, sleep_s, as_list):
        seen = []

        def fn(chunk):
            seen.append(chunk.rows)
            time.sleep(sleep_s)
            values = chunk.columns[src]
            return {dst: [x + 1 for x in values.tolist()] if as_list else values * 2}

        report = drain(channel, stage, [src], chunk_size, fn, timeout_s=20)
        return report, seen


def test_two_stage_actors_drain_a_pipeline_and_the_downstream_one_waits(channel):
    ray.get(channel.new_batch.remote(ROWS, {"a": torch.arange(ROWS)}))
    a, b = StageWorker.remote(), StageWorker.remote()
    ray.get([a.ping.remote(), b.ping.remote()])  # both started, so B is waiting before A writes
    # A computes b = 2a slowly (4 chunks of 2, 0.15 s each); B computes c = b + 1 as it arrives.
    run_b = b.run.remote(channel, "B", "b", "c", 3, 0.0, True)
    run_a = a.run.remote(channel, "A", "a", "b", 2, 0.15, False)
    (report_a, seen_a), (report_b, seen_b) = ray.get([run_a, run_b], timeout=30)

    assert ray.get(channel.column.remote("b")).tolist() == [2 * i for i in range(ROWS)]
    assert ray.get(channel.column.remote("c")) == [2 * i + 1 for i in range(ROWS)]
    assert seen_a == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [row for rows in seen_b for row in rows] == list(
        range(ROWS)
    )  # ordered: B saw every row once, in order
    assert report_a == {"wait_s": 0.0, "chunks": 4.0, "rows": float(ROWS)}  # its input was there
    assert report_b["rows"] == float(ROWS)
    assert report_b["wait_s"] > 0.15  # at least A's first chunk
    stats = ray.get(channel.stats.remote())
    assert stats["rows_out"] == 2 * ROWS and stats["columns"] == 3.0


def test_fetch_from_an_actor_times_out_naming_the_stage_and_what_it_waits_for(channel):
    channel = ray.get_actor("channel-under-test")  # the name reaches the same actor
    ray.get(channel.new_batch.remote(4, {"a": [0, 1, 2, 3]}))
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        fetch(channel, "reward", ["a", "response"], 2, timeout_s=0.3, poll_s=0.05)
    assert time.monotonic() - start < 5
    message = str(err.value)
    assert "stage 'reward' waited" in message
    assert (
        "0 rows ready (wants 1), 4 not yet consumed; missing values: 'response' on 4 rows"
        in message
    )
