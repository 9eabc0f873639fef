"""The public surface is small and pinned, and the packages depend one way only."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "orchestrator": {
        "Workflow", "Task", "TaskContext", "Retry", "Template", "Engine", "RunHandle", "RunResult",
        "run_sync", "Registry", "ResumePlan", "ResumeReport",
        "Clock", "SystemClock", "VirtualClock",
        "Config", "load_config", "Limits", "KeepAlive", "CallRetry",
        "Breaker", "Retention", "Cluster", "EngineStats",
        "LLMBackend", "LLMRequest", "LLMResponse", "Message", "Hints", "ToolCall", "Usage",
        "PlaitError", "UsageError", "RunError", "CycleError", "DeadlockError", "DuplicateTaskError",
        "OverloadedError", "ResultNotSerializableError", "TaskStartedError", "TaskTimeoutError",
        "UnknownResourceError", "UnknownTaskError", "WorkflowFailedError", "CircuitOpenError",
        "BackendError", "StoreError", "StoreVersionError",
        "Event", "EVENT_ADAPTER", "WorkflowStarted", "WorkflowResumed", "WorkflowFinished",
        "TaskAdded", "TaskReplaced", "TaskRemoved", "EdgeAdded", "EdgeRemoved", "TaskReady",
        "TaskStarted", "TaskRetrying", "CallRetrying", "TaskSucceeded", "TaskFailed", "TaskSkipped",
        "TaskCancelled", "DeadlineMissed", "DeadlineHopeless",
    },
    "orchestrator.ext": {
        "Action", "Describable", "ActionSpec", "FunctionAction", "LLMCall", "WorkflowEditor",
        "registered_name", "Rebuildable", "Composite", "RebuildError",
        "DEFAULT_BACKEND", "DEFAULT_FUNCTION_RESOURCE", "DEFAULT_TOOL_RESOURCE",
        "Runner",
        "Sampling", "ToolSpec", "OutputSchema",
        "BackendOverloadedError", "BackendRequestError", "BackendUnavailableError",
        "HealthChecked", "LoadReporting", "LoadReport", "ProgramAware", "FailureIsolating",
        "CapacityReporting", "ServerCapacity",
        "UrgentIsolating", "WallClockBackend", "WrappedBackend",
        "ServiceClass", "URGENT_CLASSES",
        "BackendKind", "ConfigSection",
        "running_clock", "use_tracer_provider",
        "AdmissionTuning", "Policy", "ProgramView", "Headroom", "DeadlineGate", "KneeController",
        "Store", "StoreBatch", "CallRecord", "EventRecord", "WorkflowRow", "WorkflowStatus",
        "Claimed", "StoreSize", "BatchRefusedError", "LeaseLostError", "TextNotStorableError",
        "WorkflowExistsError", "unstorable", "compactable",
        "RetainingStore", "LeaseStore", "CancelStore", "KeyStore",
        "read_events", "rebuild", "RunImage", "TaskImage",
        "SlotBroker", "SlotRow", "allot", "LocalSlots", "Notifier",
    },
    "executors": {
        "DIALECTS", "PROFILES", "Choice", "FunctionLLM", "OpenAIBackend", "PrefixRouter",
        "Profile", "RecordedCall", "ReplicaStats", "RequestTooLongError", "Router", "SimHTTP",
        "SimServer", "SimStats", "approx_tokens", "echo", "get_profile",
        "backends_from_config",
        "GroupingStats", "PrefixGrouper", "LaneTuning", "NO_LANES",
        "LoadReport",
        "Faults",
        "RayCluster", "RayError", "RayRunner", "RayWorkerLostError", "ray_task",
        "LocalRouterHub", "NotifierRouterLink", "PeerStats", "Placed", "Placement",
        "RouterLink", "Served",
    },
    "agents": {
        "TOOL_ERROR", "Agent", "AgentStopped", "Bid", "ConversationLog", "LoopLimits", "Prompt",
        "StructuredAsk", "Tool", "ToolAction", "ToolArgumentsError", "ToolUse", "llm_bid", "tool",
        # MCP servers as tools
        "MCPServerError", "MCPTools", "mcp_tools",
        # the blackboard
        "Answer", "Answered", "Awarded", "Board", "BoardEvent", "BoardStats", "BoardStore",
        "Claim", "ClaimLostError", "Helper", "MemoryBoardStore", "Offer", "Post", "PostFailed",
        "PostFailedError", "Posted", "Released", "Volunteer", "award",
        # peer messages
        "DEFAULT_TENANT", "Address", "Delivery", "InProcessMailStore", "MailScopeError",
        "MailStats", "MailStore", "MessageId", "MessageNotJSONError", "MessageTooLargeError",
        "PostOffice",
    },
    "memory": {
        "SQLStore", "store_url", "SQLBoardStore", "SQLMailStore",
        "Embedder", "EmbedderError", "Fact", "Hit", "Memory", "MemoryQueryError",
        "MemoryValueError", "Note", "Scope", "Turn", "PgNotifier", "RedisNotifier",
    },
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_public_names_are_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPECTED[package]
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ lists {name} but it is missing"


@pytest.mark.parametrize("package", sorted(name for name in EXPECTED if "." not in name))
def test_each_package_ships_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


@pytest.mark.parametrize("package", ["agents", "executors", "memory"])
def test_packages_import_only_orchestrators_public_names(package: str) -> None:
    others = {"agents", "executors", "memory"} - {package}
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in imports_of(path):
            top, _, rest = module.partition(".")
            where = f"{path.relative_to(ROOT)} imports {module}"
            if top == "orchestrator":
                assert rest in {"", "ext"}, f"{where}: import from orchestrator or orchestrator.ext"
            assert top not in others, f"{where}: packages beside orchestrator stay independent"


def test_orchestrator_imports_none_of_the_packages_that_build_on_it() -> None:
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        for module in imports_of(path):
            top = module.partition(".")[0]
            assert top not in {"agents", "executors", "memory"}, f"{path} imports {module}"


def internal_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, by their dotted names inside it
    (`engine._engine`), relative imports and imports under `if TYPE_CHECKING:` included
    (ast.walk sees every import statement). A name imported from a package's face
    (`from . import x`) counts as the package."""
    graph: dict[str, set[str]] = {}
    root = ROOT / package
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        inside = parts[:-1] if parts[-1] == "__init__" else parts
        name = ".".join(inside) or "__init__"
        here = inside if parts[-1] == "__init__" else inside[:-1]
        edges = graph.setdefault(name, set())
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[: len(here) - (node.level - 1)]
                if node.module:
                    edges.add(".".join([*base, node.module]))
                    continue
                for alias in node.names:  # `from . import x`: a module, or the face's name
                    module = root.joinpath(*base, f"{alias.name}.py")
                    edges.add(
                        ".".join([*base, alias.name])
                        if module.is_file()
                        else ".".join(base) or "__init__"
                    )
            elif isinstance(node, ast.ImportFrom) and node.module:
                top, _, rest = node.module.partition(".")
                if top == package and rest:
                    edges.add(rest)
        edges.discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", ["orchestrator", "executors", "agents", "memory"])
def test_no_import_cycles_inside_a_package(package: str) -> None:
    graph = internal_imports(package)
    assert graph, f"no modules read in {package}"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle or [])}"


def test_the_engine_and_a_run_do_not_import_each_other() -> None:
    graph = internal_imports("orchestrator")
    assert "engine._run" in graph["engine._engine"]
    assert "engine._engine" not in graph["engine._run"]
    assert "engine._engine" not in graph["engine._calls"]


def state_writes(package: str) -> set[tuple[str, str, str]]:
    """(module, function, object) of every `obj.state = ...` in the package's modules."""
    found: set[tuple[str, str, str]] = set()
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = [
                        t for target in node.targets
                        for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                    ]  # fmt: skip
                elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                    targets = [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr == "state":
                        found.add((path.stem, func.name, ast.unparse(target.value)))
    return found


def test_a_tasks_state_is_written_in_one_place() -> None:
    """`TaskRun.state` changes in `Run._move` alone; the other writes are not a task's run
    state: an admission `Ticket` (a call waiting for a slot), an outcome, a replayed image."""
    writes = state_writes("orchestrator")
    assert ("_run", "_move", "record") in writes
    assert {w for w in writes if w[:2] != ("_run", "_move")} == {
        ("_task", "__init__", "self"),  # TaskRun starts pending
        ("_queue", "__init__", "self"),  # Ticket starts ready
        ("_calls", "slot", "ticket"),
        ("_engine", "_admit", "item"),  # a Ticket: tasks go to Run.begin
        ("_engine", "__init__", "self"),  # an _Outcome says how a task ended
        ("_replay", "_apply", "old"),  # a TaskImage, folded from events
        ("_replay", "_apply", "task"),
        ("_replay", "_apply", "tasks[event.task]"),
        ("_batches", "_run", "batch"),  # a REST batch's state, not a task's
        ("_batches", "cancel", "batch"),
        ("_batches", "start", "batch"),
    }
