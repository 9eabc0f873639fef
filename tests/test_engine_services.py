"""The engine starts its services one after another and, when one fails to start, closes
those it started before it, in reverse order, before the error reaches the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from executors import FunctionLLM, echo
from memory import SQLStore
from orchestrator import Cluster, Engine, UsageError, VirtualClock, Workflow


class RecordingStore(SQLStore):
    """A SQLite store that notes when an engine releases its leases."""

    def __init__(self, path: Path, log: list[str]) -> None:
        super().__init__(path)
        self.log = log

    async def release(self, owner: str, workflows: Sequence[str] | None = None) -> int:
        self.log.append(f"leases of {owner} released")
        return await super().release(owner, workflows)


class RefusingBroker:
    """A slot broker that cannot take an engine's report (a bug in it, say): the shared
    limits, the engine's last service to start, fail to start."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def share(
        self,
        backend: str,
        engine: str,
        *,
        limit: int,
        in_flight: int,
        want_urgent: int,
        want_batch: int,
        lease_s: float,
    ) -> int:
        self.log.append(f"share of {backend} asked")
        raise RuntimeError("the broker refused the report")

    async def leave(self, engine: str) -> None:
        self.log.append("left the broker")


def test_a_service_that_fails_to_start_closes_those_started_before_it(tmp_path: Path) -> None:
    """Leases (on the store), the thread pool and the call path started; the shared limits
    did not: the leases are released, the pool is shut down and the call path stopped, and
    the broker, never joined, is not left."""
    log: list[str] = []

    async def main() -> Engine:
        async with RecordingStore(tmp_path / "runs.db", log) as store:
            engine = Engine(
                backends={"default": FunctionLLM(echo)},
                store=store,
                cluster=Cluster(engine_id="e1", share_limits=RefusingBroker(log)),
            )
            with pytest.raises(RuntimeError, match="the broker refused the report"):
                async with engine:
                    raise AssertionError("the engine must not start")
            log.append("the caller sees the error")
            return engine

    engine = asyncio.run(main())
    assert log == [
        "leases of e1 released",  # on start: what a dead process of this name left
        "share of default asked",
        "leases of e1 released",  # closed, as the shared limits failed to start
        "the caller sees the error",
    ]
    assert engine._executor is None  # the thread pool was shut down
    assert engine.calls._tg is None  # the call path was stopped
    with pytest.raises(UsageError, match="the engine is not running"):
        engine.submit(Workflow("late"))


def test_an_engine_that_failed_to_start_leaves_the_next_one_free() -> None:
    """Engines in one process sharing a limit: the first cannot join its broker; another,
    on a broker that works, starts and runs."""
    from orchestrator.cluster._slots import LocalSlots

    clock = VirtualClock()
    log: list[str] = []

    async def main() -> bool:
        refused = Engine(
            backends={"default": FunctionLLM(echo)},
            clock=clock,
            cluster=Cluster(share_limits=RefusingBroker(log)),
        )
        with pytest.raises(RuntimeError, match="refused"):
            await refused.__aenter__()
        assert refused._executor is None and refused.calls._tg is None
        working = Engine(
            backends={"default": FunctionLLM(echo)},
            clock=clock,
            cluster=Cluster(share_limits=LocalSlots(clock)),
        )
        async with working:
            wf = Workflow("after")
            wf.add("a", lambda: 1)
            return (await working.run(wf)).ok

    assert clock.run(main())
    assert log == ["share of default asked"]
