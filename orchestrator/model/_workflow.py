"""Workflow: a named, mutable DAG of tasks on networkx.

Mutations are validated before they touch the graph, so a refused mutation changes nothing.
While the workflow runs, every accepted mutation is reported to the engine's run state
(`_Hooks`), which emits its event and re-evaluates the tasks whose inputs changed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import networkx as nx

from ._errors import (
    CycleError,
    DuplicateTaskError,
    TaskStartedError,
    UnknownTaskError,
    UsageError,
)
from ._events import FINAL_STATES, TaskState
from ._task import (
    Action,
    Condition,
    KeyFrom,
    Retry,
    Task,
    TaskRun,
    Trigger,
    as_action,
    as_retry,
    describe,
)

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


def _on_loop(
    method: Callable[Concatenate[Workflow, P], R],
) -> Callable[Concatenate[Workflow, P], R]:
    """Run a mutation on the engine's loop thread, whichever thread calls it.

    Sync task functions run in worker threads; when they change their workflow, the
    change is handed to the loop and the thread waits for its result (or its error), so
    the run state only ever changes on one thread.
    """

    @functools.wraps(method)
    def wrapper(self: Workflow, /, *args: P.args, **kwargs: P.kwargs) -> R:
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            return method(self, *args, **kwargs)
        done: concurrent.futures.Future[R] = concurrent.futures.Future()

        def call() -> None:
            try:
                done.set_result(method(self, *args, **kwargs))
            except BaseException as exc:
                done.set_exception(exc)

        loop.call_soon_threadsafe(call)
        return done.result()

    return wrapper


class _Hooks(Protocol):
    def validate(self, task: Task) -> None: ...
    def added(self, task: Task, after: tuple[str, ...]) -> None: ...
    def replaced(self, old: Task, task: Task) -> None: ...
    def removed(self, task: Task, dependents: list[str]) -> None: ...
    def edge_added(self, source: str, target: str) -> None: ...
    def edge_removed(self, source: str, target: str) -> None: ...


class Workflow:
    """A named DAG of tasks. Build it, then run it once with an `Engine`.

    Tasks and edges may be added, removed and replaced before and during the run, also from
    inside a running task (`ctx.workflow.add(...)`).
    """

    def __init__(self, name: str) -> None:
        if not name or not isinstance(name, str):
            raise UsageError(f"a workflow needs a non-empty name, got {name!r}")
        self.name = name
        self.id = name
        """Unique among the engine's running workflows; the engine may suffix `#N`."""
        self.graph: nx.DiGraph[str] = nx.DiGraph()
        self._tasks: dict[str, Task] = {}
        self._records: Mapping[str, TaskRun] = {}
        """Each task's state in the run, owned and written by the run (kept after it ends)."""
        self._hooks: _Hooks | None = None
        self._started = False
        self._finished = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._restored: set[str] = set()
        """Tasks rebuilt from a run's log on resume that no code of this process added yet."""

    # --- reading ---------------------------------------------------------------------------

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, tasks={len(self._tasks)})"

    def task(self, task_id: str) -> Task:
        try:
            return self._tasks[task_id]
        except KeyError:
            raise UnknownTaskError(self.name, task_id) from None

    def state(self, task_id: str) -> TaskState:
        """The task's state in this workflow's run ("pending" before the run starts)."""
        self.task(task_id)
        record = self._records.get(task_id)
        return "pending" if record is None else record.state

    def run_of(self, task_id: str) -> TaskRun:
        """The task's run state: state, attempts, result, error, reason (read-only)."""
        task = self.task(task_id)
        record = self._records.get(task_id)
        return TaskRun(task) if record is None else record

    def dependencies(self, task_id: str) -> list[str]:
        self.task(task_id)
        return list(self.graph.predecessors(task_id))

    @_on_loop
    def upstream(self, task_id: str) -> dict[str, Any]:
        """The results of the tasks `task_id` waits for, directly or through others, that
        succeeded in this workflow's run (read on the loop, from any thread)."""
        self.task(task_id)
        records = self._records
        return {
            dep: record.result
            for dep in nx.ancestors(self.graph, task_id)
            if (record := records.get(dep)) is not None and record.state == "done"
        }

    def dependents(self, task_id: str) -> list[str]:
        self.task(task_id)
        return list(self.graph.successors(task_id))

    # --- mutations -------------------------------------------------------------------------

    @_on_loop
    def add(
        self,
        task_id: str,
        action: Action | Callable[..., Any],
        *,
        after: Iterable[str] = (),
        before: Iterable[str] = (),
        retry: Retry | int | None = None,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
        when: Condition | None = None,
        trigger: Trigger = "all_success",
        idempotent: bool = True,
        idempotency_key: str | KeyFrom | None = None,
    ) -> str:
        """Add a task that runs `action` once every task in `after` is done.

        `before` lists existing tasks that must wait for this one (they must not have
        started). `when` decides from the inputs whether to run or skip. Returns the id.
        `idempotent=False`: running it twice does harm, so a resumed run asks before it
        runs it again (docs/durability.md). `idempotency_key` (a string, or a function of
        the inputs returning one): the task reads it as `ctx.idempotency_key` to hand to
        the service it calls, and a durable engine records its result under it, so a
        resumed run reuses the result instead of running the task again.
        """
        self._check_open()
        if not isinstance(task_id, str) or not task_id:
            raise UsageError(f"a task id must be a non-empty string, got {task_id!r}")
        if task_id in self._tasks:
            if task_id in self._restored:
                return self._add_again(task_id, action, after)
            raise DuplicateTaskError(self.name, task_id)
        after_t = _ids(task_id, "after", after)
        before_t = _ids(task_id, "before", before)
        tasks = self._tasks
        for dep in after_t:
            if dep not in tasks:
                raise UnknownTaskError(self.name, dep, role=f"dependency of {task_id!r}")
        for dep in before_t:
            if dep not in tasks:
                raise UnknownTaskError(self.name, dep, role=f"dependent of {task_id!r}")
            self._check_not_started(dep, f"make {dep!r} wait for new task {task_id!r}")
        if after_t and before_t:
            # Only a new node with edges on both sides can close a cycle: some b in `before`
            # already reaching some a in `after`.
            for b in before_t:
                for a in after_t:
                    if a == b or nx.has_path(self.graph, b, a):
                        path = [a, task_id, *nx.shortest_path(self.graph, b, a)]
                        raise CycleError(self.name, path)
        task = Task(
            task_id,
            as_action(action),
            retry=as_retry(retry, task_id),
            timeout=timeout,
            resource=resource,
            estimate=estimate,
            when=when,
            trigger=trigger,
            idempotent=idempotent,
            idempotency_key=idempotency_key,
        )
        if self._hooks is not None:
            self._hooks.validate(task)
        graph = self.graph
        graph.add_node(task_id)
        for dep in after_t:
            graph.add_edge(dep, task_id)
        tasks[task_id] = task
        if self._hooks is None:
            for dep in before_t:
                graph.add_edge(task_id, dep)
            return task_id
        # While running, the new task is judged before its outgoing edges exist: it may
        # end at once (a false condition, a failed input), and its dependents-to-be must
        # then hear of it through edge_added, not through a count they never took.
        self._hooks.added(task, after_t)
        for dep in before_t:
            graph.add_edge(task_id, dep)
            self._hooks.edge_added(task_id, dep)
        return task_id

    def step(
        self,
        task_id: str | None = None,
        *,
        after: Iterable[str] = (),
        retry: Retry | int | None = None,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
        when: Condition | None = None,
        trigger: Trigger = "all_success",
    ) -> Callable[[F], F]:
        """Decorator form of `add`: the function's name is the task id unless given."""

        def register(fn: F) -> F:
            self.add(
                task_id or fn.__name__,
                fn,
                after=after,
                retry=retry,
                timeout=timeout,
                resource=resource,
                estimate=estimate,
                when=when,
                trigger=trigger,
            )
            return fn

        return register

    @classmethod
    def _rebuilt(
        cls, name: str, tasks: Iterable[Task], edges: Iterable[tuple[str, str]]
    ) -> Workflow:
        """A workflow as a run's log describes it (resume): its tasks and edges at once,
        checked for a cycle once instead of per edge, as a damaged log could hold one."""
        workflow = cls(name)
        graph = workflow.graph
        for task in tasks:
            workflow._tasks[task.id] = task
            graph.add_node(task.id)
        for source, target in edges:
            for task_id in (source, target):
                if task_id not in workflow._tasks:
                    raise UnknownTaskError(name, task_id, role="edge end in the log")
            graph.add_edge(source, target)
        if not nx.is_directed_acyclic_graph(graph):
            cycle = [edge[0] for edge in nx.find_cycle(graph)]
            raise CycleError(name, [*cycle, cycle[0]])
        workflow._restored = set(workflow._tasks)
        return workflow

    def _add_again(
        self, task_id: str, action: Action | Callable[..., Any], after: Iterable[str]
    ) -> str:
        """A task that runs again after a crash adds what it added before: the log has it
        already, so adding the same action under the same id is a no-op (once)."""
        had = describe(self._tasks[task_id].action)
        now = describe(as_action(action))
        if had != now:
            raise DuplicateTaskError(self.name, task_id)
        self._restored.discard(task_id)
        for dep in _ids(task_id, "after", after):
            if not self.graph.has_edge(dep, task_id):
                self.add_edge(dep, task_id)
        return task_id

    @_on_loop
    def add_edge(self, source: str, target: str) -> None:
        """Make `target` wait for `source` (and receive its result as an input)."""
        self._check_open()
        for task_id, role in ((source, "edge source"), (target, "edge target")):
            if task_id not in self._tasks:
                raise UnknownTaskError(self.name, task_id, role=role)
        if self.graph.has_edge(source, target):
            return
        self._check_not_started(target, f"add edge {source!r} -> {target!r}")
        if source == target or nx.has_path(self.graph, target, source):
            raise CycleError(self.name, [source, *nx.shortest_path(self.graph, target, source)])
        self.graph.add_edge(source, target)
        if self._hooks is not None:
            self._hooks.edge_added(source, target)

    @_on_loop
    def remove_edge(self, source: str, target: str) -> None:
        self._check_open()
        if not self.graph.has_edge(source, target):
            raise UsageError(
                f"workflow {self.name!r} has no edge {source!r} -> {target!r} to remove"
            )
        self._check_not_started(target, f"remove edge {source!r} -> {target!r}")
        self.graph.remove_edge(source, target)
        if self._hooks is not None:
            self._hooks.edge_removed(source, target)

    @_on_loop
    def remove(self, task_id: str) -> None:
        """Remove a task and its edges. A running task is cancelled; its dependents lose
        that input and are re-evaluated."""
        self._check_open()
        task = self.task(task_id)
        dependents = list(self.graph.successors(task_id))
        self.graph.remove_node(task_id)
        del self._tasks[task_id]
        if self._hooks is not None:
            self._hooks.removed(task, dependents)

    @_on_loop
    def replace(
        self,
        task_id: str,
        action: Action | Callable[..., Any],
        *,
        retry: Retry | int | None = None,
        timeout: float | None = None,
        resource: str | None = None,
        estimate: float | None = None,
    ) -> None:
        """Give a task that has not started a new action (and settings); edges stay."""
        self._check_open()
        old = self.task(task_id)
        self._check_not_started(task_id, f"replace task {task_id!r}")
        task = Task(
            task_id,
            as_action(action),
            retry=as_retry(retry, task_id) if retry is not None else old.retry,
            timeout=timeout if timeout is not None else old.timeout,
            resource=resource,
            estimate=estimate if estimate is not None else old.estimate,
            when=old.when,
            trigger=old.trigger,
            idempotent=old.idempotent,
            idempotency_key=old.idempotency_key,
        )
        if self._hooks is not None:
            self._hooks.validate(task)
        self._tasks[task_id] = task
        if self._hooks is not None:
            self._hooks.replaced(old, task)

    def _check_open(self) -> None:
        if self._finished:
            raise UsageError(
                f"workflow {self.name!r} has finished; it cannot change any more "
                "(build a new workflow to run more work)"
            )

    def _check_not_started(self, task_id: str, action: str) -> None:
        record = self._records.get(task_id)
        if record is None:
            return
        state = record.state
        if state == "running" or state == "waiting" or state in FINAL_STATES:
            raise TaskStartedError(self.name, task_id, state, action)

    # --- for the engine --------------------------------------------------------------------

    def _attach(self, hooks: _Hooks, records: Mapping[str, TaskRun]) -> None:
        if self._started:
            raise UsageError(
                f"workflow {self.name!r} has already been run; a Workflow runs once: "
                "build a new one (a function that returns a Workflow makes this easy)"
            )
        self._started = True
        self._hooks = hooks
        self._records = records
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def _reset(self) -> None:
        """Undo `_attach` of a run that was refused before anything started."""
        self._hooks = None
        self._started = False
        self._loop = None
        self.id = self.name
        self._records = {}

    def _detach(self) -> None:
        self._hooks = None
        self._finished = True
        self._loop = None


def _ids(task_id: str, name: str, given: Iterable[str]) -> tuple[str, ...]:
    """Task ids from `after=`/`before=`, in order, once each; a bare string is refused (it
    would be read letter by letter)."""
    if isinstance(given, str) or not isinstance(given, Iterable):
        raise UsageError(
            f"task {task_id!r}: {name} must be a list of task ids, got "
            f"{type(given).__name__} {given!r}; write {name}=[{given!r}]"
        )
    ids = tuple(dict.fromkeys(given))
    for dep in ids:
        if not isinstance(dep, str):
            raise UsageError(
                f"task {task_id!r}: {name} must hold task ids (strings), got "
                f"{type(dep).__name__} {dep!r}"
            )
    return ids
