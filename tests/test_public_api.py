"""The public surface is small and pinned, and the packages depend one way only."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "orchestrator": {
        "DEFAULT_BACKEND", "DEFAULT_FUNCTION_RESOURCE", "DEFAULT_TOOL_RESOURCE", "EVENT_ADAPTER",
        "FINAL_STATES",
        "Action", "BackendError", "BackendOverloadedError", "BackendRequestError",
        "BackendUnavailableError", "Clock", "ClockMismatchError", "CycleError",
        "DeadlineMissed", "DeadlockError",
        "DuplicateTaskError", "EdgeAdded", "EdgeRemoved", "Engine", "EngineStats", "Event",
        "Fcfs", "FunctionAction", "Hints", "LLMBackend", "LLMCall", "LLMRequest", "LLMResponse",
        "Las", "Limits", "Message", "OverloadedError", "PlaitError", "Policy", "PriorityClass",
        "ProgramView", "ReadyTask", "ResourceStats", "ResultNotSerializableError", "Retry",
        "Role", "RunError", "RunHandle", "RunResult", "Sampling", "Slack", "SystemClock", "Task",
        "TaskAdded", "TaskCancelled", "TaskCancelledError", "TaskContext", "TaskFailed",
        "TaskReady", "TaskRemoved", "TaskReplaced", "TaskRetrying", "TaskSkipped", "TaskStarted",
        "TaskStartedError", "TaskState", "TaskSucceeded", "TaskTimeoutError", "ToolCall",
        "ToolSpec", "Trigger", "UnknownResourceError", "UnknownTaskError", "Usage", "UsageError",
        "VirtualClock", "WallClockBackend", "Workflow", "WorkflowFailedError", "WorkflowFinished",
        "WorkflowStarted",
        "WorkflowStateError", "WorkflowStatus", "get_policy", "order", "order_programs",
        "remaining_critical_path", "run_sync", "running_clock", "urgency",
        "BackendKind", "Config", "ConfigSection", "load_config",
        "KeepAlive", "PausePredictor", "CacheBudget",
        "Breaker", "CallRetry", "CallRetrying", "CircuitBreaker", "CircuitOpenError",
        "CircuitState",
        "Capabilities", "FailureIsolating", "HealthChecked", "LoadReport", "LoadReporting",
        "ProgramAware", "capabilities",
        "CallRecord", "EventRecord", "Journal", "JournalStats", "Store", "StoreBatch",
        "StoreError", "StoreSize", "StoreVersionError", "WorkflowRow", "payload_digest",
        "read_events", "restore",
    },
    "executors": {
        "DIALECTS", "PROFILES", "Choice", "FunctionLLM", "OpenAIBackend", "PrefixRouter",
        "Profile", "RecordedCall", "ReplicaStats", "RequestTooLongError", "Router", "SimHTTP",
        "SimServer", "SimStats", "approx_tokens", "echo", "get_profile",
        "backends_from_config",
        "GroupingStats", "PrefixGrouper",
        "LoadReport",
        "Faults",
    },
    "agents": {"Agent", "Prompt", "Tool", "ToolAction"},
    "memory": {"SQLStore", "store_url"},
}  # fmt: skip


@pytest.mark.parametrize("package", sorted(EXPECTED))
def test_public_names_are_pinned(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == EXPECTED[package]
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.__all__ lists {name} but it is missing"


@pytest.mark.parametrize("package", sorted(EXPECTED))
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
                assert rest == "", f"{where}: use `from orchestrator import ...` only"
            assert top not in others, f"{where}: packages beside orchestrator stay independent"


def test_orchestrator_imports_none_of_the_packages_that_build_on_it() -> None:
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        for module in imports_of(path):
            top = module.partition(".")[0]
            assert top not in {"agents", "executors", "memory"}, f"{path} imports {module}"
