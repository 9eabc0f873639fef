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
