"""Tools: named Python functions that agents call; each call is a task on the tool runner."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator import (
    DEFAULT_TOOL_RESOURCE,
    ActionSpec,
    RebuildError,
    Registry,
    TaskContext,
    ToolSpec,
    UsageError,
    registered_name,
)

Args = Mapping[str, Any] | Callable[[TaskContext], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A function an agent can use. `parameters` is the JSON schema shown to the model."""

    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    @property
    def rebuilds(self) -> tuple[str, str]:
        """Resume finds this tool's calls by its name (see `Registry`)."""
        return ("tool", self.name)

    def rebuild(self, spec: ActionSpec, registry: Registry) -> ToolAction:
        """The call `call` made, from its recorded `ActionSpec`."""
        args = spec.args
        if "args" in args:
            return self.call(args["args"])
        if "args_from" in args:
            return self.call(registry.function(args["args_from"], "tool-arguments builder"))
        raise RebuildError(
            f"a call of tool {self.name!r} was recorded with arguments that are not data "
            f"({args.get('args_repr', '?')}), so it cannot be rebuilt; pass JSON-able "
            "arguments, or a top-level function that builds them from the inputs"
        )

    def call(self, args: Args | None = None) -> ToolAction:
        """A task action that calls this tool with `args` (or args built from the context)."""
        return ToolAction(self, args if args is not None else {})


@dataclass(frozen=True, slots=True)
class ToolAction:
    tool: Tool
    args: Args
    resource: str = DEFAULT_TOOL_RESOURCE

    @property
    def label(self) -> str:
        return f"tool {self.tool.name}"

    @property
    def spec(self) -> ActionSpec:
        """The tool by name, with its arguments when they are fixed data, else the
        registered name of the function that builds them from the task's inputs."""
        if callable(self.args):
            return ActionSpec("tool", self.tool.name, {"args_from": registered_name(self.args)})
        args = dict(self.args)
        try:
            json.dumps(args, allow_nan=False)
        except (TypeError, ValueError):
            # Not data: recorded by its text, and a rebuilt run cannot call it again.
            return ActionSpec("tool", self.tool.name, {"args_repr": repr(args)})
        return ActionSpec("tool", self.tool.name, {"args": args})

    async def run(self, ctx: TaskContext) -> Any:
        args = self.args(ctx) if callable(self.args) else self.args
        if not isinstance(args, Mapping):
            raise UsageError(
                f"tool {self.tool.name!r} needs its arguments as a mapping, "
                f"got {type(args).__name__}"
            )
        fn = self.tool.fn
        if inspect.iscoroutinefunction(fn):
            return await fn(**args)
        return await ctx.to_thread(fn, **args)
