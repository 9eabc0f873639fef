"""KV keep-alive: pauses learned per tool become the hint; the last call is marked."""

from __future__ import annotations

import pytest

from agents import Agent, Tool
from executors import FunctionLLM, echo
from orchestrator import (
    Engine,
    KeepAlive,
    LLMRequest,
    Message,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.engine._keepalive import PausePredictor
from orchestrator.ext import ToolSpec


def test_prediction_is_a_capped_quantile_of_recent_pauses() -> None:
    p = PausePredictor(KeepAlive(quantile=0.8, cap_s=5.0, initial_s=None, window=10))
    assert p.predict_one("grep") is None  # nothing seen, no default
    for s in [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 30.0]:
        p.observe("grep", s)
    assert p.predict_one("grep") == 0.8  # nearest rank: the 8th of 10
    for _ in range(10):
        p.observe("grep", 40.0)  # the window forgets the short ones
    assert p.predict_one("grep") == 5.0  # capped
    p.observe("ls", 0.05)
    assert p.predict(["ls", "grep"]) == 5.0  # the longest of the tools that may run
    assert p.predict(["ls"]) == 0.05
    assert p.predict([]) is None


def test_unseen_tools_get_the_initial_guess() -> None:
    p = PausePredictor(KeepAlive(initial_s=2.0, cap_s=1.5))
    assert p.predict(["new"]) == 1.5


@pytest.mark.parametrize(
    "bad", [{"quantile": 0.0}, {"cap_s": 0.0}, {"initial_s": -1.0}, {"window": 0}]
)
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        KeepAlive(**bad)  # type: ignore[arg-type]


def agent_with_tool(clock: VirtualClock, name: str, pause: float, turns: int) -> Workflow:
    """think -> run_tests -> think -> ... : a tool task between LLM calls."""
    agent = Agent(name, "You fix bugs.")

    async def run_tests() -> str:
        await clock.sleep(pause)
        return "ok"

    tool = Tool("run_tests", run_tests)
    wf = Workflow(name)
    prev: list[str] = []
    for t in range(turns):
        wf.add(f"think{t}", agent.ask(f"turn {t}"), after=prev)
        prev = [f"think{t}"]
        if t < turns - 1:
            wf.add(f"tool{t}", tool.call(), after=prev)
            prev = [f"tool{t}"]
    return wf


def test_calls_followed_by_a_tool_carry_its_observed_pause_and_the_last_is_marked() -> None:
    clock = VirtualClock()
    llm = FunctionLLM(echo, latency=0.5, clock=clock)

    async def main() -> None:
        async with Engine(
            backends={"default": llm}, clock=clock, keep_alive=KeepAlive(initial_s=None)
        ) as engine:
            assert (await engine.run(agent_with_tool(clock, "a", pause=3.0, turns=3))).ok
            assert (await engine.run(agent_with_tool(clock, "b", pause=3.0, turns=3))).ok

    clock.run(main())
    by_program = [(c.hints.program_id, c.hints) for c in llm.calls]
    first = [h for p, h in by_program if p.startswith("a")]
    second = [h for p, h in by_program if p.startswith("b")]
    assert first[0].keep_alive_s is None  # the tool was never seen, and no initial guess
    assert first[1].keep_alive_s == pytest.approx(3.0)  # learned from the first pause
    assert all(h.keep_alive_s == pytest.approx(3.0) for h in second[:2])
    assert second[2].keep_alive_s is None  # no tool after the final turn
    assert [h.last_call for h in second] == [False, False, True]


def test_an_agent_loop_inside_one_task_predicts_from_the_tools_it_offers() -> None:
    clock = VirtualClock()
    llm = FunctionLLM(echo, clock=clock)
    wf = Workflow("loop")

    async def loop(ctx: TaskContext) -> None:
        request = LLMRequest((Message("user", "go"),), "m", tools=(ToolSpec("build", ""),))
        await ctx.complete(request)
        await ctx.complete(LLMRequest((Message("user", "done?"),), "m"))

    wf.add("loop", loop)

    async def main() -> None:
        async with Engine(
            backends={"default": llm}, clock=clock, keep_alive=KeepAlive(initial_s=2.0)
        ) as engine:
            assert (await engine.run(wf)).ok

    clock.run(main())
    assert [c.hints.keep_alive_s for c in llm.calls] == [2.0, None]
    # A function task may make many calls: none of them is marked last by the engine.
    assert [c.hints.last_call for c in llm.calls] == [False, False]


def test_keep_alive_off_sends_no_hint() -> None:
    clock = VirtualClock()
    llm = FunctionLLM(echo, clock=clock)

    async def main() -> None:
        async with Engine(backends={"default": llm}, clock=clock, keep_alive=None) as engine:
            assert (await engine.run(agent_with_tool(clock, "c", pause=1.0, turns=2))).ok

    clock.run(main())
    assert [c.hints.keep_alive_s for c in llm.calls] == [None, None]
