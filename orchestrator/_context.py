"""The typed context a running task receives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ._clock import Clock
from ._llm import LLMRequest, LLMResponse, Usage
from ._task import DEFAULT_BACKEND

if TYPE_CHECKING:
    from ._workflow import Workflow

T = TypeVar("T")


class _Runtime(Protocol):
    """What a context needs from the engine; implemented by the engine's run state."""

    async def complete(
        self,
        ctx: TaskContext,
        request: LLMRequest,
        backend: str,
        *,
        expected_output_tokens: int | None,
        keep_alive_s: float | None,
        last_call: bool,
        prefix_key: str | None,
    ) -> LLMResponse: ...

    def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...


class TaskContext:
    """Given to a task function: its inputs, its workflow (to mutate it), time and the LLM.

    `inputs` maps each dependency's task id to its result (only dependencies that
    succeeded, for tasks with `trigger="all_done"`).
    """

    __slots__ = ("workflow", "task_id", "inputs", "attempt", "clock", "usage", "llm_calls", "_rt")

    def __init__(
        self,
        workflow: Workflow,
        task_id: str,
        inputs: Mapping[str, Any],
        attempt: int,
        clock: Clock,
        runtime: _Runtime,
    ) -> None:
        self.workflow = workflow
        self.task_id = task_id
        self.inputs = inputs
        self.attempt = attempt
        self.clock = clock
        self.usage = Usage()
        self.llm_calls = 0
        self._rt = runtime

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
        return await self._rt.to_thread(fn, *args, **kwargs)

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
        response = await self._rt.complete(
            self,
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
