"""Typed events: every mutation of a workflow and every state change of a task is one.

Events are frozen dataclasses tagged by `kind`; `Event` is their discriminated union and
`EVENT_ADAPTER` persists and restores them. `at` is the engine clock's monotonic time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from ._llm import Usage

TaskState = Literal[
    "pending", "ready", "running", "waiting", "done", "failed", "cancelled", "skipped"
]
"""pending: inputs not all there; ready: queued for admission; running: admitted and executing;
waiting: between two attempts (retry backoff); the last four are final."""

FINAL_STATES: frozenset[str] = frozenset({"done", "failed", "cancelled", "skipped"})

WorkflowStatus = Literal["pending", "running", "succeeded", "failed", "cancelled"]


ActionKind = Literal["function", "llm", "tool", "custom"]


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """What a task runs, as data: enough to rebuild the action from a registry.

    `kind`: a Python function, an agent's LLM call, a tool call, or another `Action`.
    `name`: the registered name (`module:qualname` of a function or a prompt builder, the
    agent's or tool's name, an action's class). `args`: the arguments as JSON-able data
    (a tool's arguments, an LLM call's prompt and settings)."""

    kind: ActionKind
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's settings as data (the `when` condition by its registered name)."""

    retry: int = 1
    retry_delay: tuple[float, float, float] = (0.5, 30.0, 0.5)
    """The retry's initial delay, maximum delay and jitter (the error types it retries on
    are code, not data: a rebuilt task retries on any error, as by default)."""
    timeout: float | None = None
    resource: str = ""
    estimate: float | None = None
    trigger: str = "all_success"
    when: str | None = None
    idempotent: bool = True
    """False: running it twice does harm (a payment, an e-mail); resume asks before it does."""
    idempotency_key: str | None = None
    """The key the task declared, or None."""
    idempotency_key_from: str | None = None
    """The registered name of the function that builds the key from the inputs, or None."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowStarted:
    workflow: str
    program: int
    priority: str
    deadline: float | None
    at: float
    kind: Literal["workflow_started"] = "workflow_started"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowResumed:
    """A stored run goes on in a new process (`Engine.resume`): its tasks that were not
    final are pending again; `rerun` lists those that had started (they run again)."""

    workflow: str
    program: int
    deadline: float | None
    rerun: tuple[str, ...] = ()
    at: float
    kind: Literal["workflow_resumed"] = "workflow_resumed"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowFinished:
    workflow: str
    status: WorkflowStatus
    duration: float
    failures: dict[str, str] = field(default_factory=dict)
    deadline_met: bool | None = None
    """None when the run had no deadline."""
    slack: float | None = None
    """Seconds to spare at the deadline; negative: how late it finished."""
    at: float
    kind: Literal["workflow_finished"] = "workflow_finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineMissed:
    """The run's deadline passed while it was still running (sent at that moment)."""

    workflow: str
    deadline: float
    at: float
    kind: Literal["deadline_missed"] = "deadline_missed"


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadlineHopeless:
    """The run can no longer meet its deadline even alone: its remaining critical path, at
    the least its tasks have taken, is longer than the time left (sent once, when admission
    first sees it). From then on it ranks below the runs that can still make theirs and
    waits with slack-rich work for headroom (docs/admission.md); it still runs to its end.
    A run submitted with `late="cancel"` is judged at what its tasks take at the present
    load instead, or by the deadline gate while it waits to start (what runs take at the
    present load), and is given up (cancelled) right after this event."""

    workflow: str
    deadline: float
    remaining: float
    """The estimated seconds of work left on its critical path at that moment (for a run
    the gate gives up: what a run takes at the present load)."""
    at: float
    kind: Literal["deadline_hopeless"] = "deadline_hopeless"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskAdded:
    """A task joined the run: what it runs, its settings and what it waits for."""

    workflow: str
    task: str
    action: ActionSpec
    options: TaskOptions = TaskOptions()
    after: tuple[str, ...]
    at: float
    kind: Literal["task_added"] = "task_added"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskReplaced:
    workflow: str
    task: str
    action: ActionSpec
    options: TaskOptions = TaskOptions()
    at: float
    kind: Literal["task_replaced"] = "task_replaced"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRemoved:
    workflow: str
    task: str
    at: float
    kind: Literal["task_removed"] = "task_removed"


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeAdded:
    workflow: str
    source: str
    target: str
    at: float
    kind: Literal["edge_added"] = "edge_added"


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgeRemoved:
    workflow: str
    source: str
    target: str
    at: float
    kind: Literal["edge_removed"] = "edge_removed"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskReady:
    workflow: str
    task: str
    resource: str
    at: float
    kind: Literal["task_ready"] = "task_ready"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStarted:
    workflow: str
    task: str
    attempt: int
    at: float
    kind: Literal["task_started"] = "task_started"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRetrying:
    workflow: str
    task: str
    attempt: int
    error: str
    delay: float
    at: float
    kind: Literal["task_retrying"] = "task_retrying"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRetrying:
    """One LLM call of a running task failed and is sent again after `delay` seconds
    (`attempt` is the call's attempt that failed; the task itself keeps running)."""

    workflow: str
    task: str
    backend: str
    attempt: int
    error: str
    delay: float
    at: float
    kind: Literal["call_retrying"] = "call_retrying"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSucceeded:
    """The task's result is in the event: JSON-able, as checked when the task ended."""

    workflow: str
    task: str
    duration: float
    result: Any = None
    usage: Usage | None = None
    llm_calls: int = 0
    at: float
    kind: Literal["task_succeeded"] = "task_succeeded"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFailed:
    workflow: str
    task: str
    error: str
    error_type: str
    attempts: int
    at: float
    kind: Literal["task_failed"] = "task_failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSkipped:
    workflow: str
    task: str
    reason: str
    at: float
    kind: Literal["task_skipped"] = "task_skipped"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskCancelled:
    workflow: str
    task: str
    reason: str
    at: float
    kind: Literal["task_cancelled"] = "task_cancelled"


Event = Annotated[
    WorkflowStarted
    | WorkflowResumed
    | WorkflowFinished
    | DeadlineMissed
    | DeadlineHopeless
    | TaskAdded
    | TaskReplaced
    | TaskRemoved
    | EdgeAdded
    | EdgeRemoved
    | TaskReady
    | TaskStarted
    | TaskRetrying
    | CallRetrying
    | TaskSucceeded
    | TaskFailed
    | TaskSkipped
    | TaskCancelled,
    Field(discriminator="kind"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
"""Serialise with `EVENT_ADAPTER.dump_json(event)`, restore with `validate_json(data)`."""
