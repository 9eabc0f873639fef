"""Client-side hold-back: with `Limits(kv_tokens=...)`, a new program waits while paused
programs' caches fill the backend, instead of evicting them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from agents import Agent
from executors import FunctionLLM
from orchestrator import (
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    TaskContext,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.engine._keepalive import CacheBudget
from orchestrator.ext import ToolSpec


def test_a_new_program_waits_while_the_others_fill_the_budget() -> None:
    budget = CacheBudget(1500)
    assert not budget.holds_back("a", now=0.0)  # empty: let in, counted at a guess
    budget.start("a", 900)
    budget.end("a", 900, held=1000, keep_s=9.0, now=1.0)  # paused until t=10
    assert not budget.holds_back("b", now=1.0)
    budget.start("b", 900)
    budget.end("b", 900, held=1000, keep_s=11.0, now=1.0)
    assert budget.holds_back("c", now=2.0)  # 2,000 held of 1,500
    assert not budget.holds_back("a", now=2.0)  # a holds its cache: it never waits
    assert budget.used(10.5) == 1000  # a's keep-alive ran out
    budget.start("d", 600)  # a call running now (d was let in earlier)
    assert budget.holds_back("a", now=10.5)  # a is back too late: it holds nothing now
    budget.end("d", 600, held=0, keep_s=0.0, now=10.5)
    assert not budget.holds_back("c", now=10.5)
    budget.drop("b")
    budget.unreserve("c")  # c's task ended without a call: its guess goes
    assert budget.used(10.5) == 0


def test_parallel_calls_of_one_program_all_count_until_the_last_ends() -> None:
    budget = CacheBudget(10_000)
    for _ in range(3):
        budget.start("p", 1000)
    assert budget.used(0.0) == 3000
    budget.end("p", 1000, held=1010, keep_s=0.0, now=1.0)
    assert budget.used(5.0) == 2000 + 1010  # two still run; what the first left is kept
    budget.end("p", 1000, held=1010, keep_s=0.0, now=6.0)
    budget.end("p", 1000, held=1010, keep_s=2.0, now=7.0)
    assert budget.used(8.0) == 1010 and budget.used(9.0) == 0


def test_one_pass_does_not_let_a_crowd_in() -> None:
    budget = CacheBudget(1600)  # guesses 1600 // 16 = 100 tokens a program at first
    let_in = [p for p in map(str, range(100)) if not budget.holds_back(p, now=0.0)]
    assert len(let_in) == 16


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(UsageError, match="kv_tokens"):
        Limits(kv_tokens=0)


def reply(request: LLMRequest, hints: Hints) -> LLMResponse:
    return LLMResponse("ok", Usage(prompt_tokens=1000, completion_tokens=10))


def agent(name: str) -> Workflow:
    """think -> a 5 s tool -> think (last)."""
    bot = Agent(name, "You fix bugs.")

    async def tool(ctx: TaskContext) -> None:
        await ctx.clock.sleep(5.0)

    wf = Workflow(name)
    wf.add("think0", bot.ask("look"))
    wf.add("tool", tool, after=["think0"], resource="tools")
    wf.add("think1", bot.ask("fix"), after=["tool"])
    return wf


def test_hold_back_keeps_a_new_program_out_until_a_paused_one_is_done() -> None:
    # a and b answer at t=1 and pause (tool 5 s, keep-alive 10 s) holding 1,010 tokens each;
    # a's last call runs t=6..7 and frees its cache; only then does c start.
    agents = {name: lambda name=name: agent(name) for name in "abc"}
    assert first_call_at(agents, "c", None) == pytest.approx(2.0)
    assert first_call_at(agents, "c", 1500) == pytest.approx(7.0)
    assert first_call_at(agents, "c", 5000) == pytest.approx(2.0)  # room for all: no wait


def loop_agent(name: str) -> Workflow:
    """An agent loop inside one function task: call, a 5 s tool inside the task, call."""

    async def loop(ctx: TaskContext) -> None:
        request = LLMRequest((Message("user", "x" * 4000),), "m", tools=(ToolSpec("build", ""),))
        await ctx.complete(request)
        await ctx.clock.sleep(5.0)
        await ctx.complete(request)

    wf = Workflow(name)
    wf.add("loop", loop)
    return wf


TEN_SECONDS = KeepAlive(initial_s=10.0)


def first_call_at(workflows: dict[str, Callable[[], Workflow]], late: str, kv: int | None,
                  keep_alive: KeepAlive | None = TEN_SECONDS) -> float:  # fmt: skip
    """Submit every workflow but `late` at t=0, `late` at t=2; when does `late` first call?"""
    clock = VirtualClock()
    llm = FunctionLLM(reply, latency=1.0, clock=clock)

    async def main() -> None:
        async with Engine(
            backends={"default": llm},
            clock=clock,
            limits={"default": Limits(16, kv_tokens=kv)},
            keep_alive=keep_alive,
        ) as engine:
            handles = [engine.submit(make()) for name, make in workflows.items() if name != late]
            await clock.sleep(2.0)
            handles.append(engine.submit(workflows[late]()))
            for handle in handles:
                assert (await handle).ok

    clock.run(main())
    return min(call.at for call in llm.calls if call.hints.program_id.startswith(late))


def test_agent_loops_inside_one_task_are_held_back_too() -> None:
    loops = {name: lambda name=name: loop_agent(name) for name in "abc"}
    assert first_call_at(loops, "c", None) == pytest.approx(2.0)
    assert first_call_at(loops, "c", 1500) == pytest.approx(7.0)  # a's loop ends at t=7


def test_a_call_kept_for_no_time_frees_the_budget_at_once() -> None:
    def slow_tool(name: str) -> Workflow:
        wf = agent(name)
        wf.replace("tool", _sleeper(60.0), resource="tools")
        return wf

    flows = {"a": lambda: slow_tool("a"), "b": lambda: slow_tool("b"), "c": lambda: agent("c")}
    # No keep-alive: a and b's caches may go when their first calls end (t=1), so c, coming
    # at t=2, goes at once instead of waiting for their 60 s tools.
    assert first_call_at(flows, "c", 1500, keep_alive=None) == pytest.approx(2.0)
    # Kept 10 s: until t=11 (the engine looks again a hair after, never before).
    assert first_call_at(flows, "c", 1500) == pytest.approx(11.0, abs=0.01)


def _sleeper(seconds: float) -> Callable[[TaskContext], Awaitable[None]]:
    async def sleep(ctx: TaskContext) -> None:
        await ctx.clock.sleep(seconds)

    return sleep
