"""Program-first scheduling end to end: admission order, bounds, and the hints sent."""

from __future__ import annotations

import asyncio

import pytest

from agents import Agent
from executors import FunctionLLM, echo
from orchestrator import (
    EVENT_ADAPTER,
    Engine,
    Limits,
    OverloadedError,
    RunResult,
    TaskContext,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import URGENT_CLASSES, AdmissionTuning


def agent_chain(name: str, agent: Agent, turns: int) -> Workflow:
    wf = Workflow(name)
    prev: list[str] = []
    for i in range(turns):
        wf.add(f"turn{i}", agent.ask(f"{name} turn {i}"), after=prev)
        prev = [f"turn{i}"]
    return wf


def served_order(llm: FunctionLLM) -> list[str]:
    return [call.request.messages[-1].content for call in llm.calls]


def run_programs(
    clock: VirtualClock, policy: str, workflows: list[Workflow], **submit: object
) -> tuple[FunctionLLM, list[RunResult]]:
    llm = FunctionLLM(echo, latency=1.0)

    async def main() -> list[RunResult]:
        async with Engine(
            backends={"default": llm},
            limits={"default": Limits(max_in_flight=1)},
            admission=AdmissionTuning(order=policy),
        ) as engine:
            handles = [engine.submit(wf, **submit) for wf in workflows]  # type: ignore[arg-type]
            return [await h for h in handles]

    return llm, clock.run(main())


def test_fcfs_serves_whole_programs_in_arrival_order(clock: VirtualClock) -> None:
    agent = Agent("coder", "You write code.")
    workflows = [agent_chain(n, agent, 3) for n in ("p1", "p2", "p3")]
    llm, results = run_programs(clock, "fcfs", workflows)
    assert served_order(llm) == [f"{p} turn {i}" for p in ("p1", "p2", "p3") for i in range(3)]
    # Program 1 finishes after 3 s, not after 7 s as request-level interleaving would give.
    assert [r.duration for r in results] == [3.0, 6.0, 9.0]


def test_las_lets_a_short_program_overtake_a_long_one(clock: VirtualClock) -> None:
    agent = Agent("coder", "You write code.")
    long, short = agent_chain("long", agent, 4), agent_chain("short", agent, 1)
    llm, results = run_programs(clock, "las", [long, short])
    order = served_order(llm)
    # The long program attained 1 s of service by the time the short one is ready.
    assert order.index("short turn 0") == 1
    assert results[1].duration == 2.0


def test_slack_serves_the_tightest_deadline_first(clock: VirtualClock) -> None:
    agent = Agent("sql", "You write SQL.")
    llm = FunctionLLM(echo, latency=1.0)

    async def main() -> dict[str, float]:
        async with Engine(
            backends={"default": llm}, limits={"default": Limits(max_in_flight=1)}
        ) as engine:
            relaxed = engine.submit(agent_chain("relaxed", agent, 2), deadline=100)
            tight = engine.submit(agent_chain("tight", agent, 2), deadline=5)
            results = [await relaxed, await tight]
            return {r.workflow: r.duration for r in results}

    durations = clock.run(main())
    # Both arrive at once; tight has slack 5 - 2 = 3 s, relaxed 98 s.
    assert served_order(llm) == ["tight turn 0", "tight turn 1", "relaxed turn 0", "relaxed turn 1"]
    assert durations == {"tight": 2.0, "relaxed": 4.0}


def test_interactive_work_outranks_batch(clock: VirtualClock) -> None:
    agent = Agent("a", "sys")
    llm = FunctionLLM(echo, latency=1.0)

    async def main() -> tuple[RunResult, RunResult]:
        async with Engine(
            backends={"default": llm}, limits={"default": Limits(max_in_flight=1)}
        ) as engine:
            batch = engine.submit(agent_chain("batch", agent, 5))
            await asyncio.sleep(0.5)
            urgent = engine.submit(agent_chain("urgent", agent, 2), priority="interactive")
            return await batch, await urgent

    batch, urgent = clock.run(main())
    # The batch call in flight finishes at 1 s; then both interactive turns run.
    assert urgent.finished_at == 3.0
    assert batch.finished_at == 7.0


def test_in_flight_calls_never_exceed_the_bound(clock: VirtualClock) -> None:
    running = 0
    peak = 0

    async def work(ctx: TaskContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await ctx.clock.sleep(1)
        running -= 1

    wf = Workflow("wide")
    for i in range(40):
        wf.add(f"t{i}", work)

    async def main() -> RunResult:
        async with Engine(limits={"local": Limits(max_in_flight=7)}) as engine:
            result = await engine.run(wf)
            stats = {s.name: s for s in engine.stats().resources}
            assert stats["local"].admitted == 40 and stats["local"].in_flight == 0
            assert stats["local"].peak_waiting == 40
            return result

    result = clock.run(main())
    assert result.ok and peak == 7
    assert clock.monotonic() == 6.0  # ceil(40 / 7) rounds of one second


def test_a_full_wait_queue_fails_the_overflowing_tasks_with_a_typed_error(
    clock: VirtualClock,
) -> None:
    async def work(ctx: TaskContext) -> None:
        await ctx.clock.sleep(1)

    wf = Workflow("flood")
    for i in range(10):
        wf.add(f"t{i}", work)

    async def main() -> RunResult:
        async with Engine(limits={"local": Limits(max_in_flight=1, max_waiting=4)}) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert len(result.results) == 4
    overflow = [e for e in result.errors.values() if isinstance(e, OverloadedError)]
    assert len(overflow) == 6
    assert "wait queue of resource 'local' is full (4 waiting)" in str(overflow[0])


def test_too_many_running_workflows_is_a_typed_error(clock: VirtualClock) -> None:
    async def work(ctx: TaskContext) -> None:
        await ctx.clock.sleep(1)

    def small(i: int) -> Workflow:
        wf = Workflow(f"w{i}")
        wf.add("t", work)
        return wf

    async def main() -> int:
        async with Engine(max_workflows=2) as engine:
            first = [engine.submit(small(i)) for i in range(2)]
            with pytest.raises(OverloadedError, match="running workflows is full"):
                engine.submit(small(3))
            for h in first:
                await h
            await engine.run(small(4))  # room again once those ended
            return engine.stats().finished_workflows

    assert clock.run(main()) == 3


def test_hints_carry_the_program_and_its_urgency(clock: VirtualClock) -> None:
    agent = Agent("a", "sys", max_tokens=64)
    llm = FunctionLLM(echo, latency=1.0)

    async def main() -> None:
        async with Engine(
            backends={"default": llm}, limits={"default": Limits(max_in_flight=4)}
        ) as engine:
            await asyncio.gather(
                engine.run(agent_chain("first", agent, 1)),
                engine.run(agent_chain("second", agent, 1), deadline=30, priority="interactive"),
            )

    clock.run(main())
    hints = {call.hints.program_id: call.hints for call in llm.calls}
    assert set(hints) == {"first", "second"}
    assert hints["second"].service in URGENT_CLASSES  # near its deadline: urgent work
    assert hints["first"].service == "slack_rich"
    assert hints["second"].urgency > hints["first"].urgency
    assert hints["first"].expected_output_tokens == 64


def test_usage_is_counted_per_workflow(clock: VirtualClock) -> None:
    agent = Agent("a", "sys")
    llm = FunctionLLM(lambda req, hints: "twelve chars")

    async def main() -> RunResult:
        async with Engine(backends={"default": llm}) as engine:
            return await engine.run(agent_chain("count", agent, 3))

    result = clock.run(main())
    assert result.llm_calls == 3
    assert result.usage.completion_tokens == 9  # 12 characters is 3 tokens, three times


def test_event_stream_is_typed_ordered_and_persistable(clock: VirtualClock) -> None:
    agent = Agent("a", "sys")
    llm = FunctionLLM(echo, latency=2.0)

    async def main() -> list[object]:
        async with Engine(backends={"default": llm}) as engine:
            return [event async for event in engine.iter(agent_chain("evt", agent, 2))]

    events = clock.run(main())
    kinds = [e.kind for e in events]  # type: ignore[attr-defined]
    assert kinds == [
        "workflow_started",
        "task_added",
        "task_added",
        "task_ready",
        "task_started",
        "task_succeeded",
        "task_ready",
        "task_started",
        "task_succeeded",
        "workflow_finished",
    ]
    succeeded = [e for e in events if e.kind == "task_succeeded"]  # type: ignore[attr-defined]
    assert [e.at for e in succeeded] == [2.0, 4.0]  # type: ignore[attr-defined]
    for event in events:
        assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event  # type: ignore[arg-type]
