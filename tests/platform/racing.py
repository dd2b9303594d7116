"""Races on PostgreSQL: several threads, each on its own database connection, held up behind a
row lock of another connection until every one of them waits on a lock, then let go at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
from django.db import connection


def lock_row(table: str, row_id: int):
    """A connection of its own holding the row's lock (FOR UPDATE) until it commits."""
    settings = connection.settings_dict
    conn = psycopg.connect(dbname=settings["NAME"], user=settings["USER"],
                           password=settings["PASSWORD"], host=settings["HOST"],
                           port=settings["PORT"] or 5432)
    conn.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", (row_id,))
    return conn


def wait_for_blocked(conn, count: int, outcomes: list, timeout: float = 20.0) -> None:
    """Until `count` sessions of the test database wait on a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn.execute("SELECT pg_stat_clear_snapshot()")  # the view is frozen within a transaction
        blocked = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = %s",
            (connection.settings_dict["NAME"],),
        ).fetchone()[0]
        if blocked >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} racers never blocked on the row lock: {outcomes}")


def race(racers: list[Callable[[], str]], table: str, row_id: int, timeout: float = 60) -> list[str]:
    """Run each racer in a thread of its own while `table`'s row `row_id` is locked, release it
    once all of them wait, and return their outcomes in the racers' order: what each returned,
    or the repr of what it raised (which no assertion on outcomes expects)."""
    outcomes: list[str | None] = [None] * len(racers)

    def run(index: int) -> None:
        try:
            outcomes[index] = racers[index]()
        except Exception as exc:  # noqa: BLE001 - surfaces in the caller's assertion
            outcomes[index] = repr(exc)
        finally:
            connection.close()  # each thread has its own database connection

    locker = lock_row(table, row_id)
    threads = [threading.Thread(target=run, args=(i,), name=f"racer-{i}")
               for i in range(len(racers))]
    for thread in threads:
        thread.start()
    try:
        wait_for_blocked(locker, len(racers), outcomes)
    finally:
        locker.commit()
        locker.close()
    for thread in threads:
        thread.join(timeout=timeout)
    return outcomes
