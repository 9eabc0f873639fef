"""`GET /metrics`: what the engine is doing, in Prometheus' text format.

Counters and histograms are fed by the engine's events (one listener on its bus, drained by
one task); queue lengths and in-flight calls are read from the admission queues when
Prometheus scrapes. No label carries a tenant or a workflow id: the series stay few, and
one tenant does not learn another's names from them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..batch import BatchProgress
from ..engine._engine import Engine, EngineStats
from ..model._events import Event

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JCT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
"""Seconds: from one quick call to an hour-long batch workflow."""


class Metrics:
    """The service's Prometheus registry over one engine; `start` before, `close` after."""

    def __init__(
        self,
        engine: Engine,
        batches: Callable[[], Iterable[BatchProgress]] = tuple,
        batch_counts: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self.engine = engine
        self.batches = batches
        """The progress of each running batch job (no ids: the figures are summed)."""
        self.batch_counts = batch_counts
        """Batch jobs by state."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.workflows = Counter(
            "plait_workflows_finished",
            "Workflows finished, by status and priority class",
            ["status", "priority"],
            registry=r,
        )
        self.jct = Histogram(
            "plait_workflow_duration_seconds",
            "Job completion time: a workflow's start to its end, by priority class",
            ["priority"],
            buckets=JCT_BUCKETS,
            registry=r,
        )
        self.deadlines = Counter(
            "plait_deadlines",
            "Finished workflows that had a deadline, by whether they met it",
            ["outcome"],
            registry=r,
        )
        self.tasks = Counter(
            "plait_tasks_finished", "Tasks finished, by state", ["state"], registry=r
        )
        self.task_retries = Counter(
            "plait_task_retries", "Task attempts that failed and were tried again", registry=r
        )
        self.call_retries = Counter(
            "plait_llm_call_retries",
            "LLM calls that failed and were sent again, by backend",
            ["backend"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "plait_prompt_tokens", "Prompt tokens of finished LLM tasks", registry=r
        )
        self.cached_tokens = Counter(
            "plait_cached_prompt_tokens",
            "Prompt tokens the servers reported served from their prefix cache",
            registry=r,
        )
        self.completion_tokens = Counter(
            "plait_completion_tokens", "Completion tokens of finished LLM tasks", registry=r
        )
        self.http = Counter(
            "plait_http_requests",
            "HTTP requests answered, by route and status code",
            ["method", "route", "status"],
            registry=r,
        )
        self.cut_off = Counter(
            "plait_http_connections_closed",
            "Connections the service closed to protect itself: at max_connections (cap), or "
            "without whole request headers within header_timeout_s (headers)",
            ["reason"],
            registry=r,
        )
        self.prompt_sum = self.cached_sum = 0
        self.met = {True: 0, False: 0}
        r.register(_Live(self))
        self._priority: dict[str, str] = {}
        """The class of each run started and not finished (finished events do not say)."""
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.engine.bus.listen(self._events)
        self._task = asyncio.create_task(self._consume(), name="plait-metrics")

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.engine.bus.unlisten(self._events)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def exposition(self) -> bytes:
        self._drain()  # what has happened up to this scrape is in it
        return generate_latest(self.registry)

    async def _consume(self) -> None:
        while True:
            self.observe(await self._events.get())
            self._drain()

    def _drain(self) -> None:
        while not self._events.empty():
            self.observe(self._events.get_nowait())

    def observe(self, event: Event) -> None:
        kind = event.kind
        if kind == "task_succeeded":
            self.tasks.labels("succeeded").inc()
            usage = event.usage  # type: ignore[union-attr]
            if usage is not None:
                self.prompt_tokens.inc(usage.prompt_tokens)
                self.completion_tokens.inc(usage.completion_tokens)
                self.cached_tokens.inc(usage.cached_prompt_tokens or 0)
                self.prompt_sum += usage.prompt_tokens
                self.cached_sum += usage.cached_prompt_tokens or 0
        elif kind in ("task_failed", "task_skipped", "task_cancelled"):
            self.tasks.labels(kind.removeprefix("task_")).inc()
        elif kind == "task_retrying":
            self.task_retries.inc()
        elif kind == "call_retrying":
            self.call_retries.labels(event.backend).inc()  # type: ignore[union-attr]
        elif kind == "workflow_started":
            self._priority[event.workflow] = event.priority  # type: ignore[union-attr]
        elif kind == "workflow_resumed":
            handle = self.engine.handle(event.workflow)
            if handle is not None:
                self._priority[event.workflow] = handle.priority
        elif kind == "workflow_finished":
            priority = self._priority.pop(event.workflow, "unknown")
            self.workflows.labels(event.status, priority).inc()  # type: ignore[union-attr]
            self.jct.labels(priority).observe(event.duration)  # type: ignore[union-attr]
            met = event.deadline_met  # type: ignore[union-attr]
            if met is not None:
                self.deadlines.labels("met" if met else "missed").inc()
                self.met[met] += 1


class _Live(Collector):
    """Figures read at scrape time: running workflows, queues and in-flight calls."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        stats = self.metrics.engine.stats()
        yield GaugeMetricFamily(
            "plait_workflows_running", "Workflows running now", value=stats.running_workflows
        )
        waiting = GaugeMetricFamily(
            "plait_queue_waiting",
            "Calls and tasks waiting for an admission slot, by resource (a backend's name, "
            "'tools' or 'local')",
            labels=["resource"],
        )
        in_flight = GaugeMetricFamily(
            "plait_in_flight",
            "Calls and tasks holding an admission slot now, by resource",
            labels=["resource"],
        )
        limit = GaugeMetricFamily(
            "plait_in_flight_limit", "Admission slots of each resource", labels=["resource"]
        )
        for res in stats.resources:
            waiting.add_metric([res.name], res.waiting)
            in_flight.add_metric([res.name], res.in_flight)
            limit.add_metric([res.name], res.max_in_flight)
        yield waiting
        yield in_flight
        yield limit
        m = self.metrics
        share = m.cached_sum / m.prompt_sum if m.prompt_sum else 0.0
        yield GaugeMetricFamily(
            "plait_cache_hit_share",
            "Share of prompt tokens served from the servers' prefix caches since the start",
            value=share,
        )
        met, missed = m.met[True], m.met[False]
        yield GaugeMetricFamily(
            "plait_deadline_attainment",
            "Share of finished workflows with a deadline that met it, since the start",
            value=met / (met + missed) if met + missed else 1.0,
        )

        yield from _admission_figures(stats)
        yield from _lane_figures(m.engine)
        yield from _batch_figures(m.batches(), m.batch_counts())
        yield from _cluster_figures(m.engine)


def _lane_figures(engine: Engine) -> Iterator[Metric]:
    """The urgent lanes each router keeps now (docs/admission.md, "Urgent lanes")."""
    routers = [
        (name, lanes)
        for name, backend in engine.backends.items()
        if callable(lanes := getattr(backend, "lanes", None))
    ]
    if routers:
        gauge = GaugeMetricFamily(
            "plait_router_lanes",
            "Replicas a router keeps as urgent lanes now (urgent and batch work both around)",
            labels=["resource"],
        )
        for name, lanes in routers:
            gauge.add_metric([name], len(lanes()))
        yield gauge


def _admission_figures(stats: EngineStats) -> Iterator[Metric]:
    """What deadline-aware admission learned (docs/admission.md): each backend's knee and
    the caps it answers, and the deadline gate's cap and queue."""
    if stats.knees or stats.reserve_caps:
        knee = GaugeMetricFamily(
            "plait_headroom_knee",
            "Calls in flight past which a backend's throughput gains little (learned; absent "
            "until two levels were seen)",
            labels=["resource"],
        )
        cap = GaugeMetricFamily(
            "plait_headroom_cap",
            "Calls in flight up to which slack-rich work is admitted, with urgent work around "
            "(case 'urgent') and without ('alone')",
            labels=["resource", "case"],
        )
        for k in stats.knees:
            if k.knee is not None:
                knee.add_metric([k.backend], k.knee)
            cap.add_metric([k.backend, "urgent"], k.cap_urgent)
            cap.add_metric([k.backend, "alone"], k.cap_alone)
        for backend, alone in stats.reserve_caps:  # no knee there: the reserve alone
            cap.add_metric([backend, "urgent"], alone)
            cap.add_metric([backend, "alone"], alone)
        yield knee
        yield cap
    gate = stats.gate
    if gate is None:
        return
    if gate.cap is not None:
        yield GaugeMetricFamily(
            "plait_gate_cap",
            "Runs with a deadline let in at once by the deadline gate (absent: no cap now)",
            value=gate.cap,
        )
    yield GaugeMetricFamily(
        "plait_gate_in_flight", "Runs with a deadline let in and not ended", value=gate.in_flight
    )
    yield GaugeMetricFamily(
        "plait_gate_waiting", "Runs with a deadline waiting at the gate", value=gate.waiting
    )
    yield GaugeMetricFamily(
        "plait_gate_late_waiting",
        "Of the runs waiting at the gate, those judged late (they start into spare room)",
        value=gate.late_waiting,
    )
    yield CounterMetricFamily(
        "plait_gate_held", "Runs let in (or gone) after waiting at the gate", value=gate.held
    )
    yield CounterMetricFamily(
        "plait_gate_hopeless",
        "Waiting runs found unable to meet their deadline at the present load (shed with "
        "late='cancel', else moved behind the rest)",
        value=gate.shed,
    )


def _cluster_figures(engine: Engine) -> Iterator[Metric]:
    """With several engines on one store: this engine's leases, its share of each shared
    in-flight limit, and what its routers told and heard from the other engines' routers."""
    leases = engine.leases
    if leases is not None:
        s = leases.stats
        for name, value, about in (
            ("renewals", s.renewals, "Heartbeats that renewed this engine's leases"),
            ("renewal_failures", s.renewal_failures, "Heartbeats that failed or timed out"),
            ("claimed", s.claimed, "Workflows this engine took over or picked up unowned"),
            ("resumed", s.resumed, "Workflows taken over and resumed here"),
            ("lost", s.lost, "Workflows another engine took from this one (it had stalled)"),
            ("given_up", s.given_up, "Workflows let go when the leases could not be renewed"),
        ):
            yield CounterMetricFamily(f"plait_cluster_{name}", about, value=value)
    shared = engine.shared
    if shared is not None:
        share = GaugeMetricFamily(
            "plait_shared_limit_share",
            "This engine's share of a backend's in-flight limit shared by all engines",
            labels=["resource"],
        )
        for resource in engine.backends:
            held = engine.admission.share(resource)
            if held is not None:
                share.add_metric([resource], held)
        yield share
    peers = [
        (name, stats())
        for name, backend in engine.backends.items()
        if (stats := getattr(getattr(backend, "peering", None), "stats", None)) is not None
    ]
    if peers:
        messages = CounterMetricFamily(
            "plait_router_peer_messages",
            "Router messages to and from the other engines' routers, by backend and direction",
            labels=["resource", "direction"],
        )
        unresolved = CounterMetricFamily(
            "plait_router_peer_unresolved",
            "Peers' placements whose prefix this router did not know (blocks not applied)",
            labels=["resource"],
        )
        for name, stats in peers:
            messages.add_metric([name, "published"], stats.published)
            messages.add_metric([name, "received"], stats.received)
            unresolved.add_metric([name], stats.unresolved)
        yield messages
        yield unresolved


def _batch_figures(running: Iterable[BatchProgress], counts: Mapping[str, int]) -> Iterator[Metric]:
    """The running batch jobs' progress, summed over jobs (as `plait batch run` shows it)."""
    jobs = GaugeMetricFamily("plait_batches", "Batch jobs, by state", labels=["state"])
    for state in ("running", "completed", "failed", "cancelled"):
        jobs.add_metric([state], counts.get(state, 0))
    yield jobs
    rows = GaugeMetricFamily(
        "plait_batch_rows", "Rows of the running batch jobs, by state", labels=["state"]
    )
    total = {"done": 0, "failed": 0, "running": 0, "pending": 0}
    prompt = cached = 0
    rate = 0.0
    eta: float | None = None
    for progress in running:
        total["done"] += progress.done + progress.skipped - progress.skipped_failed
        total["failed"] += progress.failed + progress.skipped_failed
        total["running"] += progress.running
        total["pending"] += max(0, progress.total - progress.finished - progress.running)
        prompt += progress.prompt_tokens
        cached += progress.cached_tokens
        rate += progress.tokens_per_s
        left = progress.eta_s
        if left is not None:
            eta = left if eta is None else max(eta, left)
    for state, value in total.items():
        rows.add_metric([state], value)
    yield rows
    yield GaugeMetricFamily(
        "plait_batch_tokens_per_second",
        "Prompt and completion tokens a second of the running batch jobs, each at its pace so far",
        value=rate,
    )
    yield GaugeMetricFamily(
        "plait_batch_cache_hit_share",
        "Share of the running batch jobs' prompt tokens served from the prefix caches",
        value=cached / prompt if prompt else 0.0,
    )
    yield GaugeMetricFamily(
        "plait_batch_eta_seconds",
        "Seconds until the last running batch job is done at its pace so far (0: none known)",
        value=eta or 0.0,
    )
