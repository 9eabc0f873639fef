"""The engine: one loop that runs every workflow, program first.

    admit ready tasks in policy order -> start them -> await the next outcome -> apply it
    -> emit its events

Everything else is a named call out of that loop. Task bodies run as asyncio tasks in the
engine's TaskGroup and report back through the inbox; they never touch run state directly
except through the workflow's validated mutations. The LLM call path belongs to `LLMCalls`,
each workflow's state to its `Run`; the engine wires them together and owns the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import os
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, TypeVar, cast

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ..admission._controller import Hopeless, Shed, UrgencyController
from ..admission._gate import GateStats
from ..admission._knee import KneeStats
from ..admission._mode import AdmissionTuning, Mode, admission_tuning
from ..admission._queue import DEFAULT_LIMITS, Admission, Limits, ResourceStats, Ticket
from ..admission._scheduler import CLASS_RANK, PriorityClass, Slack, program_key
from ..cluster._cluster import Cluster, Leases, engine_name
from ..cluster._slots import SharedLimits, SlotBroker
from ..durability._journal import Journal
from ..durability._registry import Registry
from ..durability._replay import RunImage
from ..durability._resume import Decision, ResumePlan, decision_for, plan_resume
from ..durability._retention import Retention, Sweeper
from ..durability._store import CancelStore, LeaseStore, RetainingStore, Store, StoreError
from ..model._clock import Clock, SystemClock, VirtualClock, running_clock
from ..model._errors import (
    OverloadedError,
    PlaitError,
    TaskCancelledError,
    TaskTimeoutError,
    UsageError,
    WorkflowStateError,
)
from ..model._events import (
    ActionSpec,
    DeadlineHopeless,
    DeadlineMissed,
    Event,
    TaskState,
    WorkflowResumed,
    WorkflowStarted,
)
from ..model._llm import LLMBackend, ServerCapacity, Usage, capabilities
from ..model._task import (
    TaskRun,
    check_seconds,
    check_serializable,
    describe,
    recording_problem,
)
from ..model._text import first_unstorable, key_text, storable, text_problem
from ..model._workflow import Workflow
from ._bus import EventBus
from ._calls import LLMCalls
from ._capacity import derived_limits, read_capacities
from ._config import Config, load_config
from ._context import TaskContext
from ._durable import STORE_PATIENCE_S, Durability, fail
from ._keepalive import DEFAULT_KEEP_ALIVE, KeepAlive
from ._open import open_backends, open_store
from ._resilience import DEFAULT_BREAKER, DEFAULT_CALL_RETRY, Breaker, CallRetry, CircuitBreaker
from ._run import Late, Run, RunResult, RunServices, task_kind
from ._tracing import Tracing, find_tracer


class _Outcome:
    """How one task ended, sent from its asyncio task to the loop. (A plain slotted class:
    a frozen dataclass costs microseconds more per task to build.)"""

    __slots__ = ("elapsed", "error", "llm_calls", "result", "run", "state", "task", "usage")

    def __init__(
        self,
        run: Run,
        task: TaskRun,
        state: TaskState,
        result: Any,
        error: BaseException | None,
        usage: Usage,
        llm_calls: int,
        elapsed: float,
    ) -> None:
        self.run = run
        self.task = task
        self.state = state
        self.result = result
        self.error = error
        self.usage = usage
        self.llm_calls = llm_calls
        self.elapsed = elapsed


class _Wake:
    """Put in the inbox when something outside the loop changed the run state."""


_WAKE = _Wake()


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineStats:
    running_workflows: int
    finished_workflows: int
    resources: tuple[ResourceStats, ...]
    knees: tuple[KneeStats, ...] = ()
    """What each LLM backend's headroom controller learned (empty without a knee: under
    `throughput` and `off`, unless `Limits.batch_in_flight` fixes one)."""
    gate: GateStats | None = None
    """What the deadline gate learned (None without a gate: under `throughput` and `off`)."""
    reserve_caps: tuple[tuple[str, int], ...] = ()
    """Backends that keep urgent work apart themselves (a router's lanes), which get no
    knee: the calls in flight up to which slack-rich work is admitted there (the limit less
    `Headroom.reserve` of it), by backend."""


class RunHandle:
    """A submitted workflow: await it (or `.result()`) for its `RunResult`; `.cancel()` it."""

    def __init__(self, engine: Engine, run: Run) -> None:
        self._engine = engine
        self._run = run

    @property
    def id(self) -> str:
        return self._run.id

    @property
    def workflow(self) -> Workflow:
        return self._run.workflow

    @property
    def priority(self) -> PriorityClass:
        return self._run.priority_class

    async def result(self) -> RunResult:
        return await asyncio.shield(self._run.done)

    def __await__(self) -> Generator[Any, None, RunResult]:
        return self.result().__await__()

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        self._engine.cancel(self._run.id, reason)


@dataclass(frozen=True, slots=True)
class ResumeReport:
    """What `Engine.resume` did: `runs` it started again (await their handles); `plans`
    for every unfinished run it found, those held for a decision (`needs_decision`) and
    those it could not rebuild (`failed`, each with its `error`) among them."""

    runs: list[RunHandle]
    plans: list[ResumePlan]

    @property
    def needs_decision(self) -> list[ResumePlan]:
        started = {handle.id for handle in self.runs}
        return [p for p in self.plans if p.error is None and p.workflow not in started]

    @property
    def failed(self) -> list[ResumePlan]:
        return [p for p in self.plans if p.error is not None]


class Engine:
    """Runs many workflows at once on one asyncio loop. Use it as an async context manager:

    async with Engine(backends={"default": llm}) as engine:
        result = await engine.run(workflow)

    `admission` says what the engine does about deadlines and load (docs/admission.md):
    "deadlines" (the default) runs programs with a deadline least slack first, holds
    slack-rich work back to each LLM backend's learned throughput knee while urgent work is
    around, and starts runs with a deadline through the deadline gate; "throughput" runs
    programs in arrival order (interactive first) and holds nothing back; "off" adds nothing
    to the limits given (no hold-back for a server's KV cache either). An
    `orchestrator.ext.AdmissionTuning` spells the settings out, for benchmarks and experts.
    `limits` bound each resource (`Limits`; `Limits(batch_in_flight=N)` fixes the cap for
    slack-rich work instead of learning it, in every mode).
    `call_retry` says how often one LLM call is sent before its task sees the error
    (`CallRetry`); `breaker` says when a failing backend's circuit opens (`Breaker`; None
    turns circuit breakers off). `store` (an opened `Store`, e.g. `memory.SQLStore`) makes
    every run durable: each event is appended to its log (grouped commits), and a run's
    result is handed back once its last event is committed (docs/durability.md). A store
    that fails in a way that may pass (unreachable, a full disk) pauses the runs for up to
    `STORE_PATIENCE_S` while their commit is tried again; then they stop, with nothing
    committed lost, to be resumed.
    `retention` (with a store) compacts and deletes finished runs while the engine runs
    (`Retention`; its `Sweeper` is `engine.sweeper`). `cluster` runs the engine as one of
    several on its store, and shares each LLM backend's in-flight limit between them
    (`Cluster`, docs/scaling.md).
    """

    def __init__(
        self,
        *,
        backends: Mapping[str, LLMBackend] | None = None,
        admission: Mode | AdmissionTuning = "deadlines",
        clock: Clock | None = None,
        limits: Mapping[str, Limits] | None = None,
        max_workflows: int = 10_000,
        threads: int = 64,
        keep_alive: KeepAlive | None = DEFAULT_KEEP_ALIVE,
        call_retry: CallRetry = DEFAULT_CALL_RETRY,
        breaker: Breaker | None = DEFAULT_BREAKER,
        store: Store | None = None,
        retention: Retention | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        backends = dict(backends or {})
        self.tuning = tuning = admission_tuning(admission)
        """What `admission` stands for (`AdmissionTuning`)."""
        self.policy = tuning.policy
        if clock is not None and not isinstance(clock, Clock):
            raise UsageError(
                f"Engine(clock={clock!r}) takes a Clock: SystemClock(), or a VirtualClock "
                "whose run(...) drives the program (a config's [engine] clock names one; "
                "plait run builds it)"
            )
        self._clock = clock
        merged = dict(DEFAULT_LIMITS)
        for name in backends:
            merged.setdefault(name, Limits())
        merged.update(limits or {})
        self._given_limits = dict(limits or {})
        self.capacities: dict[str, ServerCapacity] = {}
        """What each backend that can say it said of its server's size when the engine
        started (`CapacityReporting`), and so of the limits derived from it."""
        # A fixed `Limits.batch_in_flight` holds work back even with headroom=None.
        self.urgency = UrgencyController(
            {name: (merged[name].max_in_flight, merged[name].batch_in_flight) for name in backends},
            frozenset(n for n, b in backends.items() if capabilities(b).isolates_urgent),
            headroom=tuning.headroom,
            gate=tuning.gate,
            default_estimate=tuning.default_estimate,
        )
        """Decides admission (the gate, the knees, what tasks and runs take); the engine
        applies its plans."""
        urgency = self.urgency
        # Under `slack` a program without a deadline keeps its key (it ranks after every
        # one with a deadline, in arrival order): only programs with one are ranked anew
        # each round, so a workload without deadlines costs what `fcfs` costs.
        moving = isinstance(self.policy, Slack)
        static = self._static_key if self.policy.static or moving else None
        self.admission = Admission(
            merged, static_key=static, held=self._held_back, gated=urgency.holds, moving=moving
        )
        self.bus = EventBus()
        self.calls = LLMCalls(
            backends,
            policy=self.policy,
            limits=merged,
            admission=self.admission,
            bus=self.bus,
            wake=self.wake,
            next_seq=self.next_seq,
            keep_alive=keep_alive,
            call_retry=call_retry,
            breaker=breaker,
            knees=urgency.knees,
            service=urgency.service_class,
        )
        self.max_workflows = max_workflows
        self.default_estimate = tuning.default_estimate
        if threads < 1:
            raise UsageError(f"Engine(threads={threads}) must be at least 1")
        self.threads = threads
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._services: RunServices | None = None
        self._runs: dict[str, Run] = {}
        self._tenant_runs: Counter[str | None] = Counter()
        """How many of `_runs` each tenant has: `running(tenant)` is asked on every
        submission the service takes, with thousands running."""
        self._settled: list[Run] = []
        self._applying = False
        self._programs = 0
        self._seq = 0
        self._finished = 0
        self._inbox: asyncio.Queue[_Outcome | _Wake] | None = None
        self._woken = False
        self._tg: asyncio.TaskGroup | None = None
        self._group: asyncio.TaskGroup | None = None
        """The same task group, kept while the engine winds down (`_tg` refuses new runs)."""
        self._closing = False
        self.store = store
        if retention is not None and store is None:
            raise UsageError(
                "Engine(retention=...) needs a store to apply it to; pass store=SQLStore(...) "
                "too, or leave retention out"
            )
        self.retention = retention
        self._retaining: RetainingStore | None = None
        """The store as the `RetainingStore` that `retention` needs (found here, once)."""
        if retention is not None and store is not None:
            self._retaining = RetainingStore.require(store, "Engine(retention=...)")
        if cluster is not None and store is None and not cluster.broker:
            raise UsageError(
                "Engine(cluster=...) shares a store's runs between engines: pass "
                "store=SQLStore(...) (PostgreSQL for engines on several machines) too, or "
                "Cluster(share_limits=orchestrator.ext.LocalSlots(clock)) for engines in one "
                "process that share only their limits"
            )
        self.cluster = cluster
        self._shared: tuple[LeaseStore, CancelStore] | None = None
        """The store as the `LeaseStore` and `CancelStore` that `cluster` needs."""
        if cluster is not None and store is not None:
            self._shared = (
                LeaseStore.require(store, "Engine(cluster=...)"),
                CancelStore.require(store, "Engine(cluster=...)"),
            )
        slots: SlotBroker | None = None
        if cluster is not None and cluster.broker:
            slots = cast(SlotBroker, cluster.share_limits)
        elif cluster is not None and cluster.share_limits:
            if not isinstance(store, SlotBroker):
                raise UsageError(
                    f"Cluster(share_limits=True) needs a store that shares limits "
                    f"({type(store).__name__} does not); pass share_limits=False"
                )
            slots = store
        self._broker = slots
        self._llm_limits = {name: merged[name].max_in_flight for name in backends}
        self.shared: SharedLimits | None = None
        """With a broker: this engine's share of each LLM backend's in-flight limit, which
        all engines on the broker hold together (docs/scaling.md)."""
        self._shared_task: asyncio.Task[None] | None = None
        self.leases: Leases | None = None
        """The cluster side while the engine runs with `cluster` (heartbeat, take-over)."""
        self._lease_task: asyncio.Task[None] | None = None
        self.durable: Durability | None = None
        """The store's side of the engine while it runs with one (journal, memo, sweeper)."""
        self._tracing: Tracing | None = None
        """Spans of runs, tasks and calls while an OpenTelemetry SDK is set (`Tracing`)."""
        self._stack: contextlib.AsyncExitStack | None = None
        """The services started on entry, closed on exit in reverse (`__aenter__`)."""

    @classmethod
    def from_config(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any] | Config,
        *,
        store: str | Store | None = None,
        clock: Clock | None = None,
    ) -> contextlib.AbstractAsyncContextManager[Engine]:
        """An engine built from a config file (`.toml`, `.yaml`; or its contents as a dict,
        or a loaded `Config`): its backends, limits and admission mode, with the
        backends opened for as long as the engine runs. `store`: a SQLite path or database
        URL to open (or an opened `Store`) to make every run durable.

            async with Engine.from_config("plait.toml") as engine:
                result = await engine.run(workflow)
        """
        return _from_config(source, store=store, clock=clock)

    @property
    def journal(self) -> Journal | None:
        """The store's journal while the engine runs with a store (`await
        engine.journal.durable()`: everything recorded so far is committed)."""
        return None if self.durable is None else self.durable.journal

    @property
    def sweeper(self) -> Sweeper | None:
        """Applies `retention` to the store while the engine runs (None without one)."""
        return None if self.durable is None else self.durable.sweeper

    @property
    def backends(self) -> Mapping[str, LLMBackend]:
        return self.calls.backends

    @property
    def clock(self) -> Clock:
        """The engine's clock: the one given, else the running loop's (set on entry)."""
        if self._clock is None:
            self._clock = SystemClock()
        return self._clock

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        if self._tg is not None:
            raise UsageError("this Engine is already running; enter it once")
        if self._clock is None:
            self._clock = running_clock()
        self._clock.check_running_loop()
        clock = self._clock
        # One context per service, each entered once the one before it has started: a
        # service that fails to start closes those started before it, in reverse.
        async with contextlib.AsyncExitStack() as stack:
            await self._read_capacity()
            tg = asyncio.TaskGroup()
            self.calls.start(clock, tg, virtual=isinstance(clock, VirtualClock))
            stack.callback(self._stop_calls)
            self._start_tracing()
            stack.callback(self._stop_tracing)
            self._services = RunServices(
                clock=clock,
                policy=self.policy,
                admission=self.admission,
                bus=self.bus,
                next_seq=self.next_seq,
                changed=self._changed,
                default_estimate=self.default_estimate,
                durations=self.urgency.durations,
            )
            if self.store is not None:
                self._open_durable(clock)
            self._inbox = asyncio.Queue()
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.threads, thread_name_prefix="plait-task"
            )
            stack.callback(self._stop_threads)
            if self.leases is not None:
                await self.leases.start()
                stack.push_async_callback(self._release_leases)
            if self._broker is not None and self._llm_limits:
                await self._share_limits(clock)  # a first share before any call is admitted
                stack.push_async_callback(self._leave_shares)
            await tg.__aenter__()
            self._tg = self._group = tg
            stack.push_async_exit(self._wind_down)
            if self.durable is not None:
                self.durable.start(tg)
            tg.create_task(self._loop(), name="plait-engine")
            if self.leases is not None:
                self._lease_task = tg.create_task(self.leases.run(), name="plait-leases")
            if self.shared is not None:
                self._shared_task = tg.create_task(self.shared.run(), name="plait-shared-limits")
            self._stack = stack.pop_all()
        return self

    def _open_durable(self, clock: Clock) -> None:
        """The store's side of the engine (and the cluster's, with one), not started yet."""
        assert self.store is not None
        if isinstance(clock, VirtualClock):
            raise UsageError(
                "Engine(store=...) needs the system clock: a store does real I/O (a "
                "database driver's thread or socket), which virtual time would jump over "
                "to its timeouts; use clock=SystemClock(), or no store for simulations"
            )
        if self.cluster is not None and self._shared is not None:
            self.leases = Leases(
                self.cluster,
                *self._shared,
                clock,
                room=lambda: self.max_workflows - len(self._runs),
                resume=self._resume_claimed,
                let_go=self._let_go,
                mine=lambda: list(self._runs),
                cancel=self.cancel_if_running,
            )
        self.durable = Durability(
            self.store,
            clock,
            self._runs,
            self.wake,
            patience_s=STORE_PATIENCE_S,
            sweeper=(
                None
                if self.retention is None or self._retaining is None
                else Sweeper(self._retaining, self.retention, clock)
            ),
            owner=None if self.leases is None else self.leases.owner,
            lease_s=0.0 if self.cluster is None else self.cluster.lease_s,
            on_lost=None if self.leases is None else self.leases.lost,
        )
        self.calls.memo = self.durable.memo
        self.bus.recorder = self.durable.record

    async def _share_limits(self, clock: Clock) -> None:
        """Join the broker that shares each LLM backend's limit and take a first share."""
        assert self._broker is not None
        urgency = self.urgency
        self.admission.urgent = lambda run: urgency.urgent(run, clock.monotonic())
        cluster = self.cluster
        if self.leases is not None:
            owner = self.leases.owner
        else:
            owner = cluster.owner() if cluster is not None else engine_name()
        self.shared = SharedLimits(
            self._broker,
            owner,
            self._llm_limits,
            clock,
            demand=self.admission.demand,
            set_share=self._set_share,
            every_s=cluster.share_every_s if cluster is not None else 0.25,
            lease_s=cluster.lease_s if cluster is not None else 10.0,
        )
        await self.shared.round()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None
        try:
            await stack.__aexit__(exc_type, exc, tb)
        finally:
            self._abandon_runs()
        return None

    async def _wind_down(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close the task group: the runs left are cancelled and the loop winds them down
        (their tasks, the store's commit of what they told)."""
        assert self._tg is not None
        self._closing = True
        for task in (self._lease_task, self._shared_task):
            if task is not None:
                task.cancel()
        self._lease_task = self._shared_task = None
        if self.durable is not None:
            self.durable.suspend()
        for run in list(self._runs.values()):
            run.cancel("the engine was closed")
        self.wake()
        tg, self._tg = self._tg, None
        try:
            if exc is not None and not isinstance(exc, asyncio.CancelledError):
                # The body failed: let the loop wind down the cancelled runs, then let the
                # caller's own exception propagate as it is, not wrapped in an ExceptionGroup.
                await tg.__aexit__(None, None, None)
                return None
            await tg.__aexit__(exc_type, exc, tb)
            return None
        finally:
            self._group = None

    async def _release_leases(self) -> None:
        if self.leases is not None and self.durable is not None and not self.durable.error:
            await self.leases.release()  # the runs left go to other engines at once

    async def _leave_shares(self) -> None:
        if self.shared is not None:
            await self.shared.leave()  # and its slots

    def _start_tracing(self) -> None:
        """Trace runs, tasks and calls when an OpenTelemetry SDK tracer is set (`Tracing`)."""
        tracer = find_tracer()
        if tracer is None:
            return
        runs = self._runs
        tracing = Tracing(tracer, lambda run: runs[run].workflow.name if run in runs else run)
        self._tracing = tracing
        self.bus.tracer = tracing.hear
        self.calls.tracing = tracing

    def _stop_tracing(self) -> None:
        if self._tracing is not None:
            self._tracing.close()
        self._tracing = None
        self.bus.tracer = None
        self.calls.tracing = None

    def _stop_calls(self) -> None:
        self.calls.stop()
        self.calls.memo = None

    def _stop_threads(self) -> None:
        if self._executor is not None:
            # A stuck sync function keeps its thread; the engine does not wait for it.
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def _abandon_runs(self) -> None:
        """Runs the loop could not wind down (the engine was cancelled from outside) end
        as cancelled, so nobody awaiting them waits forever."""
        for run in list(self._runs.values()):
            run.abandon("the engine stopped before the workflow finished")
        self._runs.clear()
        self._tenant_runs.clear()

    # --- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._inbox is not None
        inbox = self._inbox
        durable = self.durable
        while True:
            if durable is not None and durable.error is not None:
                self._stop_runs(durable.error)
            self._finish_settled()  # first: a finished run may free what others wait for
            self._admit()
            self.bus.flush()
            if self._closing and not self._runs:
                if durable is not None:
                    self.bus.recorder = None
                    await durable.close()
                return
            if durable is not None and durable.behind():
                await durable.catch_up()  # the store is behind: let it commit first
            item = await inbox.get()
            self._applying = True
            try:
                while True:
                    if isinstance(item, _Outcome):
                        self._apply(item)
                    else:
                        self._woken = False
                    if inbox.empty():
                        break
                    item = inbox.get_nowait()
            finally:
                self._applying = False

    def _admit(self) -> None:
        urgency = self.urgency
        if urgency.gate is not None:
            # every round, also with nothing waiting: it refits on time
            released = urgency.release(self.clock.monotonic())
            for shed in released.shed:
                self._shed(shed)
            for run in released.opened:
                self.admission.reopen(run)
        admission = self.admission
        if not admission.pending:
            return
        now = self.clock.monotonic()
        plan = urgency.decide(now)
        for notice in plan.hopeless:
            self._tell_hopeless(notice)
        caps = rich = None
        if urgency.holds_back:
            if plan.changed:
                admission.look_again()
            caps = functools.partial(urgency.caps, urgent=plan.urgent)
            rich = functools.partial(urgency.slack_rich, now=now)
        key = functools.partial(self._key, now=now)
        for run, item in admission.admit(key, caps, rich):
            if isinstance(item, Ticket):
                item.state = "running"
                if not item.future.done():
                    item.future.set_result(None)
            else:
                self._start(run, cast(TaskRun, item))

    def _shed(self, shed: Shed) -> None:
        """Cancel a run the controller gave up on, telling first that it is hopeless."""
        if shed.notice is not None:
            self._tell_hopeless(shed.notice)
        self.cancel_if_running(shed.run.id, shed.reason)

    def _tell_hopeless(self, notice: Hopeless) -> None:
        run = notice.run
        assert run.deadline is not None
        self.bus.emit(
            run.id,
            DeadlineHopeless(
                workflow=run.id, deadline=run.deadline, remaining=notice.needs_s, at=notice.at
            ),
        )

    def _key(self, run: Run, now: float) -> tuple[int, float, int]:
        return program_key(self.policy, run.view(now), now)

    def _static_key(self, run: Run) -> tuple[int, float, int] | None:
        if run.deadline is not None and not self.policy.static:
            return None  # `slack`: ranked anew each round (`Admission(moving=True)`)
        return program_key(self.policy, run.view(0.0), 0.0)

    def _held_back(self, run: Run, resource: str) -> bool:
        return self.calls.held_back(run, resource)

    def _start(self, run: Run, record: TaskRun) -> None:
        assert self._tg is not None
        run.begin(record)
        handle = self._tg.create_task(self._execute(run, record), name=f"{run.id}/{record.id}")
        handle.add_done_callback(functools.partial(self._report, run, record))
        record.handle = handle

    def _apply(self, outcome: _Outcome) -> None:
        run, record = outcome.run, outcome.task
        self.admission.release(record.resource, record)
        replayed = self.calls.take_replayed(run.id, record.id)
        if outcome.state == "done" and not replayed:
            # A task answered from a record took no time: it says nothing of its kind.
            kind = task_kind(run.priority_class, record.task.action.label)
            self.urgency.task_ended(kind, outcome.elapsed)
        if not outcome.llm_calls:
            task = record.task
            self.calls.task_ended(
                run.id, task.action.label, record.resource, outcome.elapsed, outcome.state == "done"
            )
        run.ended(
            record,
            outcome.state,
            result=outcome.result,
            error=outcome.error,
            usage=outcome.usage,
            llm_calls=outcome.llm_calls,
            elapsed=outcome.elapsed,
        )
        if self.durable is not None and outcome.state == "done":
            self.durable.ended(run, record, outcome.llm_calls)

    def _changed(self, run: Run) -> None:
        """A run tells the engine to look at it again (work became ready, or it ended)."""
        if run.complete:
            self._settled.append(run)
        if not self._applying:
            self.wake()

    def _finish_settled(self) -> None:
        while self._settled:
            settled, self._settled = self._settled, []
            for run in settled:
                # Once: a run may be told complete twice, and a durable one's `done` is set
                # only after its commit, so being in `_runs` is what says it is not finished.
                if run.complete and self._runs.get(run.id) is run:
                    self._finish(run)

    # --- running one task --------------------------------------------------------------------

    async def _execute(self, run: Run, task: TaskRun) -> _Outcome:
        """Run a task's attempts and say how it ended. Raises only when the engine itself
        is cancelled; `_report` turns that (and a cancel before the first step) into an
        outcome too, so every started task reports exactly once."""
        durable = self.durable
        if durable is not None:
            await durable.inputs_ready(run, task)
        started = self.clock.monotonic()
        inputs = run.inputs_of(task)
        declared = task.task.idempotency_key
        ctx = TaskContext(
            run.workflow,
            task.id,
            inputs,
            1,
            self.clock,
            calls=self.calls,
            caller=run,
            to_thread=self.to_thread,
        )
        state: TaskState = "done"
        result: Any = None
        error: BaseException | None = None
        try:
            if declared is not None:
                ctx.idempotency_key = task.task.key_for(inputs) or ""
            if declared is not None and durable is not None:
                result = await self._keyed(durable, run, task, ctx)
            else:
                result = await self._attempts(run, task, ctx)
            check_serializable(task.id, result)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                if task.cancel_reason is None:
                    raise  # the engine is shutting down
                current.uncancel()
                state = "cancelled"
            else:
                # Nobody cancelled this task: its own code let a CancelledError out (it
                # awaited something that was cancelled). That is its failure, not ours.
                error = TaskCancelledError(
                    task.id, "its code raised CancelledError without being cancelled"
                )
                state = "failed"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit from a tool's argparse is a failure too
            state, error = "failed", exc
        elapsed = self.clock.monotonic() - started
        return _Outcome(run, task, state, result, error, ctx.usage, ctx.llm_calls, elapsed)

    async def _keyed(self, durable: Durability, run: Run, record: TaskRun, ctx: TaskContext) -> Any:
        """A task with an idempotency key, in a durable engine: a result recorded under the
        key (before a crash) is its result; else it runs and its result is recorded."""
        found, result = await durable.memo.recall_result(run.id, ctx.idempotency_key)
        if found:
            self.calls.mark_replayed(run.id, record.id)
            return result
        result = await self._attempts(run, record, ctx)
        check_serializable(record.id, result)
        durable.memo.remember_result(run.id, ctx.idempotency_key, result)
        return result

    def _report(self, run: Run, task: TaskRun, handle: asyncio.Task[_Outcome]) -> None:
        assert self._inbox is not None
        if not handle.cancelled() and handle.exception() is None:
            self._inbox.put_nowait(handle.result())
            return
        # Cancelled before its first step, or the engine is shutting down.
        task.cancel_reason = task.cancel_reason or "the engine was closed"
        self._inbox.put_nowait(_Outcome(run, task, "cancelled", None, None, Usage(), 0, 0.0))

    async def _attempts(self, run: Run, record: TaskRun, ctx: TaskContext) -> Any:
        """The task's result after as many attempts as its `Retry` allows."""
        if record.task.retry.attempts == 1:
            return await self._attempt(record, ctx)
        return await self._with_retries(run, record, ctx)

    async def _attempt(self, record: TaskRun, ctx: TaskContext) -> Any:
        task = record.task
        if task.timeout is None:
            return await task.action.run(ctx)
        deadline = asyncio.timeout(task.timeout)
        try:
            async with deadline:
                return await task.action.run(ctx)
        except TimeoutError as exc:
            if deadline.expired():
                raise TaskTimeoutError(task.id, task.timeout) from exc
            raise

    async def _with_retries(self, run: Run, record: TaskRun, ctx: TaskContext) -> Any:
        spec = record.task.retry

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            delay = state.upcoming_sleep
            text = storable(f"{type(error).__name__}: {error}")
            run.retry_waits(record, state.attempt_number, text, delay)
            self.wake()

        retrying = AsyncRetrying(
            stop=stop_after_attempt(spec.attempts),
            wait=wait_exponential_jitter(
                multiplier=spec.initial_delay, max=spec.max_delay, jitter=spec.jitter
            ),
            retry=retry_if_exception(spec.should_retry),
            sleep=self.clock.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                number = attempt.retry_state.attempt_number
                if number > 1:
                    ctx.attempt = number
                    run.retry_starts(record, number)
                    self.wake()
                return await self._attempt(record, ctx)
        raise AssertionError("unreachable: tenacity reraises the last error")

    # --- services for running tasks (TaskContext) --------------------------------------------

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            raise UsageError("the engine is not running")
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def circuit(self, backend: str) -> CircuitBreaker | None:
        """The circuit breaker of backend `backend` (see `LLMCalls.circuit`)."""
        return self.calls.circuit(backend)

    # --- events ------------------------------------------------------------------------------

    def wake(self) -> None:
        """Make the loop look again (after a mutation or a note from a running task)."""
        if not self._woken and self._inbox is not None:
            self._woken = True
            self._inbox.put_nowait(_WAKE)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # --- public API --------------------------------------------------------------------------

    def submit(
        self,
        workflow: Workflow,
        *,
        deadline: float | None = None,
        priority: PriorityClass = "batch",
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        late: Late = "finish",
        _subscriber: asyncio.Queue[Event] | None = None,
    ) -> RunHandle:
        """Start running `workflow`; `deadline` is seconds from now. Returns at once.

        `late` says what happens to a run that misses its deadline: "finish" (the default)
        runs it to its end; "cancel" cancels it when the deadline passes, and sheds it at
        once (cancelled, with a `DeadlineHopeless` event first) when most recent runs of a
        workflow of the same name took longer than its deadline: under overload, work that
        will be late anyway gives way to work that can still be on time (docs/admission.md).

        `tenant` and `labels` go into the run's row in the store (`Store.workflows` filters
        by them) and stay with it when it is resumed."""
        if self._tg is None or self._closing:
            raise UsageError(
                "the engine is not running; use `async with Engine(...) as engine:` "
                "around engine.submit()/run()/iter(), or plait's run_sync() in a script"
            )
        if not isinstance(workflow, Workflow):
            raise UsageError(f"engine.submit() takes a Workflow, got {type(workflow).__name__}")
        if priority not in CLASS_RANK:
            raise UsageError(f"priority must be one of {', '.join(CLASS_RANK)}, got {priority!r}")
        check_seconds(f"workflow {workflow.name!r}", "deadline", deadline)
        if late not in ("finish", "cancel"):
            raise UsageError(f"late must be 'finish' or 'cancel', got {late!r}")
        labels = _checked_labels(labels)
        if tenant is not None and not isinstance(tenant, str):
            raise UsageError(f"tenant must be a str or None, got {type(tenant).__name__}")
        for what, text in (("tenant", tenant or ""), ("the workflow's name", workflow.name)):
            if (problem := text_problem(text)) is not None:
                raise UsageError(f"{what}: {problem}")
        self._check_accepting()
        if self.durable is not None:
            _check_recordable(workflow)
            # Ids name runs in the store for good: unique beyond this process's lifetime.
            workflow.id = new_workflow_id(workflow.name)
            while workflow.id in self._runs:  # the store refuses an id it holds; this too
                workflow.id = new_workflow_id(workflow.name)
        elif workflow.id in self._runs:
            workflow.id = f"{workflow.name}#{self._programs + 1}"
        handle = self._launch(
            workflow,
            priority=priority,
            deadline=deadline,
            tenant=tenant,
            labels=labels,
            subscriber=_subscriber,
        )
        if late == "cancel" and deadline is not None:
            self._shed_if_late(handle._run, deadline)
        return handle

    def _shed_if_late(self, run: Run, deadline: float) -> None:
        """A `late="cancel"` run: cancelled when its deadline passes, and at once if most
        recent runs of its workflow's name took longer than the whole deadline."""
        run.late = "cancel"
        shed = self.urgency.submitted_late_cancel(run, deadline, self.clock.monotonic())
        if shed is not None:
            self._shed(shed)

    def _check_accepting(self) -> None:
        if self.durable is not None and self.durable.error is not None:
            raise self.durable.error
        if len(self._runs) >= self.max_workflows:
            raise OverloadedError("the engine's set of running workflows", self.max_workflows)

    def _launch(
        self,
        workflow: Workflow,
        *,
        priority: PriorityClass,
        deadline: float | None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        subscriber: asyncio.Queue[Event] | None = None,
        plan: ResumePlan | None = None,
    ) -> RunHandle:
        """Start a run of `workflow` (new, or going on from `plan`'s log); `deadline` is
        seconds from now."""
        self._programs += 1
        program = self._programs
        now = self.clock.monotonic()
        assert self._services is not None
        run = Run(
            workflow,
            program,
            self._services,
            priority_class=priority,
            deadline=None if deadline is None else now + deadline,
            tenant=tenant,
            labels=labels,
        )
        workflow._attach(run, run.records)
        if subscriber is not None:
            self.bus.subscribe(run.id, subscriber)
        try:
            self._add_run(run)
            image: RunImage | None = None
            if plan is None:
                self.bus.emit(
                    run.id,
                    WorkflowStarted(
                        workflow=run.id,
                        program=program,
                        priority=priority,
                        deadline=run.deadline,
                        at=now,
                    ),
                )
            else:
                image = plan.image
                durable = self.durable
                assert durable is not None and image is not None
                durable.journal.start_at(run.id, plan.last_seq)
                durable.memo.resumed(run.id)
                self.bus.emit(
                    run.id,
                    WorkflowResumed(
                        workflow=run.id,
                        program=program,
                        deadline=run.deadline,
                        rerun=plan.rerun,
                        at=now,
                    ),
                )
            run.start(None if image is None else image.tasks)
            if image is not None and self._tracing is not None:
                self._tracing.adopt(run.id, _task_shapes(run))  # no task_added on resume
            if deadline is not None:  # _finish cancels it
                run.deadline_timer = asyncio.get_running_loop().call_later(
                    max(deadline, 0.0), self._deadline_passed, run
                )
        except BaseException:
            # Refused (an unknown resource, say): nothing ran, so the caller may fix the
            # workflow and submit it again; its half-told story leaves the event stream.
            self._drop_run(run)
            self._settled = [r for r in self._settled if r is not run]
            self.bus.drop(run.id)
            if self._tracing is not None:
                self._tracing.forget(run.id, "refused at submit")
            workflow._reset()
            if self.durable is not None:
                self.durable.forget(run)
                self.durable.journal.withdraw(run.id)
            raise
        self.wake()
        return RunHandle(self, run)

    # --- cluster -----------------------------------------------------------------------------

    async def _read_capacity(self) -> None:
        """Limits the servers tell (`derived_limits`): a server's KV cache sets the backend's
        hold-back budget and its sequence limit its `max_in_flight`, where the limits given
        leave them open. Before any call, so nothing admitted is counted twice."""
        self.capacities = await read_capacities(self.backends)
        for name, capacity in self.capacities.items():
            told = capacity if self.tuning.hold_back else replace(capacity, kv_tokens=None)
            limits = derived_limits(self._given_limits.get(name), told)
            if limits is None:
                continue
            self.admission.set_limits(name, limits)
            self.calls.set_budget(name, limits.kv_tokens)
            self._llm_limits[name] = limits.max_in_flight
            self.urgency.set_limit(name, limits.max_in_flight)

    def _set_share(self, backend: str, slots: int) -> None:
        if slots != self.admission.share(backend):
            self.admission.set_share(backend, slots)
            self.wake()  # more room: what waits may go now

    def _let_go(self, workflow: str) -> None:
        """Stop a run without writing anything more of it: another engine runs it now (or
        will: "*", every run, when this engine could not renew its leases in time)."""
        durable = self.durable
        assert durable is not None
        runs = list(self._runs.values()) if workflow == "*" else [self._runs.get(workflow)]
        for run in runs:
            if run is None:
                continue
            durable.journal.let_go(run.id)
            run.cancel(
                "this engine could not renew its lease" if workflow == "*"
                else "another engine runs this workflow now"
            )  # fmt: skip
        self.wake()

    async def _resume_claimed(self, workflows: Sequence[str]) -> list[str]:
        """Resume runs this engine claimed; return those it started."""
        if self._tg is None or self._closing:
            return []
        registry = None if self.cluster is None else self.cluster.registry
        report = await self.resume(registry, workflows=workflows)
        return [handle.id for handle in report.runs]

    # --- resume ------------------------------------------------------------------------------

    async def plan_resume(
        self,
        registry: Registry | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        workflows: Sequence[str] | None = None,
    ) -> list[ResumePlan]:
        """What `resume` would do, changing nothing: for each unfinished run in the store,
        the tasks that would run again, those that keep their results, the LLM tasks to
        pay for at most, and why a run cannot be rebuilt or waits for a decision."""
        store = self._store_for("plan_resume")
        return await plan_resume(
            store, registry or Registry(), decisions=decisions, workflows=workflows
        )

    async def resume(
        self,
        registry: Registry | None = None,
        *,
        decisions: Mapping[str, Decision] | None = None,
        workflows: Sequence[str] | None = None,
    ) -> ResumeReport:
        """Go on with every unfinished run in the store (or those named in `workflows`).

        Each is rebuilt from its log, including tasks added while it ran: tasks that had
        finished keep their results, the others run (again), and an LLM call whose result
        was recorded before the crash is answered from the store instead of being sent.
        `registry` finds the code the log names (agents, tools, functions; see `Registry`).
        A task declared `idempotent=False` that was running at the crash holds its run back
        until `decisions` says, for "workflow id/task id" (or the workflow id), "rerun" or
        "fail". Runs that cannot be rebuilt are left as they are and reported."""
        self._store_for("resume")
        if self._tg is None or self._closing:
            raise UsageError("the engine is not running; resume() inside `async with Engine(...)`")
        decided = dict(decisions or {})
        plans = await self.plan_resume(registry, decisions=decided, workflows=workflows)
        runs: list[RunHandle] = []
        resumed: list[ResumePlan] = []
        for plan in plans:
            if not plan.resumable or plan.needs_decision:
                resumed.append(plan)
                continue
            if plan.workflow in self._runs:
                resumed.append(replace(plan, error="it is running in this engine already"))
                continue
            self._check_accepting()
            try:
                handle = self._start_resumed(plan, decided)
            except PlaitError as exc:
                resumed.append(replace(plan, error=str(exc)))
                continue
            runs.append(handle)
            resumed.append(plan)
        return ResumeReport(runs, resumed)

    def _start_resumed(self, plan: ResumePlan, decisions: Mapping[str, Decision]) -> RunHandle:
        workflow, row = plan.workflow_object, plan.row
        assert workflow is not None and row is not None
        deadline = None if row.deadline is None else row.deadline - self.clock.now()
        priority = row.priority if row.priority in CLASS_RANK else "batch"
        handle = self._launch(
            workflow,
            priority=cast(PriorityClass, priority),
            deadline=deadline,
            tenant=row.tenant,
            labels=row.labels,
            plan=plan,
        )
        run = self._runs[handle.id]
        for task_id in plan.rerun:
            if decision_for(decisions, plan.workflow, task_id) == "fail":
                run.give_up(
                    run.records[task_id],
                    UsageError(
                        "not run again: it is not idempotent and was running when its "
                        "process stopped (decided at resume)"
                    ),
                )
        return handle

    def _store_for(self, what: str) -> Store:
        if self.store is None:
            raise UsageError(
                f"engine.{what}() needs a store: Engine(store=SQLStore(...)) records runs "
                "so that they can be resumed"
            )
        return self.store

    async def run(
        self,
        workflow: Workflow,
        *,
        deadline: float | None = None,
        priority: PriorityClass = "batch",
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        late: Late = "finish",
    ) -> RunResult:
        """Run `workflow` to its end and return how it went (see `RunResult.raise_for_status`;
        `late` as for `submit`)."""
        handle = self.submit(
            workflow, deadline=deadline, priority=priority, tenant=tenant, labels=labels,
            late=late,
        )  # fmt: skip
        return await handle.result()

    async def iter(
        self,
        *workflows: Workflow,
        deadline: float | None = None,
        priority: PriorityClass = "batch",
    ) -> AsyncIterator[Event]:
        """Run `workflows` and yield their events as they happen, until all have finished."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for workflow in workflows:
            self.submit(workflow, deadline=deadline, priority=priority, _subscriber=queue)
        remaining = len(workflows)
        while remaining:
            event = await queue.get()
            if event.kind == "workflow_finished":
                remaining -= 1
            yield event

    async def events(self) -> AsyncIterator[Event]:
        """Every event of every workflow from now on (until the consumer stops)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self.bus.listen(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self.bus.unlisten(queue)

    def cancel_if_running(self, run_id: str, reason: str) -> bool:
        """Cancel `run_id` if it runs in this engine; False if it does not (another engine
        runs it, or it has ended). Never raises: for cancels asked from elsewhere, which may
        meet the run as it ends."""
        run = self._runs.get(run_id)
        if run is None:
            return False
        run.cancel(reason)  # (nothing if it is complete or cancelling already)
        self.wake()
        return True

    def cancel(self, workflow: Workflow | str, reason: str = "cancelled by the caller") -> None:
        """Cancel a running workflow: its running tasks are cancelled, the rest never start."""
        run = self._find(workflow)
        run.cancel(reason)
        self.wake()

    def cancel_task(
        self, workflow: Workflow | str, task_id: str, reason: str = "cancelled by the caller"
    ) -> None:
        """Cancel one task; its dependents are skipped, the rest of the workflow goes on."""
        run = self._find(workflow)
        run.workflow.task(task_id)  # UnknownTaskError if it has no such task
        run.cancel_task(run.records[task_id], reason)
        self.wake()

    def handle(self, run_id: str) -> RunHandle | None:
        """The run of this id while it runs in this engine, else None."""
        run = self._runs.get(run_id)
        return None if run is None else RunHandle(self, run)

    def running(self, tenant: str | None = None) -> int:
        """How many runs (of `tenant`, when given) this engine is running."""
        if tenant is None:
            return len(self._runs)
        return self._tenant_runs[tenant]

    def _add_run(self, run: Run) -> None:
        self._runs[run.id] = run
        self._tenant_runs[run.tenant] += 1
        if self.urgency.arrived(run, self.clock.monotonic()):
            self.admission.look_again()  # urgent work may have arrived: caps may change

    def _drop_run(self, run: Run) -> None:
        watched = self.urgency.left(run, self.clock.monotonic())
        if self._runs.get(run.id) is run:
            del self._runs[run.id]
            self._tenant_runs[run.tenant] -= 1
        if watched:
            self.admission.look_again()

    def _find(self, workflow: Workflow | str) -> Run:
        key = workflow.id if isinstance(workflow, Workflow) else workflow
        run = self._runs.get(key)
        if run is None or run.complete:  # complete: finished when the loop next turns
            raise WorkflowStateError(f"no running workflow {key!r}; it may have finished already")
        return run

    def _deadline_passed(self, run: Run) -> None:
        run.deadline_timer = None
        if not run.done.done() and run.deadline is not None:
            self.bus.emit(
                run.id,
                DeadlineMissed(workflow=run.id, deadline=run.deadline, at=self.clock.monotonic()),
            )
            if run.late == "cancel" and not run.complete:
                run.cancel("deadline passed")
            self.wake()  # listeners hear it now, not with the next outcome

    def _finish(self, run: Run) -> None:
        """The run's last task is final: tell everyone, and let go of the workflow. A
        durable run's result is handed back once its last event is committed."""
        result = run.result(hopeless_at=self.urgency.hopeless_at(run))
        self.urgency.run_ended(
            run, result.finished_at - result.started_at, result.ok, self.clock.monotonic()
        )
        if run.deadline_timer is not None:
            run.deadline_timer.cancel()
            run.deadline_timer = None
        self.bus.emit(run.id, run.finished_event(result))
        self._drop_run(run)
        self._finished += 1
        self.admission.forget(run)
        self.calls.program_done(run.id)
        run.workflow._detach()
        if self.durable is None:
            run.done.set_result(result)
        else:
            self.durable.forget(run)
            assert self._group is not None
            hand_back = self.durable.hand_back(run, result)
            self._group.create_task(hand_back, name=f"plait-durable/{run.id}")

    # --- durability ----------------------------------------------------------------------------

    def _stop_runs(self, error: StoreError) -> None:
        """The store failed: no run can be made durable any more. Each one stops (its
        running tasks are cancelled) and whoever awaits it gets the `StoreError`; what was
        committed stays, so the runs can be resumed once the store is writable again."""
        for run in list(self._runs.values()):
            run.cancel(f"the store failed: {error}")
            if self._tracing is not None:
                self._tracing.forget(run.id, "the store failed")
            run.workflow._detach()
            self._drop_run(run)
            if not run.done.done():
                fail(run.done, error)
            self.admission.forget(run)

    def stats(self) -> EngineStats:
        return EngineStats(
            len(self._runs),
            self._finished,
            tuple(self.admission.stats()),
            self.urgency.knee_stats(),
            self.urgency.gate_stats(),
            tuple(self.urgency.reserve_caps.items()),
        )


@contextlib.asynccontextmanager
async def _from_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | Config,
    *,
    store: str | Store | None,
    clock: Clock | None,
) -> AsyncIterator[Engine]:
    """`Engine.from_config`: the config's backends opened, the store opened, the engine
    running; all closed again, in reverse order, when the block ends."""
    config = source if isinstance(source, Config) else load_config(source)
    if clock is None and config.engine.clock == "virtual":
        raise UsageError(
            f'{config.source}: [engine] clock = "virtual" needs a clock that drives the '
            "program: pass Engine.from_config(..., clock=clock) with clock = VirtualClock(), "
            "and run the program with clock.run(main())"
        )
    backends = config.build_backends(clock)
    async with contextlib.AsyncExitStack() as stack:
        await open_backends(stack, backends)
        opened = (
            await stack.enter_async_context(open_store(store)) if isinstance(store, str) else store
        )
        engine = Engine(
            backends=backends,
            admission=config.engine.admission,
            clock=clock,
            limits=config.limits,
            store=opened,
        )
        async with engine:
            yield engine


def new_workflow_id(name: str) -> str:
    """A run's id in a store: its workflow's name and 96 random bits, so that ids do not
    collide among the billions of runs a store may see (a store refuses a new run whose id
    it holds already, `WorkflowExistsError`)."""
    return f"{name}-{secrets.token_hex(12)}"


def _check_recordable(workflow: Workflow) -> None:
    """Refuse a workflow whose tasks the log cannot record exactly, before anything of it is
    recorded: a run is stored whole or not at all."""
    for task in workflow:
        problem = recording_problem(task)
        if problem is not None:
            raise UsageError(f"workflow {key_text(workflow.name)!r}, {problem}")


def _checked_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise UsageError(f"labels must be a mapping of str to str, got {type(labels).__name__}")
    bad = [k for k, v in labels.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        raise UsageError(f"labels must map str to str; {bad[0]!r} does not")
    found = first_unstorable(dict(labels), "labels")
    if found is not None:
        raise UsageError(f"{found[0]}: {found[1]}")
    return dict(labels)


def _task_shapes(run: Run) -> dict[str, tuple[list[str], ActionSpec, str]]:
    """What tracing needs of a run's tasks: by id, what each waits for, its action's spec
    and its resource (a resumed run's, which no `task_added` told)."""
    graph = run.workflow.graph
    return {
        task_id: (list(graph.predecessors(task_id)), describe(record.task.action), record.resource)
        for task_id, record in run.records.items()
    }
