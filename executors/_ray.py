"""The Ray runner: function and tool tasks that run as Ray tasks on a cluster.

    async with RayCluster("127.0.0.1:6379"):              # ray.init, off the event loop
        async with Engine() as engine:
            wf.add("primes", ray_task(count_primes, num_cpus=2))
            wf.add("score", score.call({"text": "..."}))  # Tool(..., runner=RayRunner(...))

What runs where: the engine, its scheduler and every `TaskContext` stay in this process; only
the task's function goes to the cluster, pickled by Ray (by reference to its module, which
must import on the workers, or by value for functions of `__main__`), with its arguments: a
function task's dependency results, a tool's arguments. Ray is imported only when a cluster
is opened or a Ray task runs, so `import executors` works without it.

Failures: an exception the function raises comes back as itself (its type and message, the
remote traceback in a note), so the task's `retry=` treats it as a local one. A worker that
dies under a task (killed, out of memory, its node lost) is Ray's to retry, `max_retries`
times; after that the task fails with `RayWorkerLostError`, which plait's `retry=` retries.
Cancelling the task (its timeout, a cancelled run) cancels the Ray task and kills the worker
running it, so a cancelled task frees its CPUs at once, C extensions included.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.machinery
import inspect
import math
import pickle
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from orchestrator import RunError, TaskContext, UsageError, VirtualClock
from orchestrator.ext import DEFAULT_FUNCTION_RESOURCE, FunctionAction

INSTALL = "pip install 'plait[ray]'"


class RayError(RunError):
    """Ray could not run a task, for a reason other than the task's own exception.

    `retryable` says whether the task's `retry=` may try it again (a task no node can ever
    place, or a broken `runtime_env`, fails the same way again)."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class RayWorkerLostError(RayError):
    """The Ray worker running a task died (killed, out of memory, its node lost) and Ray's
    own retries (`max_retries`) are used up; the task's `retry=` may run it again."""


def import_ray(what: str) -> Any:
    """The `ray` module, or a `UsageError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"{what} needs Ray, which is not installed: {INSTALL}") from None
    return ray


@dataclass(frozen=True, slots=True)
class RayRunner:
    """Runs a task's function as a Ray task with the resources it declares.

    `num_cpus`, `num_gpus`: what one call holds while it runs (Ray places it on a node
    with that much free, and queues it until one has). `memory`: bytes it may use, for
    placement; None declares none. `resources`: custom resources (`{"highmem": 1}`).
    `max_retries`: how often Ray itself runs the call again when the worker running it dies;
    the function's own exceptions are never retried by Ray (the task's `retry=` does that).

    The function must be a plain (not async) function; it receives plain arguments and no
    `TaskContext`. Connect the process to a cluster first (`RayCluster`, or `ray.init`)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    max_retries: int = 3

    def __post_init__(self) -> None:
        _check_amount("num_cpus", self.num_cpus)
        _check_amount("num_gpus", self.num_gpus)
        if self.memory is not None and (
            isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory < 1
        ):
            raise UsageError(
                f"RayRunner(memory={self.memory!r}) must be a number of bytes (an int, "
                "e.g. 2 * 1024**3), or None"
            )
        if not isinstance(self.resources, Mapping):
            raise UsageError(
                f"RayRunner(resources={self.resources!r}) must map resource names to amounts"
            )
        for name, amount in self.resources.items():
            if name in ("CPU", "GPU", "memory"):
                raise UsageError(
                    f"RayRunner(resources={{{name!r}: ...}}): declare {name} with "
                    "num_cpus=, num_gpus= or memory= instead"
                )
            _check_amount(f"resources[{name!r}]", amount)
        if (
            isinstance(self.max_retries, bool)
            or not isinstance(self.max_retries, int)
            or self.max_retries < 0
        ):
            raise UsageError(
                f"RayRunner(max_retries={self.max_retries!r}) must be 0 or more (Ray's -1, "
                "retry forever, would let a crashing task run for ever)"
            )

    @property
    def kind(self) -> str:
        return "ray"

    def settings(self) -> dict[str, Any]:
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "memory": self.memory,
            "resources": dict(self.resources),
            "max_retries": self.max_retries,
        }

    def options(self, name: str) -> dict[str, Any]:
        """The Ray task options of a call named `name`."""
        options: dict[str, Any] = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "name": name,
        }
        if self.memory is not None:
            options["memory"] = self.memory
        if self.resources:
            options["resources"] = dict(self.resources)
        return options

    async def call(
        self, ctx: TaskContext, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run `fn(*args, **kwargs)` as a Ray task and return its result."""
        ray = import_ray(f"task {ctx.task_id!r} (a Ray task)")
        if not ray.is_initialized():
            raise UsageError(
                f"task {ctx.task_id!r} runs on Ray, but this process is not connected to a Ray "
                "cluster; open one around the engine: async with RayCluster(address): ... "
                "(or call ray.init yourself)"
            )
        if isinstance(ctx.clock, VirtualClock):
            raise UsageError(
                f"task {ctx.task_id!r} runs on Ray, which takes wall time that a VirtualClock "
                "cannot see; run the engine on the system clock"
            )
        name = f"{ctx.workflow.name}/{ctx.task_id}"
        try:
            remote = _remote(fn)
        except TypeError:  # an unhashable callable object: made without the cache
            remote = _remote.__wrapped__(fn)
        remote = remote.options(**self.options(name))
        # Submitting pickles the function and arguments and may reach the cluster (the
        # first call of a function exports it), so it runs in a thread, not on the loop.
        submitted = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(_submit, remote, ctx.task_id, args, kwargs)
        )
        try:
            ref = await asyncio.shield(submitted)
        except asyncio.CancelledError:
            submitted.add_done_callback(functools.partial(_cancel_submitted, ray))
            raise
        try:
            return await ref
        except asyncio.CancelledError:
            _cancel(ray, ref)
            raise
        except ray.exceptions.RayTaskError as exc:
            raise _remote_error(ray, exc, name) from None
        except ray.exceptions.RayError as exc:
            raise _ray_error(ray, exc, ctx.task_id, _name(fn), self.max_retries) from exc


def ray_task(
    fn: Callable[..., Any],
    *,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    memory: int | None = None,
    resources: Mapping[str, float] | None = None,
    max_retries: int = 3,
) -> FunctionAction:
    """A task action that runs plain function `fn` as a Ray task (see `RayRunner`).

    `fn` takes the dependency results (a dict: task id -> result) or nothing, and returns
    the task's result. Admitted on the "local" resource like any function task; give the
    task its own (`wf.add(..., resource="ray")` with `Engine(limits={"ray": ...})`) to bound
    how many wait on the cluster at once."""
    runner = RayRunner(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        memory=memory,
        resources=dict(resources or {}),
        max_retries=max_retries,
    )
    return FunctionAction(fn, resource=DEFAULT_FUNCTION_RESOURCE, runner=runner)


class RayCluster:
    """This process's connection to a Ray cluster, for the Ray tasks of its engines.

        async with RayCluster("127.0.0.1:6379"):
            async with Engine() as engine: ...

    `address` has Ray's meaning: "host:port" of a running head node (`ray start --head`),
    "ray://host:10001" through Ray Client, "auto" for the cluster `ray start` left on this
    machine, "local" to start a private one for this process. `runtime_env` says what the
    workers need (code, packages), `namespace` the Ray namespace; `options` are more
    `ray.init` keyword arguments, passed as they are (`num_cpus` of a "local" one, say).

    `ray.init` and `ray.shutdown` block, so entering and leaving run them in a thread. Ray
    keeps one connection per process: entering while it is connected is a `UsageError`."""

    def __init__(
        self,
        address: str,
        *,
        namespace: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise UsageError(
                f"RayCluster(address={address!r}) must name a cluster: 'host:port' of its head "
                "node, 'ray://host:10001', 'auto' or 'local'"
            )
        self.address = address
        self._init: dict[str, Any] = dict(options or {})
        if namespace is not None:
            self._init["namespace"] = namespace
        if runtime_env is not None:
            self._init["runtime_env"] = dict(runtime_env)
        self._open = False

    async def __aenter__(self) -> RayCluster:
        ray = import_ray("RayCluster")
        if self._open:
            raise UsageError("this RayCluster is already open; enter it once")
        if ray.is_initialized():
            raise UsageError(
                "this process is already connected to Ray (ray.init was called, or another "
                "RayCluster is open); Ray keeps one connection per process: use that one, "
                "or leave it first"
            )
        await self._check_reachable()
        connecting = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(ray.init, address=self.address, **self._init)
        )
        try:
            await asyncio.shield(connecting)
        except asyncio.CancelledError:
            connecting.add_done_callback(functools.partial(_shutdown_connected, ray))
            raise
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            raise RayError(
                f"could not connect to the Ray cluster at {self.address!r}: {exc}; check the "
                "address, or start a head node with `ray start --head`"
            ) from exc
        self._open = True
        return self

    async def _check_reachable(self) -> None:
        """Fail at once when nothing listens at a "host:port" address: `ray.init` would wait
        for it for ever."""
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit() or "://" in self.address:
            return
        try:
            async with asyncio.timeout(10):
                _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except (OSError, TimeoutError) as exc:
            raise RayError(
                f"no Ray head node answers at {self.address!r} ({exc or 'timed out'}); check "
                f"the address, or start one there: ray start --head --port={port}"
            ) from exc
        writer.close()
        await writer.wait_closed()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._open:
            self._open = False
            await asyncio.to_thread(import_ray("RayCluster").shutdown)

    async def resources(self) -> dict[str, float]:
        """The cluster's total resources ("CPU", "GPU", "memory" in bytes, custom ones)."""
        if not self._open:
            raise UsageError("this RayCluster is not open; use it inside `async with`")
        ray = import_ray("RayCluster")
        found: dict[str, float] = await asyncio.to_thread(ray.cluster_resources)
        return found


# --- helpers ---------------------------------------------------------------------------------


def _check_amount(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise UsageError(f"RayRunner({name}={value!r}) must be a finite number, 0 or more")


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


@functools.lru_cache(maxsize=1024)
def _remote(fn: Callable[..., Any]) -> Any:
    """`fn` as a Ray remote function, made once per function: Ray exports each remote
    function to the cluster on its first call, not again on every task."""
    ray = import_ray("a Ray task")
    _by_value_if_unimportable(ray, fn)
    if inspect.isfunction(fn):
        return ray.remote(fn)
    # ray.remote takes functions (and classes, as actors) only: a callable object or a
    # partial travels inside a function that calls it.

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return ray.remote(call)


def _by_value_if_unimportable(ray: Any, fn: Callable[..., Any]) -> None:
    """A function of a module the workers cannot import by its name (a registry file that
    `plait serve` loaded from a path, a script run by path) travels by value, with its
    module's globals, instead of as "module:name" that a worker would fail to import."""
    name = getattr(fn, "__module__", None)
    if not isinstance(name, str) or name == "__main__":
        return  # __main__ goes by value anyway
    module = sys.modules.get(name)
    if module is None:
        return
    top = name.partition(".")[0]
    if (
        importlib.machinery.PathFinder.find_spec(top) is None
        and top not in sys.builtin_module_names
    ):
        ray.cloudpickle.register_pickle_by_value(module)


def _submit(remote: Any, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return remote.remote(*args, **kwargs)
    except (TypeError, pickle.PicklingError) as exc:
        raise UsageError(
            f"task {task_id!r}: Ray cannot send its function or arguments to the cluster "
            f"({exc}); define the function at the top level of a module, and pass plain data"
        ) from exc


def _cancel(ray: Any, ref: Any) -> None:
    # force: kill the worker, so a call stuck in C code stops too (Ray starts another).
    # A cancel that fails (the connection already closed) must not hide the cancellation.
    with contextlib.suppress(Exception):
        ray.cancel(ref, force=True)


def _cancel_submitted(ray: Any, submitted: asyncio.Future[Any]) -> None:
    """Cancel the Ray task whose submission finished after its plait task was cancelled."""
    if not submitted.cancelled() and submitted.exception() is None:
        _cancel(ray, submitted.result())


def _shutdown_connected(ray: Any, connecting: asyncio.Future[Any]) -> None:
    """Close a connection whose opening finished after the `async with` was cancelled."""
    if not connecting.cancelled() and connecting.exception() is None:
        ray.shutdown()


def _remote_error(ray: Any, exc: Any, name: str) -> BaseException:
    """The exception the function raised on the cluster, to raise here as itself (Ray
    holds a RayError instead when the exception could not be pickled there)."""
    cause = exc.cause
    if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
        cause.add_note(f"raised in Ray task {name}, where its traceback reads:\n{exc}")
        return cause
    return RayError(f"Ray task {name} failed: {exc}")


def _ray_error(ray: Any, exc: Any, task_id: str, fn: str, max_retries: int) -> RayError:
    """A Ray system failure in words that say whose fault it is and what to do."""
    errors = ray.exceptions
    summary = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    if isinstance(
        exc,
        errors.WorkerCrashedError
        | errors.NodeDiedError
        | errors.OutOfMemoryError
        | errors.ObjectLostError
        | errors.LocalRayletDiedError,
    ):
        return RayWorkerLostError(
            f"task {task_id!r}: the Ray worker running {fn} was lost ({summary}), and "
            f"Ray's own retries (max_retries={max_retries}) are used up; retry the task "
            "with plait (wf.add(..., retry=3)) or give Ray more (RayRunner(max_retries=...))"
        )
    if isinstance(exc, errors.TaskCancelledError):
        return RayError(
            f"task {task_id!r}: its Ray task was cancelled outside plait (ray.cancel, or "
            f"the cluster stopping); {summary}",
            retryable=False,
        )
    if isinstance(exc, errors.RuntimeEnvSetupError):
        return RayError(
            f"task {task_id!r}: Ray could not set up the workers' runtime_env; fix it "
            f"(RayCluster(runtime_env=...)): {summary}",
            retryable=False,
        )
    if isinstance(exc, errors.TaskUnschedulableError):
        return RayError(
            f"task {task_id!r}: no node of the Ray cluster can run {fn} with the resources "
            f"it declares; ask for less, or add such a node: {summary}",
            retryable=False,
        )
    return RayError(f"task {task_id!r}: Ray could not run {fn}: {summary}")
