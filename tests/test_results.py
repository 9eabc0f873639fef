"""A task's result reaches its dependents whole: checking it never consumes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from orchestrator import ResultNotSerializableError, TaskContext, VirtualClock, Workflow, run_sync


def _gen() -> Any:
    yield from (1, 2, 3)


ONE_SHOT: dict[str, Callable[[], Any]] = {
    "generator": _gen,
    "map": lambda: map(str, [1, 2]),
    "filter": lambda: filter(None, [1, 0, 2]),
    "zip": lambda: zip([1, 2], "ab", strict=True),
    "dict holding a generator": lambda: {"rows": _gen()},
    "list holding a map": lambda: [1, map(str, [1])],
}


@pytest.mark.parametrize("name", sorted(ONE_SHOT))
def test_a_one_shot_iterator_is_refused_and_its_dependent_is_not_fed_an_empty_list(
    name: str,
) -> None:
    received: list[Any] = []

    def consume(ctx: TaskContext) -> int:
        received.append(ctx.inputs["produce"])
        return 0

    wf = Workflow("iter")
    wf.add("produce", lambda: ONE_SHOT[name]())
    wf.add("consume", consume, after=["produce"])
    result = run_sync(wf, clock=VirtualClock())

    assert result.status == "failed"
    error = result.errors["produce"]
    assert isinstance(error, ResultNotSerializableError)
    assert "'produce'" in str(error) and "list(" in str(error)
    assert received == []
    assert "consume" in result.skipped


def test_lists_and_dicts_pass_through_unchanged() -> None:
    wf = Workflow("plain")
    wf.add("produce", lambda: {"rows": [1, 2, 3], "pairs": (("a", 1),)})
    wf.add("consume", lambda ctx: ctx.inputs["produce"], after=["produce"])
    result = run_sync(wf, clock=VirtualClock())
    assert result["consume"] == {"rows": [1, 2, 3], "pairs": (("a", 1),)}
