"""The ceiling estimate of the deadlines benchmark (bench/deadlines.py): the steps queries
need in windows that cannot share a step, and the least makespan that holds what must be
done by it."""

from __future__ import annotations

import itertools
import random

import deadlines
import pytest
from deadlines import Ceiling, Window, least_need, most_need


def brute_most(windows: list[Window]) -> float:
    best = 0.0
    for size in range(1, len(windows) + 1):
        for chosen in itertools.combinations(windows, size):
            ordered = sorted(chosen, key=lambda w: w.start)
            if all(a.end <= b.start for a, b in itertools.pairwise(ordered)):
                best = max(best, sum(w.need for w in chosen))
    return best


def random_windows(rng: random.Random, n: int) -> list[Window]:
    windows = []
    for _ in range(n):
        start = rng.uniform(0, 20)
        windows.append(Window(start, start + rng.uniform(1, 6), rng.choice([0.0, *range(1, 9)])))
    return windows


def test_most_need_is_the_heaviest_set_of_windows_that_do_not_overlap() -> None:
    rng = random.Random(7)
    for _ in range(60):
        windows = random_windows(rng, rng.randint(1, 8))
        need, chosen = most_need(windows)
        assert need == brute_most(windows)
        assert sum(w.need for w in chosen) == need
        ordered = sorted(chosen, key=lambda w: w.start)
        assert all(a.end <= b.start for a, b in itertools.pairwise(ordered))


def test_least_need_tries_only_the_misses_that_matter_and_finds_the_least() -> None:
    """Against every way to choose the misses."""
    rng = random.Random(11)
    for _ in range(40):
        windows = random_windows(rng, rng.randint(2, 8))
        for misses in range(0, 3):
            expected = min(
                brute_most([w for i, w in enumerate(windows) if i not in missed])
                for missed in itertools.combinations(range(len(windows)), misses)
            )
            assert least_need(windows, misses) == expected


def ceiling(windows: tuple[Window, ...], misses: int = 0, **kw: float) -> Ceiling:
    fields: dict[str, float] = dict(
        reference=10.0, batch_busy_s=40.0, query_work_s=8.0, lane_until=0.0
    )
    fields.update(kw)
    return Ceiling(
        reference=fields["reference"],
        replicas=4,
        batch_busy_s=fields["batch_busy_s"],
        query_work_s=fields["query_work_s"],
        step_s=0.01,
        batch_savings=0,
        windows=windows,
        misses=misses,
        lane_attainment=1.0,
        lane_busy_s=fields["lane_until"],
        lane_until=fields["lane_until"],
    )


def test_queries_due_after_the_batch_cost_it_nothing() -> None:
    late = (Window(0.0, 50.0, 100.0), Window(1.0, 60.0, 100.0))
    assert ceiling(late).share(steps=True) == 1.0


def test_queries_due_before_the_batch_ends_push_its_end_out() -> None:
    # Two queries of 4 replica-s each, due by 5 s: the batch's 40 replica-s and their 8 end
    # at 12 s at the earliest; their 300 steps of 10 ms each (windows apart) add 3 more.
    due = (Window(0.0, 2.0, 100.0), Window(2.0, 5.0, 200.0))
    assert ceiling(due).share(steps=False) == 10.0 / 12.0
    assert ceiling(due).share(steps=True) == 10.0 / 12.75
    # Letting one miss drops its tokens and the larger need.
    assert ceiling(due, misses=1).share(steps=True) == 10.0 / (44.0 + 1.0) * 4


def test_a_query_due_just_past_the_bound_does_not_count() -> None:
    # Due at 11 s, after the 10 s the batch alone takes: its 40 replica-s of tokens would
    # end the batch at 20 s, but the batch can end at 10 s, before the query is due.
    assert ceiling((Window(0.0, 11.0, 0.0),), query_work_s=40.0).share(steps=False) == 1.0
    # Due at 9 s, it must be done first: (40 + 40) / 4 = 20 s.
    assert ceiling((Window(0.0, 9.0, 0.0),), query_work_s=40.0).share(steps=False) == 0.5


def test_steady_counts_every_query_as_due() -> None:
    late = (Window(0.0, 50.0, 100.0), Window(60.0, 70.0, 200.0))
    # Both due: 8 replica-s of tokens, 300 steps of 10 ms: (40 + 8 + 3) / 4 = 12.75 s.
    assert ceiling(late).steady == 10.0 / 12.75
    assert ceiling(late, misses=1).steady == 10.0 / ((40.0 + 4.0 + 1.0) / 4)


def test_too_many_ways_to_choose_the_misses_is_said_not_guessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    windows = tuple(Window(float(i), float(i) + 1.0, 5.0) for i in range(6))
    assert least_need(windows, 2) == 20.0  # six apart, two let miss
    monkeypatch.setattr(deadlines, "MAX_TRIED", 3)
    assert least_need(windows, 2) is None
    bound = ceiling(windows, misses=2)
    assert bound.share(steps=True) is None and bound.steady is None
    assert bound.share(steps=False) is not None  # tokens alone need no search


def test_a_whole_lane_leaves_the_batch_the_other_replicas_until_the_queries_end() -> None:
    # 40 replica-s of batch on 4 replicas, one kept for queries until 6 s: 18 on the other
    # three by then, the last 22 on all four: 6 + 5.5 = 11.5 s.
    assert ceiling((), lane_until=6.0).whole_lane == 10.0 / 11.5
    # Queries that end after the batch would on three replicas: 40 / 3 s.
    assert ceiling((), lane_until=20.0).whole_lane == 10.0 / (40.0 / 3)
    # No queries: nothing taken.
    assert ceiling((), lane_until=0.0).whole_lane == 1.0
