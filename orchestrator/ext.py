"""What implementers of LLM backends, stores, runners, notifiers, actions and policies need."""

from ._clock import running_clock
from ._config import BackendKind, ConfigSection
from ._context import WorkflowEditor
from ._errors import BackendOverloadedError, BackendRequestError, BackendUnavailableError
from ._events import ActionSpec, WorkflowStatus
from ._journal import read_events
from ._llm import (
    CapacityReporting,
    FailureIsolating,
    HealthChecked,
    LoadReport,
    LoadReporting,
    OutputSchema,
    ProgramAware,
    Sampling,
    ServerCapacity,
    ToolSpec,
    UrgentIsolating,
    WallClockBackend,
    WrappedBackend,
)
from ._notify import Notifier
from ._registry import Composite, Rebuildable, RebuildError
from ._replay import RunImage, TaskImage, rebuild
from ._retention import compactable
from ._runner import Runner
from ._scheduler import Policy, ProgramView
from ._slots import SlotBroker, SlotRow, allot
from ._store import (
    BatchRefusedError,
    CallRecord,
    CancelStore,
    Claimed,
    EventRecord,
    KeyStore,
    LeaseLostError,
    LeaseStore,
    RetainingStore,
    Store,
    StoreBatch,
    StoreSize,
    TextNotStorableError,
    WorkflowExistsError,
    WorkflowRow,
    unstorable,
)
from ._task import (
    DEFAULT_BACKEND,
    DEFAULT_FUNCTION_RESOURCE,
    DEFAULT_TOOL_RESOURCE,
    Action,
    Describable,
    FunctionAction,
    LLMCall,
    registered_name,
)

__all__ = [
    # actions: what a task runs, recorded as data (`ActionSpec`) and rebuilt by a `Registry`
    "Action", "Describable", "ActionSpec", "FunctionAction", "LLMCall", "WorkflowEditor",
    "registered_name", "Rebuildable", "Composite", "RebuildError",
    "DEFAULT_BACKEND", "DEFAULT_FUNCTION_RESOURCE", "DEFAULT_TOOL_RESOURCE",
    # runners: where a task's synchronous function runs (`Tool(..., runner=...)`)
    "Runner",
    # LLM backends: the rest of a request, the errors to raise, the optional capabilities
    "Sampling", "ToolSpec", "OutputSchema",
    "BackendOverloadedError", "BackendRequestError", "BackendUnavailableError",
    "HealthChecked", "LoadReporting", "LoadReport", "ProgramAware", "FailureIsolating",
    "CapacityReporting", "ServerCapacity",
    "UrgentIsolating", "WallClockBackend", "WrappedBackend",
    # a config file's backend kinds (`kind = "..."`, the `plait.backends` entry points)
    "BackendKind", "ConfigSection",
    # a component's clock when none is given
    "running_clock",
    # scheduling policies (`Engine(policy=...)`)
    "Policy", "ProgramView",
    # stores (`Engine(store=...)`, the `plait.stores` entry points): the durable log
    "Store", "StoreBatch", "CallRecord", "EventRecord", "WorkflowRow", "WorkflowStatus",
    "Claimed", "StoreSize", "BatchRefusedError", "LeaseLostError", "TextNotStorableError",
    "WorkflowExistsError", "unstorable", "compactable",
    # what a store may add to the log: retention, leases, cancel requests, idempotency keys
    "RetainingStore", "LeaseStore", "CancelStore", "KeyStore",
    # a stored run read back
    "read_events", "rebuild", "RunImage", "TaskImage",
    # between engines: shared in-flight limits (`Engine(slots=...)`) and wake-ups
    # (the `plait.notifiers` entry points)
    "SlotBroker", "SlotRow", "allot", "Notifier",
]  # fmt: skip
