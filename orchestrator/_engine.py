"""The engine: one loop that runs every workflow, program first.

    admit ready tasks in policy order -> start them -> await the next outcome -> apply it
    -> emit its events

Everything else is a named call out of that loop. Task bodies run as asyncio tasks in the
engine's TaskGroup and report back through the inbox; they never touch run state directly
except through the workflow's validated mutations.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from ._admission import DEFAULT_LIMITS, Admission, Limits, ResourceStats, Ticket
from ._clock import Clock, SystemClock, VirtualClock, running_clock
from ._context import TaskContext
from ._errors import (
    OverloadedError,
    TaskCancelledError,
    TaskTimeoutError,
    UsageError,
    WorkflowStateError,
)
from ._events import DeadlineMissed, Event, TaskRetrying, TaskStarted, WorkflowStarted
from ._keepalive import DEFAULT_KEEP_ALIVE, CacheBudget, KeepAlive, PausePredictor
from ._llm import FailureIsolating, Hints, LLMBackend, LLMRequest, Usage, WallClockBackend
from ._resilience import (
    DEFAULT_BREAKER,
    DEFAULT_CALL_RETRY,
    Breaker,
    CallRetry,
    CircuitBreaker,
)
from ._run import Run, RunResult
from ._scheduler import CLASS_RANK, Policy, PriorityClass, get_policy, program_key, urgency
from ._task import LLMCall, Task, check_seconds, check_serializable
from ._workflow import Workflow


class _Outcome:
    """How one task ended, sent from its asyncio task to the loop. (A plain slotted class:
    a frozen dataclass costs microseconds more per task to build.)"""

    __slots__ = ("elapsed", "error", "llm_calls", "result", "run", "state", "task", "usage")

    def __init__(
        self,
        run: Run,
        task: Task,
        state: Literal["done", "failed", "cancelled"],
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

    async def result(self) -> RunResult:
        return await asyncio.shield(self._run.done)

    def __await__(self) -> Generator[Any, None, RunResult]:
        return self.result().__await__()

    def cancel(self, reason: str = "cancelled by the caller") -> None:
        self._engine.cancel(self._run.id, reason)


class Engine:
    """Runs many workflows at once on one asyncio loop. Use it as an async context manager:

    async with Engine(backends={"default": llm}) as engine:
        result = await engine.run(workflow)

    `call_retry` says how often one LLM call is sent before its task sees the error
    (`CallRetry`); `breaker` says when a failing backend's circuit opens (`Breaker`; None
    turns circuit breakers off).
    """

    def __init__(
        self,
        *,
        backends: Mapping[str, LLMBackend] | None = None,
        policy: str | Policy = "fcfs",
        clock: Clock | None = None,
        limits: Mapping[str, Limits] | None = None,
        max_workflows: int = 10_000,
        default_estimate: float = 1.0,
        threads: int = 64,
        keep_alive: KeepAlive | None = DEFAULT_KEEP_ALIVE,
        call_retry: CallRetry = DEFAULT_CALL_RETRY,
        breaker: Breaker | None = DEFAULT_BREAKER,
    ) -> None:
        self.backends: dict[str, LLMBackend] = dict(backends or {})
        # Keep-alive hints go to LLM backends: without one, nothing to learn pauses for.
        self.pauses = PausePredictor(keep_alive) if keep_alive and self.backends else None
        self.policy = get_policy(policy)
        self._clock = clock
        merged = dict(DEFAULT_LIMITS)
        for name in self.backends:
            merged.setdefault(name, Limits())
        merged.update(limits or {})
        static = self._static_key if self.policy.static else None
        self.admission = Admission(merged, static_key=static, held=self._held_back)
        self._budgets = {
            name: CacheBudget(lim.kv_tokens)
            for name, lim in merged.items()
            if lim.kv_tokens is not None
        }
        self.max_workflows = max_workflows
        self.default_estimate = default_estimate
        if threads < 1:
            raise UsageError(f"Engine(threads={threads}) must be at least 1")
        self.threads = threads
        self.call_retry = call_retry
        self.breaker = breaker
        self._circuits: dict[str, CircuitBreaker] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._runs: dict[str, Run] = {}
        self._programs = 0
        self._seq = 0
        self._finished = 0
        self._events: list[tuple[Run, Event]] = []
        self._listeners: list[asyncio.Queue[Event]] = []
        self._inbox: asyncio.Queue[_Outcome | _Wake] | None = None
        self._woken = False
        self._tg: asyncio.TaskGroup | None = None
        self._closing = False

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
        if isinstance(self._clock, VirtualClock):
            _refuse_wall_clock_backends(self.backends)
        self._inbox = asyncio.Queue()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="plait-task"
        )
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._tg.create_task(self._loop(), name="plait-engine")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
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
            self._abandon_runs()
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

    # --- the loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._inbox is not None
        inbox = self._inbox
        while True:
            self._admit()
            self._flush()
            if self._closing and not self._runs:
                return
            item = await inbox.get()
            while True:
                if isinstance(item, _Outcome):
                    self._apply(item)
                else:
                    self._woken = False
                if inbox.empty():
                    break
                item = inbox.get_nowait()

    def _admit(self) -> None:
        now = self.clock.monotonic()
        policy = self.policy
        for run, item in self.admission.admit(lambda run: program_key(policy, run.view(now), now)):
            if isinstance(item, Ticket):
                item.state = "running"
                if not item.future.done():
                    item.future.set_result(None)
            else:
                self._start(run, item)

    def _static_key(self, run: Run) -> tuple[int, float, int]:
        return program_key(self.policy, run.view(0.0), 0.0)

    def _start(self, run: Run, task: Task) -> None:
        assert self._tg is not None
        task.state = "running"
        task.attempts = 1
        task.started_at = self.clock.monotonic()
        run.running += 1
        if run.observed:
            run.emit(TaskStarted(workflow=run.id, task=task.id, attempt=1, at=task.started_at))
        handle = self._tg.create_task(self._execute(run, task), name=f"{run.id}/{task.id}")
        handle.add_done_callback(functools.partial(self._report, run, task))
        task.handle = handle

    def _apply(self, outcome: _Outcome) -> None:
        run, task = outcome.run, outcome.task
        self.admission.release(task.resource)
        task.handle = None
        run.running -= 1
        run.record(outcome.elapsed, outcome.llm_calls, outcome.usage)
        if not outcome.llm_calls:
            if self.pauses is not None and outcome.state == "done":
                self.pauses.observe(task.action.label, outcome.elapsed)  # a tool's pause
            if self._budgets and task.resource in self._budgets:
                self._budgets[task.resource].unreserve(run.id)  # let in, made no call
        if task.state in ("running", "waiting"):
            if outcome.state == "cancelled":
                reason = task.cancel_reason or run.cancelling or "cancelled"
                run.finalize(task, "cancelled", reason=reason)
            else:
                run.finalize(
                    task,
                    outcome.state,
                    result=outcome.result,
                    error=outcome.error,
                    usage=outcome.usage if outcome.llm_calls else None,
                    llm_calls=outcome.llm_calls,
                )
        run._maybe_finish()

    # --- running one task --------------------------------------------------------------------

    async def _execute(self, run: Run, task: Task) -> _Outcome:
        """Run a task's attempts and say how it ended. Raises only when the engine itself
        is cancelled; `_report` turns that (and a cancel before the first step) into an
        outcome too, so every started task reports exactly once."""
        started = self.clock.monotonic()
        ctx = TaskContext(run.workflow, task.id, run.inputs_of(task), 1, self.clock, run)
        state: Literal["done", "failed", "cancelled"] = "done"
        result: Any = None
        error: BaseException | None = None
        try:
            if task.retry.attempts == 1:
                result = await self._attempt(task, ctx)
            else:
                result = await self._with_retries(run, task, ctx)
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

    def _report(self, run: Run, task: Task, handle: asyncio.Task[_Outcome]) -> None:
        assert self._inbox is not None
        if not handle.cancelled() and handle.exception() is None:
            self._inbox.put_nowait(handle.result())
            return
        # Cancelled before its first step, or the engine is shutting down.
        task.cancel_reason = task.cancel_reason or "the engine was closed"
        self._inbox.put_nowait(_Outcome(run, task, "cancelled", None, None, Usage(), 0, 0.0))

    async def _attempt(self, task: Task, ctx: TaskContext) -> Any:
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

    async def _with_retries(self, run: Run, task: Task, ctx: TaskContext) -> Any:
        spec = task.retry

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            delay = state.upcoming_sleep
            task.state = "waiting"
            run.emit(
                TaskRetrying(
                    workflow=run.id,
                    task=task.id,
                    attempt=state.attempt_number,
                    error=f"{type(error).__name__}: {error}",
                    delay=delay,
                    at=self.clock.monotonic(),
                )
            )
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
                    task.state = "running"
                    task.attempts = number
                    ctx.attempt = number
                    run.emit(
                        TaskStarted(
                            workflow=run.id, task=task.id, attempt=number, at=self.clock.monotonic()
                        )
                    )
                    self.wake()
                return await self._attempt(task, ctx)
        raise AssertionError("unreachable: tenacity reraises the last error")

    # --- services for running tasks (TaskContext) --------------------------------------------

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            raise UsageError("the engine is not running")
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    @contextlib.asynccontextmanager
    async def slot(self, run: Run, resource: str) -> AsyncIterator[None]:
        """Hold one in-flight place of `resource`, waiting for it in the scheduler's order."""
        ticket = Ticket(resource, self.next_seq(), asyncio.get_running_loop().create_future())
        self.admission.push(run, ticket)  # OverloadedError if its queue is full
        self.wake()
        try:
            await ticket.future
        except asyncio.CancelledError:
            if ticket.state == "ready":
                self.admission.discard(ticket)
            elif ticket.state == "running":
                self.admission.release(resource)
                self.wake()
            ticket.state = "cancelled"
            raise
        try:
            yield
        finally:
            ticket.state = "done"
            self.admission.release(resource)
            self.wake()

    # --- the LLM call path (TaskContext.complete) --------------------------------------------

    def hints_for(self, run: Run, **fields: Any) -> Hints:
        now = self.clock.monotonic()
        view = run.view(now)
        return Hints(
            program_id=run.id,
            urgency=urgency(self.policy, view, now),
            priority_class=run.priority_class,
            deadline_s=None if run.deadline is None else run.deadline - now,
            **fields,
        )

    def keep_alive_for(self, run: Run, task_id: str, request: LLMRequest) -> float | None:
        """The pause expected after this call: that of the tools the task's dependents run,
        else of the tools the request offers the model (an agent loop inside one task)."""
        if self.pauses is None:
            return None
        wf = run.workflow
        tools = [
            wf._tasks[d].action.label
            for d in wf.dependents(task_id)
            if wf._tasks[d].resource not in self.backends
        ]
        if not tools:
            tools = [f"tool {t.name}" for t in request.tools]
        return self.pauses.predict(tools)

    def _held_back(self, run: Run, resource: str) -> bool:
        return self._budgets[resource].holds_back(run.id, self.clock.monotonic())

    def call_started(self, run: Run, backend: str, context: int) -> None:
        """A call of `run` with a `context`-token prompt is going to `backend` (hold-back)."""
        budget = self._budgets.get(backend)
        if budget is not None:
            budget.start(run.id, context)

    def call_ended(self, run: Run, backend: str, context: int, held: int, keep_s: float) -> None:
        """That call is over; `held` tokens stay in the server's cache for `keep_s`."""
        budget = self._budgets.get(backend)
        if budget is None:
            return
        budget.end(run.id, context, held, keep_s, self.clock.monotonic())
        self.admission.look_again()
        self.wake()
        if keep_s > 0:  # then the budget frees: look again (a little late, never early)
            asyncio.get_running_loop().call_later(keep_s * 1.0001 + 1e-6, self._cache_expired)

    def _cache_expired(self) -> None:
        self.admission.look_again()
        self.wake()

    def is_last_call(self, run: Run, task_id: str) -> bool:
        """A one-call LLM task with nothing left after it in its run: the program's last call."""
        task = run.workflow._tasks.get(task_id)
        return (
            task is not None
            and isinstance(task.action, LLMCall)
            and run.unfinished == 1
            and not run.workflow.dependents(task_id)
        )

    def circuit(self, backend: str) -> CircuitBreaker | None:
        """The circuit breaker of backend `backend`: None if `Engine(breaker=None)`, or if
        the backend isolates failures itself (`isolates_failures`: a router over replicas
        ejects the failing one; one breaker over all of them would stop the healthy too)."""
        wrapped = self.backends.get(backend)
        if self.breaker is None or (
            isinstance(wrapped, FailureIsolating) and wrapped.isolates_failures()
        ):
            return None
        circuit = self._circuits.get(backend)
        if circuit is None:
            circuit = CircuitBreaker(self.breaker.failures, self.breaker.cooldown_s)
            self._circuits[backend] = circuit
        return circuit

    def backend(self, name: str) -> LLMBackend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends)) or "none"
            raise UsageError(
                f"no LLM backend named {name!r} (known: {known}); with plait run, add a "
                f"[backends.{name}] table to the config file or return it from the module's "
                "backends(clock); in Python, pass it to Engine(backends={...})"
            ) from None

    # --- events ------------------------------------------------------------------------------

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def emit(self, run: Run, event: Event) -> None:
        self._events.append((run, event))

    def _flush(self) -> None:
        if not self._events:
            return
        events, self._events = self._events, []
        listeners = self._listeners
        for run, event in events:
            for queue in run.subscribers:
                queue.put_nowait(event)
            for queue in listeners:
                queue.put_nowait(event)

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
        _subscriber: asyncio.Queue[Event] | None = None,
    ) -> RunHandle:
        """Start running `workflow`; `deadline` is seconds from now. Returns at once."""
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
        if len(self._runs) >= self.max_workflows:
            raise OverloadedError("the engine's set of running workflows", self.max_workflows)
        self._programs += 1
        program = self._programs
        if workflow.id in self._runs:
            workflow.id = f"{workflow.name}#{program}"
        now = self.clock.monotonic()
        run = Run(
            self,
            workflow,
            program,
            priority_class=priority,
            deadline=None if deadline is None else now + deadline,
            subscribers=[_subscriber] if _subscriber is not None else [],
        )
        workflow._attach(run)
        try:
            self.emit(
                run,
                WorkflowStarted(
                    workflow=run.id,
                    program=program,
                    priority=priority,
                    deadline=run.deadline,
                    at=now,
                ),
            )
            self._runs[run.id] = run
            run.start()
            if deadline is not None and not run.done.done():
                run.deadline_timer = asyncio.get_running_loop().call_later(
                    deadline, self._deadline_passed, run
                )
        except BaseException:
            # Refused (an unknown resource, say): nothing ran, so the caller may fix the
            # workflow and submit it again; its half-told story leaves the event stream.
            self._runs.pop(run.id, None)
            self._events = [(r, e) for r, e in self._events if r is not run]
            workflow._reset()
            raise
        self.wake()
        return RunHandle(self, run)

    async def run(
        self,
        workflow: Workflow,
        *,
        deadline: float | None = None,
        priority: PriorityClass = "batch",
    ) -> RunResult:
        """Run `workflow` to its end and return how it went (see `RunResult.raise_for_status`)."""
        return await self.submit(workflow, deadline=deadline, priority=priority).result()

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
        self._listeners.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.remove(queue)

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
        run.cancel_task(run.workflow.task(task_id), reason)
        self.wake()

    def _find(self, workflow: Workflow | str) -> Run:
        key = workflow.id if isinstance(workflow, Workflow) else workflow
        try:
            return self._runs[key]
        except KeyError:
            raise WorkflowStateError(
                f"no running workflow {key!r}; it may have finished already"
            ) from None

    def _deadline_passed(self, run: Run) -> None:
        run.deadline_timer = None
        if not run.done.done() and run.deadline is not None:
            self.emit(
                run,
                DeadlineMissed(workflow=run.id, deadline=run.deadline, at=self.clock.monotonic()),
            )
            self.wake()  # listeners hear it now, not with the next outcome

    def finish(self, run: Run, result: RunResult) -> None:
        """Called by a run when its last task is final."""
        if run.deadline_timer is not None:
            run.deadline_timer.cancel()
            run.deadline_timer = None
        self.emit(run, run.finished_event(result))
        self._runs.pop(run.id, None)
        self._finished += 1
        self.admission.forget(run)
        for budget in self._budgets.values():
            budget.drop(run.id)
        if self._budgets:
            self.admission.look_again()
        self._tell_backends_done(run.id)
        run.workflow._detach()
        run.done.set_result(result)

    def _tell_backends_done(self, program_id: str) -> None:
        """Backends that keep something per program (an SGLang session) hear that it ended,
        whether or not its last call said so; best effort, in the background."""
        if self._tg is None or self._closing:
            return
        for backend in self.backends.values():
            note = getattr(backend, "program_done", None)
            if note is not None:
                self._tg.create_task(_quietly(note(program_id)))

    def stats(self) -> EngineStats:
        return EngineStats(len(self._runs), self._finished, tuple(self.admission.stats()))


async def _quietly(note: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):  # a courtesy to the server: nothing depends on it
        await note


def _refuse_wall_clock_backends(backends: Mapping[str, LLMBackend]) -> None:
    """A virtual clock jumps to the next timer whenever every task waits, so it would jump
    over a socket's wait straight to the call's timeout: refuse before the first call."""
    for name, backend in backends.items():
        if isinstance(backend, WallClockBackend) and backend.needs_wall_clock():
            raise UsageError(
                f"backend {name!r} ({type(backend).__name__}) talks to a server over the "
                "network and needs the system clock, but the engine runs on a VirtualClock "
                "(virtual time would jump over the wait to the call's timeout); use "
                'clock=SystemClock() in Python, or clock = "system" / --clock system with plait run'
            )
