"""A store is the event log; what it can do beyond (retention, leases, cancel requests,
idempotency keys) it declares by subclassing each feature's ABC, and whoever needs a feature
finds it by that class once, where it is asked for, with an error that names the fix."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import MemoryStore

from executors import FunctionLLM, echo
from memory import SQLStore
from orchestrator import (
    Cluster,
    Engine,
    LLMRequest,
    Message,
    Registry,
    Retention,
    TaskContext,
    UsageError,
    Workflow,
)
from orchestrator.ext import CancelStore, Claimed, KeyStore, LeaseStore, RetainingStore
from orchestrator.service import Service

ROOT = Path(__file__).resolve().parent.parent
FEATURES = (RetainingStore, LeaseStore, CancelStore, KeyStore)


class Gate:
    """Where the first process's task stops; the resumed one opens it first."""

    opened: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None
    runs: ClassVar[int] = 0


async def asks_then_waits(ctx: TaskContext) -> str:
    """Calls the LLM, then waits at the gate: its call finished before the "crash"."""
    reply = await ctx.complete(LLMRequest(messages=(Message("user", "hello"),), model="m"))
    Gate.runs += 1
    assert Gate.opened is not None and Gate.reached is not None
    Gate.reached.set()
    await Gate.opened.wait()
    return reply.text.upper()


def shout(ctx: TaskContext) -> str:
    return f"{ctx.input('ask')}!"


def test_a_store_with_the_event_log_alone_records_and_resumes_runs() -> None:
    """`MemoryStore` declares no feature: the engine records a run in it, and a second
    engine resumes the run from it, its finished LLM call answered from the log."""
    sent: list[str] = []

    def reply(request: LLMRequest, hints: object) -> str:
        sent.append(request.messages[-1].content)
        return echo(request, hints)  # type: ignore[arg-type]

    async def main() -> None:
        Gate.opened, Gate.reached, Gate.runs = asyncio.Event(), asyncio.Event(), 0
        store = MemoryStore()
        assert not isinstance(store, FEATURES)
        llm = FunctionLLM(reply)
        wf = Workflow("event-log-only")
        wf.add("ask", asks_then_waits)
        wf.add("shout", shout, after=["ask"])
        async with Engine(backends={"default": llm}, store=store) as engine:
            handle = engine.submit(wf)
            await Gate.reached.wait()
            assert engine.journal is not None
            await engine.journal.durable()
            run_id = handle.id
        row = await store.workflow(run_id)
        assert row is not None and row.status == "running"  # as a killed process leaves it
        assert await store.unfinished() == [run_id]

        Gate.opened.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(Registry())
            result = await report.runs[0]
        assert result.status == "succeeded", result.failures
        assert result["shout"] == "HELLO!"
        assert sent == ["hello"]  # answered from the store the second time
        assert Gate.runs == 2
        row = await store.workflow(run_id)
        assert row is not None and row.status == "succeeded"
        assert await store.unfinished() == []

    asyncio.run(main())


class NotCalled:
    """Feature methods of the fakes below: finding a feature never calls one."""

    async def claim(self, owner: str, lease_s: float, limit: int) -> list[Claimed]:
        raise AssertionError("claim() called")

    async def renew(
        self, owner: str, lease_s: float, workflows: Sequence[str] | None = None
    ) -> int:
        raise AssertionError("renew() called")

    async def release(self, owner: str, workflows: Sequence[str] | None = None) -> int:
        raise AssertionError("release() called")

    async def ask_cancel(self, workflow: str, reason: str) -> bool:
        raise AssertionError("ask_cancel() called")

    async def cancels(self, owner: str) -> list[tuple[str, str]]:
        raise AssertionError("cancels() called")


class LeasesAlone(NotCalled, MemoryStore, LeaseStore):
    """Declares leases, not cancel requests (it has their methods all the same)."""


class LeasesAndCancels(NotCalled, MemoryStore, LeaseStore, CancelStore):
    """Declares leases and cancel requests, not idempotency keys."""


class Undeclared(NotCalled, MemoryStore):
    """Has every lease and cancel method but declares neither feature."""


def test_a_feature_asked_of_a_store_without_it_names_the_feature_and_the_fix(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError) as retaining:
        Engine(store=MemoryStore(), retention=Retention())
    assert str(retaining.value) == (
        "Engine(retention=...) needs a store that compacts and deletes finished runs "
        "(MemoryStore does not): use memory.SQLStore, or declare the feature on MemoryStore "
        "by subclassing orchestrator.ext.RetainingStore (a Store itself) and implementing "
        "delete, retain, compact, collect_garbage, size"
    )
    no_limits = Cluster(share_limits=False)
    with pytest.raises(UsageError, match=r"leases its runs to engines \(MemoryStore does not\)"):
        Engine(store=MemoryStore(), cluster=no_limits)
    with pytest.raises(
        UsageError, match=r"LeaseStore \(a Store itself\) and implementing claim, renew, release"
    ):
        Engine(store=MemoryStore(), cluster=no_limits)
    with pytest.raises(UsageError, match="carries cancel requests.*ask_cancel, cancels"):
        Engine(store=LeasesAlone(), cluster=no_limits)
    engine = Engine(store=LeasesAndCancels(), cluster=no_limits)
    with pytest.raises(UsageError, match="the service over Engine.cluster=.... needs a store "):
        Service(engine, Registry(), (), batch_dir=tmp_path)
    with pytest.raises(UsageError, match="reserve_key, name_key"):
        Service(engine, Registry(), (), batch_dir=tmp_path)


def test_a_feature_is_found_by_its_class_not_by_its_methods() -> None:
    """A store with every lease method that does not declare the feature is refused: what
    it promises is what its class says, not what its attributes happen to be named."""
    with pytest.raises(UsageError, match="leases its runs"):
        Engine(store=Undeclared(), cluster=Cluster(share_limits=False))
    store = LeasesAndCancels()
    assert LeaseStore.require(store, "a test") is store
    assert CancelStore.require(store, "a test") is store
    with pytest.raises(UsageError, match="a test needs a store that keeps idempotency keys"):
        KeyStore.require(store, "a test")


def test_a_store_that_declares_a_feature_has_all_its_methods() -> None:
    """Declared without one of its methods, a feature fails when the store is made, not at
    the first call of the method it lacks."""

    class HalfCancels(MemoryStore, CancelStore):
        ask_cancel = NotCalled.ask_cancel

    with pytest.raises(TypeError, match="abstract method '?cancels"):
        HalfCancels()  # type: ignore[abstract]


def test_the_sql_store_declares_every_feature(tmp_path: Path) -> None:
    store = SQLStore(tmp_path / "never-opened.db")
    assert all(isinstance(store, feature) for feature in FEATURES)
    engine = Engine(store=store, retention=Retention(), cluster=Cluster(share_limits=False))
    Service(engine, Registry(), (), batch_dir=tmp_path)  # no error: it keeps the keys too


def test_a_store_without_a_feature_runs_without_asking_for_it(tmp_path: Path) -> None:
    """Nothing is asked of a store until a feature is: no retention, no cluster, no
    service over a cluster, no error."""
    engine = Engine(store=MemoryStore())
    Service(engine, Registry(), (), batch_dir=tmp_path)


def _of_a_class(node: ast.Attribute) -> bool:
    """`type(...).x` or `Name.x` with a class's name: an attribute looked up on a class."""
    owner = node.value
    if isinstance(owner, ast.Call):
        return isinstance(owner.func, ast.Name) and owner.func.id == "type"
    return isinstance(owner, ast.Name) and owner.id[:1].isupper()


def _method_comparisons(source: str, name: str) -> list[str]:
    """`type(a).x is B.x` (or `is not`, or two classes) in `source`: telling what an object
    can do by comparing its class's methods with another's, as the engine once told a store
    that leases by `type(store).claim is Store.claim`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
            if (
                isinstance(op, ast.Is | ast.IsNot)
                and isinstance(left, ast.Attribute)
                and isinstance(right, ast.Attribute)
                and left.attr == right.attr
                and (_of_a_class(left) or _of_a_class(right))
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_finds_a_feature_by_comparing_methods() -> None:
    packages = ("orchestrator", "memory", "executors", "agents", "bench")
    sources = [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(sources) > 50
    found = [
        hit
        for path in sources
        for hit in _method_comparisons(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "find a feature by its protocol (isinstance), not by its methods"


def test_the_method_comparison_check_can_fail() -> None:
    """The check above finds the comparison the engine once made, and `is not` too; an
    identity test of two objects' attributes is not one."""
    code = (
        "def f(store):\n"
        "    return type(store).claim is Store.claim\n"
        "def g(a, b):\n"
        "    return a.fn is b.fn or type(a).release is not type(b).release\n"
    )
    assert _method_comparisons(code, "sample.py") == [
        "sample.py:2: type(store).claim is Store.claim",
        "sample.py:4: type(a).release is not type(b).release",
    ]
