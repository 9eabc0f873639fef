"""Workflow ids carry 96 random bits, and a new run whose id the store holds already is
refused (never merged into the stored run) and started again under another id. On SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest
from conftest import StoreFactory
from test_service import Api, B, on_stores

from executors import FunctionLLM, echo
from orchestrator import Engine, TaskContext, Workflow
from orchestrator.engine import _engine as engine_module
from orchestrator.ext import (
    EventRecord,
    LeaseLostError,
    StoreBatch,
    WorkflowExistsError,
    WorkflowRow,
)


def ev(workflow: str, seq: int, data: str = "{}") -> EventRecord:
    return EventRecord(workflow, seq, "k", float(seq), data)


def row(id: str, tenant: str, status: str = "running") -> WorkflowRow:
    return WorkflowRow(
        id=id,
        name="n",
        status=status,
        created=1.0,
        updated=1.0,
        tenant=tenant,  # type: ignore[arg-type]
    )


class Ids:
    """An id generator that hands out `given` first, then fresh ids."""

    def __init__(self, *given: str) -> None:
        self.given = list(given)
        self.made: list[str] = []
        self._fresh: Iterator[int] = iter(range(1, 1000))

    def __call__(self, name: str) -> str:
        made = self.given.pop(0) if self.given else f"{name}-fresh{next(self._fresh)}"
        self.made.append(made)
        return made


def test_ids_carry_96_random_bits() -> None:
    ids = {engine_module.new_workflow_id("task") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"task-[0-9a-f]{24}", i) for i in ids)


def test_the_store_refuses_a_new_workflow_under_a_stored_id(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            await store.append(
                StoreBatch(events=[ev("x", 1), ev("x", 2)], workflows=[row("x", "a")])
            )
            before = await store.events("x")
            clash = StoreBatch(
                events=[ev("y", 1), ev("x", 1, '{"other":1}')],
                workflows=[row("y", "b"), row("x", "b")],
            )
            with pytest.raises(WorkflowExistsError) as caught:
                await store.append(clash)
            assert caught.value.workflows == ("x",)
            stored = await store.workflow("x")
            assert stored is not None and stored.tenant == "a"
            assert await store.events("x") == before
            assert await store.workflow("y") is None  # nothing of the batch was written
            # With engines sharing the store, a taken id is refused as such, not as a lost
            # lease (which would drop the new run without a word).
            await store.append(
                StoreBatch(events=[ev("z", 1)], workflows=[row("z", "a")], owner="e1", lease_s=60)
            )
            clash = StoreBatch(
                events=[ev("z", 1)], workflows=[row("z", "b")], owner="e2", lease_s=60
            )
            with pytest.raises(WorkflowExistsError):
                await store.append(clash)
            # The stored run's own later batches (a resume, a takeover) still replace its row.
            await store.append(
                StoreBatch(events=[ev("x", 3)], workflows=[row("x", "a", "succeeded")])
            )
            stored = await store.workflow("x")
            assert stored is not None and stored.status == "succeeded"
            with pytest.raises(LeaseLostError):  # and another engine's are still fenced
                await store.append(StoreBatch(events=[ev("z", 2)], owner="e2", lease_s=60))

    asyncio.run(main())


def test_a_colliding_submission_gets_another_id_and_leaves_the_first_alone(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = Ids("task-same", "task-same")
    monkeypatch.setattr(engine_module, "new_workflow_id", ids)

    async def body(api: Api) -> None:
        status, first, _ = await api.call("POST", "/v1/tasks?wait=30", {"function": "join"})
        assert status == 200 and first["id"] == "task-same", first
        store = api.engine.store
        assert store is not None
        events = await store.events("task-same")
        status, second, _ = await api.call(
            "POST", "/v1/tasks?wait=30", {"agent": "writer", "prompt": "hi"}, B
        )
        assert status == 200, second
        assert second["id"] == "task-fresh1" and second["results"] == {"task": "hi"}
        assert ids.made == ["task-same", "task-same", "task-fresh1"]
        stored = await store.workflow("task-same")
        assert stored is not None and stored.tenant == "acme" and stored.status == "succeeded"
        assert await store.events("task-same") == events
        fresh = await store.workflow("task-fresh1")
        assert fresh is not None and fresh.tenant == "beta"
        # The first tenant still reads its run; the second never sees it.
        status, view, _ = await api.call("GET", "/v1/workflows/task-same")
        assert status == 200 and view["status"] == "succeeded"
        status, _, _ = await api.call("GET", "/v1/workflows/task-same", headers=B)
        assert status == 404
        status, ready, _ = await api.call("GET", "/readyz")
        assert status == 200, ready

    on_stores(make_store, body)


async def hold(ctx: TaskContext) -> str:
    await asyncio.Event().wait()
    return "never"


def test_an_engine_never_reuses_the_id_of_a_run_it_holds(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = Ids("w-same", "w-same")
    monkeypatch.setattr(engine_module, "new_workflow_id", ids)

    async def main() -> None:
        async with (
            make_store() as store,
            Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine,
        ):
            first = Workflow("w")
            first.add("a", hold)
            running = engine.submit(first)
            second = Workflow("w")
            second.add("a", lambda ctx: "done")
            assert (await engine.submit(second)).results == {"a": "done"}
            assert (running.id, ids.made) == ("w-same", ["w-same", "w-same", "w-fresh1"])
            running.cancel("the test is over")

    asyncio.run(main())
