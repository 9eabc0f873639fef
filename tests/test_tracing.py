"""OpenTelemetry traces: a span per run, task, LLM call and tool call with the GenAI
attributes, parents and DAG links right, the call's trace context sent to the server, and
nothing traced while no SDK tracer provider is set."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otlp_receiver import OTLPReceiver, serve_in_thread

from agents import Agent, tool
from executors import FunctionLLM
from orchestrator import (
    Engine,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    Registry,
    TaskContext,
    ToolCall,
    Usage,
    UsageError,
    Workflow,
    load_config,
)
from orchestrator.cli._cli import main as plait_cli
from orchestrator.engine._tracing import SCHEMA_URL, find_tracer, use_tracer_provider
from orchestrator.ext import BackendUnavailableError


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    yield exporter
    use_tracer_provider(None)
    provider.shutdown()


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


@tool
def broken(city: str) -> str:
    """Always fails."""
    raise ConnectionError("down")


helper = Agent("helper", "You look things up.", model="m1", tools=(lookup,))


def reply(request: LLMRequest, hints: Hints) -> LLMResponse | str:
    if not any(m.role == "tool" for m in request.messages):
        call = ToolCall("c0", "lookup", '{"city": "Oslo"}')
        return LLMResponse("", Usage(30, 5, cached_prompt_tokens=16), "tool_calls", (call,))
    return LLMResponse("Oslo is sunny.", Usage(40, 4), "stop")


def by_name(found: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    [span] = [s for s in found if s.name == name]
    return span


def test_a_run_traces_its_tasks_calls_and_tools_with_the_genai_attributes(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[Hints] = []

    def recorded(request: LLMRequest, hints: Hints) -> LLMResponse | str:
        seen.append(hints)
        return reply(request, hints)

    async def main() -> None:
        llm = FunctionLLM(recorded)
        wf = Workflow("weather")
        wf.add("city", lambda ctx: "Oslo")
        helper.solve(wf, "answer", "Weather in Oslo?", after=["city"])
        async with Engine(backends={"default": llm}) as engine:
            result = await engine.run(wf, deadline=60)
        assert result.ok, result.failures

    asyncio.run(main())
    found = spans.get_finished_spans()
    run = by_name(found, "invoke_workflow weather")
    assert run.parent is None and run.kind == SpanKind.INTERNAL
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert run.attributes["plait.status"] == "succeeded"
    assert run.attributes["plait.deadline_met"] is True
    assert run.instrumentation_scope is not None
    assert run.instrumentation_scope.schema_url == SCHEMA_URL

    task = {
        s.attributes["plait.task.id"]: s
        for s in found
        if s.attributes and "plait.task.id" in s.attributes and s.kind == SpanKind.INTERNAL
    }
    assert set(task) == {"city", "answer.turn1", "answer.turn1.0.lookup", "answer.turn2", "answer"}
    for span in task.values():
        assert span.parent is not None and span.parent.span_id == run.context.span_id
    turn1, tool_span = task["answer.turn1"], task["answer.turn1.0.lookup"]
    assert turn1.name == "invoke_agent helper"
    assert tool_span.name == "execute_tool lookup"
    assert tool_span.attributes is not None and tool_span.attributes["gen_ai.tool.name"] == "lookup"
    # The DAG: each task's span links to the spans of the tasks it waited for.
    assert [link.context.span_id for link in tool_span.links] == [turn1.context.span_id]
    assert [link.context.span_id for link in turn1.links] == [task["city"].context.span_id]
    assert task["city"].name.startswith("task ")

    chats = sorted((s for s in found if s.name == "chat m1"), key=lambda s: s.start_time or 0)
    assert len(chats) == 2
    first = chats[0]
    assert first.kind == SpanKind.CLIENT
    assert first.parent is not None and first.parent.span_id == turn1.context.span_id
    attributes = first.attributes
    assert attributes is not None
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "m1"
    assert attributes["gen_ai.usage.input_tokens"] == 30
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 16
    assert attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert attributes["plait.program_id"] == seen[0].program_id
    assert attributes["plait.service"] == seen[0].service
    # The server was sent the call span's trace context.
    context = first.context
    assert (
        seen[0].traceparent
        == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
    assert all(s.context.trace_id == run.context.trace_id for s in found)


def test_a_failed_task_and_its_run_carry_the_error(spans: InMemorySpanExporter) -> None:
    async def main() -> None:
        wf = Workflow("fails")
        wf.add("boom", broken.call({"city": "Oslo"}))
        async with Engine(backends={"default": FunctionLLM(reply)}) as engine:
            result = await engine.run(wf)
        assert not result.ok

    asyncio.run(main())
    found = spans.get_finished_spans()
    tool_span = by_name(found, "execute_tool broken")
    assert tool_span.status.status_code == StatusCode.ERROR
    assert tool_span.attributes is not None
    assert tool_span.attributes["error.type"] == "ConnectionError"
    run = by_name(found, "invoke_workflow fails")
    assert run.status.status_code == StatusCode.ERROR
    assert "boom" in (run.status.description or "")


def test_without_a_tracer_provider_nothing_is_traced_or_sent() -> None:
    seen: list[Hints] = []

    def recorded(request: LLMRequest, hints: Hints) -> Any:
        seen.append(hints)
        return "ok"

    async def main() -> None:
        wf = Workflow("plain")
        wf.add("ask", helper.ask("hi"))
        async with Engine(backends={"default": FunctionLLM(recorded)}) as engine:
            assert engine.bus.tracer is None and engine.calls.tracing is None
            result = await engine.run(wf)
        assert result.ok

    asyncio.run(main())
    assert seen[0].traceparent is None


def test_traces_go_over_otlp_http_to_a_collector_as_the_config_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plait run` with a `[telemetry]` table exports every span over OTLP/HTTP, here to a
    receiver started by the test; `OTEL_SERVICE_NAME` names the service."""
    monkeypatch.setenv("OTEL_SERVICE_NAME", "nightly-agents")
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    module = tmp_path / "flow.py"
    module.write_text(FLOW)
    with OTLPReceiver() as receiver:
        config = tmp_path / "plait.toml"
        config.write_text(
            f'[telemetry]\nendpoint = "{receiver.endpoint}"\n\n'
            '[engine]\nclock = "virtual"\n\n[backends.default]\nkind = "sim"\n'
        )
        out = io.StringIO()
        code = plait_cli(["run", str(module), "--config", str(config)], out=out)
        assert code == 0, out.getvalue()
        received = receiver.wait_for(5)
    assert "traces exported over OTLP/HTTP" in out.getvalue()
    names = {span["name"] for span in received}
    assert {"invoke_workflow traced", "invoke_agent writer", "chat sim"} <= names
    run = next(s for s in received if s["name"] == "invoke_workflow traced")
    chat = next(s for s in received if s["name"] == "chat sim")
    agent = next(s for s in received if s["name"] == "invoke_agent writer")
    assert agent["parent"] == run["span_id"] and chat["parent"] == agent["span_id"]
    assert {s["trace_id"] for s in received} == {run["trace_id"]}
    assert run["resource"]["service.name"] == "nightly-agents"
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.usage.output_tokens"] > 0
    assert run["schema_url"] == SCHEMA_URL


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

FLOW = """
from agents import Agent
from orchestrator import Workflow

writer = Agent("writer", "You write.", model="sim")


def workflows():
    wf = Workflow("traced")
    wf.add("draft", writer.ask("Write a line."))
    return wf
"""


def test_a_bad_telemetry_table_is_refused_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "plait.toml"
    config.write_text('[telemetry]\nendpoint = "collector:4318"\nsampling = 0.5\n')
    with pytest.raises(UsageError) as caught:
        load_config(config)
    text = str(caught.value)
    assert "telemetry: endpoint must be an http:// or https:// URL" in text or "telemetry" in text
    assert "sampling" in text


def test_the_trace_collector_example_prints_a_plait_run_as_a_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/tracing.md's recipe: examples/trace_collector.py receives what `plait run
    examples/tool_agent.py` sends with OTEL_EXPORTER_OTLP_ENDPOINT set, and prints each run
    as a tree of its spans."""
    spec = importlib.util.spec_from_file_location(
        "trace_collector", EXAMPLES / "trace_collector.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    collector = module.Collector(out=io.StringIO())
    port, stop = serve_in_thread(collector.app())
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        for name in (
            "OTEL_SDK_DISABLED",
            "OTEL_TRACES_EXPORTER",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ):
            monkeypatch.delenv(name, raising=False)
        out = io.StringIO()
        assert plait_cli(["run", str(EXAMPLES / "tool_agent.py")], out=out) == 0, out.getvalue()
    finally:
        stop()
    assert len(collector.printed) == 2  # one tree per workflow of the example
    first = collector.printed[0].splitlines()
    assert first[1].startswith("invoke_workflow analysis-")
    assert any(line.startswith("  invoke_agent analyst") for line in first)
    assert any(
        line.startswith("    chat llama-3.1-8b") and "input_tokens=" in line for line in first
    )


def test_error_messages_stay_off_spans_only_their_type_goes(spans: InMemorySpanExporter) -> None:
    """A task's error can quote what it was given (a key in a URL, a prompt): spans carry
    the error's type, never its message."""

    @tool
    def leaky(city: str) -> str:
        """Fails with a secret in its message."""
        raise RuntimeError(f"GET /weather?api_key=sk-SECRET&city={city}")

    async def main() -> None:
        wf = Workflow("leaks")
        wf.add("boom", leaky.call({"city": "Oslo"}), retry=2)
        async with Engine(backends={"default": FunctionLLM(reply)}) as engine:
            assert not (await engine.run(wf)).ok

    asyncio.run(main())
    found = spans.get_finished_spans()
    text = repr(
        [(s.status.description, s.attributes, [e.attributes for e in s.events]) for s in found]
    )
    assert "sk-SECRET" not in text
    tool_span = by_name(found, "execute_tool leaky")
    assert tool_span.status.description == "RuntimeError"
    assert [e.name for e in tool_span.events] == ["retry"]


def test_spans_of_a_run_refused_at_submit_or_left_by_the_engine_are_ended(
    spans: InMemorySpanExporter,
) -> None:
    async def main() -> None:
        refused = Workflow("refused")
        refused.add("x", lambda ctx: 1, resource="nowhere")
        gate = asyncio.Event()

        async def wait(ctx: object) -> None:
            await gate.wait()

        left = Workflow("left")
        left.add("waits", wait)
        async with Engine(backends={"default": FunctionLLM(reply)}) as engine:
            with pytest.raises(UsageError):
                engine.submit(refused)
            engine.submit(left)
            await asyncio.sleep(0.05)  # the task is running as the engine closes

    asyncio.run(main())
    found = spans.get_finished_spans()
    abandoned = {s.name: (s.attributes or {}).get("plait.abandoned") for s in found}
    assert abandoned["invoke_workflow refused"] == "refused at submit"
    assert "invoke_workflow left" in abandoned  # ended, not leaked
    assert all(s.end_time is not None for s in found)


def test_a_resumed_run_traces_its_tasks_and_says_which_calls_were_replayed(
    spans: InMemorySpanExporter, make_store: StoreFactory
) -> None:
    """The resumed run's tasks get spans (no task_added tells them), and of a task's two
    calls only the one answered from the log is `plait.replayed`."""

    class Gate:
        stop: asyncio.Event
        reached: asyncio.Event

    async def twice(ctx: TaskContext) -> str:
        first = await ctx.complete(LLMRequest((Message("user", "first"),), "m1"))
        if not Gate.stop.is_set():
            Gate.reached.set()
            await asyncio.Event().wait()  # the first process stops here
        second = await ctx.complete(LLMRequest((Message("user", "second"),), "m1"))
        return first.text + second.text

    async def main() -> None:
        Gate.stop, Gate.reached = asyncio.Event(), asyncio.Event()
        llm = FunctionLLM(lambda request, hints: request.messages[-1].content)
        async with make_store() as store:
            async with Engine(backends={"default": llm}, store=store) as engine:
                wf = Workflow("resumable")
                wf.add("calls", twice, resource="default")
                engine.submit(wf)
                await Gate.reached.wait()
                assert engine.journal is not None
                await engine.journal.durable()
            Gate.stop.set()
            spans.clear()
            async with Engine(backends={"default": llm}, store=store) as engine:
                report = await engine.resume(Registry(twice))
                result = await report.runs[0]
        assert result.ok and result["calls"] == "firstsecond"

    asyncio.run(main())
    found = spans.get_finished_spans()
    task = next(s for s in found if s.name.startswith("task ") and "twice" in s.name)
    run = next(s for s in found if s.name == "invoke_workflow resumable")
    assert task.parent is not None and task.parent.span_id == run.context.span_id
    assert (run.attributes or {}).get("plait.resumed") is True
    chats = sorted((s for s in found if s.name == "chat m1"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {}).get("plait.replayed", False) for s in chats] == [True, False]
    assert all(c.parent is not None and c.parent.span_id == task.context.span_id for c in chats)


def test_an_sdk_provider_disabled_by_the_environment_traces_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = TracerProvider()
    use_tracer_provider(provider)
    try:
        assert find_tracer() is None
    finally:
        use_tracer_provider(None)


def test_a_call_sent_again_is_an_event_on_its_task_s_span(spans: InMemorySpanExporter) -> None:
    failed: list[int] = []

    def flaky(request: LLMRequest, hints: Hints) -> str:
        if not failed:
            failed.append(1)
            raise BackendUnavailableError("connection refused")
        return "ok"

    async def main() -> None:
        wf = Workflow("flaky")
        wf.add("ask", helper.ask("hi"))
        async with Engine(backends={"default": FunctionLLM(flaky)}) as engine:
            assert (await engine.run(wf)).ok

    asyncio.run(main())
    found = spans.get_finished_spans()
    task = next(s for s in found if s.name == "invoke_agent helper")
    [event] = [e for e in task.events if e.name == "call_retry"]
    assert event.attributes is not None
    assert event.attributes["error.type"] == "BackendUnavailableError"
    assert event.attributes["plait.backend"] == "default"
