"""Runners: where a task's synchronous function runs when not in the engine's threads.

A function or tool task runs its function in the engine's worker threads unless it names a
`Runner`, which runs it somewhere else (a Ray cluster: `executors.RayRunner`). There the function
cannot reach the engine, so it receives plain arguments, never the `TaskContext`, and its
result or exception comes back as a local one would.

A run's log records a function task's runner as data (`{"kind": "ray", ...settings}`), and a
resumed run makes it again with the factory registered for its kind under the
`plait.runners` entry point group, so this package never imports the packages that
implement runners.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from ._errors import UsageError

if TYPE_CHECKING:
    from ..engine._context import TaskContext

RUNNERS_GROUP = "plait.runners"


@runtime_checkable
class Runner(Protocol):
    """Runs a task's synchronous function elsewhere than the engine's threads.

    `kind` names the factory registered under the `plait.runners` entry point group, and
    `settings()` is what `factory(**settings)` takes to make the same runner again (JSON
    data). `call` runs `fn(*args, **kwargs)` and returns its result; cancelling the call
    stops the function where it runs."""

    @property
    def kind(self) -> str: ...

    def settings(self) -> dict[str, Any]: ...

    def call(
        self, ctx: TaskContext, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Awaitable[Any]: ...


def runner_spec(runner: Runner) -> dict[str, Any]:
    """How a run's log records `runner`: its kind and its settings."""
    return {"kind": runner.kind, **runner.settings()}


def make_runner(spec: Mapping[str, Any]) -> Runner:
    """The runner `spec` (from `runner_spec`) describes, made by its kind's factory.

    Raises `UsageError` when no installed package registers the kind, or the factory refuses
    the settings."""
    settings = dict(spec)
    kind = settings.pop("kind", None)
    if not isinstance(kind, str) or not kind:
        raise UsageError(f"a runner is recorded without its kind: {dict(spec)!r}")
    factory = _factory(kind)
    if factory is None:
        raise UsageError(
            f"no installed package provides the runner kind {kind!r} (entry point group "
            f"{RUNNERS_GROUP}); install the package that does (plait registers its own "
            "'ray' runner when it is installed: reinstall plait)"
        )
    try:
        runner = factory(**settings)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"the {kind!r} runner cannot be made from its recorded settings {settings!r}: {exc}"
        ) from exc
    if not isinstance(runner, Runner):
        raise UsageError(
            f"entry point {kind} (group {RUNNERS_GROUP}) made a {type(runner).__name__}, "
            "not a Runner; fix the package that registers it"
        )
    return runner


@functools.cache
def _factory(kind: str) -> Callable[..., Any] | None:
    """The factory registered for `kind`, looked up once: reading the installed packages'
    entry points takes milliseconds, and a resumed run may rebuild thousands of tasks."""
    found = entry_points(group=RUNNERS_GROUP, name=kind)
    return None if not found else cast(Callable[..., Any], next(iter(found)).load())
