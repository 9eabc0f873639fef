"""Tool-using agents: the loop unrolled into tasks, what the model gets wrong said back to it,
bounds that stop a runaway loop, structured output, and a loop resumed after a crash."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, ClassVar

import pydantic
import pytest
from conftest import StoreFactory

from agents import TOOL_ERROR, Agent, LoopLimits, Tool, tool
from executors import FunctionLLM, SimServer
from orchestrator import (
    Engine,
    KeepAlive,
    LLMRequest,
    LLMResponse,
    Registry,
    RunResult,
    ToolCall,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import ActionSpec

Script = Callable[[LLMRequest], LLMResponse | str]


class Weather(pydantic.BaseModel):
    city: str
    celsius: float


class Calls:
    """What the tools saw (tests read it after the run)."""

    seen: ClassVar[list[tuple[str, Any]]] = []


@tool
async def temperature(city: str) -> float:
    """The temperature in a city now.

    Args:
        city: the city's name
    """
    Calls.seen.append(("temperature", city))
    return {"Oslo": 4.0, "Rome": 19.5}.get(city, 10.0)


@tool
def broken(city: str) -> str:
    """A tool that always raises."""
    raise ConnectionError(f"weather service down for {city}")


def calls(*made: tuple[str, dict[str, Any] | str]) -> LLMResponse:
    return LLMResponse(
        "",
        Usage(20, 5),
        "tool_calls",
        tuple(
            ToolCall(f"c{i}", name, args if isinstance(args, str) else json.dumps(args))
            for i, (name, args) in enumerate(made)
        ),
    )


def run(
    clock: VirtualClock, wf: Workflow, script: Script, **engine: Any
) -> tuple[RunResult, FunctionLLM]:
    llm = FunctionLLM(lambda request, hints: script(request), latency=1.0, clock=clock)

    async def main() -> RunResult:
        async with Engine(backends={"default": llm}, **engine) as e:
            return await e.run(wf)

    return clock.run(main()), llm


def tool_replies(request: LLMRequest) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in request.messages if m.role == "tool"}


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    Calls.seen = []


def test_the_schema_comes_from_the_signature_and_docstring() -> None:
    assert temperature.description == "The temperature in a city now."
    params = temperature.parameters
    assert params["required"] == ["city"]
    assert params["properties"]["city"]["description"] == "the city's name"
    assert params["additionalProperties"] is False
    assert temperature.validate('{"city": "Oslo"}') == {"city": "Oslo"}


def test_tools_refuse_what_cannot_be_described() -> None:
    def variadic(*cities: str) -> None: ...

    with pytest.raises(UsageError, match="takes named arguments only"):
        tool(variadic)
    with pytest.raises(UsageError, match="name must be 1-64"):
        Tool("has space", lambda: None)
    with pytest.raises(UsageError, match="tools must be Tool objects"):
        Agent("a", "s", tools=(lambda: None,))  # type: ignore[arg-type]


def test_a_loop_unrolls_into_turns_and_parallel_tool_tasks(clock: VirtualClock) -> None:
    agent = Agent("weather", "You report the weather.", tools=(temperature,))

    def script(request: LLMRequest) -> LLMResponse | str:
        if request.messages[-1].role == "user":
            return calls(("temperature", {"city": "Oslo"}), ("temperature", {"city": "Rome"}))
        return f"Oslo {tool_replies(request)['c0']}, Rome {tool_replies(request)['c1']}"

    wf = Workflow("loop")
    agent.solve(wf, "answer", "Oslo or Rome?")
    wf.add("shout", lambda ctx: ctx.input("answer").upper(), after=["answer"])
    result, llm = run(clock, wf, script)
    assert result.status == "succeeded", result.failures
    assert result["answer"] == "Oslo 4.0, Rome 19.5"
    assert result["shout"] == "OSLO 4.0, ROME 19.5"
    assert sorted(wf.graph.nodes) == [
        "answer",
        "answer.turn1",
        "answer.turn1.0.temperature",
        "answer.turn1.1.temperature",
        "answer.turn2",
        "shout",
    ]
    assert sorted(Calls.seen) == [("temperature", "Oslo"), ("temperature", "Rome")]
    # The second turn sends the history back: the assistant's calls, then each answer.
    second = llm.calls[1].request.messages
    assert [m.role for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [c.name for c in second[2].tool_calls] == ["temperature", "temperature"]
    # Both tool tasks ran at once: two LLM calls of 1 s and nothing else took time.
    assert result.finished_at - result.started_at == pytest.approx(2.0)


def test_what_the_model_gets_wrong_goes_back_to_it(clock: VirtualClock) -> None:
    agent = Agent("weather", "You report the weather.", tools=(temperature, broken))

    def script(request: LLMRequest) -> LLMResponse | str:
        if request.messages[-1].role == "user":
            return calls(
                ("temperature", {"town": "Oslo"}),  # a field the schema does not have
                ("temperature", "{not json"),
                ("forecast", {"city": "Oslo"}),  # no such tool
                ("broken", {"city": "Oslo"}),  # raises
            )
        return json.dumps(tool_replies(request))

    wf = Workflow("mistakes")
    agent.solve(wf, "answer", "Weather?")
    result, _ = run(clock, wf, script)
    assert result.status == "succeeded", result.failures
    replies = json.loads(result["answer"])
    assert "city: Field required" in replies["c0"] and "town: Extra inputs" in replies["c0"]
    assert "Invalid JSON" in replies["c1"]
    assert replies["c2"] == "there is no tool 'forecast'; the tools are: broken, temperature"
    assert replies["c3"] == ("tool 'broken' raised ConnectionError: weather service down for Oslo")
    assert Calls.seen == []  # nothing invalid reached a function
    # Only the valid call became a task; its error is kept in its result.
    assert result["answer.turn1.3.broken"] == {
        TOOL_ERROR: "tool 'broken' raised ConnectionError: weather service down for Oslo"
    }
    assert "answer.turn1.0.temperature" not in wf.graph


def test_a_model_that_never_stops_is_stopped_with_the_reason(clock: VirtualClock) -> None:
    agent = Agent("looper", "You loop.", tools=(temperature,))
    wf = Workflow("runaway")
    agent.solve(wf, "answer", "Go", limits=LoopLimits(max_turns=3))
    result, llm = run(clock, wf, lambda request: calls(("temperature", {"city": "Oslo"})))
    assert result.status == "failed"
    assert result.failures["answer.turn3"].startswith(
        "AgentStopped: agent 'looper' stopped: still calling tools after 3 turns "
        "(LoopLimits.max_turns=3)"
    )
    assert len(llm.calls) == 3
    assert "answer" in result.skipped


def test_a_token_budget_stops_the_loop(clock: VirtualClock) -> None:
    agent = Agent("spender", "You spend.", tools=(temperature,))
    wf = Workflow("budget")
    agent.solve(wf, "answer", "Go", limits=LoopLimits(max_tokens=40))
    # Each call uses 25 tokens: the second turn's reply reaches 50 >= 40.
    result, llm = run(clock, wf, lambda request: calls(("temperature", {"city": "Oslo"})))
    assert result.status == "failed"
    assert "used 50 tokens, the loop's budget is 40" in str(result.failures["answer.turn2"])
    assert len(llm.calls) == 2


def test_structured_output_is_validated_and_re_asked(clock: VirtualClock) -> None:
    agent = Agent("weather", "You report the weather.")
    answers = iter(['{"city": "Oslo"}', "```json\n" + '{"city": "Oslo", "celsius": 4}\n```'])
    wf = Workflow("structured")
    wf.add("report", agent.ask("Oslo?", output=Weather))
    wf.add("warm", lambda ctx: ctx.input("report").celsius > 10, after=["report"])
    result, llm = run(clock, wf, lambda request: next(answers))
    assert result.status == "succeeded", result.failures
    assert result["report"] == Weather(city="Oslo", celsius=4.0)
    assert result["warm"] is False
    first, second = (c.request for c in llm.calls)
    assert first.output is not None and first.output.schema == Weather.model_json_schema()
    assert "celsius: Field required" in second.messages[-1].content


def test_structured_output_that_never_validates_fails_with_the_last_error(
    clock: VirtualClock,
) -> None:
    agent = Agent("weather", "You report the weather.")
    wf = Workflow("never")
    wf.add("report", agent.ask("Oslo?", output=Weather, retries=2))
    result, llm = run(clock, wf, lambda request: "sunny, I think")
    assert result.status == "failed"
    error = str(result.failures["report"])
    assert "did not fit Weather after 3 tries" in error and "Invalid JSON" in error
    assert len(llm.calls) == 3


def test_a_loop_with_tools_gets_its_final_answer_in_the_schema(clock: VirtualClock) -> None:
    agent = Agent("weather", "You report the weather.", tools=(temperature,))

    def script(request: LLMRequest) -> LLMResponse | str:
        if request.messages[-1].role == "user" and request.tools:
            return calls(("temperature", {"city": "Oslo"}))
        if request.output is None:
            return "It is 4 degrees in Oslo."  # prose: the loop asks again with the schema
        return '{"city": "Oslo", "celsius": 4}'

    wf = Workflow("tool-structured")
    agent.solve(wf, "answer", "Oslo?", output=Weather)
    result, llm = run(clock, wf, script)
    assert result.status == "succeeded", result.failures
    assert result["answer"] == Weather(city="Oslo", celsius=4.0)
    # Tools were offered without a schema (a grammar would forbid the call syntax); the
    # re-ask enforced the schema without tools.
    assert [(bool(c.request.tools), c.request.output is not None) for c in llm.calls] == [
        (True, False),
        (True, False),
        (False, True),
    ]


def test_the_tool_pause_is_learned_and_sent_as_keep_alive(clock: VirtualClock) -> None:
    @tool
    async def slow(q: str) -> str:
        """Takes three seconds."""
        await clock.sleep(3.0)
        return q

    agent = Agent("patient", "You wait.", tools=(slow,))

    def script(request: LLMRequest) -> LLMResponse | str:
        return calls(("slow", {"q": "x"})) if request.messages[-1].role == "user" else "done"

    async def main() -> list[float | None]:
        llm = FunctionLLM(lambda r, h: script(r), latency=1.0, clock=clock)
        async with Engine(backends={"default": llm}, keep_alive=KeepAlive(initial_s=None)) as e:
            for i in range(2):
                wf = Workflow(f"w{i}")
                agent.solve(wf, "answer", f"Go {i}")
                assert (await e.run(wf)).status == "succeeded"
        return [c.hints.keep_alive_s for c in llm.calls]

    first_turn, _, second_run_turn, _ = clock.run(main())
    assert first_turn is None  # nothing observed yet
    assert second_run_turn == pytest.approx(3.0)  # the tool's pause, learned from run 1


def test_agent_loops_run_on_the_simulated_server(clock: VirtualClock) -> None:
    agent = Agent("weather", "You report the weather.", tools=(temperature,), max_tokens=64)

    async def main() -> RunResult:
        async with (
            SimServer(clock=clock) as sim,
            Engine(backends={"default": sim}) as engine,
        ):
            wf = Workflow("sim")
            agent.solve(wf, "answer", "Oslo?", output=Weather)
            return await engine.run(wf)

    result = clock.run(main())
    assert result.status == "succeeded", result.failures
    assert isinstance(result["answer"], Weather)
    assert Calls.seen and Calls.seen[0][0] == "temperature"


# --- a loop resumed after a crash ----------------------------------------------------------


class Gate:
    event: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None


@tool
async def gated(city: str) -> str:
    """Stops at the gate in the first process."""
    assert Gate.event is not None and Gate.reached is not None
    if not Gate.event.is_set():
        Gate.reached.set()
    await Gate.event.wait()
    return f"{city}: 4 degrees"


resumable = Agent("resumable", "You report the weather.", tools=(gated,))


def test_a_loop_resumes_from_its_last_step_without_paying_a_turn_twice(
    make_store: StoreFactory,
) -> None:
    sent: list[str] = []

    def reply(request: LLMRequest, hints: object) -> LLMResponse | str:
        last = request.messages[-1]
        sent.append(last.role)
        if last.role == "user":
            return calls(("gated", {"city": "Oslo"}))
        return f"answer: {last.content}"

    async def main() -> None:
        Gate.event, Gate.reached = asyncio.Event(), asyncio.Event()
        llm = FunctionLLM(reply)
        async with make_store() as store:
            async with Engine(backends={"default": llm}, store=store) as engine:
                wf = Workflow("resumable-loop")
                resumable.solve(wf, "answer", "Oslo?")
                handle = engine.submit(wf)
                await Gate.reached.wait()
                assert engine.journal is not None
                await engine.journal.durable()
                run_id = handle.id
            assert sent == ["user"]  # turn 1 answered; the tool waits at the crash
            Gate.event.set()
            async with Engine(backends={"default": llm}, store=store) as engine:
                report = await engine.resume(Registry(resumable))
                assert not report.failed, [p.error for p in report.failed]
                assert [h.id for h in report.runs] == [run_id]
                result = await report.runs[0]
            assert result.status == "succeeded", result.failures
            assert result["answer"] == "answer: Oslo: 4 degrees"
            assert sent == ["user", "tool"]  # turn 1 was not sent again

    asyncio.run(main())


class Page(pydantic.BaseModel):
    number: int
    text: str


class Stop:
    """Where the first process stops: at page 2's tool task ("page"), or after the last
    turn's call, as its answer is remembered ("answer"); None: nowhere."""

    at: ClassVar[str | None] = None


async def stop_at(where: str) -> None:
    assert Gate.event is not None and Gate.reached is not None
    if Stop.at == where and not Gate.event.is_set():
        Gate.reached.set()
        await Gate.event.wait()


@tool
async def page(number: int) -> Page:
    """One page of the book (a model: its text must read the same after a resume).

    Args:
        number: the page
    """
    if number == 2:
        await stop_at("page")
    return Page(number=number, text=f"page {number}")


class Book:
    """A `ConversationLog` in a list."""

    def __init__(self) -> None:
        self.turns: list[dict[str, str]] = []

    async def append_turn(self, agent: str, workflow: str, role: str, content: str) -> None:
        await stop_at("answer")
        self.turns.append({"role": role, "content": content})

    async def conversation(self, agent: str, workflow: str) -> list[dict[str, str]]:
        return list(self.turns)


BOOK = Book()
reader = Agent("reader", "You read books.", tools=(page,), memory=BOOK)
EARLIER = [{"role": "user", "content": "Find a book."}, {"role": "assistant", "content": "Found."}]


def read_four(request: LLMRequest, hints: object) -> LLMResponse | str:
    read = [m.content for m in request.messages if m.role == "tool"]
    if len(read) < 4:
        call = ToolCall(f"p{len(read)}", "page", json.dumps({"number": len(read)}))
        return LLMResponse("", Usage(20, 5), "tool_calls", (call,))
    return " / ".join(read)


async def read_book(engine: Engine) -> Any:
    BOOK.turns = list(EARLIER)
    wf = Workflow("book")
    reader.solve(wf, "answer", "Read four pages.", limits=LoopLimits(max_turns=5))
    return engine.submit(wf)


@pytest.mark.parametrize("stop", ["page", "answer"])
def test_a_resumed_loop_sends_what_an_uninterrupted_one_sends(
    make_store: StoreFactory, stop: str
) -> None:
    async def main() -> None:
        Gate.event, Gate.reached = asyncio.Event(), asyncio.Event()
        Stop.at = None
        whole = FunctionLLM(read_four)
        async with Engine(backends={"default": whole}) as engine:
            expected = await (await read_book(engine))
        assert expected.status == "succeeded", expected.failures
        assert len(whole.calls) == 5
        remembered = BOOK.turns

        Stop.at = stop
        llm = FunctionLLM(read_four)
        async with make_store() as store:
            async with Engine(backends={"default": llm}, store=store) as engine:
                await read_book(engine)
                await Gate.reached.wait()
                assert engine.journal is not None
                await engine.journal.durable()
            # Stopped at page 2 (turns 1-3 sent), or once the last turn's call was recorded.
            assert len(llm.calls) == (3 if stop == "page" else 5)
            Gate.event.set()
            async with Engine(backends={"default": llm}, store=store) as engine:
                report = await engine.resume(Registry(reader))
                assert not report.failed, [p.error for p in report.failed]
                result = await report.runs[0]
            assert (await store.size()).calls == 5  # each call recorded once
        assert result.status == "succeeded", result.failures
        assert result["answer"] == expected["answer"]
        # Every turn sent exactly what the uninterrupted run sent, and none was sent twice
        # (the last turn, rerun after the crash, was answered from the store).
        assert [c.request for c in llm.calls] == [c.request for c in whole.calls]
        assert BOOK.turns == remembered
        assert [m["role"] for m in BOOK.turns] == ["user", "assistant"] * 2

    asyncio.run(main())


def test_a_turn_recorded_with_the_whole_history_is_refused_with_what_to_do() -> None:
    args = {"answer": "answer", "limits": [8, None, 2], "step": "turn", "turn": 2}
    old = ActionSpec("llm", "reader", {**args, "history": [], "pending": [], "tokens": 0})
    with pytest.raises(UsageError, match="recorded by an earlier plait.*run the loop again"):
        reader.rebuild(old, Registry(reader))


@tool
def chapter(number: int) -> str:
    """One kilobyte of a book.

    Args:
        number: the chapter
    """
    return f"{number:04d}" + "x" * 1020


skimmer = Agent("skimmer", "You skim books.", tools=(chapter,))


def test_the_store_grows_with_a_loops_turns_not_their_square(make_store: StoreFactory) -> None:
    """Each turn records what it adds to the conversation, not the whole of it."""

    def read(turns: int) -> Callable[[LLMRequest, object], LLMResponse | str]:
        def reply(request: LLMRequest, hints: object) -> LLMResponse | str:
            done = sum(1 for m in request.messages if m.role == "tool")
            if done < turns - 1:
                call = ToolCall(f"c{done}", "chapter", json.dumps({"number": done}))
                return LLMResponse("", Usage(20, 5), "tool_calls", (call,))
            return f"skimmed {done} chapters"

        return reply

    async def stored(turns: int) -> int:
        async with make_store() as store:
            before = await store.size()
            async with Engine(backends={"default": FunctionLLM(read(turns))}, store=store) as e:
                wf = Workflow("skim")
                skimmer.solve(wf, "answer", "Skim the book.", limits=LoopLimits(max_turns=turns))
                result = await e.run(wf)
            assert result.status == "succeeded", result.failures
            assert result["answer"] == f"skimmed {turns - 1} chapters"
            after = await store.size()
        return (after.event_bytes + after.payload_bytes) - (
            before.event_bytes + before.payload_bytes
        )

    async def main() -> None:
        short, long = await stored(20), await stored(40)
        assert long / short < 2.2, (short, long)

    asyncio.run(main())


# --- agents on the blackboard ----------------------------------------------------------------


def test_agents_volunteer_by_capability_and_answer_with_their_model(clock: VirtualClock) -> None:
    from agents import Board, llm_bid

    geo = Agent("geo", "You know maps.", capabilities={"geo"})
    sql_a = Agent("sql-a", "You write SQL.", capabilities={"sql"}, bid=lambda post: 1.0)

    def reply(request: LLMRequest) -> str:
        system = request.messages[0].content
        if "how well can you serve" in request.messages[-1].content:
            return "I would say 9" if system == "You write SQL, well." else "3"
        return f"{system} answers: {request.messages[-1].content}"

    llm = FunctionLLM(lambda request, hints: reply(request), latency=1.0, clock=clock)
    asks = Agent("sql-b", "You write SQL, well.")  # what its bid asks the model as
    sql_b = Agent("sql-b", "You write SQL, well.", capabilities={"sql"}, bid=llm_bid(asks, llm))

    async def main() -> RunResult:
        async with Engine(backends={"default": llm}) as engine, Board(clock=clock) as board:
            for agent in (geo, sql_a, sql_b):
                board.join(agent)

            async def coordinator(ctx: Any) -> str:
                post = await board.post("count the rows", capabilities={"sql"}, ctx=ctx)
                return str(await board.answer_of(post))

            wf = Workflow("board")
            wf.add("coordinator", coordinator)
            return await engine.run(wf)

    result = clock.run(main())
    assert result.status == "succeeded", result.failures
    # sql-b bid 9 (asked of its model) over sql-a's rule-based 1; geo was never asked.
    assert result["coordinator"] == "You write SQL, well. answers: count the rows"
    asked = [c.request.messages[0].content for c in llm.calls]
    assert "You know maps." not in asked


def test_an_agent_cannot_answer_a_post_made_outside_a_workflow(clock: VirtualClock) -> None:
    from agents import Board, PostFailedError

    async def main() -> None:
        async with Board(clock=clock, max_attempts=1) as board:
            board.join(Agent("sql", "You write SQL.", capabilities={"sql"}))
            post = await board.post("count the rows", capabilities={"sql"})
            await board.answer_of(post)

    with pytest.raises(PostFailedError, match="reaches only as a task of a workflow"):
        clock.run(main())
