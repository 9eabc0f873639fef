"""Agents and tools as tasks."""

from __future__ import annotations

import pytest

from agents import Agent, Tool
from executors import FunctionLLM, echo
from orchestrator import Engine, RunResult, TaskContext, UsageError, VirtualClock, Workflow


def test_agent_request_opens_with_its_system_prompt() -> None:
    agent = Agent("critic", "You review drafts.", model="m", max_tokens=50)
    request = agent.request("Review: hello")
    assert [m.role for m in request.messages] == ["system", "user"]
    assert request.messages[0].content == "You review drafts."
    assert request.model == "m" and request.max_tokens == 50


def test_ask_builds_the_prompt_from_the_task_inputs(clock: VirtualClock) -> None:
    agent = Agent("summariser", "Summarise.")
    llm = FunctionLLM(echo)
    wf = Workflow("ask")
    wf.add("source", lambda: "the text")
    wf.add("summary", agent.ask(lambda ctx: f"Summarise: {ctx.input('source')}"), after=["source"])

    async def main() -> RunResult:
        async with Engine(backends={"default": llm}) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert result["summary"] == "Summarise: the text"
    assert llm.calls[0].request.messages[0].content == "Summarise."


def test_an_llm_task_on_an_unknown_backend_is_refused_before_it_runs(clock: VirtualClock) -> None:
    agent = Agent("a", "s", backend="gpu-cluster")
    wf = Workflow("nobackend")
    wf.add("t", agent.ask("hi"))

    async def main() -> None:
        async with Engine(backends={"default": FunctionLLM(echo)}) as engine:
            await engine.run(wf)

    with pytest.raises(UsageError, match="'gpu-cluster'.*known: default, local, tools"):
        clock.run(main())


def test_tools_run_as_tasks_with_fixed_or_computed_arguments(clock: VirtualClock) -> None:
    def add(a: int, b: int) -> int:  # sync: runs in a worker thread
        return a + b

    async def shout(text: str) -> str:
        return text.upper()

    adder = Tool("add", add, "Add two numbers", {"type": "object"})
    shouter = Tool("shout", shout)
    wf = Workflow("tools")
    wf.add("sum", adder.call({"a": 2, "b": 3}))
    wf.add("loud", shouter.call(lambda ctx: {"text": f"total {ctx.input('sum')}"}), after=["sum"])

    async def main() -> RunResult:
        async with Engine() as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert result.results == {"sum": 5, "loud": "TOTAL 5"}
    assert wf.task("sum").resource == "tools"
    assert adder.spec().name == "add"


def test_a_tool_with_bad_arguments_fails_with_the_reason(clock: VirtualClock) -> None:
    async def needs_q(q: str) -> str:
        return q

    search = Tool("search", needs_q)
    wf = Workflow("badargs")
    wf.add("wrong_name", search.call({"query": "x"}))
    wf.add("not_a_mapping", search.call(lambda ctx: ["x"]))  # type: ignore[arg-type,return-value]

    async def main() -> RunResult:
        async with Engine() as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert "unexpected keyword argument 'query'" in result.failures["wrong_name"]
    assert "needs its arguments as a mapping, got list" in result.failures["not_a_mapping"]


def test_ask_refuses_a_prompt_that_is_neither_text_nor_function() -> None:
    with pytest.raises(UsageError, match="takes a str or a function"):
        Agent("a", "s").ask(42)  # type: ignore[arg-type]


def test_llm_calls_from_inside_a_function_task_carry_hints(clock: VirtualClock) -> None:
    agent = Agent("a", "s")
    llm = FunctionLLM(echo, latency=1.5)

    async def two_calls(ctx: TaskContext) -> str:
        first = await ctx.complete(agent.request("one"))
        second = await ctx.complete(agent.request("two"), keep_alive_s=3.0, last_call=True)
        return first.text + second.text

    wf = Workflow("inner")
    wf.add("t", two_calls)

    async def main() -> RunResult:
        async with Engine(backends={"default": llm}) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert result["t"] == "onetwo" and result.llm_calls == 2 and result.duration == 3.0
    assert [c.hints.last_call for c in llm.calls] == [False, True]
    assert llm.calls[1].hints.keep_alive_s == 3.0
