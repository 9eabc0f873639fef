"""Turning a run's log back into tasks: `ActionSpec` -> action, `TaskOptions` -> settings.

A stored run names what each task runs (`ActionSpec`: kind, registered name, arguments). To
run it again in a new process, those names must mean the same code there. A `Registry`
holds what the application registers (its agents, tools and functions) and, for functions,
falls back on importing `module:qualname`: the store is trusted as the application's own
code is (it names code to run, as a pickle would).

    registry = Registry(researcher, search_tool, summarise)   # agents, tools, functions
    report = await engine.resume(registry=registry)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ..model._errors import UsageError
from ..model._events import ActionSpec, TaskOptions
from ..model._llm import DEFAULT_BACKEND
from ..model._runner import Runner, make_runner
from ..model._task import Action, FunctionAction, LLMCall, Retry, Task, registered_name


class RebuildError(UsageError):
    """A stored task names code this process cannot find; the message says what to register."""


@runtime_checkable
class Rebuildable(Protocol):
    """Something that rebuilds the actions it made (an agent its LLM calls, a tool its
    calls) from their `ActionSpec`s. `rebuilds` is the (kind, name) its specs carry."""

    @property
    def rebuilds(self) -> tuple[str, str]: ...

    def rebuild(self, spec: ActionSpec, registry: Registry) -> Action: ...


@runtime_checkable
class Composite(Protocol):
    """A `Rebuildable` that brings others along (an agent its tools): registering it
    registers them too."""

    def parts(self) -> Iterable[Rebuildable]: ...


class Registry:
    """What a resumed run's `ActionSpec`s and options name: agents, tools, functions.

    `Registry(*entries)` takes `Rebuildable`s (agents, tools) and plain functions (task
    functions, prompt builders, conditions, idempotency keys; registered under their
    `module:qualname`). `imports=False` turns off finding unregistered functions by import.
    """

    def __init__(self, *entries: Rebuildable | Callable[..., Any], imports: bool = True) -> None:
        self._builders: dict[tuple[str, str], Rebuildable] = {}
        self._functions: dict[str, Callable[..., Any]] = {}
        self._plain: dict[tuple[str, str], Action] = {}
        """Actions rebuilt from specs without arguments, shared: they hold no state."""
        self._retries: dict[tuple[int, tuple[float, float, float]], Retry] = {}
        self.imports = imports
        self.add(*entries)

    def add(self, *entries: Rebuildable | Callable[..., Any]) -> Registry:
        for entry in entries:
            if isinstance(entry, Rebuildable):
                if isinstance(entry, Composite):
                    for part in entry.parts():
                        self._builders.setdefault(part.rebuilds, part)
                self._builders[entry.rebuilds] = entry
            elif callable(entry):
                self._functions[registered_name(entry)] = entry
            else:
                raise UsageError(
                    f"Registry takes agents, tools and functions, got {type(entry).__name__} "
                    f"{entry!r:.60}"
                )
        return self

    def merge(self, other: Registry) -> Registry:
        """Add everything `other` holds (its entries win)."""
        self._builders.update(other._builders)
        self._functions.update(other._functions)
        return self

    def scan(self, module: ModuleType) -> Registry:
        """Register what `module` defines at its top level: its functions, agents, tools."""
        for value in list(vars(module).values()):
            if isinstance(value, Rebuildable) and not isinstance(value, type):
                self.add(value)
            elif callable(value) and getattr(value, "__module__", None) == module.__name__:
                self._functions[registered_name(value)] = value
        return self

    # --- lookups ---------------------------------------------------------------------------

    def has(self, kind: str, name: str) -> bool:
        """Whether an agent ("llm") or a tool ("tool") of this name is registered."""
        return (kind, name) in self._builders

    def names(self) -> dict[str, list[str]]:
        """What is registered, by kind: agents, tools and functions (`module:qualname`)."""
        return {
            "agents": sorted(n for k, n in self._builders if k == "llm"),
            "tools": sorted(n for k, n in self._builders if k == "tool"),
            "functions": sorted(self._functions),
        }

    def function(self, name: str, what: str = "function") -> Callable[..., Any]:
        """The function registered (or importable) as `module:qualname`."""
        found = self._functions.get(name)
        if found is not None:
            return found
        module_name, sep, qualname = name.partition(":")
        if not sep:  # a bare name: a registered function of that qualname
            module_name, qualname = "", name
        # The same function under another module name (a file run as a script by `plait
        # run` and imported by the application, say): registered ones match by qualname.
        same = [fn for key, fn in self._functions.items() if key.endswith(f":{qualname}")]
        if len(same) == 1:
            return same[0]
        if "<" in qualname:
            raise RebuildError(
                f"the {what} {name} was defined inside a function (or is a lambda), so no "
                "other process can find it by name; register it: Registry(..., the_function), "
                "or define it at the top level of a module"
            )
        if not self.imports or not qualname or not module_name:
            raise RebuildError(f"no {what} {name} is registered; add it: Registry(..., fn)")
        try:
            target: Any = _module(module_name)
            for part in qualname.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise RebuildError(
                f"the {what} {name} cannot be found in this process ({exc}); import the "
                "module that defines it, or register it: Registry(..., fn)"
            ) from None
        if not callable(target):
            raise RebuildError(f"{name} is a {type(target).__name__}, not a {what}")
        return target  # type: ignore[no-any-return]

    def action(self, spec: ActionSpec) -> Action:
        """Rebuild the action `spec` describes."""
        if not spec.args and spec.kind == "function":
            key = (spec.kind, spec.name)
            shared = self._plain.get(key)
            if shared is None:
                shared = self._plain[key] = self._action(spec)
            return shared
        return self._action(spec)

    def _action(self, spec: ActionSpec) -> Action:
        builder = self._builders.get((spec.kind, spec.name))
        if builder is not None:
            return builder.rebuild(spec, self)
        if spec.kind == "function":
            runner = spec.args.get("runner")
            return FunctionAction(
                self.function(spec.name), runner=None if runner is None else self.runner(runner)
            )
        if spec.kind == "llm" and ":" in spec.name:
            build = self.function(spec.name, "LLM request builder")
            return LLMCall(build, backend=spec.args.get("backend", DEFAULT_BACKEND))
        what = {"llm": "agent", "tool": "tool"}.get(spec.kind, "action")
        raise RebuildError(
            f"no {what} named {spec.name!r} is registered; pass it to the Registry "
            f"(Registry(..., {spec.name if what != 'action' else 'a Rebuildable'}))"
        )

    def runner(self, spec: Mapping[str, Any]) -> Runner:
        """The runner a stored function task ran on (`{"kind": "ray", ...settings}`), made
        by the factory installed packages register for its kind (`plait.runners`)."""
        try:
            return make_runner(spec)
        except UsageError as exc:
            raise RebuildError(str(exc)) from exc

    def task(self, task_id: str, spec: ActionSpec, options: TaskOptions) -> Task:
        """The task as its `task_added` event describes it."""
        key_from = options.idempotency_key_from
        return Task(
            task_id,
            self.action(spec),
            retry=self._retry(options),
            timeout=options.timeout,
            resource=options.resource or None,
            estimate=options.estimate,
            when=None if options.when is None else self.function(options.when, "condition"),
            trigger="all_done" if options.trigger == "all_done" else "all_success",
            idempotent=options.idempotent,
            idempotency_key=(
                self.function(key_from, "idempotency key function")
                if key_from is not None
                else options.idempotency_key
            ),
        )

    def _retry(self, options: TaskOptions) -> Retry:
        key = (options.retry, options.retry_delay)
        retry = self._retries.get(key)
        if retry is None:
            initial, maximum, jitter = options.retry_delay
            retry = self._retries[key] = Retry(
                attempts=options.retry, initial_delay=initial, max_delay=maximum, jitter=jitter
            )
        return retry


def _module(name: str) -> ModuleType:
    loaded = sys.modules.get(name)
    return loaded if loaded is not None else importlib.import_module(name)
