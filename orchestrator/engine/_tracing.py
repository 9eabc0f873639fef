"""Traces: a span per workflow run, task, LLM call and tool call, on OpenTelemetry.

The engine traces only when an OpenTelemetry SDK tracer provider is in place (the global one,
`plait run`'s `[telemetry]`, or `use_tracer_provider`); otherwise nothing here runs and the
engine pays one check per event it would have built. Runs and tasks are traced from the
engine's events (the bus hands each to `Tracing.hear` as it is emitted); an LLM call is
traced where it is sent, so its W3C trace context goes to the model server
(`Hints.traceparent`), whose own spans (vLLM's `--otlp-traces-endpoint`) then join the
trace.

Spans follow the OpenTelemetry GenAI semantic conventions (`SEMCONV`): `invoke_workflow
{name}` for a run, `execute_tool {tool}` for a tool task, `chat {model}` (kind CLIENT) for
an LLM call with `gen_ai.*` request and usage attributes; other tasks are `task {label}`.
plait's own attributes are under `plait.*`. A task's span is the run's child and links to
the spans of the tasks it waited for; an LLM call's span is its task's child.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..model._errors import UsageError
from ..model._events import ActionSpec, Event
from ..model._llm import Hints, LLMRequest, LLMResponse
from ._config import TelemetrySettings

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

SEMCONV = "1.44.0"
"""The OpenTelemetry semantic conventions version whose GenAI span attributes these spans
carry (`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.*`,
`gen_ai.response.*`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
`gen_ai.usage.cache_read.input_tokens`, `gen_ai.tool.name`, `gen_ai.workflow.name`)."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV}"

_override: TracerProvider | None = None

EXPORT_TIMEOUT_S = 5.0
"""How long one export to the collector may take (`OTEL_EXPORTER_OTLP_TIMEOUT` overrides)."""
FLUSH_S = 10.0
"""How long `plait run` and `plait serve` wait, as they exit, for the last spans to go."""


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace engines started from now on with `provider` instead of OpenTelemetry's global
    one (None: the global one again). For tests, and for programs that keep plait's spans
    apart from the rest."""
    global _override
    _override = provider


def find_tracer() -> Tracer | None:
    """The tracer engines trace with, or None when tracing is off: OpenTelemetry is not
    installed, or no SDK tracer provider is set (the API's default does nothing)."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = _override if _override is not None else trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    tracer = provider.get_tracer("plait", schema_url=SCHEMA_URL)
    if isinstance(tracer, trace.NoOpTracer):  # an SDK provider with OTEL_SDK_DISABLED=true
        return None
    return tracer


def _env_off() -> bool:
    env = os.environ
    return (
        env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        or env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
    )


def export_wanted(settings: TelemetrySettings | None) -> bool:
    """Whether `plait run` and `plait serve` export traces: a `[telemetry]` table, or the
    standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`, unless
    `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`."""
    if _env_off():
        return False
    env = os.environ
    return settings is not None or any(
        env.get(name)
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )


@contextlib.asynccontextmanager
async def exporting(settings: TelemetrySettings | None) -> AsyncIterator[TracerProvider | None]:
    """While inside, engines trace and their spans go over OTLP/HTTP (`export_wanted`); on
    the way out the spans still queued are sent. None inside when nothing is wanted."""
    if not export_wanted(settings):
        yield None
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
        from opentelemetry.sdk.trace import TracerProvider as SDKProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise UsageError(
            "exporting traces needs OpenTelemetry's SDK and OTLP exporter, which are not "
            "installed: pip install 'plait[otel]' (or remove [telemetry] and the OTEL_EXPORTER_* "
            "variables)"
        ) from None
    name = settings.service_name if settings is not None else "plait"
    # The environment's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the file.
    resource = Resource.create({SERVICE_NAME: name}).merge(OTELResourceDetector().detect())
    provider = SDKProvider(resource=resource)
    endpoint = settings.endpoint if settings is not None else None
    # A collector that does not answer holds each export this long (unless the environment
    # says otherwise), and the exit waits for the last ones at most FLUSH_S.
    timeout = None if os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT") else EXPORT_TIMEOUT_S
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    previous = _override
    use_tracer_provider(provider)
    try:
        yield provider
    finally:
        use_tracer_provider(previous)
        # From a thread of its own (the collector may be served by this very event loop),
        # waited for at most FLUSH_S: spans a dead collector cannot take are dropped.
        done = threading.Event()

        def shut() -> None:
            provider.shutdown()
            done.set()

        threading.Thread(target=shut, name="plait-trace-flush", daemon=True).start()
        await asyncio.to_thread(done.wait, FLUSH_S)


def _now_ns() -> int:
    return time.time_ns()


@dataclass(slots=True)
class _Task:
    after: list[str]
    kind: str
    name: str
    resource: str
    ready_ns: int | None = None
    span: Span | None = None


class Tracing:
    """Spans of one engine's runs, tasks and LLM calls (see the module's docstring)."""

    def __init__(self, tracer: Tracer, name_of: Callable[[str], str] = lambda run: run) -> None:
        from opentelemetry import trace

        self.tracer = tracer
        self.name_of = name_of
        """A run's workflow name, from its id."""
        self._trace = trace
        self._runs: dict[str, Span] = {}
        self._tasks: dict[str, dict[str, _Task]] = {}

    # --- runs and tasks, from the engine's events --------------------------------------------

    def hear(self, run: str, said: Event) -> None:
        """One event of `run`, as the engine emits it."""
        event: Any = said
        kind = event.kind
        if kind in ("workflow_started", "workflow_resumed"):
            self._run_started(run, event)
        elif kind == "task_added":
            spec = event.action
            self._tasks.setdefault(run, {})[event.task] = _Task(
                list(event.after), spec.kind, _shown(spec), event.options.resource
            )
        elif kind == "task_replaced":
            task = self._task(run, event.task)
            if task is not None:
                task.kind, task.name = event.action.kind, _shown(event.action)
                task.resource = event.options.resource
        elif kind == "edge_added":
            task = self._task(run, event.target)
            if task is not None:
                task.after.append(event.source)
        elif kind == "edge_removed":
            task = self._task(run, event.target)
            if task is not None and event.source in task.after:
                task.after.remove(event.source)
        elif kind == "task_ready":
            task = self._task(run, event.task)
            if task is not None:
                task.ready_ns = _now_ns()
        elif kind == "task_started":
            self._task_started(run, event)
        elif kind == "task_retrying":
            task = self._task(run, event.task)
            if task is not None and task.span is not None:
                task.span.add_event(
                    "retry",
                    {"plait.attempt": event.attempt, "error.type": _error_type(event.error)},
                )
        elif kind == "call_retrying":
            task = self._task(run, event.task)
            if task is not None and task.span is not None:
                retry = {
                    "plait.backend": event.backend,
                    "plait.attempt": event.attempt,
                    "error.type": _error_type(event.error),
                }
                task.span.add_event("call_retry", retry)
        elif kind in ("task_succeeded", "task_failed", "task_cancelled"):
            self._task_ended(run, event)
        elif kind in ("deadline_missed", "deadline_hopeless"):
            span = self._runs.get(run)
            if span is not None:
                span.add_event(kind)
        elif kind == "workflow_finished":
            self._run_finished(run, event)

    def _task(self, run: str, task: str) -> _Task | None:
        return self._tasks.get(run, {}).get(task)

    def _run_started(self, run: str, event: Any) -> None:
        name = self.name_of(run)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "gen_ai.workflow.name": name,
            "plait.run.id": run,
            "plait.program": event.program,
            "plait.resumed": event.kind == "workflow_resumed",
        }
        if getattr(event, "priority", None):
            attributes["plait.priority_class"] = event.priority
        if event.deadline is not None:
            attributes["plait.deadline_in_s"] = max(0.0, event.deadline - event.at)
        self.forget(run, "started again")
        self._runs[run] = self.tracer.start_span(
            f"invoke_workflow {name}", attributes=attributes, start_time=_now_ns()
        )

    def _task_started(self, run: str, event: Any) -> None:
        task = self._task(run, event.task)
        parent = self._runs.get(run)
        if task is None or parent is None or task.span is not None:
            return  # a later attempt: its retries are events of the first's span
        now = _now_ns()
        tasks = self._tasks.get(run, {})
        links = [
            self._trace.Link(before.span.get_span_context())
            for name in task.after
            if (before := tasks.get(name)) is not None and before.span is not None
        ]
        attributes: dict[str, Any] = {
            "plait.task.id": event.task,
            "plait.task.kind": task.kind,
            "plait.resource": task.resource,
        }
        if task.ready_ns is not None:
            attributes["plait.queue_wait_s"] = (now - task.ready_ns) / 1e9
        if task.kind == "tool":
            span_name = f"execute_tool {task.name}"
            attributes["gen_ai.operation.name"] = "execute_tool"
            attributes["gen_ai.tool.name"] = task.name
        elif task.kind == "llm":
            span_name = f"invoke_agent {task.name}"
            attributes["gen_ai.operation.name"] = "invoke_agent"
            attributes["gen_ai.agent.name"] = task.name
        else:
            span_name = f"task {task.name}"
        task.span = self.tracer.start_span(
            span_name,
            context=self._trace.set_span_in_context(parent),
            attributes=attributes,
            links=links,
            start_time=now,
        )

    def _task_ended(self, run: str, event: Any) -> None:
        task = self._task(run, event.task)
        if task is None or task.span is None:
            return
        span = task.span
        if event.kind == "task_failed":
            # The type, not the message: a message can carry what the task was given.
            span.set_attribute("error.type", event.error_type)
            span.set_attribute("plait.attempts", event.attempts)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, event.error_type))
        elif event.kind == "task_cancelled":
            span.set_attribute("plait.cancelled", True)
        span.end(end_time=_now_ns())
        # Kept for the links of the tasks after it: its context, not the whole span.
        task.span = self._trace.NonRecordingSpan(span.get_span_context())

    def _run_finished(self, run: str, event: Any) -> None:
        span = self._runs.pop(run, None)
        self._end_tasks(self._tasks.pop(run, {}), "the run ended")
        if span is None:
            return
        span.set_attribute("plait.status", event.status)
        if event.deadline_met is not None:
            span.set_attribute("plait.deadline_met", event.deadline_met)
        if event.status != "succeeded":
            first = next(iter(event.failures.items()), None)
            text = f"{first[0]}: {_error_type(first[1])}" if first else event.status
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, text))
        span.end(end_time=_now_ns())

    def _end_tasks(self, tasks: Mapping[str, _Task], why: str) -> None:
        for task in tasks.values():  # a task left open (the run was stopped): closed here
            if task.span is not None and task.span.is_recording():
                task.span.set_attribute("plait.abandoned", why)
                task.span.end()

    def adopt(self, run: str, tasks: Mapping[str, tuple[list[str], ActionSpec, str]]) -> None:
        """A resumed run's tasks (rebuilt from its log, no `task_added` of them): by id,
        what each waits for, its action and its resource."""
        known = self._tasks.setdefault(run, {})
        for task, (after, spec, resource) in tasks.items():
            known.setdefault(task, _Task(list(after), spec.kind, _shown(spec), resource))

    def forget(self, run: str, why: str) -> None:
        """End what is open of `run` without a `workflow_finished` (it was refused at
        submit, stopped by a store failure, or the engine closed): marked abandoned."""
        self._end_tasks(self._tasks.pop(run, {}), why)
        span = self._runs.pop(run, None)
        if span is not None:
            span.set_attribute("plait.abandoned", why)
            span.end()

    def close(self) -> None:
        """The engine stops tracing: every span still open is ended, abandoned."""
        for run in list(self._runs) + [r for r in self._tasks if r not in self._runs]:
            self.forget(run, "the engine closed")

    # --- LLM calls, where they are sent ------------------------------------------------------

    def call(self, run: str, task: str, backend: str, llm: object, request: LLMRequest) -> CallSpan:
        """A span for one LLM call of `task` to `llm` (the backend named `backend`), started
        now (end it with `CallSpan.ended`)."""
        # gen_ai.provider.name: the server's kind (its dialect, say), not its name here.
        provider = str(getattr(llm, "dialect", None) or type(llm).__name__.lower())
        owner = self._task(run, task)
        parent = owner.span if owner is not None and owner.span is not None else None
        parent = parent or self._runs.get(run)
        model = request.model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "plait.backend": backend,
            "plait.task.id": task,
        }
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        attributes["gen_ai.request.temperature"] = request.sampling.temperature
        attributes["gen_ai.request.top_p"] = request.sampling.top_p
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            f"chat {model}",
            context=context,
            kind=self._trace.SpanKind.CLIENT,
            attributes=attributes,
        )
        return CallSpan(span, self._trace)


class CallSpan:
    """One LLM call's span: its W3C trace context for the server, and how it ended."""

    __slots__ = ("_trace", "span")

    def __init__(self, span: Span, trace: Any) -> None:
        self.span = span
        self._trace = trace

    @property
    def traceparent(self) -> str | None:
        """The W3C `traceparent` header that makes the server's spans children of this one."""
        from opentelemetry.propagate import inject

        carrier: dict[str, str] = {}
        inject(carrier, context=self._trace.set_span_in_context(self.span))
        return carrier.get("traceparent")

    def hinted(self, hints: Hints) -> None:
        """What the call's hints said: plait's scheduling, beside the GenAI attributes."""
        span = self.span
        span.set_attribute("plait.program_id", hints.program_id)
        span.set_attribute("plait.urgency", hints.urgency)
        if hints.service is not None:
            span.set_attribute("plait.service", hints.service)
        if hints.keep_alive_s is not None:
            span.set_attribute("plait.keep_alive_s", hints.keep_alive_s)
        if hints.slack_s is not None:
            span.set_attribute("plait.slack_s", hints.slack_s)

    def ended(
        self,
        response: LLMResponse | None,
        error: BaseException | None = None,
        *,
        replayed: bool = False,
    ) -> None:
        span = self.span
        if replayed:
            span.set_attribute("plait.replayed", True)
        if response is not None:
            usage = response.usage
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            if usage.cached_prompt_tokens is not None:
                span.set_attribute(
                    "gen_ai.usage.cache_read.input_tokens", usage.cached_prompt_tokens
                )
            span.set_attribute("gen_ai.response.finish_reasons", [response.finish_reason])
        if isinstance(error, asyncio.CancelledError):
            span.set_attribute("plait.cancelled", True)  # not the call's failure
        elif error is not None:
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(
                self._trace.Status(self._trace.StatusCode.ERROR, type(error).__qualname__)
            )
        span.end()


def _shown(spec: ActionSpec) -> str:
    """What a task's span is named by: its action's name; an MCP server's tool by the
    tool's own name."""
    listed = spec.args.get("listed") if spec.kind == "tool" else None
    if isinstance(listed, dict):
        return str(listed.get("name", spec.name))
    return spec.name


def _error_type(error: str) -> str:
    """`Type: message` (as events say an error) -> `Type`."""
    return error.split(":", 1)[0]
