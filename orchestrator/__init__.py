"""plait's core: workflows as mutable task DAGs, run program-first by one async engine.

This package owns the loop and the protocols. These names are what a workflow, an engine and
its configuration need; `orchestrator.ext` holds what implementers of LLM backends, stores,
runners, notifiers, actions and policies need besides (`executors`, `agents` and `memory` are
such implementers and import only from these two).
"""

from ._admission import Limits
from ._clock import Clock, SystemClock, VirtualClock
from ._cluster import Cluster
from ._config import Config, load_config
from ._context import TaskContext
from ._engine import Engine, EngineStats, ResumeReport, RunHandle
from ._errors import (
    BackendError,
    CircuitOpenError,
    CycleError,
    DeadlockError,
    DuplicateTaskError,
    OverloadedError,
    PlaitError,
    ResultNotSerializableError,
    RunError,
    TaskStartedError,
    TaskTimeoutError,
    UnknownResourceError,
    UnknownTaskError,
    UsageError,
    WorkflowFailedError,
)
from ._events import (
    EVENT_ADAPTER,
    CallRetrying,
    DeadlineHopeless,
    DeadlineMissed,
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
    TaskSucceeded,
    WorkflowFinished,
    WorkflowResumed,
    WorkflowStarted,
)
from ._gate import DeadlineGate
from ._keepalive import KeepAlive
from ._knee import Headroom
from ._llm import Hints, LLMBackend, LLMRequest, LLMResponse, Message, ToolCall, Usage
from ._registry import Registry
from ._resilience import Breaker, CallRetry
from ._resume import ResumePlan
from ._retention import Retention
from ._run import RunResult
from ._store import StoreError, StoreVersionError
from ._sync import run_sync
from ._task import Retry, Task
from ._template import Template
from ._workflow import Workflow

__all__ = [
    # workflows, the engine, runs and resuming them
    "Workflow", "Task", "TaskContext", "Retry", "Template", "Engine", "RunHandle", "RunResult",
    "run_sync", "Registry", "ResumePlan", "ResumeReport",
    # time
    "Clock", "SystemClock", "VirtualClock",
    # configuring the engine, and what it reports
    "Config", "load_config", "Limits", "KeepAlive", "Headroom", "DeadlineGate", "CallRetry",
    "Breaker", "Retention", "Cluster", "EngineStats",
    # LLM calls, as a task or a fake backend sees them
    "LLMBackend", "LLMRequest", "LLMResponse", "Message", "Hints", "ToolCall", "Usage",
    # errors: UsageError is the caller's mistake, RunError what went wrong running
    "PlaitError", "UsageError", "RunError", "CycleError", "DeadlockError", "DuplicateTaskError",
    "OverloadedError", "ResultNotSerializableError", "TaskStartedError", "TaskTimeoutError",
    "UnknownResourceError", "UnknownTaskError", "WorkflowFailedError", "CircuitOpenError",
    "BackendError", "StoreError", "StoreVersionError",
    # events
    "Event", "EVENT_ADAPTER", "WorkflowStarted", "WorkflowResumed", "WorkflowFinished",
    "TaskAdded", "TaskReplaced", "TaskRemoved", "EdgeAdded", "EdgeRemoved", "TaskReady",
    "TaskStarted", "TaskRetrying", "CallRetrying", "TaskSucceeded", "TaskFailed", "TaskSkipped",
    "TaskCancelled", "DeadlineMissed", "DeadlineHopeless",
]  # fmt: skip
