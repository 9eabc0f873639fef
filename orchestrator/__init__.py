"""plait's core: workflows as mutable task DAGs, run program-first by one async engine.

This package owns the loop and the protocols. These names are what a workflow, an engine and
its configuration need; `orchestrator.ext` holds what implementers of LLM backends, stores,
runners, notifiers, actions and policies need besides (`executors`, `agents` and `memory` are
such implementers and import only from these two).
"""

from .admission._queue import Limits
from .cluster._cluster import Cluster
from .durability._registry import Registry
from .durability._resume import ResumePlan
from .durability._retention import Retention
from .durability._store import StoreError, StoreVersionError
from .engine._config import Config, load_config
from .engine._context import TaskContext
from .engine._engine import Engine, EngineStats, ResumeReport, RunHandle
from .engine._keepalive import KeepAlive
from .engine._resilience import Breaker, CallRetry
from .engine._run import RunResult
from .engine._sync import run_sync
from .model._clock import Clock, SystemClock, VirtualClock
from .model._errors import (
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
from .model._events import (
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
from .model._llm import Hints, LLMBackend, LLMRequest, LLMResponse, Message, ToolCall, Usage
from .model._task import Retry, Task
from .model._template import Template
from .model._workflow import Workflow

__all__ = [
    # workflows, the engine, runs and resuming them
    "Workflow", "Task", "TaskContext", "Retry", "Template", "Engine", "RunHandle", "RunResult",
    "run_sync", "Registry", "ResumePlan", "ResumeReport",
    # time
    "Clock", "SystemClock", "VirtualClock",
    # configuring the engine, and what it reports
    "Config", "load_config", "Limits", "KeepAlive", "CallRetry",
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
