"""Admission queues: bounds, order and statistics, without an event loop."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator import Limits, OverloadedError, UsageError
from orchestrator.admission._queue import Admission


@dataclass
class Item:
    """A queued entry as admission sees one (`Queued`): a ready task's run state, say."""

    id: str
    resource: str
    ready_seq: int
    state: str = "ready"


def ready(task_id: str, seq: int, resource: str = "llm") -> Item:
    return Item(task_id, resource, seq)


def test_admits_up_to_the_bound_best_program_first() -> None:
    adm = Admission({"llm": Limits(max_in_flight=3)})
    for seq, (program, name) in enumerate([(2, "x1"), (1, "a1"), (2, "x2"), (1, "a2")], 1):
        adm.push(program, ready(name, seq))
    admitted = adm.admit(key=lambda program: program)
    assert [(p, t.id) for p, t in admitted] == [(1, "a1"), (1, "a2"), (2, "x1")]
    stats = adm.stats()[0]
    assert (stats.in_flight, stats.waiting, stats.admitted, stats.peak_waiting) == (3, 1, 3, 4)
    assert adm.admit(key=lambda program: program) == []
    adm.release("llm")
    assert [t.id for _, t in adm.admit(key=lambda program: program)] == ["x2"]


def test_full_wait_queue_is_a_typed_error_and_counted() -> None:
    adm = Admission({"llm": Limits(max_in_flight=1, max_waiting=2)})
    adm.push(1, ready("a", 1))
    adm.push(1, ready("b", 2))
    with pytest.raises(OverloadedError, match="'llm'.*2 waiting") as info:
        adm.push(1, ready("c", 3))
    assert info.value.limit == 2
    assert adm.stats()[0].rejected == 1


def test_discarded_task_is_skipped_when_reached() -> None:
    adm = Admission({"llm": Limits(max_in_flight=5)})
    a, b = ready("a", 1), ready("b", 2)
    adm.push(1, a)
    adm.push(1, b)
    a.state = "cancelled"
    adm.discard(a)
    assert [t.id for _, t in adm.admit(key=lambda p: p)] == ["b"]
    assert adm.stats()[0].waiting == 0


def test_limits_must_be_positive() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        Limits(max_in_flight=0)


def test_only_programs_whose_key_moves_are_ranked_each_round() -> None:
    """The `deadlines` order: programs with a deadline (the static key says None of them)
    are ranked by the round's key, least first, ahead of the rest, which keep their arrival
    order from the heap; the round's key is asked of the moving ones only."""
    slack = {"d1": 5.0, "d2": 1.0}  # programs with a deadline, by their slack this round
    asked: list[str] = []

    def key(program: str) -> tuple[float, str]:
        asked.append(program)
        return (slack[program], program)

    adm = Admission(
        {"llm": Limits(max_in_flight=2)},
        static_key=lambda p: None if p in slack else (float("inf"), p),
        moving=True,
    )
    for seq, program in enumerate(["b1", "d1", "b2", "d2"], 1):
        adm.push(program, ready(f"{program}-t", seq))
    assert [p for p, _ in adm.admit(key=key)] == ["d2", "d1"]
    assert sorted(asked) == ["d1", "d2"]
    adm.release("llm")
    adm.release("llm")
    asked.clear()
    assert [p for p, _ in adm.admit(key=key)] == ["b1", "b2"]
    assert asked == []  # nothing with a deadline waits: the heap alone, as under fcfs


def test_without_a_moving_program_the_round_asks_no_key() -> None:
    """A workload without deadlines under the `deadlines` order costs what `fcfs` costs:
    programs are taken from the heap, never ranked by the round's key."""

    def key(program: str) -> str:
        raise AssertionError(f"ranked {program} anew")

    adm = Admission(
        {"llm": Limits(max_in_flight=3)}, static_key=lambda p: (float("inf"), p), moving=True
    )
    for seq, program in enumerate(["c", "a", "b"], 1):
        adm.push(program, ready(f"{program}-t", seq))
    assert [p for p, _ in adm.admit(key=key)] == ["a", "b", "c"]
