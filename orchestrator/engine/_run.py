"""The state of one running workflow (one *program*): readiness, outcomes and its result.

All of it runs on the engine's loop thread: the engine applies task outcomes here, and the
workflow reports its mutations here (`_Hooks`), whoever makes them. Every change of a
task's state goes through `Run._move`, and only there. The run knows nothing of the engine:
what it needs (clock, policy, admission queues, the event bus) is handed to it
(`RunServices`), and it tells whoever runs it that it changed through `services.changed`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..admission._learned import Durations
from ..admission._queue import Admission
from ..admission._scheduler import Policy, PriorityClass, ProgramView, remaining_critical_paths
from ..durability._replay import TaskImage
from ..model._clock import Clock
from ..model._errors import (
    OverloadedError,
    RecordedFailure,
    UnknownResourceError,
    UsageError,
    WorkflowFailedError,
    error_text,
)
from ..model._events import (
    FINAL_STATES,
    EdgeAdded,
    EdgeRemoved,
    Event,
    TaskAdded,
    TaskCancelled,
    TaskFailed,
    TaskReady,
    TaskRemoved,
    TaskReplaced,
    TaskRetrying,
    TaskSkipped,
    TaskStarted,
    TaskState,
    TaskSucceeded,
    WorkflowFinished,
    WorkflowStatus,
)
from ..model._llm import Usage
from ..model._task import LLMCall, Task, TaskRun, describe, recording_problem
from ..model._text import storable
from ..model._workflow import Workflow
from ._bus import EventBus


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
    hopeless_at: float | None = None
    """When admission found the deadline out of reach even alone (`DeadlineHopeless`);
    None if it never did."""

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


_VERBS = {"failed": "failed", "skipped": "was skipped", "cancelled": "was cancelled"}

_Verdict = tuple[TaskState, BaseException | None, str | None]
"""The final state a task takes instead of running, with its error or reason."""


def task_kind(priority_class: str, label: str) -> str:
    """What `Durations` learns a task's time under: its label within its run's class."""
    return f"{priority_class}: {label}"


Late = Literal["finish", "cancel"]
"""What happens to a run that misses its deadline (`Engine.submit(late=...)`)."""


@dataclass(frozen=True, slots=True)
class RunServices:
    """What a run needs from whoever runs it, handed down once (the engine builds it)."""

    clock: Clock
    policy: Policy
    admission: Admission
    bus: EventBus
    next_seq: Callable[[], int]
    changed: Callable[[Run], None]
    """Look at this run again: a task of it became ready, or it may have ended."""
    default_estimate: float = 1.0
    durations: Durations | None = None
    """Learned task durations (the engine's); without them, `default_estimate` for every
    task without an estimate."""


class Run:
    """One workflow's run state; implements the workflow's mutation hooks."""

    def __init__(
        self,
        workflow: Workflow,
        program: int,
        services: RunServices,
        *,
        priority_class: PriorityClass,
        deadline: float | None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.workflow = workflow
        self.tenant = tenant
        self.labels: Mapping[str, str] = labels or {}
        self.id = workflow.id
        self.program = program
        self.priority_class: PriorityClass = priority_class
        self.deadline = deadline
        self.services = services
        self.records: dict[str, TaskRun] = {}
        self.attained = 0.0
        self.started_at = services.clock.monotonic()
        self.unfinished = 0
        self.running = 0
        self.cancelling: str | None = None
        self.failures: dict[str, BaseException] = {}
        self.llm_calls = 0
        self.usage = Usage()
        self.done: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self.complete = False
        """Every task is final and none is running: the run can be finished."""
        self._remaining: tuple[float, float, bool] | None = None
        """The remaining critical path, lately and at the least (`_critical_paths`)."""
        self.late: Late = "finish"
        """"cancel": cancelled when the deadline passes (`Engine.submit(late=...)`)."""
        self.deadline_timer: asyncio.TimerHandle | None = None

    @property
    def workflow_name(self) -> str:
        return self.workflow.name

    def __repr__(self) -> str:
        return f"Run({self.id!r}, program={self.program})"

    # --- the one place a task's state changes ----------------------------------------------

    def _move(self, record: TaskRun, state: TaskState) -> None:
        record.state = state

    # --- scheduling ------------------------------------------------------------------------

    def view(self, now: float) -> ProgramView:
        remaining = least = 0.0
        guessed = False
        if self.services.policy.needs_remaining and self.deadline is not None:
            if self._remaining is None:
                self._remaining = self._critical_paths()
            remaining, least, guessed = self._remaining
            if self.late == "cancel":
                # Given up once late: what it needs is what tasks take at the present load,
                # so one late at this load makes way at once instead of using capacity
                # others need and being cancelled at its deadline anyway.
                least = remaining
        elif self.deadline is not None:
            guessed = True  # the policy estimates no path: 0 stands for one not known
        return ProgramView(
            self.program,
            self.priority_class,
            self.attained,
            self.deadline,
            remaining,
            least,
            guessed,
        )

    def _critical_paths(self) -> tuple[float, float, bool]:
        """The remaining critical path at what tasks take lately, and at the least they
        have taken (a task's own estimate, or the default, stands for both); and whether
        some task's time is only the default."""
        learned = self.services.durations
        default = self.services.default_estimate
        unfinished: dict[str, tuple[float, float]] = {}
        guessed = False
        for r in self.records.values():
            if r.state in FINAL_STATES:
                continue
            task = r.task
            if task.estimate is not None:
                unfinished[task.id] = (task.estimate, task.estimate)
            elif learned is None:
                unfinished[task.id] = (default, default)
                guessed = True
            else:
                kind = task_kind(self.priority_class, task.action.label)
                unfinished[task.id] = (learned.estimate(kind), learned.least(kind))
                guessed = guessed or not learned.knows(kind)
        return (*remaining_critical_paths(self.workflow.graph, unfinished), guessed)

    # --- what a task's context asks (facts for its LLM calls) -----------------------------

    def next_steps(self, task_id: str) -> Sequence[tuple[str, str]]:
        tasks = self.workflow._tasks
        return [
            (tasks[d].action.label, tasks[d].resource)
            for d in self.workflow.graph.successors(task_id)
            if d in tasks
        ]

    def is_last_call(self, task_id: str) -> bool:
        """A one-call LLM task with nothing left after it in its run: the program's last call."""
        task = self.workflow._tasks.get(task_id)
        return (
            task is not None
            and isinstance(task.action, LLMCall)
            and self.unfinished == 1
            and not self.workflow.graph.out_degree(task_id)
        )

    def holds_slot(self, task_id: str, backend: str) -> bool:
        record = self.records.get(task_id)
        return record is not None and record.resource == backend

    # --- start and readiness ---------------------------------------------------------------

    def start(self, restored: Mapping[str, TaskImage] | None = None) -> None:
        """Begin: every task pending, those without inputs judged at once. `restored`: the
        run goes on from its log (`Engine.resume`), whose events already tell its tasks;
        the final ones keep their state and result, the others start over as pending."""
        graph = self.workflow.graph
        tasks = list(self.workflow)
        for task in tasks:
            self.validate(task)
        records = self.records
        for task in tasks:
            records[task.id] = TaskRun(task)
        if restored is not None:
            self._restore(restored)
        now = self.services.clock.monotonic()
        observed = self.observed and restored is None
        for task in tasks:
            record = records[task.id]
            if restored is None:
                record.waiting_on = graph.in_degree(task.id)
            else:
                record.waiting_on = sum(
                    1
                    for dep in graph.predecessors(task.id)
                    if records[dep].state not in FINAL_STATES
                )
            if observed:
                self._added_event(task, tuple(graph.predecessors(task.id)), now)
        self.unfinished = sum(1 for r in records.values() if r.state not in FINAL_STATES)
        for record in list(records.values()):
            if record.waiting_on == 0 and record.state == "pending":
                self._decide(record)
        self._check_complete()

    def _restore(self, images: Mapping[str, TaskImage]) -> None:
        for record in self.records.values():
            image = images[record.task.id]
            record.attempts = image.attempts
            if not image.final:
                continue
            self._move(record, image.state)
            if image.state == "done":
                record.result = image.result
            elif image.state == "failed":
                record.error = RecordedFailure(image.error or "failed")
                self.failures[record.task.id] = record.error
            else:
                record.reason = image.reason

    def _added_event(self, task: Task, after: tuple[str, ...], now: float) -> None:
        self._emit(
            TaskAdded(
                workflow=self.id,
                task=task.id,
                action=describe(task.action),
                options=task.options(),
                after=after,
                at=now,
            ),
        )

    def validate(self, task: Task) -> None:
        """Refuse a task on a resource the engine does not know, or one the log could not
        record (before it joins)."""
        admission = self.services.admission
        if not admission.knows(task.resource):
            raise UnknownResourceError(task.id, task.resource, admission.names)
        if self.services.bus.recorder is not None:
            problem = recording_problem(task)
            if problem is not None:
                raise UsageError(f"workflow {self.id!r}, {problem}")

    def inputs_of(self, record: TaskRun) -> dict[str, Any]:
        records = self.records
        inputs = {}
        for dep in self.workflow.graph.predecessors(record.task.id):
            r = records[dep]
            if r.state == "done":
                inputs[dep] = r.result
        return inputs

    def inputs_mark(self, record: TaskRun) -> int:
        """The journal mark the task's inputs need committed before it starts."""
        records = self.records
        return max(
            (records[d].mark for d in self.workflow.graph.predecessors(record.task.id)),
            default=0,
        )

    def _decide(self, record: TaskRun) -> None:
        """All inputs of the task are final: make it ready, or skip, cancel or fail it."""
        verdict = self._verdict(record)
        if verdict is not None:
            state, error, reason = verdict
            self.finalize(record, state, error=error, reason=reason)

    def _verdict(
        self, record: TaskRun
    ) -> tuple[TaskState, BaseException | None, str | None] | None:
        """Queue the task and return None, or say which final state it takes instead."""
        if self.cancelling is not None:
            return "cancelled", None, self.cancelling
        task = record.task
        records = self.records
        if task.trigger == "all_success":
            for dep in self.workflow.graph.predecessors(task.id):
                state = records[dep].state
                if state != "done":
                    verb = _VERBS.get(state, f"is {state}")
                    return "skipped", None, f"dependency {dep!r} {verb}"
        if task.when is not None:
            try:
                go = task.when(self.inputs_of(record))
            except Exception as exc:
                return "failed", exc, None
            if not go:
                return "skipped", None, "its condition was false"
        services = self.services
        self._move(record, "ready")
        record.ready_seq = services.next_seq()
        try:
            services.admission.push(self, record)
        except OverloadedError as exc:
            self._move(record, "pending")
            return "failed", exc, None
        if self.observed:
            now = services.clock.monotonic()
            self._emit(TaskReady(workflow=self.id, task=task.id, resource=task.resource, at=now))
        services.changed(self)
        return None

    # --- attempts (the engine runs them) ---------------------------------------------------

    def begin(self, record: TaskRun) -> float:
        """The task was admitted and starts its first attempt; returns the start time."""
        now = self.services.clock.monotonic()
        self._move(record, "running")
        record.attempts = 1
        record.started_at = now
        self.running += 1
        if self.observed:
            self._emit(TaskStarted(workflow=self.id, task=record.task.id, attempt=1, at=now))
        return now

    def retry_waits(self, record: TaskRun, attempt: int, error: str, delay: float) -> None:
        self._move(record, "waiting")
        self._emit(
            TaskRetrying(
                workflow=self.id,
                task=record.task.id,
                attempt=attempt,
                error=error,
                delay=delay,
                at=self.services.clock.monotonic(),
            ),
        )

    def retry_starts(self, record: TaskRun, attempt: int) -> None:
        self._move(record, "running")
        record.attempts = attempt
        self._emit(
            TaskStarted(
                workflow=self.id,
                task=record.task.id,
                attempt=attempt,
                at=self.services.clock.monotonic(),
            ),
        )

    def ended(
        self,
        record: TaskRun,
        state: TaskState,
        *,
        result: Any,
        error: BaseException | None,
        usage: Usage,
        llm_calls: int,
        elapsed: float,
    ) -> None:
        """The task's asyncio task has ended (after the engine released its slot)."""
        record.handle = None
        self.running -= 1
        self.attained += elapsed
        if llm_calls:
            self.llm_calls += llm_calls
            self.usage = self.usage + usage
        if record.state in ("running", "waiting"):
            if state == "cancelled":
                reason = record.cancel_reason or self.cancelling or "cancelled"
                self.finalize(record, "cancelled", reason=reason)
            else:
                self.finalize(
                    record,
                    state,
                    result=result,
                    error=error,
                    usage=usage if llm_calls else None,
                    llm_calls=llm_calls,
                )
        self._check_complete()

    # --- final states ----------------------------------------------------------------------

    def finalize(
        self,
        record: TaskRun,
        state: TaskState,
        *,
        result: Any = None,
        error: BaseException | None = None,
        reason: str | None = None,
        usage: Usage | None = None,
        llm_calls: int = 0,
    ) -> None:
        """Move the task to a final state, emit it, and settle the dependents it unblocks."""
        if record.state == "ready":
            self.services.admission.discard(record)
        self._move(record, state)
        self.unfinished -= 1
        self._remaining = None
        if record.removed:
            return  # its end was told when it left the workflow; nothing depends on it
        if state == "done":
            record.result = result
            if self.observed:
                now = self.services.clock.monotonic()
                started = record.started_at
                duration = now - started if started is not None else 0.0
                self._emit(
                    TaskSucceeded(
                        workflow=self.id,
                        task=record.task.id,
                        duration=duration,
                        result=result,
                        usage=usage,
                        llm_calls=llm_calls,
                        at=now,
                    ),
                )
        else:
            self._report(record, state, error, reason)
        self._release_dependents(record)

    def _report(
        self, record: TaskRun, state: TaskState, error: BaseException | None, why: str | None
    ) -> None:
        now = self.services.clock.monotonic()
        wid, tid = self.id, record.task.id
        if state == "failed":
            assert error is not None
            record.error = error
            self.failures[tid] = error
            self._emit(
                TaskFailed(
                    workflow=wid,
                    task=tid,
                    error=error_text(error),
                    error_type=type(error).__name__,
                    attempts=record.attempts,
                    at=now,
                ),
            )
        elif state == "skipped":
            record.reason = why
            self._emit(TaskSkipped(workflow=wid, task=tid, reason=storable(why or ""), at=now))
        else:
            record.reason = why
            self._emit(TaskCancelled(workflow=wid, task=tid, reason=storable(why or ""), at=now))

    def _release_dependents(self, first: TaskRun) -> None:
        # Dependents that end without running (skipped, cancelled) go on a stack instead of
        # recursing: a failure at the head of a 10,000-task chain must not overflow the stack.
        records = self.records
        successors = self.workflow.graph.successors
        stack = [first]
        while stack:
            record = stack.pop()
            if records.get(record.task.id) is not record:
                continue  # removed while it ran: nothing depends on it any more
            for dep in successors(record.task.id):
                nxt = records[dep]
                nxt.waiting_on -= 1
                if nxt.waiting_on == 0 and nxt.state == "pending":
                    verdict = self._verdict(nxt)
                    if verdict is not None:
                        state, error, why = verdict
                        self._move(nxt, state)
                        self.unfinished -= 1
                        self._report(nxt, state, error, why)
                        stack.append(nxt)

    # --- cancelling and ending -------------------------------------------------------------

    def abandon(self, reason: str) -> None:
        """End this run as cancelled without the loop (it is gone)."""
        if self.done.done():
            return
        self.cancelling = self.cancelling or reason
        for record in self.records.values():
            if record.state not in FINAL_STATES:
                self._move(record, "cancelled")
                record.reason = reason
        self.workflow._detach()
        self.done.set_result(self.result())

    def cancel(self, reason: str) -> None:
        if self.cancelling is not None or self.done.done() or self.complete:
            return  # a complete run ended as it was; it is finished when the loop turns
        self.cancelling = reason
        for record in list(self.records.values()):
            self.cancel_task(record, reason)
        self._check_complete()

    def cancel_task(self, record: TaskRun, reason: str) -> None:
        if record.state in FINAL_STATES:
            return
        if record.handle is not None and record.state in ("running", "waiting"):
            if record.cancel_reason is None:
                record.cancel_reason = reason
                record.handle.cancel(reason)
            return
        self.finalize(record, "cancelled", reason=reason)
        self._check_complete()

    def give_up(self, record: TaskRun, error: BaseException) -> None:
        """Fail a task that has not started (resume's decision not to run it again)."""
        if record.state in ("pending", "ready"):
            self.finalize(record, "failed", error=error)
            self._mutated()

    def _check_complete(self) -> None:
        if self.unfinished > 0 or self.running > 0 or self.done.done() or self.complete:
            return
        self.complete = True
        self.services.changed(self)

    def result(self, hopeless_at: float | None = None) -> RunResult:
        """The run's result as it stands; `hopeless_at`: when admission found its deadline
        out of reach (None: it did not)."""
        results: dict[str, Any] = {}
        skipped: dict[str, str] = {}
        cancelled: dict[str, str] = {}
        for record in self.records.values():
            state = record.state
            if state == "done":
                results[record.task.id] = record.result
            elif state == "skipped":
                skipped[record.task.id] = record.reason or ""
            elif state == "cancelled":
                cancelled[record.task.id] = record.reason or ""
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
            finished_at=self.services.clock.monotonic(),
            llm_calls=self.llm_calls,
            usage=self.usage,
            deadline=self.deadline,
            hopeless_at=hopeless_at,
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
        """Whether anyone reads this run's events (hot paths build events only if so)."""
        return self.services.bus.observed(self.id)

    def _emit(self, event: Event) -> None:
        self.services.bus.emit(self.id, event)

    # --- workflow mutation hooks -------------------------------------------------------------

    def added(self, task: Task, after: tuple[str, ...]) -> None:
        records = self.records
        record = records[task.id] = TaskRun(task)
        record.waiting_on = sum(1 for dep in after if records[dep].state not in FINAL_STATES)
        self.unfinished += 1
        self.complete = False
        self._remaining = None
        if self.observed:
            self._added_event(task, after, self.services.clock.monotonic())
        if record.waiting_on == 0:
            self._decide(record)
        self._mutated()

    def replaced(self, old: Task, task: Task) -> None:
        record = self.records[task.id]
        if record.state == "ready":
            self.services.admission.discard(record)  # its queue entry is stale from now
            self._move(record, "pending")
        record.task = task
        record.resource = task.resource
        graph, records = self.workflow.graph, self.records
        record.waiting_on = sum(
            1 for dep in graph.predecessors(task.id) if records[dep].state not in FINAL_STATES
        )
        if self.observed:
            self._emit(
                TaskReplaced(
                    workflow=self.id,
                    task=task.id,
                    action=describe(task.action),
                    options=task.options(),
                    at=self.services.clock.monotonic(),
                )
            )
        if record.waiting_on == 0:
            self._decide(record)
        self._mutated()

    def removed(self, task: Task, dependents: list[str]) -> None:
        # Out of the run first. A running one is cancelled and told as cancelled now, before
        # it leaves: its asyncio task ends later and reports to a record marked removed,
        # which says nothing more (an id added again meanwhile has a record of its own).
        record = self.records.pop(task.id)
        self._remaining = None
        reason = "removed from its workflow"
        was_final = record.state in FINAL_STATES
        if record.state in ("running", "waiting"):
            self.cancel_task(record, reason)
            self._report(record, "cancelled", None, reason)
            record.removed = True
        elif not was_final:
            self.finalize(record, "cancelled", reason=reason)
        self._emit(TaskRemoved(workflow=self.id, task=task.id, at=self.services.clock.monotonic()))
        if not was_final:
            records = self.records
            for dep in dependents:
                nxt = records[dep]
                nxt.waiting_on -= 1
                if nxt.waiting_on == 0 and nxt.state == "pending":
                    self._decide(nxt)
        self._mutated()

    def edge_added(self, source: str, target: str) -> None:
        records = self.records
        self._remaining = None
        self._emit(
            EdgeAdded(
                workflow=self.id,
                source=source,
                target=target,
                at=self.services.clock.monotonic(),
            )
        )
        nxt = records[target]
        if nxt.state == "ready":
            # Its inputs changed: back to pending, and judged again below if they are final.
            self.services.admission.discard(nxt)
            self._move(nxt, "pending")
        if records[source].state not in FINAL_STATES:
            nxt.waiting_on += 1
        elif nxt.waiting_on == 0 and nxt.state == "pending":
            self._decide(nxt)
        self._mutated()

    def edge_removed(self, source: str, target: str) -> None:
        records = self.records
        self._remaining = None
        self._emit(
            EdgeRemoved(
                workflow=self.id,
                source=source,
                target=target,
                at=self.services.clock.monotonic(),
            )
        )
        if records[source].state not in FINAL_STATES:
            nxt = records[target]
            nxt.waiting_on -= 1
            if nxt.waiting_on == 0 and nxt.state == "pending":
                self._decide(nxt)
        self._mutated()

    def _mutated(self) -> None:
        """After every mutation: the run may have ended, and its events should be heard
        now, not with the next task's outcome."""
        self._check_complete()
        self.services.changed(self)
