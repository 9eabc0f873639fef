"""Tasks and the actions they run: a Python function, an LLM call, or anything with `run(ctx)`.

A `Task` is a definition (what to run and how: retries, timeout, resource); a `TaskRun` is
its state in one run of its workflow, owned and written by that run alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

from ._errors import ResultNotSerializableError, UsageError
from ._events import ActionSpec, TaskOptions, TaskState
from ._llm import DEFAULT_BACKEND, DEFAULT_FUNCTION_RESOURCE, DEFAULT_TOOL_RESOURCE, LLMRequest
from ._runner import Runner, runner_spec
from ._text import MAX_NESTING, first_unstorable, key_text

if TYPE_CHECKING:
    from ..engine._context import TaskContext


__all__ = ["DEFAULT_BACKEND", "DEFAULT_FUNCTION_RESOURCE", "DEFAULT_TOOL_RESOURCE"]

Trigger = Literal["all_success", "all_done"]
"""all_success: run only if every input succeeded (otherwise skip);
all_done: run once every input is final, with the inputs that succeeded."""


@runtime_checkable
class Action(Protocol):
    """What a task does. `resource` names the limiter that admits it."""

    @property
    def resource(self) -> str: ...

    @property
    def label(self) -> str:
        """A short description for events and progress views."""
        ...

    def run(self, ctx: TaskContext) -> Awaitable[Any]: ...


@runtime_checkable
class Describable(Protocol):
    """An action that says what it runs as data (`ActionSpec`), so the event log can
    rebuild it. Actions without it are described by their class."""

    @property
    def spec(self) -> ActionSpec: ...


_DESCRIBABLE: dict[type, bool] = {}
"""Whether a class's actions are `Describable`, checked once per class: a runtime protocol
check costs 15-20 us, and every task added to a run is described."""


def describe(action: Action) -> ActionSpec:
    """The action's `ActionSpec` (its own, or `custom` named by its class)."""
    if isinstance(action, FunctionAction | LLMCall):  # the common ones, without a protocol check
        return action.spec
    cls = type(action)
    describable = _DESCRIBABLE.get(cls)
    if describable is None:
        describable = _DESCRIBABLE[cls] = isinstance(action, Describable)
    if describable:
        return cast(Describable, action).spec
    return ActionSpec("custom", f"{cls.__module__}:{cls.__qualname__}")


def registered_name(fn: object) -> str:
    """`module:qualname` of a function: how a registry finds it again (a lambda or a
    function defined inside another has a name no registry can import)."""
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{qualname}"


@functools.lru_cache(maxsize=4096)
def _shape(fn: Callable[..., Any]) -> tuple[bool, bool]:
    """(is it async, does it take the context); cached because inspect is slow."""
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ on an object
    )
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return is_async, True
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    required = [p for p in positional if p.default is p.empty and p.kind != p.VAR_POSITIONAL]
    if len(required) > 1:
        raise UsageError(
            f"task function {getattr(fn, '__qualname__', fn)!r} takes {len(required)} required "
            "arguments; a task function takes the TaskContext or nothing "
            "(read dependency results from ctx.inputs)"
        )
    return is_async, bool(positional)


class FunctionAction:
    """Runs a Python function, sync or async, taking the `TaskContext` or nothing.

    Sync functions run in a worker thread so a slow one cannot stall the loop. With a
    `runner` (a Ray cluster, say) a sync function runs there instead, where it cannot
    reach the engine: it takes the dependency results (`ctx.inputs`, as a dict) or nothing.
    """

    __slots__ = ("_fn", "_is_async", "_takes_ctx", "_resource", "_runner", "_spec")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        resource: str = DEFAULT_FUNCTION_RESOURCE,
        runner: Runner | None = None,
    ):
        if not callable(fn):
            raise UsageError(f"a task needs a callable or an Action, got {type(fn).__name__}")
        self._fn = fn
        try:
            self._is_async, self._takes_ctx = _shape(fn)
        except TypeError:  # an unhashable callable object: inspect it without the cache
            self._is_async, self._takes_ctx = _shape.__wrapped__(fn)
        if runner is not None and not isinstance(runner, Runner):
            raise UsageError(
                f"task function {_name(fn)!r}: runner must be a Runner "
                f"(executors.RayRunner(...), say), got {type(runner).__name__} {runner!r}"
            )
        if runner is not None and self._is_async:
            raise UsageError(
                f"task function {_name(fn)!r} is async, and the {runner.kind!r} runner runs "
                "plain functions in another process; make it a plain def (or run it without "
                "a runner)"
            )
        self._resource = resource
        self._runner = runner
        self._spec: ActionSpec | None = None

    @property
    def resource(self) -> str:
        return self._resource

    @property
    def runner(self) -> Runner | None:
        """Where the function runs, when not in the engine's threads."""
        return self._runner

    @property
    def label(self) -> str:
        where = "" if self._runner is None else f" on {self._runner.kind}"
        return f"function {_name(self._fn)}{where}"

    @property
    def spec(self) -> ActionSpec:
        if self._spec is None:
            args = {} if self._runner is None else {"runner": runner_spec(self._runner)}
            self._spec = ActionSpec("function", registered_name(self._fn), args)
        return self._spec

    async def run(self, ctx: TaskContext) -> Any:
        fn = self._fn
        if self._runner is not None:
            if self._takes_ctx:
                return await self._runner.call(ctx, fn, dict(ctx.inputs))
            return await self._runner.call(ctx, fn)
        if self._is_async:
            return await (fn(ctx) if self._takes_ctx else fn())
        if self._takes_ctx:
            return await ctx.to_thread(fn, ctx)
        return await ctx.to_thread(fn)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


@dataclass(frozen=True, slots=True)
class LLMCall:
    """An LLM call: `build` turns the task's context (its inputs) into the request.

    Agents make these with `agent.ask(...)`; the task's result is the response text.
    """

    build: Callable[[TaskContext], LLMRequest]
    backend: str = DEFAULT_BACKEND
    label: str = "llm call"
    expected_output_tokens: int | None = None
    description: ActionSpec | None = None
    """What the call is, as data (an agent's name, its prompt); `Agent.ask` fills it in."""

    @property
    def resource(self) -> str:
        return self.backend

    @property
    def spec(self) -> ActionSpec:
        if self.description is not None:
            return self.description
        return ActionSpec("llm", registered_name(self.build), {"backend": self.backend})

    async def run(self, ctx: TaskContext) -> Any:
        request = self.build(ctx)
        response = await ctx.complete(
            request, backend=self.backend, expected_output_tokens=self.expected_output_tokens
        )
        return response.text


@dataclass(frozen=True, slots=True)
class Retry:
    """How often to try a task and how long to wait in between (exponential, jittered).

    `attempts` counts the first try. Errors of the types in `on` are retried, except
    `UsageError`s, which retrying cannot fix.
    """

    attempts: int = 1
    initial_delay: float = 0.5
    max_delay: float = 30.0
    jitter: float = 0.5
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"Retry(attempts={self.attempts}) must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.jitter < 0:
            raise UsageError("Retry delays and jitter must not be negative")

    def should_retry(self, error: BaseException) -> bool:
        if not getattr(error, "retryable", True):
            return False  # e.g. a backend's 400: the same request fails the same way
        return isinstance(error, self.on) and not isinstance(
            error,
            UsageError | ResultNotSerializableError | asyncio.CancelledError | KeyboardInterrupt,
        )


NO_RETRY = Retry()

Condition = Callable[[Mapping[str, Any]], bool]
KeyFrom = Callable[[Mapping[str, Any]], str]
"""Builds a task's idempotency key from its inputs."""


class Task:
    """One node of a workflow, as defined: its action and its settings, which running it
    never changes (`Workflow.replace` puts a new one in its place); its state in a run is
    its `TaskRun`."""

    __slots__ = (
        "id",
        "action",
        "retry",
        "timeout",
        "resource",
        "estimate",
        "when",
        "trigger",
        "idempotent",
        "idempotency_key",
    )

    def __init__(
        self,
        task_id: str,
        action: Action,
        *,
        retry: Retry = NO_RETRY,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
        when: Condition | None = None,
        trigger: Trigger = "all_success",
        idempotent: bool = True,
        idempotency_key: str | KeyFrom | None = None,
    ) -> None:
        check_seconds(f"task {task_id!r}", "timeout", timeout)
        check_seconds(f"task {task_id!r}", "estimate", estimate, zero_ok=True)
        if resource is not None and (not isinstance(resource, str) or not resource):
            raise UsageError(
                f"task {task_id!r}: resource must be a non-empty string (a backend or limit "
                f"name), got {type(resource).__name__} {resource!r}"
            )
        if when is not None and not callable(when):
            raise UsageError(
                f"task {task_id!r}: when must be a function of the inputs returning a bool, "
                f"got {type(when).__name__} {when!r}"
            )
        if trigger not in ("all_success", "all_done"):
            raise UsageError(
                f"task {task_id!r}: trigger must be 'all_success' or 'all_done', got {trigger!r}"
            )
        if not isinstance(idempotent, bool):
            raise UsageError(
                f"task {task_id!r}: idempotent must be True or False, got {idempotent!r}"
            )
        if idempotency_key is not None and not (
            (isinstance(idempotency_key, str) and idempotency_key) or callable(idempotency_key)
        ):
            raise UsageError(
                f"task {task_id!r}: idempotency_key must be a non-empty string or a function "
                f"of the inputs returning one, got {type(idempotency_key).__name__} "
                f"{idempotency_key!r}"
            )
        self.id = task_id
        self.action = action
        self.retry = retry
        self.timeout = timeout
        self.resource = resource or action.resource
        self.estimate = estimate
        self.when = when
        self.trigger: Trigger = trigger
        self.idempotent = idempotent
        self.idempotency_key = idempotency_key

    def __repr__(self) -> str:
        return f"Task({self.id!r}, {self.action.label!r})"

    def key_for(self, inputs: Mapping[str, Any]) -> str | None:
        """The task's declared idempotency key for these inputs, or None."""
        key = self.idempotency_key
        if key is None or isinstance(key, str):
            return key
        built = key(inputs)
        if not isinstance(built, str) or not built:
            raise UsageError(
                f"task {self.id!r}: its idempotency_key function returned "
                f"{type(built).__name__} {built!r}; it must return a non-empty string"
            )
        return built

    def options(self) -> TaskOptions:
        retry, key = self.retry, self.idempotency_key
        return TaskOptions(
            retry=retry.attempts,
            retry_delay=(retry.initial_delay, retry.max_delay, retry.jitter),
            timeout=self.timeout,
            resource=self.resource,
            estimate=self.estimate,
            trigger=self.trigger,
            when=None if self.when is None else registered_name(self.when),
            idempotent=self.idempotent,
            idempotency_key=key if isinstance(key := self.idempotency_key, str) else None,
            idempotency_key_from=None
            if key is None or isinstance(key, str)
            else registered_name(key),
        )


class TaskRun:
    """A task's state in one run: written by that run (`Run`) alone, read by anyone.

    `state` moves pending -> ready -> running (<-> waiting between attempts) -> one of the
    final states; `waiting_on` counts its dependencies that are not final yet."""

    __slots__ = (
        "task",
        "resource",
        "state",
        "result",
        "error",
        "reason",
        "attempts",
        "started_at",
        "ready_seq",
        "waiting_on",
        "handle",
        "cancel_reason",
        "removed",
        "mark",
    )

    def __init__(self, task: Task) -> None:
        self.task = task
        self.resource = task.resource
        self.state: TaskState = "pending"
        self.result: Any = None
        self.error: BaseException | None = None
        self.reason: str | None = None
        self.attempts = 0
        self.started_at: float | None = None
        self.ready_seq = 0
        self.waiting_on = 0
        self.handle: asyncio.Task[Any] | None = None
        self.cancel_reason: str | None = None
        self.removed = False
        """Removed from its workflow while it ran: its end is not told again."""
        self.mark = 0
        """In a durable engine, the journal's count of records once this task's costly
        result (an LLM call's, a non-idempotent task's) was appended: its dependents wait
        for that many to be committed before they start."""

    @property
    def id(self) -> str:
        return self.task.id

    def __repr__(self) -> str:
        return f"TaskRun({self.task.id!r}, state={self.state!r}, attempts={self.attempts})"


def as_action(action: Action | Callable[..., Any]) -> Action:
    # Duck-typed on purpose: isinstance() against a runtime protocol costs microseconds,
    # and workflows of 100,000 tasks add one action each.
    if hasattr(action, "run") and hasattr(action, "resource"):
        return action  # type: ignore[return-value]
    return FunctionAction(action)


def as_retry(retry: Retry | int | None, task_id: str = "?") -> Retry:
    if retry is None:
        return NO_RETRY
    if isinstance(retry, Retry):
        return retry
    if isinstance(retry, bool) or not isinstance(retry, int):
        raise UsageError(
            f"task {task_id!r}: retry must be a number of attempts (an int, e.g. retry=3) or "
            f"a Retry(...), got {type(retry).__name__} {retry!r}"
        )
    return Retry(attempts=retry)


def check_seconds(owner: str, name: str, value: object, *, zero_ok: bool = False) -> None:
    """Seconds must be real, finite numbers: a string such as "5" fails where it is given
    (`add`, `submit`), not as a TypeError deep in the run. `owner` names what they belong to."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(
            f"{owner}: {name} must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "zero or more" if zero_ok else "more than zero"
        raise UsageError(f"{owner}: {name} must be finite and {bound}, got {value!r}")


_PLAIN = (str, int, float, bool, type(None))


def check_serializable(task_id: str, value: Any) -> None:
    """Refuse results that the event log could not store exactly (checked when the task
    ends): see `first_unstorable` for what is held (NaN, bytes, sets, non-str keys, lone
    surrogates and NUL are not).

    The check never consumes or alters the value: a one-shot iterator (a generator, `map`,
    `zip`, ...) anywhere in it is refused before anything is serialised, because turning it
    into JSON would empty it for the dependents that read it next."""
    if value is None or type(value) is int or type(value) is bool:
        return
    if not isinstance(value, _PLAIN):
        one_shot = _find_iterator(value, set())
        if one_shot is not None:
            raise ResultNotSerializableError(
                task_id,
                type(value).__name__,
                f"it holds a one-shot iterator ({type(one_shot).__name__}) that could be read "
                "only once; return list(...) of it instead",
            )
    found = first_unstorable(value, "result")
    if found is not None:
        path, problem = found
        raise ResultNotSerializableError(task_id, type(value).__name__, f"{path}: {problem}")


def recording_problem(task: Task) -> str | None:
    """What in the task a log could not record exactly (an id, an argument or a key with a
    lone surrogate or NUL, an argument that is not JSON data), naming the task; or None."""
    spec = describe(task.action)
    told: dict[str, Any] = {"id": task.id, "name": spec.name, "args": spec.args}
    if isinstance(key := task.idempotency_key, str):
        told["idempotency_key"] = key
    found = first_unstorable(told)
    if found is None:
        return None
    return f"task {key_text(task.id)!r}: {found[0]}: {found[1]}"


def _find_iterator(value: Any, seen: set[int], depth: int = 0) -> Any:
    """The first one-shot iterator inside `value` (containers, dataclasses, pydantic models),
    looked for no deeper than the store holds (`first_unstorable` refuses what is deeper)."""
    if isinstance(value, _PLAIN) or id(value) in seen or depth > MAX_NESTING:
        return None
    if isinstance(value, Iterator):
        return value
    seen.add(id(value))
    children: Iterable[Any]
    if isinstance(value, Mapping):
        children = list(value.keys()) + list(value.values())
    elif isinstance(value, list | tuple | set | frozenset):
        children = value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = [getattr(value, f.name) for f in dataclasses.fields(value)]
    elif hasattr(value, "__pydantic_fields__") and not isinstance(value, type):
        children = [getattr(value, name, None) for name in type(value).__pydantic_fields__]
    else:
        return None
    for child in children:
        found = _find_iterator(child, seen, depth + 1)
        if found is not None:
            return found
    return None
