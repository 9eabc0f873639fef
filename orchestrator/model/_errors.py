"""Error roots: `UsageError` for the developer's mistakes, `RunError` for run-time failures.

Every message names the bad value and says what to do about it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._text import storable


class PlaitError(Exception):
    """Root of every error plait raises on purpose."""


class UsageError(PlaitError):
    """The program using plait did something it must not; fix the calling code."""


class RunError(PlaitError):
    """Something went wrong while running; the calling code may retry or report it."""


# --- workflow definition -------------------------------------------------------------------


class DuplicateTaskError(UsageError):
    def __init__(self, workflow: str, task_id: str) -> None:
        super().__init__(
            f"workflow {workflow!r} already has a task {task_id!r}; "
            "give every task a unique id, or use replace() to change an existing one"
        )
        self.task_id = task_id


class UnknownTaskError(UsageError):
    def __init__(self, workflow: str, task_id: str, *, role: str = "task") -> None:
        super().__init__(
            f"workflow {workflow!r} has no task {task_id!r} ({role}); "
            "add that task first, or check the id for a typo"
        )
        self.task_id = task_id


class CycleError(UsageError):
    """A mutation would close a cycle; `cycle` lists the task ids around it."""

    def __init__(self, workflow: str, cycle: Sequence[str]) -> None:
        path = " -> ".join(cycle)
        super().__init__(
            f"workflow {workflow!r} would contain the cycle {path}; "
            "a workflow must stay acyclic: express repetition by adding new tasks at run time"
        )
        self.cycle = tuple(cycle)


class TaskStartedError(UsageError):
    """A mutation tried to change the inputs of a task that has already started."""

    def __init__(self, workflow: str, task_id: str, state: str, action: str) -> None:
        super().__init__(
            f"cannot {action}: task {task_id!r} of workflow {workflow!r} is already {state}; "
            "only tasks that have not started can gain inputs or be replaced"
        )
        self.task_id = task_id


class WorkflowStateError(UsageError):
    def __init__(self, message: str) -> None:
        super().__init__(message)


class UnknownResourceError(UsageError):
    def __init__(self, task_id: str, resource: str, known: Sequence[str]) -> None:
        names = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"task {task_id!r} needs resource {resource!r}, which the engine does not know "
            f"(known: {names}); with plait run, add a [backends.{resource}] table (an LLM "
            f"backend) or [limits.{resource}] to the config file, or return it from the "
            f"module's backends(clock); in Python, pass it to Engine(backends=...) or "
            "Engine(limits=...)"
        )
        self.resource = resource


class ClockMismatchError(UsageError):
    def __init__(self, message: str | None = None) -> None:
        super().__init__(
            message
            or "this VirtualClock is not driving the running event loop; run the engine with "
            "plait's run_sync(..., clock=clock) or clock.run(main()) so virtual time can advance"
        )


# --- run time --------------------------------------------------------------------------------


class TaskTimeoutError(RunError):
    def __init__(self, task_id: str, seconds: float) -> None:
        super().__init__(
            f"task {task_id!r} did not finish within its timeout of {seconds:g} s; "
            "give it more with workflow.add(..., timeout=...) if it needs longer"
        )
        self.task_id = task_id
        self.seconds = seconds


class ResultNotSerializableError(RunError):
    def __init__(self, task_id: str, type_name: str, detail: str) -> None:
        super().__init__(
            f"task {task_id!r} returned a {type_name}, which cannot be stored as JSON ({detail}); "
            "return plain data (str, numbers, lists, dicts, dataclasses or pydantic models)"
        )
        self.task_id = task_id


class DeadlockError(RunError):
    """Virtual time cannot advance: every task waits, and nothing (no timer, no worker
    thread, no I/O) could ever wake one."""

    def __init__(self, waiting: list[str]) -> None:
        names = ", ".join(waiting[:10]) + (" ..." if len(waiting) > 10 else "")
        super().__init__(
            f"deadlock in virtual time: {len(waiting)} task(s) wait and nothing can wake "
            f"them ({names}); give the waits a timeout, or run threads through "
            "ctx.to_thread()/run_in_executor() so the clock knows they are working"
        )
        self.waiting = waiting


class OverloadedError(RunError):
    """A bounded queue is full: the caller should back off and try again later."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} is full ({limit} waiting); retry later or raise its bound")
        self.what = what
        self.limit = limit


class TaskCancelledError(RunError):
    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id!r} was cancelled: {reason}")
        self.task_id = task_id
        self.reason = reason


class BackendError(RunError):
    """An LLM backend failed; adapters translate their library's errors into this.

    `retryable` says whether trying again may help (a 400 will not; a 503 may).
    `retry_after`, when set, is how many seconds to wait at least before trying again.
    """

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        backend: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.backend = backend
        self.status = status
        self.retry_after = retry_after


class BackendUnavailableError(BackendError):
    """The backend could not be reached, or did not answer in time."""


class CircuitOpenError(BackendUnavailableError):
    """The engine stopped sending to a backend that failed too often in a row; it lets one
    probe call through after `retry_after` seconds. Raised without calling the backend."""

    def __init__(
        self, backend: str, failures: int, retry_after: float, *, waited_s: float | None = None
    ) -> None:
        message = (
            f"circuit open for backend {backend!r} after {failures} consecutive failures; "
            f"retry in {retry_after:.3g} s (Engine(breaker=Breaker(...)) sets the threshold "
            "and cooldown)"
        )
        if waited_s is not None:
            message = (
                f"backend {backend!r} is down for longer than calls wait for it "
                "(Breaker(wait_s=...), plait batch run --backend-wait): "
                f"{failures} consecutive failures over {waited_s:.0f} s; check the server, "
                "then run the work again"
            )
        super().__init__(message, backend=backend, retry_after=retry_after)
        self.failures = failures
        if waited_s is not None:
            self.retryable = False  # calls waited as long as they may: no retry helps now


class BackendOverloadedError(BackendError):
    """The backend said it is busy (429, 503): back off, at least `retry_after` seconds."""


class BackendRequestError(BackendError):
    """The backend refused the request as malformed (4xx): retrying cannot help."""

    retryable = False


class WorkflowFailedError(RunError):
    """Raised by `RunResult.raise_for_status()`; `failures` maps task id to its error text."""

    def __init__(self, workflow: str, status: str, failures: dict[str, str]) -> None:
        lines = "".join(f"\n  {task}: {error}" for task, error in failures.items())
        super().__init__(f"workflow {workflow!r} {status} with {len(failures)} failure(s):{lines}")
        self.workflow = workflow
        self.failures = failures


class RecordedFailure(RunError):
    """A task's failure as its run's log recorded it: how a resumed run holds a failure
    that happened in an earlier process (`text` reads as `error_text` gave it then)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def error_text(error: BaseException) -> str:
    """How a task's failure reads in events, results and the CLI: its type, then its message
    (`ValueError: bad row 3`), so `KeyError: 'x'` is not just `'x'`. Text the store cannot
    hold (a lone surrogate, NUL) is written as its escape: a message is always recorded."""
    if isinstance(error, RecordedFailure):
        return error.text
    message = storable(str(error))
    name = type(error).__name__
    return f"{name}: {message}" if message else name
