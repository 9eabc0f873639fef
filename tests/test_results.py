"""A task's result reaches its dependents whole (checking it never consumes it), and a result
the store cannot hold exactly fails that task alone, never the engine."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
from conftest import StoreFactory

from orchestrator import (
    Engine,
    ResultNotSerializableError,
    Retry,
    TaskContext,
    VirtualClock,
    Workflow,
    run_sync,
)
from orchestrator.ext import read_events
from orchestrator.model._errors import error_text


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


# --- what the store can hold ----------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: float
    tags: Any = None


class Answer(pydantic.BaseModel):
    text: str
    score: float


UNSTORABLE: dict[str, tuple[Callable[[], Any], str]] = {
    "lone surrogate": (lambda: "\udcff", "lone surrogate (\\udcff)"),
    "NUL": (lambda: "a\x00b", "NUL character"),
    "NaN": (lambda: float("nan"), "nan, which JSON cannot hold"),
    "infinity": (lambda: float("-inf"), "-inf, which JSON cannot hold"),
    "bytes": (lambda: b"x", "a bytes"),
    "set": (lambda: {1, 2}, "a set"),
    "int key": (lambda: {1: "one"}, "key 1 is a int"),
    "surrogate key": (lambda: {"ok": {"\udcff": 1}}, "result.ok.\\udcff: its key"),
    "NaN in a list": (lambda: {"rows": [1.0, float("nan")]}, "result.rows[1]"),
    "bytes in a dataclass": (lambda: Point(1.0, b"x"), "result.tags"),
    "NUL in a pydantic model": (lambda: Answer(text="\x00", score=1), "result.text"),
    "object": (lambda: object(), "a object"),
}


@pytest.mark.parametrize("name", sorted(UNSTORABLE))
def test_an_unstorable_result_fails_its_task_only_and_the_run_goes_on(
    name: str, make_store: StoreFactory
) -> None:
    """In a durable engine, where every result is encoded into the log: the task fails with
    the reason, its dependent is skipped, the rest of the run and other runs go on, and the
    log reads back whole."""
    produce, detail = UNSTORABLE[name]

    async def main() -> None:
        async with make_store() as store, Engine(store=store) as engine:
            wf = Workflow("bad")
            wf.add("produce", lambda: produce())
            wf.add("use", lambda ctx: ctx.inputs["produce"], after=["produce"])
            wf.add("other", lambda: "fine")
            result = await engine.run(wf)
            assert result.status == "failed"
            error = result.errors["produce"]
            assert isinstance(error, ResultNotSerializableError)
            assert "'produce'" in str(error) and detail in str(error), str(error)
            assert "use" in result.skipped and result["other"] == "fine"
            later = Workflow("later")
            later.add("one", lambda: 1)
            assert (await engine.run(later))["one"] == 1
            events = await read_events(store, result.workflow)
            failed = [e for e in events if e["kind"] == "task_failed"]
            assert [e["task"] for e in failed] == ["produce"]
            assert failed[0]["error"] == error_text(error)

    asyncio.run(main())


@pytest.mark.parametrize("text", ["\udcff", "a\x00b"])
def test_an_error_message_the_store_cannot_hold_is_recorded_escaped(
    text: str, make_store: StoreFactory
) -> None:
    def fail() -> None:
        raise ValueError(f"bad {text}")

    async def main() -> None:
        async with make_store() as store, Engine(store=store) as engine:
            wf = Workflow("raises")
            wf.add("fail", fail, retry=Retry(attempts=2, initial_delay=0.001, jitter=0))
            wf.add("other", lambda: "fine")
            result = await engine.run(wf)
            assert result.failures["fail"] == f"ValueError: bad {ascii(text)[1:-1]}"
            assert result["other"] == "fine"
            events = await read_events(store, result.workflow)
            kinds = [e["kind"] for e in events]
            assert "task_retrying" in kinds and "workflow_finished" in kinds

    asyncio.run(main())


def test_json_data_dataclasses_and_pydantic_models_are_stored_as_documented(
    make_store: StoreFactory,
) -> None:
    """Tuples come back as lists, dataclasses and models as their fields; dependents in the
    same process get the object itself."""
    received: list[Any] = []

    def use(ctx: TaskContext) -> int:
        received.extend(ctx.inputs.values())
        return 0

    async def main() -> None:
        async with make_store() as store, Engine(store=store) as engine:
            wf = Workflow("plain")
            wf.add("pair", lambda: (1, "a"))
            wf.add("point", lambda: Point(0.5, ["t"]))
            wf.add("answer", lambda: Answer(text="é\u2603", score=2))
            wf.add("use", use, after=["pair", "point", "answer"])
            result = await engine.run(wf)
            assert result.ok, result.failures
            assert sorted(map(repr, received)) == sorted(
                map(repr, [(1, "a"), Point(0.5, ["t"]), Answer(text="é\u2603", score=2)])
            )
            events = await read_events(store, result.workflow)
            stored = {e["task"]: e["result"] for e in events if e["kind"] == "task_succeeded"}
            assert stored["pair"] == [1, "a"]
            assert stored["point"] == {"x": 0.5, "tags": ["t"]}
            assert stored["answer"] == {"text": "é\u2603", "score": 2.0}

    asyncio.run(main())
