"""MCP servers as agent tools, against real servers built with the official SDK
(tests/mcp_server.py) over stdio and streamable HTTP: the tools listed once per run and
offered to the model, calls as tasks on the server's resource, errors said to the model or
failing the task with the server and tool named, and a resumed run that offers the same
tools and does not call again."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory

from agents import Agent, MCPServerError, MCPTools, ToolArgumentsError, mcp_tools
from agents._mcp import Listed, shown_name
from executors import FunctionLLM
from orchestrator import (
    Engine,
    LLMRequest,
    LLMResponse,
    Registry,
    RunResult,
    SystemClock,
    ToolCall,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.cli._cli import main as plait_cli

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class HTTPServer:
    """tests/mcp_server.py over streamable HTTP in a process of its own, on a free port."""

    def __init__(self, log: Path, variant: str = "") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        env = dict(os.environ, MCP_TEST_LOG=str(log), MCP_TEST_VARIANT=variant)
        self.process = subprocess.Popen(
            [sys.executable, SERVER, "http", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    async def started(self) -> HTTPServer:
        for _ in range(300):  # the process imports the SDK first: a few seconds at most
            if self.process.poll() is not None:
                raise RuntimeError(f"the MCP test server exited ({self.process.returncode})")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return self
        raise RuntimeError("the MCP test server did not start listening")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.log"


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest, log: Path) -> Iterator[Callable[..., Any]]:
    """A factory of `MCPTools` for the test server (async: an HTTP one starts first)."""
    started: list[HTTPServer] = []

    async def make(name: str = "demo", **options: Any) -> MCPTools:
        if request.param == "stdio":
            env = {"MCP_TEST_LOG": str(log), "MCP_TEST_VARIANT": options.pop("variant", "")}
            return mcp_tools(name, command=[sys.executable, SERVER, "stdio"], env=env, **options)
        http = await HTTPServer(log, options.pop("variant", "")).started()
        started.append(http)
        return mcp_tools(name, url=http.url, **options)

    yield make
    for http in started:
        http.stop()


def said(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def calls(*made: tuple[str, dict[str, Any]]) -> LLMResponse:
    return LLMResponse(
        "",
        Usage(20, 5),
        "tool_calls",
        tuple(ToolCall(f"c{i}", name, json.dumps(args)) for i, (name, args) in enumerate(made)),
    )


def tool_replies(request: LLMRequest) -> list[str]:
    return [m.content for m in request.messages if m.role == "tool"]


async def run_loop(
    tools: MCPTools, reply: Callable[[LLMRequest], Any], *, enter: bool = True
) -> tuple[RunResult, FunctionLLM]:
    """The agent's loop over `tools`, run once (`enter`: with the connection opened first,
    else at the first use)."""
    llm = FunctionLLM(lambda request, hints: reply(request))
    agent = Agent("helper", "You use tools.", tools=(tools,))
    wf = Workflow("mcp-loop")
    agent.solve(wf, "answer", "Go.")
    async with contextlib.AsyncExitStack() as stack:
        if enter:
            await stack.enter_async_context(tools)
        engine = await stack.enter_async_context(Engine(backends={"default": llm}))
        result = await engine.run(wf)
    await tools.aclose()
    return result, llm


def test_an_agent_calls_an_mcp_server_s_tools(server: Callable[..., Any], log: Path) -> None:
    """The loop lists the server's tools in a task of its own, offers them to the model with
    the server's schemas, and runs each call as a task on the server's resource; a tool's
    plain answer reads as its value, a structured one as its fields."""

    def reply(request: LLMRequest) -> LLMResponse | str:
        answers = tool_replies(request)
        if not answers:
            return calls(("echo", {"text": "hi"}), ("add", {"numbers": [1, 2, 3]}))
        return " | ".join(answers)

    async def main() -> None:
        tools = await server()
        result, llm = await run_loop(tools, reply)
        assert result.status == "succeeded", result.failures
        assert result["answer"] == 'hi | {"total":6,"count":3}'
        offered = {t.name: t for t in llm.calls[0].request.tools}
        assert set(offered) == {"echo", "add", "fail", "refuse", "big", "files_read", "die", "slow"}
        assert offered["echo"].parameters["required"] == ["text"]
        assert offered["echo"].description == "Say the text back."
        listing = result["mcp demo"]
        names = ["echo", "add", "fail", "refuse", "big", "files.read", "die", "slow"]
        assert [t["name"] for t in listing] == names
        assert sorted(said(log)) == ["add", "echo hi"]

    asyncio.run(main())


def test_misfit_arguments_and_error_answers_go_back_to_the_model(
    server: Callable[..., Any], log: Path
) -> None:
    def reply(request: LLMRequest) -> LLMResponse | str:
        answers = tool_replies(request)
        if not answers:
            return calls(
                ("echo", {"txt": 1}),
                ("fail", {"why": "no disk"}),
                ("nope", {}),
                ("refuse", {"path": "/x"}),
                ("slow", {"seconds": 0.5}),
                ("files_read", {"path": "a"}),
            )
        return "\n".join(answers)

    async def main() -> None:
        result, _ = await run_loop(await server(), reply)
        assert result.status == "succeeded", result.failures
        misfit, failed, unknown, refused, slow, dotted = result["answer"].split("\n")
        assert "tool 'echo' do not fit its schema" in misfit and "'text' is a required" in misfit
        assert failed == (
            "tool 'fail' answered with an error: Error executing tool fail: cannot: no disk"
        )
        assert "there is no tool 'nope'" in unknown and "echo" in unknown
        # A JSON-RPC error is the model's to fix, and the connection stays: the slow call
        # made beside it on the same connection is answered.
        assert refused == (
            "tool 'refuse': the server refused the call: invalid params: no such path '/x'"
        )
        assert slow == "late"
        assert dotted == "read a"  # offered as files_read, called by its own name
        assert sorted(said(log)) == ["fail", "refuse"]  # the misfit call never reached it

    asyncio.run(main())


def test_a_server_that_dies_mid_call_fails_the_task_naming_server_and_tool(
    server: Callable[..., Any], log: Path, request: pytest.FixtureRequest
) -> None:
    """The call's task fails with `MCPServerError` after its retries, each on a new
    connection (a stdio server is started again; an HTTP one stays down); the run fails
    with the server and tool named, and the loop still tells the model and goes on."""

    def reply(request: LLMRequest) -> LLMResponse | str:
        answers = tool_replies(request)
        if not answers:
            return calls(("die", {}))
        if len(answers) == 1:
            return calls(("echo", {"text": "back"}))
        return " / ".join(answers)

    async def main() -> None:
        result, _ = await run_loop(await server(retry=1), reply)
        assert result.status == "failed"
        failure = result.failures["answer.turn1.0.die"]
        assert failure.startswith("MCPServerError: MCP server 'demo', tool 'die': ")
        assert isinstance(result.errors["answer.turn1.0.die"], MCPServerError)
        first, second = result["answer"].split(" / ")
        assert "failed" in first
        if request.node.callspec.params["server"] == "stdio":
            assert "connection closed" in failure.lower()
            assert second == "back"
            assert said(log) == ["die", "die", "echo back"]  # tried twice, then anew
        else:
            assert "cannot connect to http://127.0.0.1:" in failure  # the retry found it gone
            assert "MCP server 'demo', tool 'echo'" in result.failures["answer.turn2.0.echo"]
            assert said(log) == ["die"]

    asyncio.run(main())


def test_a_server_that_is_down_is_named_with_how_it_was_reached() -> None:
    async def main() -> None:
        url = f"http://127.0.0.1:{free_port()}/mcp"
        tools = mcp_tools("gone", url=url, retry=0, connect_timeout_s=5)
        result, llm = await run_loop(tools, lambda request: "unused", enter=False)
        assert result.status == "failed"
        failure = result.failures["mcp gone"]
        assert f"MCP server 'gone': cannot connect to {url}" in failure
        assert llm.calls == []  # no turn runs without its tools
        command = mcp_tools("bad", command=["/nonexistent/server"], retry=0)
        result, _ = await run_loop(command, lambda request: "unused", enter=False)
        assert (
            "MCP server 'bad': cannot connect to `/nonexistent/server`"
            in result.failures["mcp bad"]
        )

    asyncio.run(main())


def test_a_tool_whose_schema_changed_since_the_run_listed_it_is_refused(
    server: Callable[..., Any], log: Path
) -> None:
    """The server restarts between the listing and the call with `echo` taking another
    required argument: the model was shown the old schema, so the call fails, naming the
    server and tool, rather than sending what the tool no longer takes."""

    async def main() -> None:
        tools = await server(retry=0)
        changed = await server(variant="wider")  # the same server, restarted changed

        async def reply(request: LLMRequest) -> LLMResponse | str:
            if not tool_replies(request):
                await tools.aclose()  # the server goes away; the next use reconnects
                tools.env, tools.url = changed.env, changed.url
                return calls(("echo", {"text": "hi"}))
            return tool_replies(request)[0]

        result, _ = await run_loop(tools, reply)
        failure = result.failures["answer.turn1.0.echo"]
        assert "MCP server 'demo', tool 'echo': the tool's input schema changed" in failure
        assert said(log) == []

    asyncio.run(main())


def test_bad_server_settings_are_refused_with_what_to_give() -> None:
    with pytest.raises(UsageError, match="give command=.*or url="):
        mcp_tools("x")
    with pytest.raises(UsageError, match="give command=.*or url="):
        mcp_tools("x", command=["a"], url="http://h/mcp")
    with pytest.raises(UsageError, match="list of strings"):
        mcp_tools("x", command="python server.py")
    with pytest.raises(UsageError, match="http:// or https://"):
        mcp_tools("x", url="ftp://h/mcp")
    with pytest.raises(UsageError, match="name must be"):
        mcp_tools("has space", url="http://h/mcp")
    with pytest.raises(UsageError, match="two MCP servers share a name"):
        Agent("a", "p", tools=(mcp_tools("x", url="http://h/a"), mcp_tools("x", url="http://h/b")))


class Gate:
    reached: asyncio.Event
    opened: asyncio.Event


def test_a_resumed_run_offers_the_listed_tools_and_does_not_call_again(
    make_store: StoreFactory, log: Path
) -> None:
    """The first process lists the tools and calls `echo`, then stops while the next turn
    waits for its model. The server is restarted changed (`echo` takes more). The resumed
    run offers the model the tools as listed before, and the answered call is not made
    again: the server saw one call."""
    env = {"MCP_TEST_LOG": str(log), "MCP_TEST_VARIANT": ""}
    tools = mcp_tools("demo", command=[sys.executable, SERVER, "stdio"], env=env)
    agent = Agent("helper", "You use tools.", tools=(tools,))
    offered: list[list[str]] = []

    async def reply(request: LLMRequest, hints: object) -> LLMResponse | str:
        offered.append([json.dumps(t.parameters, sort_keys=True) for t in request.tools])
        answers = tool_replies(request)
        if not answers:
            return calls(("echo", {"text": "once"}))
        if not Gate.opened.is_set():
            Gate.reached.set()
            await Gate.opened.wait()
        return f"done: {answers[0]}"

    async def main() -> None:
        Gate.reached, Gate.opened = asyncio.Event(), asyncio.Event()
        llm = FunctionLLM(reply)
        async with make_store() as store:
            async with tools, Engine(backends={"default": llm}, store=store) as engine:
                wf = Workflow("resumable-mcp")
                agent.solve(wf, "answer", "Go.")
                handle = engine.submit(wf)
                await Gate.reached.wait()
                assert engine.journal is not None
                await engine.journal.durable()
                run_id = handle.id
            assert said(log) == ["echo once"]
            tools.env = {**env, "MCP_TEST_VARIANT": "wider"}
            Gate.opened.set()
            async with tools, Engine(backends={"default": llm}, store=store) as engine:
                report = await engine.resume(Registry(agent))
                assert not report.failed, [p.error for p in report.failed]
                assert [h.id for h in report.runs] == [run_id]
                result = await report.runs[0]
        assert result.status == "succeeded", result.failures
        assert result["answer"] == "done: once"
        assert said(log) == ["echo once"]  # answered before the stop: not called again
        assert offered[-1] == offered[0]  # the tools as the first process listed them

    asyncio.run(main())


def test_tools_of_one_name_from_two_sources_need_a_prefix(log: Path) -> None:
    env = {"MCP_TEST_LOG": str(log)}
    command = [sys.executable, SERVER, "stdio"]

    async def main() -> None:
        a = mcp_tools("a", command=command, env=env)
        b = mcp_tools("b", command=command, env=env)
        llm = FunctionLLM(lambda request, hints: "unused")
        agent = Agent("helper", "p", tools=(a, b))
        wf = Workflow("two")
        agent.solve(wf, "answer", "Go.")
        async with a, b, Engine(backends={"default": llm}) as engine:
            result = await engine.run(wf)
        twice = "['add', 'big', 'die', 'echo', 'fail', 'files_read', 'refuse', 'slow'] twice"
        assert f"offers tools named {twice}" in result.failures["answer.turn1"]
        prefixed = mcp_tools("b", command=command, env=env, prefix="b_")
        agent = Agent("helper", "p", tools=(a, prefixed))
        wf = Workflow("two")
        agent.solve(wf, "answer", "Go.")
        async with a, prefixed, Engine(backends={"default": llm}) as engine:
            result = await engine.run(wf)
        assert result.status == "succeeded", result.failures
        assert {t.name for t in llm.calls[-1].request.tools} >= {"echo", "b_echo"}

    asyncio.run(main())


def test_mcp_servers_refuse_virtual_time(log: Path) -> None:
    """Virtual time jumps ahead while the loop waits on a server: refused, saying why."""
    env = {"MCP_TEST_LOG": str(log)}
    tools = mcp_tools("demo", command=[sys.executable, SERVER, "stdio"], env=env)
    agent = Agent("helper", "p", tools=(tools,))
    wf = Workflow("virtual")
    agent.solve(wf, "answer", "Go.")
    clock = VirtualClock()

    async def main() -> RunResult:
        llm = FunctionLLM(lambda request, hints: "unused", clock=clock)
        async with Engine(backends={"default": llm}, clock=clock) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert (
        "answers in real time; run its workflows on the system clock"
        in (result.failures["mcp demo"])
    )


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_mcp_example_searches_reads_and_answers_through_its_server() -> None:
    spec = importlib.util.spec_from_file_location("example_mcp_agent", EXAMPLES / "mcp_agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    async def main() -> list[RunResult]:
        async with module.lifespan():
            backends = module.fake_backends(SystemClock())
            async with Engine(backends=backends) as engine:
                return [await engine.run(wf) for wf in module.workflows()]

    deploys, on_call = asyncio.run(main())
    assert deploys["answer"].startswith("Deploys run Tuesday to Thursday")
    assert deploys["answer.turn1.0.search"] == ["deploys"]
    assert on_call["answer"].startswith("The on-call engineer answers pages within 15 minutes")


def test_the_mcp_example_runs_with_plait_run_on_the_simulated_server() -> None:
    out = io.StringIO()
    assert plait_cli(["run", str(EXAMPLES / "mcp_agent.py")], out=out) == 0
    text = out.getvalue()
    assert "2 workflow(s), 2 succeeded" in text


def test_a_long_answer_is_cut_before_the_model_and_the_log(log: Path) -> None:
    async def main() -> None:
        tools = mcp_tools("demo", command=[sys.executable, SERVER, "stdio"], max_result_chars=1_000)

        def reply(request: LLMRequest) -> LLMResponse | str:
            answers = tool_replies(request)
            return answers[0] if answers else calls(("big", {"chars": 50_000}))

        result, _ = await run_loop(tools, reply)
        assert result.status == "succeeded", result.failures
        answer = result["answer"]
        assert answer.startswith("x" * 1_000 + "\n")
        assert answer.endswith("[tool 'big' answered 50,000 characters; cut at 1,000]")

    asyncio.run(main())


def test_a_server_that_never_lists_its_tools_is_given_up_within_the_connect_timeout() -> None:
    async def main() -> None:
        tools = mcp_tools("demo", command=[sys.executable, SERVER, "stdio"], connect_timeout_s=2)
        async with tools:
            client, _ = await tools.link.open()

            async def never(**_: Any) -> Any:
                await asyncio.Event().wait()

            object.__setattr__(client, "list_tools", never)
            started = asyncio.get_running_loop().time()
            with pytest.raises(MCPServerError, match="did not list its tools within 2 s"):
                await tools.list()
            assert asyncio.get_running_loop().time() - started < 10

    asyncio.run(main())


def test_arguments_are_checked_only_against_a_schema_that_can_be_read() -> None:
    """A schema the validator cannot read (a bad pattern, a $ref to nowhere) leaves the
    arguments for the server to judge instead of failing the turn."""
    tools = mcp_tools("demo", url="http://127.0.0.1:1/mcp")
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}
    nowhere = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    for schema in (bad, nowhere):
        tool = tools.tool(Listed("t", "", schema))
        assert tool.validate({"a": "b"}) == {"a": "b"}
    strict = tools.tool(Listed("t", "", {"type": "object", "required": ["a"]}))
    with pytest.raises(ToolArgumentsError, match="'a' is a required property"):
        strict.validate("{}")


def test_tool_names_a_model_cannot_call_are_mapped_and_kept_apart() -> None:
    assert shown_name("", "files.read") == "files_read"
    assert shown_name("gh_", "repos/list") == "gh_repos_list"
    long_a, long_b = shown_name("", "a" * 80), shown_name("", "a" * 79 + "b")
    assert len(long_a) == len(long_b) == 64 and long_a != long_b


def test_two_servers_of_one_name_in_a_workflow_are_refused() -> None:
    a = mcp_tools("files", url="http://127.0.0.1:1/a")
    b = mcp_tools("files", url="http://127.0.0.1:1/b")
    wf = Workflow("two")
    Agent("one", "p", tools=(a,)).solve(wf, "x", "Go.")
    with pytest.raises(UsageError, match="two MCP servers are named 'files'"):
        Agent("two", "p", tools=(b,)).solve(wf, "y", "Go.")
    Agent("three", "p", tools=(a,)).solve(wf, "z", "Go.")  # the same server: one listing
