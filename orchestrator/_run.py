"""The state of one running workflow (one *program*): readiness, outcomes and its result.

All of it runs on the engine's loop thread: the engine applies task outcomes here, and the
workflow reports its mutations here (`_Hooks`), whoever makes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ._errors import (
    BackendError,
    CircuitOpenError,
    OverloadedError,
    UnknownResourceError,
    WorkflowFailedError,
    error_text,
)
from ._events import (
    FINAL_STATES,
    CallRetrying,
    EdgeAdded,
    EdgeRemoved,
    Event,
    TaskAdded,
    TaskCancelled,
    TaskFailed,
    TaskReady,
    TaskRemoved,
    TaskReplaced,
    TaskSkipped,
    TaskSucceeded,
    WorkflowFinished,
    WorkflowStatus,
)
from ._llm import LLMRequest, LLMResponse, Usage
from ._resilience import call_with_retries
from ._scheduler import PriorityClass, ProgramView, remaining_critical_path
from ._task import Task
from ._workflow import Workflow

if TYPE_CHECKING:
    from ._context import TaskContext
    from ._engine import Engine


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a workflow run ended: results of the tasks that succeeded and why others did not."""

    workflow: str
    status: WorkflowStatus
    results: Mapping[str, Any]
    failures: Mapping[str, str] = field(default_factory=dict)
    errors: Mapping[str, BaseException] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    cancelled: Mapping[str, str] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    llm_calls: int = 0
    usage: Usage = Usage()
    deadline: float | None = None
    """When the run had to be done, on the engine's clock (as started_at); None: no deadline."""

    @property
    def duration(self) -> float:
        return self.finished_at - self.started_at

    @property
    def deadline_met(self) -> bool | None:
        """Whether the run finished by its deadline; None when it had none."""
        return None if self.deadline is None else self.finished_at <= self.deadline

    @property
    def slack(self) -> float | None:
        """Seconds to spare at the deadline; negative: how late the run finished."""
        return None if self.deadline is None else self.deadline - self.finished_at

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def __getitem__(self, task_id: str) -> Any:
        try:
            return self.results[task_id]
        except KeyError:
            why = (
                self.failures.get(task_id)
                or self.skipped.get(task_id)
                or self.cancelled.get(task_id)
            )
            detail = f": {why}" if why else " (no such task)"
            raise KeyError(f"task {task_id!r} of {self.workflow!r} has no result{detail}") from None

    def raise_for_status(self) -> RunResult:
        """Return self if the run succeeded, else raise `WorkflowFailedError` listing failures."""
        if self.status != "succeeded":
            failures = dict(self.failures) or dict(self.cancelled)
            raise WorkflowFailedError(self.workflow, self.status, failures)
        return self


T = TypeVar("T")

_VERBS = {"failed": "failed", "skipped": "was skipped", "cancelled": "was cancelled"}


class Run:
    """One workflow's run state; implements the workflow's mutation hooks."""

    def __init__(
        self,
        engine: Engine,
        workflow: Workflow,
        program: int,
        *,
        priority_class: PriorityClass,
        deadline: float | None,
        subscribers: list[asyncio.Queue[Event]],
    ) -> None:
        self.engine = engine
        self.workflow = workflow
        self.id = workflow.id
        self.program = program
        self.priority_class: PriorityClass = priority_class
        self.deadline = deadline
        self.subscribers = subscribers
        self.attained = 0.0
        self.started_at = engine.clock.monotonic()
        self.unfinished = 0
        self.running = 0
        self.cancelling: str | None = None
        self.failures: dict[str, BaseException] = {}
        self.llm_calls = 0
        self.usage = Usage()
        self.done: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._remaining: float | None = None
        self.deadline_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"Run({self.id!r}, program={self.program})"

    # --- scheduling ------------------------------------------------------------------------

    def view(self, now: float) -> ProgramView:
        remaining = 0.0
        if self.engine.policy.needs_remaining and self.deadline is not None:
            if self._remaining is None:
                default = self.engine.default_estimate
                unfinished = {
                    t.id: (t.estimate if t.estimate is not None else default)
                    for t in self.workflow
                    if t.state not in FINAL_STATES
                }
                self._remaining = remaining_critical_path(self.workflow.graph, unfinished)
            remaining = self._remaining
        return ProgramView(
            self.program, self.priority_class, self.attained, self.deadline, remaining
        )

    # --- start and readiness ---------------------------------------------------------------

    def start(self) -> None:
        graph = self.workflow.graph
        for task in self.workflow:
            self.validate(task)
        now = self.engine.clock.monotonic()
        observed = self.observed
        for task in self.workflow:
            task.waiting_on = graph.in_degree(task.id)
            if observed:
                after = tuple(graph.predecessors(task.id))
                label = task.action.label
                self.emit(
                    TaskAdded(workflow=self.id, task=task.id, action=label, after=after, at=now)
                )
        self.unfinished = len(self.workflow)
        for task in list(self.workflow):
            if task.waiting_on == 0 and task.state == "pending":
                self._decide(task)
        self._maybe_finish()

    def validate(self, task: Task) -> None:
        """Refuse a task on a resource the engine does not know (before it joins)."""
        if not self.engine.admission.knows(task.resource):
            raise UnknownResourceError(task.id, task.resource, self.engine.admission.names)

    def inputs_of(self, task: Task) -> dict[str, Any]:
        tasks = self.workflow._tasks
        inputs = {}
        for dep in self.workflow.graph.predecessors(task.id):
            t = tasks[dep]
            if t.state == "done":
                inputs[dep] = t.result
        return inputs

    def _decide(self, task: Task) -> None:
        """All inputs of `task` are final: make it ready, or skip, cancel or fail it."""
        verdict = self._verdict(task)
        if verdict is not None:
            state, error, reason = verdict
            self.finalize(task, state, error=error, reason=reason)

    def _verdict(self, task: Task) -> tuple[str, BaseException | None, str | None] | None:
        """Queue `task` and return None, or say which final state it takes instead."""
        if self.cancelling is not None:
            return "cancelled", None, self.cancelling
        tasks = self.workflow._tasks
        if task.trigger == "all_success":
            for dep in self.workflow.graph.predecessors(task.id):
                state = tasks[dep].state
                if state != "done":
                    verb = _VERBS.get(state, f"is {state}")
                    return "skipped", None, f"dependency {dep!r} {verb}"
        if task.when is not None:
            try:
                go = task.when(self.inputs_of(task))
            except Exception as exc:
                return "failed", exc, None
            if not go:
                return "skipped", None, "its condition was false"
        engine = self.engine
        task.state = "ready"
        task.ready_seq = engine.next_seq()
        try:
            engine.admission.push(self, task)
        except OverloadedError as exc:
            task.state = "pending"
            return "failed", exc, None
        if self.observed:
            now = engine.clock.monotonic()
            self.emit(TaskReady(workflow=self.id, task=task.id, resource=task.resource, at=now))
        return None

    def finalize(
        self,
        task: Task,
        state: str,
        *,
        result: Any = None,
        error: BaseException | None = None,
        reason: str | None = None,
        usage: Usage | None = None,
        llm_calls: int = 0,
    ) -> None:
        """Move `task` to a final state, emit it, and settle the dependents it unblocks."""
        if task.state == "ready":
            self.engine.admission.discard(task)
        task.state = state
        self.unfinished -= 1
        self._remaining = None
        if state == "done":
            task.result = result
            if self.observed:
                now = self.engine.clock.monotonic()
                duration = now - task.started_at if task.started_at is not None else 0.0
                self.emit(
                    TaskSucceeded(
                        workflow=self.id,
                        task=task.id,
                        duration=duration,
                        usage=usage,
                        llm_calls=llm_calls,
                        at=now,
                    )
                )
        else:
            self._report(task, state, error, reason)
        self._release_dependents(task)

    def _report(self, task: Task, state: str, error: BaseException | None, why: str | None) -> None:
        now = self.engine.clock.monotonic()
        wid, tid = self.id, task.id
        if state == "failed":
            assert error is not None
            task.error = error
            self.failures[tid] = error
            message = error_text(error)
            self.emit(
                TaskFailed(
                    workflow=wid,
                    task=tid,
                    error=message,
                    error_type=type(error).__name__,
                    attempts=task.attempts,
                    at=now,
                )
            )
        elif state == "skipped":
            task.reason = why
            self.emit(TaskSkipped(workflow=wid, task=tid, reason=why or "", at=now))
        else:
            task.reason = why
            self.emit(TaskCancelled(workflow=wid, task=tid, reason=why or "", at=now))

    def _release_dependents(self, first: Task) -> None:
        # Dependents that end without running (skipped, cancelled) go on a stack instead of
        # recursing: a failure at the head of a 10,000-task chain must not overflow the stack.
        tasks = self.workflow._tasks
        successors = self.workflow.graph.successors
        stack = [first]
        while stack:
            task = stack.pop()
            if tasks.get(task.id) is not task:
                continue  # removed while it ran: nothing depends on it any more
            for dep in successors(task.id):
                nxt = tasks[dep]
                nxt.waiting_on -= 1
                if nxt.waiting_on == 0 and nxt.state == "pending":
                    verdict = self._verdict(nxt)
                    if verdict is not None:
                        state, error, why = verdict
                        nxt.state = state
                        self.unfinished -= 1
                        self._report(nxt, state, error, why)
                        stack.append(nxt)

    # --- outcomes --------------------------------------------------------------------------

    def record(self, elapsed: float, llm_calls: int, usage: Usage) -> None:
        self.attained += elapsed
        if llm_calls:
            self.llm_calls += llm_calls
            self.usage = self.usage + usage

    async def complete(
        self,
        ctx: TaskContext,
        request: LLMRequest,
        backend: str,
        *,
        expected_output_tokens: int | None,
        keep_alive_s: float | None,
        last_call: bool,
        prefix_key: str | None,
    ) -> LLMResponse:
        """One LLM call on behalf of a task of this run, carrying the program's hints.

        Failed sends are retried as `engine.call_retry` says, each retry an event, and
        every send passes the backend's circuit breaker."""
        engine = self.engine
        llm = engine.backend(backend)
        if keep_alive_s is None:
            keep_alive_s = engine.keep_alive_for(self, ctx.task_id, request)
        last_call = last_call or engine.is_last_call(self, ctx.task_id)
        circuit = engine.circuit(backend)
        clock = engine.clock

        context = sum(len(m.content) for m in request.messages) // 4  # ~4 characters a token

        async def send() -> LLMResponse:
            # The program holds cache on the backend from here (after any slot was granted:
            # a call still queued for one holds nothing) until its keep-alive runs out.
            engine.call_started(self, backend, context)
            held, keep = context, 0.0
            try:
                response = await hinted_send()
                usage = response.usage
                held = usage.prompt_tokens + usage.completion_tokens or context
                keep = 0.0 if last_call else keep_alive_s or 0.0
                return response
            finally:
                engine.call_ended(self, backend, context, held, keep)

        async def hinted_send() -> LLMResponse:
            # Hints are taken per attempt: urgency and the deadline move while a retry waits.
            hints = engine.hints_for(
                self,
                expected_output_tokens=expected_output_tokens,
                keep_alive_s=keep_alive_s,
                last_call=last_call,
                prefix_key=prefix_key,
            )
            if circuit is None:
                return await llm.complete(request, hints)
            wait = circuit.acquire(clock.monotonic())
            if wait is not None:
                raise CircuitOpenError(backend, circuit.consecutive_failures, wait)
            try:
                response = await llm.complete(request, hints)
            except BackendError as exc:
                if exc.retryable:
                    circuit.failed(clock.monotonic())
                else:
                    circuit.succeeded()  # it answered: the server is up, the request was bad
                raise
            except BaseException:
                circuit.abandoned()
                raise
            circuit.succeeded()
            return response

        task = self.workflow._tasks.get(ctx.task_id)
        if task is not None and task.resource == backend:
            # The task itself holds the slot, and keeps it while a retry waits: the slot is
            # the task's admission, released once by the engine when the task ends; giving
            # it back mid-task would let the backend's limit be exceeded when it resumes.
            attempt = send
        else:

            async def attempt() -> LLMResponse:
                # A slot taken for this call alone is given back while a retry waits, and
                # queued for again in the scheduler's order.
                async with engine.slot(self, backend):
                    return await send()

        def retrying(number: int, error: BaseException, delay: float) -> None:
            self.emit(
                CallRetrying(
                    workflow=self.id,
                    task=ctx.task_id,
                    backend=backend,
                    attempt=number,
                    error=f"{type(error).__name__}: {error}",
                    delay=delay,
                    at=clock.monotonic(),
                )
            )
            engine.wake()

        return await call_with_retries(
            attempt, engine.call_retry, sleep=clock.sleep, on_retry=retrying
        )

    def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        return self.engine.to_thread(fn, *args, **kwargs)

    def abandon(self, reason: str) -> None:
        """End this run as cancelled without the loop (it is gone)."""
        if self.done.done():
            return
        self.cancelling = self.cancelling or reason
        for task in self.workflow:
            if task.state not in FINAL_STATES:
                task.state = "cancelled"
                task.reason = reason
        self.workflow._detach()
        self.done.set_result(self._result())

    def cancel(self, reason: str) -> None:
        if self.cancelling is not None or self.done.done():
            return
        self.cancelling = reason
        for task in list(self.workflow):
            self.cancel_task(task, reason)
        self._maybe_finish()

    def cancel_task(self, task: Task, reason: str) -> None:
        if task.state in FINAL_STATES:
            return
        if task.handle is not None and task.state in ("running", "waiting"):
            if task.cancel_reason is None:
                task.cancel_reason = reason
                task.handle.cancel(reason)
            return
        self.finalize(task, "cancelled", reason=reason)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.unfinished > 0 or self.running > 0 or self.done.done():
            return
        self.engine.finish(self, self._result())

    def _result(self) -> RunResult:
        results: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        cancelled: dict[str, str] = {}
        for task in self.workflow:
            if task.state == "done":
                results[task.id] = task.result
            elif task.state == "skipped":
                skipped[task.id] = task.reason or ""
            elif task.state == "cancelled":
                cancelled[task.id] = task.reason or ""
        status: WorkflowStatus
        if self.cancelling is not None:
            status = "cancelled"
        elif self.failures:
            status = "failed"
        else:
            status = "succeeded"
        return RunResult(
            workflow=self.id,
            status=status,
            results=results,
            failures={t: error_text(e) for t, e in self.failures.items()},
            errors=dict(self.failures),
            skipped=skipped,
            cancelled=cancelled,
            started_at=self.started_at,
            finished_at=self.engine.clock.monotonic(),
            llm_calls=self.llm_calls,
            usage=self.usage,
            deadline=self.deadline,
        )

    def finished_event(self, result: RunResult) -> WorkflowFinished:
        return WorkflowFinished(
            workflow=self.id,
            status=result.status,
            duration=result.duration,
            failures=dict(result.failures),
            deadline_met=result.deadline_met,
            slack=result.slack,
            at=result.finished_at,
        )

    @property
    def observed(self) -> bool:
        """Whether anyone reads this run's events. Hot paths build events only if so: on a
        100,000-task graph that nobody watches, building them would be a third of the cost."""
        return bool(self.subscribers) or self.engine.has_listeners

    def emit(self, event: Event) -> None:
        if self.observed:
            self.engine.emit(self, event)

    # --- workflow mutation hooks -------------------------------------------------------------

    def added(self, task: Task, after: tuple[str, ...]) -> None:
        tasks = self.workflow._tasks
        task.waiting_on = sum(1 for dep in after if tasks[dep].state not in FINAL_STATES)
        self.unfinished += 1
        self._remaining = None
        now = self.engine.clock.monotonic()
        self.emit(
            TaskAdded(workflow=self.id, task=task.id, action=task.action.label, after=after, at=now)
        )
        if task.waiting_on == 0:
            self._decide(task)
        self.engine.wake()

    def replaced(self, old: Task, task: Task) -> None:
        if old.state == "ready":
            self.engine.admission.discard(old)
        old.state = "cancelled"  # the stale copy must never be admitted from a queue
        graph, tasks = self.workflow.graph, self.workflow._tasks
        task.waiting_on = sum(
            1 for dep in graph.predecessors(task.id) if tasks[dep].state not in FINAL_STATES
        )
        self.emit(
            TaskReplaced(
                workflow=self.id,
                task=task.id,
                action=task.action.label,
                at=self.engine.clock.monotonic(),
            )
        )
        if task.waiting_on == 0:
            self._decide(task)
        self.engine.wake()

    def removed(self, task: Task, dependents: list[str]) -> None:
        self.emit(TaskRemoved(workflow=self.id, task=task.id, at=self.engine.clock.monotonic()))
        self._remaining = None
        was_final = task.state in FINAL_STATES
        if task.state in ("running", "waiting"):
            self.cancel_task(task, "removed from its workflow")
        elif not was_final:
            self.finalize(task, "cancelled", reason="removed from its workflow")
        if not was_final:
            tasks = self.workflow._tasks
            for dep in dependents:
                nxt = tasks[dep]
                nxt.waiting_on -= 1
                if nxt.waiting_on == 0 and nxt.state == "pending":
                    self._decide(nxt)
        self._maybe_finish()
        self.engine.wake()

    def edge_added(self, source: str, target: str) -> None:
        tasks = self.workflow._tasks
        self._remaining = None
        self.emit(
            EdgeAdded(
                workflow=self.id, source=source, target=target, at=self.engine.clock.monotonic()
            )
        )
        nxt = tasks[target]
        if nxt.state == "ready":
            # Its inputs changed: back to pending, and judged again below if they are final.
            self.engine.admission.discard(nxt)
            nxt.state = "pending"
        if tasks[source].state not in FINAL_STATES:
            nxt.waiting_on += 1
        elif nxt.waiting_on == 0 and nxt.state == "pending":
            self._decide(nxt)
        self.engine.wake()

    def edge_removed(self, source: str, target: str) -> None:
        tasks = self.workflow._tasks
        self._remaining = None
        self.emit(
            EdgeRemoved(
                workflow=self.id, source=source, target=target, at=self.engine.clock.monotonic()
            )
        )
        if tasks[source].state not in FINAL_STATES:
            nxt = tasks[target]
            nxt.waiting_on -= 1
            if nxt.waiting_on == 0 and nxt.state == "pending":
                self._decide(nxt)
        self.engine.wake()
