"""Resume: a run stopped mid-way (its process gone) goes on in a new engine from its log,
keeping what had finished, running what had not, and paying no LLM call twice. On SQLite
and PostgreSQL.

A crash is played in process: the engine is closed while a task waits on a gate that the
first "process" never opens; a closing durable engine records nothing more, so the store is
left as a killed process leaves it (committed events; the run still `running`). The
subprocess harness with real SIGKILLs is bench/crash.py (tests/test_crash.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest
from conftest import StoreFactory

from agents import Agent, Tool
from executors import FunctionLLM, echo
from orchestrator import (
    Engine,
    LLMRequest,
    Message,
    Registry,
    TaskContext,
    Template,
    UsageError,
    Workflow,
)
from orchestrator.engine._run import task_kind
from orchestrator.ext import Store

writer = Agent("writer", "You write.")


class Gate:
    """Where tasks of the first process stop; the resumed process opens it first."""

    event: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None
    keys: ClassVar[list[str]] = []
    runs: ClassVar[dict[str, int]] = {}

    @classmethod
    def reset(cls) -> None:
        cls.event, cls.reached, cls.keys, cls.runs = asyncio.Event(), asyncio.Event(), [], {}

    @classmethod
    async def wait(cls, name: str) -> None:
        cls.runs[name] = cls.runs.get(name, 0) + 1
        assert cls.event is not None and cls.reached is not None
        if not cls.event.is_set():
            cls.reached.set()
        await cls.event.wait()


# Task code lives at the top of the module: a resumed run finds it by `module:qualname`.


async def draft(ctx: TaskContext) -> str:
    """Calls the LLM itself, then stops at the gate: its call finished before the crash."""
    reply = await ctx.complete(
        LLMRequest(messages=(Message("user", f"draft about {ctx.input('topic')}"),), model="m")
    )
    await Gate.wait("draft")
    return reply.text.upper()


def topic() -> str:
    return "kv caches"


async def fan_out(ctx: TaskContext) -> int:
    """Adds tasks while it runs, then stops at the gate: a rerun adds them again."""
    for i in range(2):
        ctx.workflow.add(f"part {i}", writer.ask(f"Part {i}"), before=["join"])
    await Gate.wait("fan_out")
    return 2


def join(ctx: TaskContext) -> str:
    return " / ".join(f"{k}={v}" for k, v in sorted(ctx.inputs.items()))


async def charge(ctx: TaskContext) -> str:
    Gate.keys.append(ctx.idempotency_key)
    await Gate.wait("charge")
    return f"charged {ctx.idempotency_key}"


def order_key(inputs: dict[str, Any]) -> str:
    return f"order-{inputs['topic']}"


def search(q: str) -> list[str]:
    return [f"paper on {q}"]


search_tool = Tool("search", search)
REGISTRY = Registry(writer, search_tool)


def counting_llm() -> tuple[FunctionLLM, dict[str, int]]:
    sent: dict[str, int] = {}

    def reply(request: LLMRequest, hints: object) -> str:
        text = request.messages[-1].content
        sent[text] = sent.get(text, 0) + 1
        return echo(request, hints)  # type: ignore[arg-type]

    return FunctionLLM(reply), sent


async def crash_during(
    store: Store, llm: FunctionLLM, wf: Workflow, *, reach: int = 1, **submit: Any
) -> str:
    """Run `wf` until `reach` tasks wait at the gate and their events are committed, then
    let the process go as a crash does. Returns the run's id."""
    async with Engine(backends={"default": llm}, store=store) as engine:
        handle = engine.submit(wf, **submit)
        assert Gate.reached is not None
        while len([n for n, c in Gate.runs.items() if c]) < reach:
            Gate.reached.clear()
            await Gate.reached.wait()
        assert engine.journal is not None
        await engine.journal.durable()
        run_id = handle.id
    return run_id


def resumed(
    make_store: StoreFactory,
    body: Callable[[Store, FunctionLLM, dict[str, int]], Awaitable[None]],
) -> None:
    async def main() -> None:
        Gate.reset()
        llm, sent = counting_llm()
        async with make_store() as store:
            await body(store, llm, sent)

    asyncio.run(main())


def test_a_resumed_run_keeps_finished_results_and_pays_no_call_twice(
    make_store: StoreFactory,
) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("report")
        wf.add("topic", topic)
        wf.add("intro", writer.ask("Write an intro"), after=["topic"])
        wf.add("draft", draft, after=["topic"])
        wf.add("papers", search_tool.call({"q": "kv"}), after=["topic"])
        wf.add("join", join, after=["intro", "draft", "papers"])
        run_id = await crash_during(store, llm, wf)
        assert sent == {"Write an intro": 1, "draft about kv caches": 1}
        row = await store.workflow(run_id)
        assert row is not None and row.status == "running"  # as a killed process leaves it

        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            plans = await engine.plan_resume(REGISTRY)
            assert [(p.workflow, p.rerun, p.pending) for p in plans] == [
                (run_id, ("draft",), ("join",))
            ]
            report = await engine.resume(REGISTRY)
            assert [h.id for h in report.runs] == [run_id]
            result = await report.runs[0]
        assert result.status == "succeeded", result.failures
        assert result["draft"] == "DRAFT ABOUT KV CACHES"
        assert result["intro"] == "Write an intro"
        assert "papers=['paper on kv']" in result["join"]
        # The intro finished before the crash: kept. The draft's call had finished: its
        # rerun was answered from the store. Nothing was sent twice.
        assert sent == {"Write an intro": 1, "draft about kv caches": 1}
        assert Gate.runs["draft"] == 2  # the draft task itself did run again
        row = await store.workflow(run_id)
        assert row is not None and row.status == "succeeded"
        assert await store.unfinished() == []
        records = await store.events(run_id)
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        assert [r.kind for r in records].count("workflow_resumed") == 1
        assert [r.kind for r in records].count("workflow_finished") == 1

    resumed(make_store, body)


def test_tenant_labels_and_a_template_prompt_survive_a_resume(make_store: StoreFactory) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("templated")
        wf.add("topic", topic)
        wf.add("draft", draft, after=["topic"])
        wf.add(
            "intro",
            writer.ask(Template("Intro on ${topic}, $${not a ref}")),
            after=["topic", "draft"],
        )
        labels = {"team": "search", "ticket": "T-1"}
        run_id = await crash_during(store, llm, wf, tenant="acme", labels=labels)
        row = await store.workflow(run_id)
        assert row is not None and (row.tenant, dict(row.labels)) == ("acme", labels)

        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
            result = await report.runs[0]
        assert result.status == "succeeded", result.failures
        assert result["intro"] == "Intro on kv caches, ${not a ref}"
        row = await store.workflow(run_id)
        assert row is not None and row.status == "succeeded"
        assert (row.tenant, dict(row.labels)) == ("acme", labels)
        assert [w.id for w in await store.workflows(tenant="acme", labels=labels)] == [run_id]

    resumed(make_store, body)


def test_tasks_added_at_run_time_come_back_and_a_rerun_may_add_them_again(
    make_store: StoreFactory,
) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("fan")
        wf.add("fan", fan_out)
        wf.add("join", join, after=["fan"])
        run_id = await crash_during(store, llm, wf)
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            (plan,) = await engine.plan_resume(REGISTRY)
            # The parts it added finished before the crash (the LLM answers at once).
            assert (plan.rerun, plan.pending, plan.kept) == (("fan",), ("join",), 2)
            report = await engine.resume(REGISTRY)
            result = await report.runs[0]
        assert result.status == "succeeded", result.failures
        assert result["join"] == "fan=2 / part 0=Part 0 / part 1=Part 1"
        assert sent == {"Part 0": 1, "Part 1": 1}
        assert result.workflow == run_id

    resumed(make_store, body)


def test_a_task_that_is_not_idempotent_waits_for_a_decision(make_store: StoreFactory) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("pay")
        wf.add("topic", topic)
        wf.add("charge", charge, after=["topic"], idempotent=False)
        wf.add("receipt", join, after=["charge"])
        run_id = await crash_during(store, llm, wf)
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
            assert report.runs == []
            assert [(p.workflow, p.needs_decision) for p in report.needs_decision] == [
                (run_id, ("charge",))
            ]
            assert Gate.runs["charge"] == 1  # not run again silently
            row = await store.workflow(run_id)
            assert row is not None and row.status == "running"  # left for the decision

            report = await engine.resume(REGISTRY, decisions={f"{run_id}/charge": "fail"})
            result = await report.runs[0]
        assert result.status == "failed"
        assert "not idempotent" in result.failures["charge"]
        assert result.skipped["receipt"] == "dependency 'charge' failed"
        assert Gate.runs["charge"] == 1

    resumed(make_store, body)


def test_a_decision_to_rerun_runs_it_with_the_same_idempotency_key(
    make_store: StoreFactory,
) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("pay")
        wf.add("topic", topic)
        wf.add("charge", charge, after=["topic"], idempotent=False)
        run_id = await crash_during(store, llm, wf)
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY, decisions={run_id: "rerun"})
            result = await report.runs[0]
        assert result["charge"] == f"charged {run_id}/charge"
        assert Gate.keys == [f"{run_id}/charge", f"{run_id}/charge"]  # stable across lives

    resumed(make_store, body)


def test_a_declared_idempotency_key_needs_no_decision(make_store: StoreFactory) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("pay")
        wf.add("topic", topic)
        wf.add("charge", charge, after=["topic"], idempotent=False, idempotency_key=order_key)
        await crash_during(store, llm, wf)
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
            result = await report.runs[0]
        assert result["charge"] == "charged order-kv caches"
        assert Gate.keys == ["order-kv caches", "order-kv caches"]

    resumed(make_store, body)


def test_a_run_whose_code_cannot_be_found_is_reported_and_left_as_it_was(
    make_store: StoreFactory,
) -> None:
    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        async def local_step(ctx: TaskContext) -> None:
            await Gate.wait("local")

        wf = Workflow("local")
        wf.add("step", local_step)
        run_id = await crash_during(store, llm, wf)
        before = len(await store.events(run_id))
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
        assert report.runs == []
        (failed,) = report.failed
        assert failed.workflow == run_id
        assert "defined inside a function" in (failed.error or "")
        assert "Registry(" in (failed.error or "")
        assert len(await store.events(run_id)) == before  # nothing was written
        row = await store.workflow(run_id)
        assert row is not None and row.status == "running"

        # Registered, it is found.
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(Registry(local_step))
            result = await report.runs[0]
        assert result.status == "succeeded"

    resumed(make_store, body)


def test_resume_needs_a_store_and_a_running_engine() -> None:
    async def main() -> None:
        async with Engine(backends={"default": FunctionLLM(echo)}) as engine:
            with pytest.raises(UsageError, match="needs a store"):
                await engine.resume()

    asyncio.run(main())


def test_the_registry_names_what_is_missing() -> None:
    from orchestrator.ext import ActionSpec, RebuildError

    registry = Registry(imports=False)
    with pytest.raises(RebuildError, match="no agent named 'critic'"):
        registry.action(ActionSpec("llm", "critic", {"prompt": "x"}))
    with pytest.raises(RebuildError, match="no function test_resume:topic is registered"):
        registry.action(ActionSpec("function", "test_resume:topic"))
    with pytest.raises(RebuildError, match="cannot be found"):
        Registry().action(ActionSpec("function", "test_resume:no_such_function"))
    assert Registry().function("test_resume:topic") is topic
    assert Registry(topic, imports=False).function("test_resume:topic") is topic


def test_a_result_recalled_by_its_idempotency_key_teaches_no_duration(
    make_store: StoreFactory,
) -> None:
    """A crash after a keyed task's result was recorded but before its end was: resumed,
    the task is answered from the record at once. That is not what its kind takes, so
    neither the engine's mean nor its least learns it (as for a call answered from the
    record, tests/test_headroom.py)."""

    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("pay")
        wf.add("topic", topic)
        wf.add("charge", charge, after=["topic"], idempotent=False, idempotency_key=order_key)
        label = task_kind("batch", wf.task("charge").action.label)
        run_id = await crash_during(store, llm, wf)
        # What the crashed process's journal had committed: the result under its key, the
        # task's end not yet.
        await store.record_call(run_id, "task:order-kv caches", b'"charged order-kv caches"')
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
            result = await report.runs[0]
            learned = (
                engine.urgency.durations.least(label),
                engine.urgency.durations.estimate(label),
            )
            default = engine.urgency.durations.default
        assert result.status == "succeeded", result.failures
        assert result["charge"] == "charged order-kv caches"
        assert Gate.keys == ["order-kv caches"]  # not run again: recalled
        assert learned == (default, default)

    resumed(make_store, body)
