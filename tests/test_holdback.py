"""Client-side hold-back: with `Limits(kv_tokens=...)`, a new program waits while paused
programs' caches fill the backend, instead of evicting them."""

from __future__ import annotations

import pytest

from agents import Agent
from executors import FunctionLLM
from orchestrator import (
    CacheBudget,
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMRequest,
    LLMResponse,
    TaskContext,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)


def test_a_new_program_waits_while_the_others_fill_the_budget() -> None:
    budget = CacheBudget(1500)
    assert not budget.holds_back("a", now=0.0)  # empty: let in
    budget.note("a", 1000, until=10.0)  # paused until t=10
    assert not budget.holds_back("b", now=1.0)
    budget.note("b", 1000, until=12.0)
    assert budget.holds_back("c", now=2.0)  # 2,000 held of 1,500
    assert not budget.holds_back("a", now=2.0)  # programs already in never wait
    assert not budget.holds_back("c", now=10.5)  # a's keep-alive ran out
    assert budget.used(10.5) == 1000 + 1000  # b, and c counted at the mean at once
    budget.drop("b")
    assert budget.used(10.5) == 1000


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


def first_call_of_c(kv_tokens: int | None) -> float:
    clock = VirtualClock()
    llm = FunctionLLM(reply, latency=1.0, clock=clock)

    async def main() -> None:
        async with Engine(
            backends={"default": llm},
            clock=clock,
            limits={"default": Limits(16, kv_tokens=kv_tokens)},
            keep_alive=KeepAlive(initial_s=10.0),
        ) as engine:
            a, b = engine.submit(agent("a")), engine.submit(agent("b"))
            await clock.sleep(2.0)
            c = engine.submit(agent("c"))
            for handle in (a, b, c):
                assert (await handle).ok

    clock.run(main())
    return min(call.at for call in llm.calls if call.hints.program_id.startswith("c"))


def test_hold_back_keeps_a_new_program_out_until_a_paused_one_is_done() -> None:
    # a and b answer at t=1 and pause (tool 5 s, keep-alive 10 s) holding 1,010 tokens each;
    # a's last call runs t=6..7 and frees its cache; only then does c start.
    assert first_call_of_c(None) == pytest.approx(2.0)
    assert first_call_of_c(1500) == pytest.approx(7.0)
    assert first_call_of_c(5000) == pytest.approx(2.0)  # room for all: nobody waits
