"""The typed context a running task receives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from ..model._clock import Clock
from ..model._llm import DEFAULT_BACKEND, LLMRequest, LLMResponse, Usage
from ._calls import CallSite, LLMCalls, Program

T = TypeVar("T")


class WorkflowEditor(Protocol):
    """The running workflow as a task sees it: read it, and change it while it runs.

    It is the task's own `Workflow` (this protocol names its methods so that the context
    does not depend on the workflow module, which depends on tasks, which take a context)."""

    @property
    def name(self) -> str: ...

    @property
    def id(self) -> str: ...

    def __contains__(self, task_id: object) -> bool: ...

    def __len__(self) -> int: ...

    def add(
        self,
        task_id: str,
        action: Any,
        *,
        after: Iterable[str] = (),
        before: Iterable[str] = (),
        retry: Any = None,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
        when: Callable[[Mapping[str, Any]], bool] | None = None,
        trigger: Any = "all_success",
    ) -> str: ...

    def add_edge(self, source: str, target: str) -> None: ...

    def remove_edge(self, source: str, target: str) -> None: ...

    def remove(self, task_id: str) -> None: ...

    def replace(
        self,
        task_id: str,
        action: Any,
        *,
        retry: Any = None,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
    ) -> None: ...

    def dependencies(self, task_id: str) -> list[str]: ...

    def upstream(self, task_id: str) -> dict[str, Any]: ...

    def dependents(self, task_id: str) -> list[str]: ...


class Caller(Program, Protocol):
    """The run a task belongs to, as its context needs it (a `Run` implements it)."""

    def next_steps(self, task_id: str) -> Sequence[tuple[str, str]]:
        """(label, resource) of the tasks waiting for `task_id`."""
        ...

    def is_last_call(self, task_id: str) -> bool: ...

    def holds_slot(self, task_id: str, backend: str) -> bool: ...


class TaskContext:
    """Given to a task function: its inputs, its workflow (to mutate it), time and the LLM.

    `inputs` maps each dependency's task id to its result (only dependencies that
    succeeded, for tasks with `trigger="all_done"`); `upstream` does so for every task it
    waits for, directly or through others.
    """

    __slots__ = (
        "workflow",
        "task_id",
        "inputs",
        "attempt",
        "clock",
        "usage",
        "llm_calls",
        "_key",
        "_calls",
        "_caller",
        "_to_thread",
        "_upstream",
    )

    def __init__(
        self,
        workflow: WorkflowEditor,
        task_id: str,
        inputs: Mapping[str, Any],
        attempt: int,
        clock: Clock,
        *,
        calls: LLMCalls,
        caller: Caller,
        to_thread: Callable[..., Awaitable[Any]],
    ) -> None:
        self.workflow = workflow
        self.task_id = task_id
        self.inputs = inputs
        self.attempt = attempt
        self.clock = clock
        self.usage = Usage()
        self.llm_calls = 0
        self._calls = calls
        self._caller = caller
        self._to_thread = to_thread
        self._key: str | None = None
        self._upstream: Mapping[str, Any] | None = None

    @property
    def idempotency_key(self) -> str:
        """The task's declared idempotency key, else `workflow id/task id`: the same when
        the task runs again after a crash; hand it to a service that deduplicates."""
        return self._key if self._key is not None else f"{self.workflow.id}/{self.task_id}"

    @idempotency_key.setter
    def idempotency_key(self, key: str) -> None:
        self._key = key

    @property
    def upstream(self) -> Mapping[str, Any]:
        """The results of every task this one waits for, directly or through others (those
        that succeeded), by task id: final before it started, and the same after a resume.
        A step that builds on all of its predecessors reads them here rather than carrying
        them along (an agent loop's turns rebuild the conversation this way)."""
        if self._upstream is None:
            self._upstream = self.workflow.upstream(self.task_id)
        return self._upstream

    def input(self, task_id: str) -> Any:
        """The result of dependency `task_id`, with a clear error if it is not an input."""
        try:
            return self.inputs[task_id]
        except KeyError:
            known = ", ".join(sorted(self.inputs)) or "none"
            raise KeyError(
                f"task {self.task_id!r} has no input {task_id!r} (inputs: {known}); "
                f"add the edge with after=[{task_id!r}]"
            ) from None

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run blocking `fn` in the engine's worker threads (bounded by `Engine(threads=)`)."""
        result: T = await self._to_thread(fn, *args, **kwargs)
        return result

    async def complete(
        self,
        request: LLMRequest,
        *,
        backend: str = DEFAULT_BACKEND,
        expected_output_tokens: int | None = None,
        keep_alive_s: float | None = None,
        last_call: bool = False,
        prefix_key: str | None = None,
    ) -> LLMResponse:
        """Send one LLM call under this task's program priority; usage is added to the task.

        A task that is not itself an LLM task on `backend` (a function running an agent
        loop, say) waits for a slot of that backend first, in the scheduler's order, so the
        backend's `max_in_flight` holds for every call."""
        caller, task_id = self._caller, self.task_id
        site = CallSite(
            task_id,
            holds_slot=caller.holds_slot(task_id, backend),
            next_steps=caller.next_steps(task_id),
            last_call=caller.is_last_call(task_id),
            attempt=self.attempt,
            index=self.llm_calls,
        )
        response = await self._calls.complete(
            caller,
            site,
            request,
            backend,
            expected_output_tokens=expected_output_tokens,
            keep_alive_s=keep_alive_s,
            last_call=last_call,
            prefix_key=prefix_key,
        )
        self.usage = self.usage + response.usage
        self.llm_calls += 1
        return response
