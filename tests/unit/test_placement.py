"""The placement function: order, aging, fit, reservation and reasons (pure, no database)."""

from __future__ import annotations

import copy
import random

import pytest

from experiments.placement import (
    ActiveRun,
    Preemption,
    preempt,
    Placement,
    QueuedRun,
    Waiting,
    effective_priority,
    place,
)

HOUR = 3600.0
NOW = 100 * HOUR


def run(id, priority=0, created_at=NOW, kind="npu", count=1, cluster=None) -> QueuedRun:
    return QueuedRun(id, priority, created_at, kind, count, cluster)


def placed(placements: list[Placement]) -> list[tuple[int, str]]:
    return [(p.run_id, p.cluster) for p in placements]


def reasons(waiting: list[Waiting]) -> dict[int, str]:
    return {w.run_id: w.reason for w in waiting}


# --- order -------------------------------------------------------------------------------------


def test_higher_priority_goes_first():
    queue = [run(1, priority=0), run(2, priority=5), run(3, priority=2)]
    placements, _ = place(queue, {"npu-a": {"npu": 8}}, now=NOW, aging_per_hour=0)
    assert [p.run_id for p in placements] == [2, 3, 1]
    # With room for one, only the highest priority starts.
    placements, waiting = place(queue, {"npu-a": {"npu": 1}}, now=NOW, aging_per_hour=0)
    assert placed(placements) == [(2, "npu-a")]
    assert [w.run_id for w in waiting] == [3, 1]


def test_same_priority_oldest_first_then_lowest_id():
    queue = [run(5, created_at=NOW - 10), run(4, created_at=NOW - 20), run(3, created_at=NOW - 10)]
    placements, _ = place(queue, {"npu-a": {"npu": 8}}, now=NOW, aging_per_hour=0)
    assert [p.run_id for p in placements] == [4, 3, 5]


def test_effective_priority_is_priority_plus_aging_times_hours():
    r = run(1, priority=3, created_at=NOW - 5 * HOUR)
    assert effective_priority(r, NOW, 1.0) == 8.0  # 3 + 1.0 * 5 h
    assert effective_priority(r, NOW, 0.5) == 5.5  # 3 + 0.5 * 5 h
    assert effective_priority(r, NOW, 0.0) == 3.0


@pytest.mark.parametrize(
    "new_queued_after, first",
    [
        # old: 0 + 1.0 * 10 h = 10 at NOW; new, priority 2, queued d hours after the old one:
        # 2 + 1.0 * (10 - d) h. Level at d = 2 h exactly, and ties go to the older run.
        (1 * HOUR, "new"),  # new: 2 + 9 = 11 > 10
        (2 * HOUR - 1, "new"),  # new: 2 + 8.00028 = 10.00028 > 10
        (2 * HOUR, "old"),  # new: 2 + 8 = 10 = 10, older first
        (2 * HOUR + 1, "old"),  # new: 2 + 7.99972 < 10
        (5 * HOUR, "old"),  # new: 2 + 5 = 7
    ],
)
def test_aging_lets_an_old_low_priority_run_overtake_a_newer_higher_priority_one(
    new_queued_after, first
):
    old = run(1, priority=0, created_at=NOW - 10 * HOUR)
    new = run(2, priority=2, created_at=NOW - 10 * HOUR + new_queued_after)
    placements, _ = place([new, old], {"npu-a": {"npu": 1}}, now=NOW)
    assert [p.run_id for p in placements] == [1 if first == "old" else 2]


def test_aging_rate_scales_the_hours_needed():
    # At 0.5 per hour a priority gap of 2 takes 4 h: queued 3 h apart the newer still wins,
    # 4 h apart they are level (older first). Without aging, priority alone decides.
    for gap, aging, winner in [(3, 0.5, 2), (4, 0.5, 1), (100, 0.0, 2)]:
        old = run(1, priority=0, created_at=NOW - gap * HOUR)
        new = run(2, priority=2, created_at=NOW)
        placements, _ = place([new, old], {"npu-a": {"npu": 1}}, now=NOW, aging_per_hour=aging)
        assert [p.run_id for p in placements] == [winner], (gap, aging)


def test_a_run_queued_after_now_ages_zero_hours_not_negative():
    future = run(1, priority=1, created_at=NOW + 2 * HOUR)  # clock skew: 1 + 0, not 1 - 2
    current = run(2, priority=0, created_at=NOW)
    placements, _ = place([current, future], {"npu-a": {"npu": 1}}, now=NOW)
    assert [p.run_id for p in placements] == [1]


# --- fit -----------------------------------------------------------------------------------------


def test_best_fit_picks_the_cluster_left_with_fewest_free_devices():
    free = {"a": {"npu": 8}, "b": {"npu": 5}, "c": {"npu": 4}}
    assert placed(place([run(1, count=4)], free, now=NOW)[0]) == [(1, "c")]  # leaves 0
    assert placed(place([run(1, count=5)], free, now=NOW)[0]) == [(1, "b")]  # leaves 0
    assert placed(place([run(1, count=3)], free, now=NOW)[0]) == [(1, "c")]  # 1 < 2 < 5 left
    assert placed(place([run(1, count=6)], free, now=NOW)[0]) == [(1, "a")]  # only fit


def test_best_fit_ties_go_to_the_first_cluster_by_name():
    free = {"z": {"npu": 4}, "b": {"npu": 4}, "m": {"npu": 4}}
    assert placed(place([run(1, count=2)], free, now=NOW)[0]) == [(1, "b")]


def test_placing_takes_devices_so_later_runs_see_what_is_left():
    free = {"a": {"npu": 8}, "b": {"npu": 4}}
    queue = [run(1, priority=3, count=4), run(2, priority=2, count=4), run(3, priority=1, count=4),
             run(4, priority=0, count=1)]
    placements, waiting = place(queue, free, now=NOW)
    # 1 -> b (leaves 0), 2 -> a (leaves 4), 3 -> a (leaves 0), 4: nothing left anywhere.
    assert placed(placements) == [(1, "b"), (2, "a"), (3, "a")]
    assert reasons(waiting) == {4: "needs 1 npu devices; largest free on any cluster: 0 (a)"}


def test_pinned_runs_use_only_their_cluster():
    free = {"npu-a": {"npu": 8}, "npu-b": {"npu": 2}}
    placements, waiting = place(
        [run(1, count=2, cluster="npu-b"), run(2, count=4, cluster="npu-b")], free, now=NOW
    )
    assert placed(placements) == [(1, "npu-b")]  # not npu-a, though it has more room
    assert reasons(waiting) == {2: "needs 4 npu devices; cluster npu-b has 0 free"}


def test_pinned_run_takes_its_cluster_even_when_another_fits_better():
    free = {"npu-a": {"npu": 8}, "npu-b": {"npu": 2}}
    placements, _ = place([run(1, count=2, cluster="npu-a")], free, now=NOW)
    assert placed(placements) == [(1, "npu-a")]


def test_device_type_must_match():
    free = {"npu-a": {"npu": 8}, "mixed": {"gpu": 2, "cpu": 64}}
    queue = [run(1, kind="gpu", count=2), run(2, kind="cpu", count=16), run(3, kind="npu", count=8),
             run(4, kind="gpu", count=1)]
    placements, waiting = place(queue, free, now=NOW)
    assert placed(placements) == [(1, "mixed"), (2, "mixed"), (3, "npu-a")]
    assert reasons(waiting) == {4: "needs 1 gpu devices; largest free on any cluster: 0 (mixed)"}


def test_free_is_not_changed():
    free = {"npu-a": {"npu": 8}, "npu-b": {"npu": 2}}
    before = copy.deepcopy(free)
    place([run(1, count=2), run(2, count=8)], free, now=NOW, total=free)
    assert free == before


# --- reasons -------------------------------------------------------------------------------------


def test_reason_when_no_cluster_has_enough_free():
    free = {"npu-a": {"npu": 4}, "npu-b": {"npu": 4}, "gpu-a": {"gpu": 8}}
    _, waiting = place([run(1, count=8)], free, now=NOW)
    assert reasons(waiting) == {1: "needs 8 npu devices; largest free on any cluster: 4 (npu-a)"}


def test_reason_when_no_cluster_has_the_kind():
    _, waiting = place([run(1, kind="npu", count=1)], {"gpu-a": {"gpu": 8}}, now=NOW)
    assert reasons(waiting) == {1: "no cluster has npu devices"}


def test_reason_when_the_pinned_cluster_lacks_the_kind_or_is_unknown():
    free = {"npu-a": {"npu": 8}, "gpu-a": {"gpu": 8}}
    queue = [run(1, cluster="gpu-a"), run(2, cluster="ghost")]
    _, waiting = place(queue, free, now=NOW)
    assert reasons(waiting) == {
        1: "cluster gpu-a has no npu devices",
        2: "cluster ghost has no capacity listed",
    }


def test_reasons_for_runs_that_can_never_fit_given_totals():
    free = {"npu-a": {"npu": 2}, "npu-b": {"npu": 8}, "down": {"npu": 0}}
    total = {"npu-a": {"npu": 8}, "npu-b": {"npu": 8}, "down": {"npu": 0}}
    queue = [run(1, count=16), run(2, count=16, cluster="npu-a"), run(3, count=1, cluster="down")]
    placements, waiting = place(queue, free, now=NOW, total=total)
    assert placements == []
    assert reasons(waiting) == {
        1: "needs 16 npu devices; largest cluster: 8 healthy (npu-a)",  # ties by name
        2: "needs 16 npu devices; cluster npu-a has 8 healthy in all",
        3: "needs 1 npu devices; cluster down has 0 healthy in all",
    }


def test_placement_limit():
    queue = [run(i, priority=-i) for i in range(1, 6)]
    free = {"npu-a": {"npu": 8}}
    placements, waiting = place(queue, free, now=NOW, max_placements=2)
    assert [p.run_id for p in placements] == [1, 2]
    assert reasons(waiting) == {i: "placement limit of 2 reached in this pass" for i in (3, 4, 5)}
    placements, waiting = place(queue, free, now=NOW, max_placements=0)
    assert placements == [] and [w.run_id for w in waiting] == [1, 2, 3, 4, 5]
    assert len(place(queue, free, now=NOW, max_placements=None)[0]) == 5


def test_empty_inputs():
    assert place([], {}, now=NOW) == ([], [])
    assert place([], {"npu-a": {"npu": 8}}, now=NOW, total={"npu-a": {"npu": 8}}) == ([], [])
    assert place([], {}, now=NOW, max_placements=0) == ([], [])
    nothing = ([], [Waiting(1, "no cluster has npu devices")])
    assert place([run(1)], {}, now=NOW) == nothing
    assert place([run(1)], {}, now=NOW, total={}) == nothing


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"aging_per_hour": -1.0}, "aging_per_hour"),
        ({"max_placements": -1}, "max_placements"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        place([run(1)], {"npu-a": {"npu": 8}}, now=NOW, **kwargs)


def test_duplicate_run_ids_are_refused():
    with pytest.raises(ValueError, match="unique"):
        place([run(1), run(1, priority=3)], {"npu-a": {"npu": 8}}, now=NOW)


# --- reservation ---------------------------------------------------------------------------------

FREE = {"npu-a": {"npu": 4, "gpu": 2}, "npu-b": {"npu": 0}}
TOTAL = {"npu-a": {"npu": 8, "gpu": 2}, "npu-b": {"npu": 8}}
BIG = run(17, priority=10, count=8)
SMALL = run(2, priority=0, count=2)


def test_without_totals_small_runs_take_what_a_blocked_big_run_waits_for():
    placements, waiting = place([BIG, SMALL], FREE, now=NOW)
    assert placed(placements) == [(2, "npu-a")]
    assert reasons(waiting) == {17: "needs 8 npu devices; largest free on any cluster: 4 (npu-a)"}


def test_with_totals_a_blocked_big_run_reserves_its_best_cluster():
    placements, waiting = place([BIG, SMALL], FREE, now=NOW, total=TOTAL)
    assert placements == []
    assert reasons(waiting) == {
        17: "needs 8 npu devices; largest free on any cluster: 4 (npu-a)",
        2: "blocked behind higher-priority run 17 (reserving npu-a)",
    }


def test_reservation_holds_one_kind_on_one_cluster():
    free = {**FREE, "npu-c": {"npu": 2}}
    total = {**TOTAL, "npu-c": {"npu": 2}}
    gpu = run(3, priority=0, kind="gpu", count=2)
    placements, waiting = place([BIG, SMALL, gpu], free, now=NOW, total=total)
    # npu-a's npu devices are held for run 17; npu-c's and npu-a's gpus are not.
    assert placed(placements) == [(2, "npu-c"), (3, "npu-a")]
    assert [w.run_id for w in waiting] == [17]


def test_the_reserved_cluster_is_the_one_with_most_free_among_those_big_enough():
    free = {"a": {"npu": 4}, "b": {"npu": 6}, "c": {"npu": 7}}
    total = {"a": {"npu": 8}, "b": {"npu": 8}, "c": {"npu": 7}}  # c can never hold 8
    queue = [BIG, run(2, count=3), run(3, count=4), run(4, count=1)]
    placements, waiting = place(queue, free, now=NOW, total=total)
    # 17 reserves b (6 free, c is too small); 2 -> a (leaves 1; c would leave 4);
    # 3 -> c (a has 1 left); 4 -> a (leaves 0; c has 3 left).
    assert placed(placements) == [(2, "a"), (3, "c"), (4, "a")]
    assert reasons(waiting) == {17: "needs 8 npu devices; largest free on any cluster: 7 (c)"}


def test_runs_that_can_never_fit_reserve_nothing():
    huge = run(1, priority=10, count=16)
    placements, waiting = place([huge, SMALL], FREE, now=NOW, total=TOTAL)
    assert placed(placements) == [(2, "npu-a")]
    assert reasons(waiting) == {1: "needs 16 npu devices; largest cluster: 8 healthy (npu-a)"}


def test_higher_priority_runs_are_not_held_back_by_a_later_reservation():
    first = run(1, priority=20, count=2)
    placements, _ = place([BIG, SMALL, first], FREE, now=NOW, total=TOTAL)
    assert placed(placements) == [(1, "npu-a")]  # before 17 reserves what is left


def test_a_blocked_run_that_does_not_fit_elsewhere_reserves_its_own_candidate():
    free = {"npu-a": {"npu": 4}, "npu-b": {"npu": 1}}
    total = {"npu-a": {"npu": 8}, "npu-b": {"npu": 8}}
    queue = [BIG, SMALL, run(3, priority=-1, count=1)]
    placements, waiting = place(queue, free, now=NOW, total=total)
    # 17 reserves npu-a; 2 would fit there, does not fit npu-b (1 free) and reserves npu-b,
    # so 3 cannot take npu-b's last device ahead of it.
    assert placements == []
    assert reasons(waiting) == {
        17: "needs 8 npu devices; largest free on any cluster: 4 (npu-a)",
        2: "blocked behind higher-priority run 17 (reserving npu-a)",
        # Both reserved clusters would hold 3; it is told about its best fit (npu-b, 0 left).
        3: "blocked behind higher-priority run 2 (reserving npu-b)",
    }


def test_pinned_runs_and_reservations():
    pinned_big = run(17, priority=10, count=8, cluster="npu-a")
    free = {"npu-a": {"npu": 4}, "npu-b": {"npu": 4}}
    total = {"npu-a": {"npu": 8}, "npu-b": {"npu": 8}}
    queue = [pinned_big, run(2, count=2, cluster="npu-a"), run(3, count=6, cluster="npu-a"),
             run(4, count=2)]
    placements, waiting = place(queue, free, now=NOW, total=total)
    assert placed(placements) == [(4, "npu-b")]
    assert reasons(waiting) == {
        17: "needs 8 npu devices; cluster npu-a has 4 free",
        2: "blocked behind higher-priority run 17 (reserving npu-a)",
        3: "needs 6 npu devices; cluster npu-a has 4 free",  # would not fit anyway
    }


# --- properties over random queues ---------------------------------------------------------------

KINDS = ("npu", "gpu", "cpu")


def random_case(seed: int, runs: int = 200, clusters: int = 6):
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(clusters)]
    total = {
        name: {kind: rng.choice([0, 4, 8, 16]) for kind in rng.sample(KINDS, rng.randint(1, 3))}
        for name in names
    }
    free = {name: {k: rng.randint(0, n) for k, n in kinds.items()} for name, kinds in total.items()}
    queue = [
        QueuedRun(
            id=i,
            priority=rng.randint(-3, 3),
            created_at=NOW - rng.uniform(0, 48 * HOUR),
            device_type=rng.choice(KINDS),
            device_count=rng.choice([1, 1, 2, 4, 8, 16, 32]),
            cluster=rng.choice(names + [None] * clusters + ["ghost"]),
        )
        for i in range(runs)
    ]
    return queue, free, total


def reference_place(queue, free, now, aging_per_hour=1.0, total=None, limit=None):
    """A slow, obvious version of the rules: the placements only."""
    left = {c: dict(kinds) for c, kinds in free.items()}
    reserved = set()  # (cluster, kind)
    ordered = sorted(
        queue, key=lambda r: (-(r.priority + aging_per_hour * max(0.0, now - r.created_at) / HOUR),
                              r.created_at, r.id)
    )
    out = []
    for r in ordered:
        if limit is not None and len(out) >= limit:
            break
        kind, need = r.device_type, r.device_count
        candidates = [r.cluster] if r.cluster else sorted(set(free) | set(total or {}))
        usable = [c for c in candidates if (c, kind) not in reserved]
        fits = sorted(
            (left[c][kind] - need, c) for c in usable if left.get(c, {}).get(kind, -1) >= need
        )
        if fits:
            left[fits[0][1]][kind] -= need
            out.append((r.id, fits[0][1]))
        elif total is not None:
            could = [c for c in usable if total.get(c, {}).get(kind, 0) >= need]
            if could:
                best = min(could, key=lambda c: (-left.get(c, {}).get(kind, 0), c))
                reserved.add((best, kind))
    return out


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("with_total", [False, True])
def test_matches_the_slow_reference(seed, with_total):
    queue, free, total = random_case(seed, clusters=3 + seed % 10)
    total = total if with_total else None
    limit = [None, 5, 50][seed % 3]
    placements, _ = place(queue, free, now=NOW, total=total, max_placements=limit)
    assert placed(placements) == reference_place(queue, free, NOW, 1.0, total, limit)


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("with_total", [False, True])
def test_invariants_on_random_queues(seed, with_total):
    queue, free, total = random_case(seed)
    placements, waiting = place(queue, free, now=NOW, total=total if with_total else None)
    by_id = {r.id: r for r in queue}

    # Every run is in exactly one list.
    ids = [p.run_id for p in placements] + [w.run_id for w in waiting]
    assert sorted(ids) == sorted(by_id)

    # Never over-allocate; kinds match; pinned runs land on their cluster.
    used: dict[tuple[str, str], int] = {}
    for p in placements:
        r = by_id[p.run_id]
        assert r.cluster in (None, p.cluster)
        assert r.device_type in free[p.cluster]
        used[p.cluster, r.device_type] = used.get((p.cluster, r.device_type), 0) + r.device_count
    for (cluster, kind), n in used.items():
        assert n <= free[cluster][kind]

    # Nothing that waits would have fitted what was left, unless a reservation held it back.
    left = {c: {k: n - used.get((c, k), 0) for k, n in kinds.items()} for c, kinds in free.items()}
    for w in waiting:
        r = by_id[w.run_id]
        candidates = [r.cluster] if r.cluster else list(left)
        fits = any(left.get(c, {}).get(r.device_type, -1) >= r.device_count for c in candidates)
        if fits:
            assert with_total and w.reason.startswith("blocked behind higher-priority run"), w


@pytest.mark.parametrize("seed", range(10))
def test_same_input_same_output_whatever_the_input_order(seed):
    queue, free, total = random_case(seed)
    expected = place(queue, free, now=NOW, total=total)
    rng = random.Random(seed)
    for _ in range(3):
        shuffled = rng.sample(queue, len(queue))
        free_shuffled = {c: free[c] for c in rng.sample(list(free), len(free))}
        total_shuffled = {c: dict(reversed(total[c].items())) for c in reversed(list(total))}
        assert place(shuffled, free_shuffled, now=NOW, total=total_shuffled) == expected
    assert place(queue, free, now=NOW, total=total) == expected


# --- quotas and fair share ---------------------------------------------------------------------


def prun(id, project, count=1, kind="gpu", priority=0, created_at=NOW, cluster=None) -> QueuedRun:
    return QueuedRun(id, priority, created_at, kind, count, cluster, project=project)


def causes(waiting: list[Waiting]) -> dict[int, str]:
    return {w.run_id: w.cause for w in waiting}


def test_without_projects_fair_share_changes_nothing():
    queue, free, total = random_case(3)
    with_projects = [QueuedRun(r.id, r.priority, r.created_at, r.device_type, r.device_count,
                               r.cluster, r.allowed, project="only") for r in queue]
    plain = place(queue, free, now=NOW, total=total)
    one = place(with_projects, free, now=NOW, total=total, usage={"only": {"npu": 40}},
                weights={"only": 3.0})
    assert one == plain


def test_the_project_furthest_below_its_share_goes_first():
    # Project a holds 6 of 8 gpus, b holds none: b's runs go first although a's are older and of
    # higher priority; then the devices run out and a's run waits, told why.
    queue = [prun(1, "a", 2, priority=5, created_at=NOW - 3 * HOUR),
             prun(2, "b", 1, created_at=NOW), prun(3, "b", 1, created_at=NOW)]
    placements, waiting = place(queue, {"c": {"gpu": 2}}, now=NOW, total={"c": {"gpu": 8}},
                                usage={"a": {"gpu": 6}})
    assert placed(placements) == [(2, "c"), (3, "c")]
    assert causes(waiting) == {1: "share"}
    assert reasons(waiting)[1] == ("fair share: gpu devices went first to projects further below "
                                   "their share (b); project a holds 6 gpu devices at weight 1")


def test_shares_interleave_by_dominant_share_and_weight():
    # 12 gpus free, nothing held; a has weight 2, b weight 1: a gets two devices for each of b's.
    queue = [prun(i, "a", created_at=NOW - i) for i in range(1, 11)]
    queue += [prun(i, "b", created_at=NOW - i) for i in range(11, 21)]
    placements, waiting = place(queue, {"c": {"gpu": 12}}, now=NOW, total={"c": {"gpu": 12}},
                                weights={"a": 2.0})
    by_project = {"a": 0, "b": 0}
    for p in placements:
        by_project["a" if p.run_id <= 10 else "b"] += 1
    assert by_project == {"a": 8, "b": 4}
    assert set(causes(waiting).values()) == {"share"}


def test_dominant_share_compares_across_device_kinds():
    # a holds 4 of 8 npus (1/2), b holds 2 of 16 gpus (1/8): b is further below its share and
    # its gpu run goes first even though a asks for cpus, a kind b does not use.
    queue = [prun(1, "a", 4, kind="cpu", created_at=NOW - HOUR), prun(2, "b", 4, kind="cpu")]
    total = {"c": {"npu": 8, "gpu": 16, "cpu": 4}}
    placements, waiting = place(queue, {"c": {"cpu": 4}}, now=NOW, total=total,
                                usage={"a": {"npu": 4}, "b": {"gpu": 2}})
    assert placed(placements) == [(2, "c")]
    assert causes(waiting) == {1: "share"}


def test_quota_caps_what_a_project_holds_and_reserves_nothing():
    queue = [prun(1, "a", 4, priority=9), prun(2, "a", 2), prun(3, "a", 16), prun(4, "b", 4)]
    placements, waiting = place(queue, {"c": {"gpu": 16}}, now=NOW, total={"c": {"gpu": 16}},
                                quotas={"a": {"gpu": 8}}, usage={"a": {"gpu": 3}})
    # a holds 3: run 1 (4) fits its quota of 8, then run 2 (2) would make 9.
    assert sorted(placed(placements)) == [(1, "c"), (4, "c")]
    assert causes(waiting) == {2: "quota", 3: "quota"}
    assert reasons(waiting) == {
        2: "project a's quota of 8 gpu devices: 7 held, this run needs 2",
        3: "needs 16 gpu devices; project a's quota is 8",
    }


def test_a_quota_below_what_is_held_only_stops_new_admissions():
    queue = [prun(1, "a", 1)]
    placements, waiting = place(queue, {"c": {"gpu": 8}}, now=NOW, total={"c": {"gpu": 16}},
                                quotas={"a": {"gpu": 4}}, usage={"a": {"gpu": 8}})
    assert placements == []
    assert reasons(waiting) == {1: "project a's quota of 4 gpu devices: 8 held, this run needs 1"}
    # Quotas of other kinds do not limit this one.
    placements, _ = place(queue, {"c": {"gpu": 8}}, now=NOW, quotas={"a": {"npu": 0}})
    assert placed(placements) == [(1, "c")]


def test_a_blocker_of_another_project_is_named_as_placed_by_fair_share():
    # b is below its share: its big run reserves the cluster and a's small one waits behind it.
    queue = [prun(1, "a", 1, created_at=NOW - HOUR), prun(2, "b", 8)]
    placements, waiting = place(queue, {"c": {"gpu": 4}}, now=NOW, total={"c": {"gpu": 8}},
                                usage={"a": {"gpu": 4}})
    assert placements == []
    assert reasons(waiting)[1] == ("blocked behind run 2 of project b, placed first by fair "
                                   "share (reserving c)")


def test_weights_must_be_positive():
    with pytest.raises(ValueError, match="weights must be > 0"):
        place([prun(1, "a")], {"c": {"gpu": 1}}, now=NOW, weights={"a": 0.0})


@pytest.mark.parametrize("seed", range(10))
def test_random_queues_keep_quotas_and_decide_every_run_once(seed):
    queue, free, total = random_case(seed)
    rng = random.Random(seed)
    projects = ["a", "b", "c"]
    queue = [QueuedRun(r.id, r.priority, r.created_at, r.device_type, r.device_count, r.cluster,
                       project=rng.choice(projects)) for r in queue]
    quotas = {p: {k: rng.choice([0, 4, 16, 64]) for k in rng.sample(KINDS, 2)} for p in projects}
    usage = {p: {k: rng.randint(0, 8) for k in KINDS} for p in projects}
    weights = {p: rng.choice([0.5, 1.0, 3.0]) for p in projects}
    placements, waiting = place(queue, free, now=NOW, total=total, quotas=quotas, usage=usage,
                                weights=weights)
    assert sorted([p.run_id for p in placements] + [w.run_id for w in waiting]) == \
        sorted(r.id for r in queue)
    by_id = {r.id: r for r in queue}
    held = copy.deepcopy(usage)
    for p in placements:
        r = by_id[p.run_id]
        before = held[r.project][r.device_type]
        held[r.project][r.device_type] += r.device_count
        quota = quotas[r.project].get(r.device_type)
        assert quota is None or held[r.project][r.device_type] <= quota, (r, before, quota)
    for w in waiting:
        assert w.cause in {"capacity", "quota", "share"}
        if w.cause == "quota":
            r = by_id[w.run_id]
            assert quotas[r.project].get(r.device_type) is not None


# --- preemption --------------------------------------------------------------------------------


def active(id, project, count, priority=0, cluster="c", kind="gpu", started_at=NOW - HOUR,
           **flags) -> ActiveRun:
    return ActiveRun(id, priority, project, kind, count, cluster, started_at, **flags)


def victims(preemptions: list[Preemption]) -> list[tuple[int, int]]:
    return [(p.victim, p.for_run) for p in preemptions]


def test_an_urgent_run_preempts_the_lowest_priority_newest_runs_of_a_project_above_its_share():
    # a holds all 8 gpus in four runs; b holds none and its urgent run needs 4.
    running = [active(1, "a", 2, priority=0, started_at=NOW - 3 * HOUR),
               active(2, "a", 2, priority=0, started_at=NOW - HOUR),
               active(3, "a", 2, priority=-5, started_at=NOW - 5 * HOUR),
               active(4, "a", 2, priority=10)]
    urgent = prun(9, "b", 4, priority=50)
    chosen = preempt([urgent], running, {"c": {"gpu": 0}}, total={"c": {"gpu": 8}})
    assert victims(chosen) == [(3, 9), (2, 9)]  # priority -5 first, then the newer of the 0s
    assert chosen[0].cluster == "c"
    assert chosen[0].reason.startswith("preempted for run 9 (priority 50, project b): project a "
                                       "holds more than its share")


def test_a_project_within_its_share_is_never_touched():
    # a, b and c (waiting) share 8 gpus: a third each. a holds 2, within its share: its run is
    # left alone although its priority is the lowest; b's is stopped.
    running = [active(1, "a", 2, priority=-10), active(2, "b", 6)]
    chosen = preempt([prun(9, "c", 2, priority=50)], running, {"c": {"gpu": 0}},
                     total={"c": {"gpu": 8}})
    assert victims(chosen) == [(2, 9)]
    # a and b hold 4 each, b waits for more: both hold their half, nothing is stopped ...
    running = [active(1, "a", 4), active(2, "b", 4)]
    assert preempt([prun(9, "b", 2, priority=50)], running, {"c": {"gpu": 0}},
                   total={"c": {"gpu": 8}}) == []
    # ... unless b's weight is 3: its share is three quarters, a (half) is above its quarter.
    chosen = preempt([prun(9, "b", 2, priority=50)], running, {"c": {"gpu": 0}},
                     total={"c": {"gpu": 8}}, weights={"b": 3.0})
    assert victims(chosen) == [(1, 9)]


def test_only_preemptible_lower_priority_running_jobs_are_stopped():
    running = [active(1, "a", 4, priority=60), active(2, "a", 2, preemptible=False),
               active(3, "a", 2, stoppable=False)]
    assert preempt([prun(9, "b", 2, priority=50)], running, {"c": {"gpu": 0}},
                   total={"c": {"gpu": 8}}) == []
    # Not enough allowed victims for the whole need: nobody is stopped for nothing.
    running = [active(1, "a", 2), active(2, "a", 6, preemptible=False)]
    assert preempt([prun(9, "b", 4, priority=50)], running, {"c": {"gpu": 0}},
                   total={"c": {"gpu": 8}}) == []


def test_devices_already_being_freed_stop_nothing_more():
    running = [active(1, "a", 4, preempting=True), active(2, "a", 4)]
    assert preempt([prun(9, "b", 4, priority=50)], running, {"c": {"gpu": 0}},
                   total={"c": {"gpu": 8}}) == []


def test_free_devices_count_and_the_cluster_needing_fewest_stops_wins():
    total = {"c1": {"gpu": 8}, "c2": {"gpu": 8}}
    running = [active(1, "a", 4, cluster="c1"), active(2, "a", 2, cluster="c2"),
               active(3, "a", 4, cluster="c2", started_at=NOW - 5 * HOUR)]
    chosen = preempt([prun(9, "b", 4, priority=50)], running, {"c1": {"gpu": 0}, "c2": {"gpu": 2}},
                     total=total)
    assert victims(chosen) == [(2, 9)] and chosen[0].cluster == "c2"
    # Pinned to c1, it stops the run there.
    chosen = preempt([prun(9, "b", 4, priority=50, cluster="c1")], running,
                     {"c1": {"gpu": 0}, "c2": {"gpu": 2}}, total=total)
    assert victims(chosen) == [(1, 9)]


def test_two_waiting_runs_do_not_take_the_same_victims():
    running = [active(1, "a", 4), active(2, "a", 4)]
    chosen = preempt([prun(8, "b", 4, priority=50), prun(9, "b", 4, priority=40)], running,
                     {"c": {"gpu": 0}}, total={"c": {"gpu": 8}})
    # After the first stop a holds 4 of 8 = its share with b present: the second run waits.
    assert victims(chosen) == [(2, 8)]
