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
