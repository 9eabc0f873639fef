"""Rebuild a run from its events: a pure fold, no engine, no clock.

The event log is the run's history: what each task runs (`ActionSpec`), its settings, its
edges as they changed while the workflow ran, every state change and every result. Folding
it gives the run as it stood after its last event (`RunImage`): what resume starts from,
and what a viewer draws.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..model._errors import UsageError
from ..model._events import (
    FINAL_STATES,
    ActionSpec,
    Event,
    TaskCancelled,
    TaskFailed,
    TaskOptions,
    TaskReady,
    TaskRetrying,
    TaskSkipped,
    TaskStarted,
    TaskState,
    TaskSucceeded,
    WorkflowStatus,
)


@dataclass(slots=True)
class TaskImage:
    """One task as its events tell it."""

    id: str
    action: ActionSpec
    options: TaskOptions
    after: set[str] = field(default_factory=set)
    state: TaskState = "pending"
    attempts: int = 0
    result: Any = None
    error: str | None = None
    reason: str | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


@dataclass(slots=True)
class RunImage:
    """One workflow run as its events tell it; `status` is None while it has not finished."""

    workflow: str
    program: int = 0
    priority: str = "batch"
    deadline: float | None = None
    tasks: dict[str, TaskImage] = field(default_factory=dict)
    status: WorkflowStatus | None = None
    events: int = 0
    resumes: int = 0
    """How often the run was resumed in a new process."""
    removed: set[str] = field(default_factory=set)
    """Tasks removed while the run went on (a removed running task still reports its end)."""

    @property
    def edges(self) -> set[tuple[str, str]]:
        return {(dep, t.id) for t in self.tasks.values() for dep in t.after}

    def results(self) -> dict[str, Any]:
        return {t.id: t.result for t in self.tasks.values() if t.state == "done"}

    def unfinished(self) -> list[str]:
        """Tasks that were not final at the last event: what a resumed run runs again."""
        return [t.id for t in self.tasks.values() if not t.final]


def rebuild(events: Iterable[Event], onto: RunImage | None = None) -> RunImage:
    """Fold one workflow's events, in order, into its `RunImage` (or into `onto`, the
    image of the events before these, which it updates).

    Raises `UsageError` if the events are of several workflows or do not start with
    `workflow_started`: a log to replay must be one run's, whole."""
    image = onto
    for event in events:
        if image is None:
            if event.kind != "workflow_started":
                raise UsageError(
                    f"a run's events begin with workflow_started, this one with {event.kind} "
                    f"(of {event.workflow!r}): the log is not whole"
                )
            image = RunImage(event.workflow, event.program, event.priority, event.deadline)
        elif event.workflow != image.workflow:
            raise UsageError(
                f"rebuild() takes one run's events; got {event.workflow!r} among "
                f"{image.workflow!r}'s"
            )
        _apply(image, event)
        image.events += 1
    if image is None:
        raise UsageError("rebuild() needs at least the run's workflow_started event")
    return image


_TASK_STATE_EVENTS = (
    TaskReady,
    TaskStarted,
    TaskRetrying,
    TaskSucceeded,
    TaskFailed,
    TaskSkipped,
    TaskCancelled,
)


def _apply(image: RunImage, event: Event) -> None:
    tasks = image.tasks
    if isinstance(event, _TASK_STATE_EVENTS) and event.task not in tasks:
        if event.task in image.removed:
            return  # the end of a task that had left the workflow: nothing reads it
        raise UsageError(
            f"event {event.kind} of task {event.task!r} of {image.workflow!r}, which was "
            "never added: the log is not whole"
        )
    match event.kind:
        case "task_added":
            image.removed.discard(event.task)
            tasks[event.task] = TaskImage(
                event.task, event.action, event.options, after=set(event.after)
            )
        case "task_replaced":
            old = tasks[event.task]
            old.action, old.options, old.state = event.action, event.options, "pending"
        case "task_removed":
            del tasks[event.task]
            image.removed.add(event.task)
            for task in tasks.values():
                task.after.discard(event.task)
        case "edge_added":
            tasks[event.target].after.add(event.source)
        case "edge_removed":
            tasks[event.target].after.discard(event.source)
        case "task_ready":
            tasks[event.task].state = "ready"
        case "task_started":
            task = tasks[event.task]
            task.state, task.attempts = "running", event.attempt
        case "task_retrying":
            tasks[event.task].state = "waiting"
        case "task_succeeded":
            task = tasks[event.task]
            task.state, task.result = "done", event.result
            # It ran at least once; a compacted log drops a first attempt's task_started.
            task.attempts = max(task.attempts, 1)
        case "task_failed":
            task = tasks[event.task]
            task.state, task.error, task.attempts = "failed", event.error, event.attempts
        case "task_skipped" | "task_cancelled":
            task = tasks[event.task]
            task.state = "skipped" if event.kind == "task_skipped" else "cancelled"
            task.reason = event.reason
        case "workflow_resumed":
            image.program, image.deadline = event.program, event.deadline
            image.resumes += 1
            for task in tasks.values():
                if not task.final:
                    task.state = "pending"
        case "workflow_finished":
            image.status = event.status
        case _:
            pass  # workflow_started (read above), call_retrying, deadline_missed,
            # deadline_hopeless: no state
