"""The scheduling policy is pure: these tests run without an event loop."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest

from orchestrator import UsageError
from orchestrator.admission._scheduler import (
    Fcfs,
    Las,
    ReadyTask,
    Slack,
    get_policy,
    order,
    order_programs,
    remaining_critical_path,
    urgency,
)
from orchestrator.ext import ProgramView


def names(views: list[ProgramView]) -> list[int]:
    return [v.program for v in views]


def test_fcfs_orders_programs_by_arrival() -> None:
    views = [ProgramView(3), ProgramView(1), ProgramView(2)]
    assert names(order_programs(Fcfs(), views, now=0)) == [1, 2, 3]


def test_las_favours_the_program_with_least_attained_service() -> None:
    views = [ProgramView(1, attained=9.0), ProgramView(2, attained=0.5), ProgramView(3)]
    assert names(order_programs(Las(), views, now=0)) == [3, 2, 1]


def test_las_breaks_ties_by_arrival() -> None:
    views = [ProgramView(2, attained=1.0), ProgramView(1, attained=1.0)]
    assert names(order_programs(Las(), views, now=0)) == [1, 2]


def test_slack_puts_least_slack_first_using_the_remaining_critical_path() -> None:
    # slack = deadline - now - remaining
    a = ProgramView(1, deadline=100.0, remaining=10.0)  # slack 80 at now=10
    b = ProgramView(2, deadline=50.0, remaining=30.0)  # slack 10
    c = ProgramView(3, deadline=None)  # no deadline: last
    d = ProgramView(4, deadline=40.0, remaining=0.0)  # slack 30
    assert names(order_programs(Slack(), [a, b, c, d], now=10)) == [2, 4, 1, 3]
    assert Slack().key(b, now=10) == 10
    assert math.isinf(Slack().key(c, now=10))


def test_interactive_work_outranks_batch_under_every_policy() -> None:
    batch = ProgramView(1, priority_class="batch", deadline=1.0)
    interactive = ProgramView(2, priority_class="interactive", attained=50.0, deadline=90.0)
    for policy in (Fcfs(), Las(), Slack()):
        assert names(order_programs(policy, [batch, interactive], now=0)) == [2, 1]


def test_order_groups_ready_tasks_by_program_then_by_readiness() -> None:
    programs = {1: ProgramView(1, attained=5.0), 2: ProgramView(2, attained=1.0)}
    ready = [ReadyTask(1, "a", 1), ReadyTask(2, "x", 2), ReadyTask(1, "b", 3), ReadyTask(2, "y", 4)]
    fcfs = [t.task for t in order(Fcfs(), ready, programs, now=0)]
    las = [t.task for t in order(Las(), ready, programs, now=0)]
    assert fcfs == ["a", "b", "x", "y"]
    assert las == ["x", "y", "a", "b"]


def test_urgency_agrees_with_the_order() -> None:
    views = [ProgramView(i, attained=float(10 - i)) for i in range(1, 6)]
    for policy in (Fcfs(), Las(), Slack()):
        ordered = order_programs(policy, views, now=0)
        urgencies = [urgency(policy, v, now=0) for v in ordered]
        assert urgencies == sorted(urgencies, reverse=True)


def test_urgency_keeps_arrival_order_among_programs_without_a_deadline() -> None:
    # Under `slack` they all rank last; their hints must still say which came first, at
    # program numbers a long batch reaches (the tie-breaker alone rounds away there).
    views = [ProgramView(5_000 + i) for i in range(50)] + [ProgramView(1, deadline=30.0)]
    ordered = order_programs(Slack(), views, now=0)
    urgencies = [urgency(Slack(), v, now=0) for v in ordered]
    assert ordered[0].program == 1
    assert all(a > b for a, b in itertools.pairwise(urgencies))


def test_remaining_critical_path_takes_the_longest_unfinished_chain() -> None:
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_edges_from([("a", "b"), ("b", "d"), ("a", "c"), ("c", "d")])
    estimates = {"a": 1.0, "b": 5.0, "c": 2.0, "d": 1.0}
    assert remaining_critical_path(graph, estimates) == 7.0
    # With a and b finished only c -> d is left.
    assert remaining_critical_path(graph, {"c": 2.0, "d": 1.0}) == 3.0
    assert remaining_critical_path(graph, {}) == 0.0


def test_unknown_policy_name_lists_the_choices() -> None:
    with pytest.raises(UsageError, match="fcfs, las, slack"):
        get_policy("sjf")
    assert get_policy("las").name == "las"
