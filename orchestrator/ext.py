"""What implementers of LLM backends, stores, runners, notifiers, actions and policies need."""

from .admission._gate import DeadlineGate
from .admission._knee import Headroom, KneeController
from .admission._mode import AdmissionTuning
from .admission._scheduler import Policy, ProgramView
from .cluster._notify import Notifier
from .cluster._slots import LocalSlots, SlotBroker, SlotRow, allot
from .durability._journal import read_events
from .durability._registry import Composite, Rebuildable, RebuildError
from .durability._replay import RunImage, TaskImage, rebuild
from .durability._retention import compactable
from .durability._store import (
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
from .engine._config import BackendKind, ConfigSection
from .engine._context import WorkflowEditor
from .engine._tracing import use_tracer_provider
from .model._clock import running_clock
from .model._errors import BackendOverloadedError, BackendRequestError, BackendUnavailableError
from .model._events import ActionSpec, WorkflowStatus
from .model._llm import (
    URGENT_CLASSES,
    CapacityReporting,
    FailureIsolating,
    HealthChecked,
    LoadReport,
    LoadReporting,
    OutputSchema,
    ProgramAware,
    Sampling,
    ServerCapacity,
    ServiceClass,
    ToolSpec,
    UrgentIsolating,
    WallClockBackend,
    WrappedBackend,
)
from .model._runner import Runner
from .model._task import (
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
    # how a program is served now (`Hints.service`)
    "ServiceClass", "URGENT_CLASSES",
    # a config file's backend kinds (`kind = "..."`, the `plait.backends` entry points)
    "BackendKind", "ConfigSection",
    # a component's clock when none is given
    "running_clock",
    # the OpenTelemetry tracer provider plait's engines trace with, if not the global one
    "use_tracer_provider",
    # admission spelled out, for benchmarks and experts (`Engine(admission=AdmissionTuning(...))`):
    # its order (a scheduling policy), the knee's and the deadline gate's settings; a
    # backend's throughput knee learned from its calls (a router learns one per replica)
    "AdmissionTuning", "Policy", "ProgramView", "Headroom", "DeadlineGate", "KneeController",
    # stores (`Engine(store=...)`, the `plait.stores` entry points): the durable log
    "Store", "StoreBatch", "CallRecord", "EventRecord", "WorkflowRow", "WorkflowStatus",
    "Claimed", "StoreSize", "BatchRefusedError", "LeaseLostError", "TextNotStorableError",
    "WorkflowExistsError", "unstorable", "compactable",
    # what a store may add to the log: retention, leases, cancel requests, idempotency keys
    "RetainingStore", "LeaseStore", "CancelStore", "KeyStore",
    # a stored run read back
    "read_events", "rebuild", "RunImage", "TaskImage",
    # between engines: shared in-flight limits (`Cluster(share_limits=...)`) and wake-ups
    # (the `plait.notifiers` entry points)
    "SlotBroker", "SlotRow", "allot", "LocalSlots", "Notifier",
]  # fmt: skip
