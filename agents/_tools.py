"""Tools: typed Python functions that agents call; each call is a task on the tool runner.

A tool's JSON schema comes from its function's signature and docstring (through pydantic),
and the arguments a model sends are checked against it before the function runs: what does
not fit goes back to the model as the tool's answer, never into the function.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic

from orchestrator import Registry, TaskContext, UsageError
from orchestrator.ext import (
    DEFAULT_TOOL_RESOURCE,
    ActionSpec,
    RebuildError,
    Runner,
    ToolSpec,
    registered_name,
)

Args = Mapping[str, Any] | Callable[[TaskContext], Mapping[str, Any]]


class ToolArgumentsError(UsageError):
    """Arguments that do not fit a tool's schema (said to the model in an agent loop)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A function an agent can use. `parameters` is the JSON schema shown to the model:
    derived from `fn`'s signature and docstring when not given (see `tool`).

    `runner` (optional) runs every call of the tool elsewhere than the engine's threads, on
    a Ray cluster say (`executors.RayRunner(num_cpus=2)`); `fn` must then be a plain function."""

    name: str
    fn: Callable[..., Any]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    runner: Runner | None = None
    _model: type[pydantic.BaseModel] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.name):
            raise UsageError(
                f"a tool's name must be 1-64 letters, digits, '_' or '-' (what servers "
                f"accept), got {self.name!r}"
            )
        if not callable(self.fn):
            raise UsageError(f"tool {self.name!r}: fn must be callable, got {self.fn!r}")
        if self.runner is not None:
            if not isinstance(self.runner, Runner):
                raise UsageError(
                    f"tool {self.name!r}: runner must be a Runner (executors.RayRunner(...), say), "
                    f"got {type(self.runner).__name__} {self.runner!r}"
                )
            if inspect.iscoroutinefunction(self.fn):
                raise UsageError(
                    f"tool {self.name!r}: its function is async, and the "
                    f"{self.runner.kind!r} runner runs plain functions in another process; "
                    "make it a plain def (or leave runner out)"
                )
        if self._model is None:
            model = _arguments_model(self.name, self.fn)
            object.__setattr__(self, "_model", model)
            if not self.parameters:
                object.__setattr__(self, "parameters", model.model_json_schema())
        if not self.description:
            object.__setattr__(self, "description", _summary(self.fn))

    def validate(self, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
        """The arguments, checked against the signature: JSON text as a model writes it, or
        a mapping. Raises `ToolArgumentsError` saying what is wrong, in words a model can act
        on."""
        assert self._model is not None
        try:
            if isinstance(arguments, str):
                checked = self._model.model_validate_json(arguments or "{}")
            else:
                checked = self._model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            raise ToolArgumentsError(
                f"the arguments for tool {self.name!r} do not fit its schema: "
                f"{problems(exc, 'arguments')}"
            ) from None
        return {name: getattr(checked, name) for name in type(checked).model_fields}

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    @property
    def rebuilds(self) -> tuple[str, str]:
        """Resume finds this tool's calls by its name (see `Registry`)."""
        return ("tool", self.name)

    def rebuild(self, spec: ActionSpec, registry: Registry) -> ToolAction | ToolUse:
        """The call `call` made, from its recorded `ActionSpec`."""
        args = spec.args
        if args.get("for_model"):
            return ToolUse(self, args["args"])
        if "args" in args:
            self.validate(args["args"])  # data that does not fit fails here, not in the run
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

    def use(self, args: Mapping[str, Any]) -> Any:
        """The task an agent loop adds for a call the model asked for, `args` checked."""
        return ToolUse(self, args)

    def task_options(self) -> dict[str, Any]:
        """`Workflow.add` options of that task (none: the tools resource, no retry)."""
        return {}


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
        fn, runner = self.tool.fn, self.tool.runner
        if runner is not None:
            return await runner.call(ctx, fn, **args)
        if inspect.iscoroutinefunction(fn):
            return await fn(**args)
        return await ctx.to_thread(fn, **args)


def problems(exc: pydantic.ValidationError, whole: str, *, limit: int | None = None) -> str:
    """A validation error in words a model can act on: `field: what is wrong; ...` (`whole`
    names an error about the value as a whole)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or whole}: {e['msg']}"
        for e in exc.errors(include_url=False)[:limit]
    )


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    runner: Runner | None = None,
) -> Any:
    """Make a `Tool` of a typed function, as a call or a decorator (`@tool` or
    `@tool(name=...)`). The schema comes from the annotations and defaults; the description
    from the docstring's first paragraph, and each argument's from an `Args:` section.
    `runner` runs its calls elsewhere (`@tool(runner=executors.RayRunner(num_cpus=2))`)."""

    def make(f: Callable[..., Any]) -> Tool:
        return Tool(name or f.__name__, f, description or "", runner=runner)

    return make(fn) if fn is not None else make


def _summary(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _argument_docs(fn: Callable[..., Any]) -> dict[str, str]:
    """`name: text` lines under an `Args:` (or `Arguments:`/`Parameters:`) heading."""
    doc = inspect.getdoc(fn) or ""
    found: dict[str, str] = {}
    inside = False
    for line in doc.splitlines():
        if re.fullmatch(r"\s*(Args|Arguments|Parameters):\s*", line):
            inside = True
            continue
        if inside:
            match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if match:
                found[match.group(1)] = match.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                inside = False
    return found


def _arguments_model(name: str, fn: Callable[..., Any]) -> type[pydantic.BaseModel]:
    """A pydantic model of `fn`'s keyword arguments: what the model may send, no more."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"tool {name!r}: cannot read the signature of {fn!r}: {exc}") from None
    docs = _argument_docs(fn)
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise UsageError(
                f"tool {name!r}: parameter {param.name!r} is {param.kind.description}; a tool "
                "takes named arguments only (the model sends a JSON object)"
            )
        annotation = Any if param.annotation is param.empty else param.annotation
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, pydantic.Field(default, description=docs.get(param.name)))
    try:
        return pydantic.create_model(
            f"{name}_arguments",
            __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
    except (pydantic.PydanticSchemaGenerationError, TypeError, NameError) as exc:
        raise UsageError(
            f"tool {name!r}: its arguments cannot be described as JSON ({exc}); annotate them "
            "with JSON types (str, int, float, bool, lists, dicts, pydantic models)"
        ) from None


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A tool call the model asked for, with arguments already checked. A tool that raises
    answers the model with the error (the loop goes on) instead of failing the task."""

    tool: Tool
    args: Mapping[str, Any]
    """The arguments as the model sent them (JSON data), already checked once."""

    @property
    def resource(self) -> str:
        return DEFAULT_TOOL_RESOURCE

    @property
    def label(self) -> str:
        return f"tool {self.tool.name}"  # the keep-alive predictor learns pauses by this

    @property
    def spec(self) -> ActionSpec:
        return ActionSpec("tool", self.tool.name, {"args": dict(self.args), "for_model": True})

    async def run(self, ctx: TaskContext) -> Any:
        try:
            # Checked again here: `args` is the model's JSON, and the function takes the
            # typed values (a pydantic model where it is annotated with one).
            return await self.tool.call(self.tool.validate(self.args)).run(ctx)
        except Exception as exc:
            return {TOOL_ERROR: f"tool {self.tool.name!r} raised {type(exc).__name__}: {exc}"}


TOOL_ERROR = "plait_tool_error"
"""The key of a tool task's result when the tool raised (the model reads the message)."""
