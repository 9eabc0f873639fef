"""MCP servers as tools: a Model Context Protocol server's tools offered to an agent's loop.

`mcp_tools("files", command=["python", "server.py"])` (stdio) or `mcp_tools("search",
url="http://host:8000/mcp")` (streamable HTTP) names a server; put it among an agent's
`tools`. A loop lists the server's tools once per run, as a task of its own (`mcp NAME`), so
the list is in the run's log and a resumed run offers the model the same tools. Each call
the model makes is a task (on the `tools` resource, or one of the server's own with its own
limits), with a timeout and retries, recorded like any task: a resumed run does not call again what
was answered. The connection is the official `mcp` SDK's, opened at the first use and kept.

What the server answers as an error (`is_error`), and arguments that do not fit the tool's
schema, go back to the model as the tool's reply. What the server cannot answer (it is
down, it dropped the connection, it no longer offers the tool or changed its schema since
the run listed it) fails the task with `MCPServerError`, which names the server and tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from orchestrator import RunError, TaskContext, UsageError, VirtualClock
from orchestrator.ext import DEFAULT_TOOL_RESOURCE, ActionSpec

from ._tools import TOOL_ERROR, Tool, ToolArgumentsError

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class MCPServerError(RunError):
    """An MCP server could not answer: not reachable, the connection dropped, or the tool is
    gone or changed since the run listed it. `server` and `tool` name them."""

    def __init__(self, server: str, tool: str | None, message: str) -> None:
        where = f"MCP server {server!r}" + (f", tool {tool!r}" if tool else "")
        super().__init__(f"{where}: {message}")
        self.server = server
        self.tool = tool
        self.detail = message

    def about(self, tool: str) -> MCPServerError:
        """The same error, said of a call of `tool`."""
        return self if self.tool else MCPServerError(self.server, tool, self.detail)


@dataclass(frozen=True, slots=True)
class Listed:
    """One tool as a server listed it: its own name, description and input schema."""

    name: str
    description: str
    input_schema: dict[str, Any]

    def data(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "schema": self.input_schema}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Listed:
        return cls(str(data["name"]), str(data.get("description") or ""), dict(data["schema"]))


class MCPTools:
    """A Model Context Protocol server whose tools an agent may call (`mcp_tools`).

    `name`: what plait calls the server (the listing task, the calls' resource, errors).
    `command` (stdio: the program and its arguments, with `env` and `cwd`) or `url`
    (streamable HTTP, with `headers`). `prefix`: put before each tool's name as the model
    sees it (two servers with a tool of the same name need one; characters a model cannot
    call, such as `.` and `/`, become `_`). `timeout_s` and `retry`: each call's task timeout
    and retries (a retry after a dropped connection opens a new one; give 0 for tools with
    side effects that must not run twice). `connect_timeout_s`: opening the connection, and
    listing the tools. `max_result_chars`: an answer longer than this (as text) is cut there,
    with a note of the cut, before it reaches the model and the log. `env` is laid over the
    SDK's small default environment of a stdio server (HOME, PATH, ...), not over this
    process's. Use it as an async context manager to close the
    connection (a stdio server's process) at a point of your choosing; otherwise it is
    opened at the first use and closed with the event loop. `resource`: what its listing
    and calls take, the engine's `tools` by default; name one of your own to give the
    server limits of its own (`Engine(limits={"search": Limits(4)})`, or a `[limits.search]`
    table)."""

    def __init__(
        self,
        name: str,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        headers: Mapping[str, str] | None = None,
        prefix: str = "",
        timeout_s: float = 60.0,
        retry: int = 1,
        connect_timeout_s: float = 30.0,
        resource: str = DEFAULT_TOOL_RESOURCE,
        max_result_chars: int = 100_000,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise UsageError(
                f"an MCP server's name must be 1-64 letters, digits, '_' or '-', got {name!r}"
            )
        if (command is None) == (url is None):
            raise UsageError(
                f"MCP server {name!r}: give command=[program, args...] (stdio) or url=... "
                "(streamable HTTP), one of them"
            )
        if command is not None and (
            isinstance(command, str) or not command or not all(isinstance(c, str) for c in command)
        ):
            raise UsageError(
                f"MCP server {name!r}: command is the program and its arguments as a list of "
                f"strings, got {command!r}"
            )
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"MCP server {name!r}: url must be http:// or https://, got {url!r}")
        if prefix and not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", prefix):
            raise UsageError(f"MCP server {name!r}: prefix {prefix!r} must be letters, digits, _ -")
        if timeout_s <= 0 or connect_timeout_s <= 0 or retry < 0 or max_result_chars < 1:
            raise UsageError(
                f"MCP server {name!r}: timeout_s, connect_timeout_s and max_result_chars must "
                "be positive and retry not negative"
            )
        self.name = name
        self.command = tuple(command) if command is not None else None
        self.url = url
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.headers = dict(headers or {})
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.retry = retry
        self.connect_timeout_s = connect_timeout_s
        self.resource = resource
        self.max_result_chars = max_result_chars
        self._link: _Link | None = None
        # Imported now, not at the first call: importing the SDK takes a second or more,
        # which would stall the event loop mid-run.
        with contextlib.suppress(ImportError):
            import mcp.client.streamable_http  # noqa: F401

    def __repr__(self) -> str:
        target = " ".join(self.command) if self.command is not None else self.url
        return f"MCPTools({self.name!r}, {target})"

    @property
    def attempts(self) -> int | None:
        """Each task's tries (`Workflow.add(retry=...)`): the first and `retry` more."""
        return self.retry + 1 if self.retry else None

    @property
    def listing_task(self) -> str:
        """The task of a workflow that lists this server's tools for the run."""
        return f"mcp {self.name}"

    @property
    def rebuilds(self) -> tuple[str, str]:
        """Resume finds this server's tasks by its name (see `Registry`)."""
        return ("tool", self.spec_name)

    @property
    def spec_name(self) -> str:
        """The name its tasks' specs carry (no tool's name has a space)."""
        return f"mcp {self.name}"

    def rebuild(self, spec: ActionSpec, registry: Any) -> Any:
        """The listing or call task recorded as `spec`."""
        args = spec.args
        if args.get("step") == "list":
            return Listing(self)
        listed = Listed.from_data(args["listed"])
        return MCPUse(self.tool(listed), dict(args["args"]))

    # --- the connection ----------------------------------------------------------------

    @property
    def link(self) -> _Link:
        if self._link is None:
            self._link = _Link(self)
        return self._link

    async def __aenter__(self) -> MCPTools:
        await self.link.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection (a stdio server's process ends); the next use opens it."""
        if self._link is not None:
            await self._link.close()

    async def list(self) -> list[Listed]:
        """The server's tools now (every page)."""
        return await self.link.listed()

    def tool(self, listed: Listed) -> MCPTool:
        """The `Tool` a model sees for `listed`."""
        return MCPTool.of(self, listed)

    def tools(self, listing: Sequence[Mapping[str, Any]]) -> tuple[MCPTool, ...]:
        """The tools of a listing task's result."""
        return tuple(self.tool(Listed.from_data(item)) for item in listing)


mcp_tools = MCPTools
"""An MCP server's tools for an agent: `Agent(tools=(mcp_tools("files", command=[...]),
...))` (the `MCPTools` constructor under the name the examples use)."""


def _digest(schema: Mapping[str, Any]) -> str:
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- the tool a model sees --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MCPTool(Tool):
    """One tool of an MCP server as the model sees it: its name (with the server's prefix),
    description and input schema as listed for the run. Arguments are checked against that
    schema; a call is an `MCPUse` task on the server's resource."""

    server: MCPTools | None = field(default=None, repr=False, compare=False)
    listed: Listed | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, server: MCPTools, listed: Listed) -> MCPTool:
        return cls(
            shown_name(server.prefix, listed.name),
            _no_direct_call,
            listed.description or f"{listed.name} (MCP server {server.name})",
            dict(listed.input_schema),
            server=server,
            listed=listed,
        )

    def __post_init__(self) -> None:
        # The schema is the server's: no function signature to derive it from.
        if self.server is None or self.listed is None:
            raise UsageError("an MCPTool comes from MCPTools.tool(...), not built by hand")

    def validate(self, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
        try:
            value = json.loads(arguments or "{}") if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"the arguments for tool {self.name!r} are not JSON: {exc}"
            ) from None
        if not isinstance(value, Mapping):
            raise ToolArgumentsError(
                f"the arguments for tool {self.name!r} must be a JSON object, got "
                f"{type(value).__name__}"
            )
        problems = _schema_problems(self.parameters, dict(value))
        if problems:
            raise ToolArgumentsError(
                f"the arguments for tool {self.name!r} do not fit its schema: {problems}"
            )
        return dict(value)

    def use(self, args: Mapping[str, Any]) -> MCPUse:
        return MCPUse(self, dict(args))

    def task_options(self) -> dict[str, Any]:
        assert self.server is not None
        return {
            "timeout": self.server.timeout_s,
            "retry": self.server.attempts,
            "resource": self.server.resource,
        }


def shown_name(prefix: str, name: str) -> str:
    """A server's tool name as a model can call it (1-64 letters, digits, `_`, `-`): other
    characters (`.`, `/`, ...) become `_`, and a name too long keeps its start and a hash
    of the whole, so two long names stay apart."""
    shown = re.sub(r"[^A-Za-z0-9_-]", "_", f"{prefix}{name}")
    if len(shown) > 64:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        shown = f"{shown[:55]}_{digest}"
    return shown


def _no_direct_call(**_: Any) -> Any:
    raise UsageError("an MCP tool is called through its server (MCPUse), not as a function")


def _schema_problems(schema: Mapping[str, Any], value: dict[str, Any]) -> str:
    """What in `value` does not fit the JSON schema `schema` ("" when it fits); a schema the
    validator cannot read is left to the server to judge."""
    import jsonschema  # the mcp SDK's own dependency

    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator_cls.check_schema(dict(schema))
        validator = validator_cls(schema)
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.path))
    except Exception:  # a schema it cannot read (a bad pattern, a $ref to nowhere)
        return ""
    return "; ".join(
        f"{'.'.join(str(p) for p in e.path) or 'arguments'}: {e.message}" for e in errors[:5]
    )


# --- the tasks --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listing:
    """The task that lists a server's tools for the run: its result (the tools' names,
    descriptions and schemas) is what every loop of the run offers the model."""

    server: MCPTools

    @property
    def resource(self) -> str:
        return self.server.resource

    @property
    def label(self) -> str:
        return f"mcp {self.server.name} list"

    @property
    def spec(self) -> ActionSpec:
        return ActionSpec("tool", self.server.spec_name, {"step": "list"})

    async def run(self, ctx: TaskContext) -> Any:
        _real_time(ctx, self.server)
        tools = await self.server.list()
        shown: dict[str, str] = {}
        for listed in tools:
            name = self.server.tool(listed).name
            if name in shown:
                raise MCPServerError(
                    self.server.name,
                    listed.name,
                    f"its name reads {name!r} to a model, as {shown[name]!r} does; the server "
                    "must name them apart",
                )
            shown[name] = listed.name
        return [t.data() for t in tools]


@dataclass(frozen=True, slots=True)
class MCPUse:
    """A call the model asked of an MCP tool, with arguments already checked against the
    schema listed for the run."""

    tool: MCPTool
    args: dict[str, Any]

    @property
    def server(self) -> MCPTools:
        assert self.tool.server is not None
        return self.tool.server

    @property
    def resource(self) -> str:
        return self.server.resource

    @property
    def label(self) -> str:
        return f"tool {self.tool.name}"  # the keep-alive predictor learns pauses by this

    @property
    def spec(self) -> ActionSpec:
        assert self.tool.listed is not None
        return ActionSpec(
            "tool", self.server.spec_name, {"listed": self.tool.listed.data(), "args": self.args}
        )

    async def run(self, ctx: TaskContext) -> Any:
        _real_time(ctx, self.server)
        listed = self.tool.listed
        assert listed is not None
        try:
            self.tool.validate(self.args)
        except ToolArgumentsError as exc:
            return {TOOL_ERROR: str(exc)}
        try:
            result = await self.server.link.call(listed, self.args)
        except _Refused as exc:
            return {TOOL_ERROR: f"tool {self.tool.name!r}: {exc}"}
        if result.is_error:
            return {TOOL_ERROR: f"tool {self.tool.name!r} answered with an error: {_text(result)}"}
        structured = result.structured_content
        if isinstance(structured, dict) and set(structured) == {"result"}:
            answer = structured["result"]  # a plain value, wrapped by the server's SDK
        elif structured is not None:
            answer = structured
        else:
            answer = _text(result)
        return _capped(answer, self.server.max_result_chars, self.tool.name)


def _real_time(ctx: TaskContext, server: MCPTools) -> None:
    """Refuse virtual time: it jumps ahead while the loop waits on the server, so timeouts
    would fire at once."""
    if isinstance(ctx.clock, VirtualClock):
        raise UsageError(
            f"MCP server {server.name!r} answers in real time; run its workflows on the system "
            "clock (CLOCK = 'system', [engine] clock = \"system\" or plait run --clock system)"
        )


def _capped(answer: Any, limit: int, tool: str) -> Any:
    """`answer`, or its JSON text cut at `limit` characters with a note of the cut: a
    server's answer goes to the model and the run's log, and neither is the place for
    megabytes."""
    text = answer if isinstance(answer, str) else json.dumps(answer, default=str)
    if len(text) <= limit:
        return answer
    return f"{text[:limit]}\n[tool {tool!r} answered {len(text):,} characters; cut at {limit:,}]"


def _text(result: Any) -> str:
    """The text of a tool's content; other kinds of content by their kind."""
    parts = []
    for item in result.content:
        text = getattr(item, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(item, 'type', 'content')}]")
    return "\n".join(parts)


# --- the connection ---------------------------------------------------------------------------


class _Refused(Exception):
    """The server answered the call with a protocol error the model can act on (invalid
    parameters, say): the tool's reply, not a broken connection."""


class _Link:
    """One open connection to a server, owned by a task of its own (the SDK's client must be
    entered and left in one task); calls from any task go through it. A connection that
    broke is opened again by the next use; each opening has a generation, so a call that
    failed closes only the connection it used."""

    def __init__(self, server: MCPTools) -> None:
        self.server = server
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0
        self._listed: dict[str, Listed] | None = None
        """The server's tools as listed on the current connection."""

    def _target(self, http: Any) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client

        server = self.server
        if server.command is not None:
            return StdioServerParameters(
                command=server.command[0],
                args=list(server.command[1:]),
                env=server.env,
                cwd=server.cwd,
            )
        assert server.url is not None
        if http is None:
            return server.url
        return streamable_http_client(server.url, http_client=http)

    def _describe(self) -> str:
        server = self.server
        return f"`{' '.join(server.command)}`" if server.command else str(server.url)

    async def open(self) -> tuple[Any, int]:
        """The connection's client and its generation, opened if need be."""
        _sdk(self.server.name)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: nothing of the old one is usable
            self._loop, self._lock, self._client, self._owner = loop, asyncio.Lock(), None, None
        assert self._lock is not None
        async with self._lock:
            if self._client is not None and self._owner is not None and not self._owner.done():
                return self._client, self._generation
            self._listed = None
            ready: asyncio.Future[Any] = loop.create_future()
            stop = self._stop = asyncio.Event()
            owner = loop.create_task(self._own(ready, stop), name=f"plait-mcp-{self.server.name}")
            self._owner = owner
            try:
                async with asyncio.timeout(self.server.connect_timeout_s):
                    client = await asyncio.shield(ready)
            except TimeoutError:
                owner.cancel()
                raise MCPServerError(
                    self.server.name,
                    None,
                    f"{self._describe()} did not answer within {self.server.connect_timeout_s:g} s "
                    "(connect_timeout_s)",
                ) from None
            except BaseException:
                owner.cancel()  # the caller was cancelled: no connection is left behind
                raise
            self._generation += 1
            self._client = client
            return client, self._generation

    async def _own(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                http = None
                if self.server.url is not None and self.server.headers:
                    from mcp.shared._httpx_utils import create_mcp_http_client

                    http = await stack.enter_async_context(
                        create_mcp_http_client(headers=self.server.headers)
                    )
                client = await stack.enter_async_context(Client(self._target(http), mode="legacy"))
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except Exception as exc:  # the SDK wraps what broke in exception groups
            if not ready.done():
                ready.set_exception(
                    MCPServerError(
                        self.server.name,
                        None,
                        f"cannot connect to {self._describe()}: {_cause(exc)}",
                    )
                )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError | BaseExceptionGroup):
                if not ready.done():
                    ready.cancel()
                return  # closed, or cancelled while connecting
            raise
        finally:
            if self._owner is asyncio.current_task():
                self._client = None

    async def close(self) -> None:
        owner, stop = self._owner, self._stop
        if owner is None or stop is None or owner.get_loop() is not asyncio.get_running_loop():
            return
        stop.set()
        await asyncio.wait({owner})  # the caller's own cancellation still reaches it
        if self._owner is owner:  # not a connection opened meanwhile by another task
            self._owner = self._client = None

    async def _broken(self, generation: int) -> None:
        """Forget the connection of `generation` if it is still the current one: the next
        use opens a new one."""
        if generation == self._generation and self._client is not None:
            self._listed = None
            await self.close()

    async def listed(self) -> list[Listed]:
        """The server's tools (every page), within `connect_timeout_s`."""
        client, generation = await self.open()
        tools: list[Listed] = []
        cursor = None
        try:
            async with asyncio.timeout(self.server.connect_timeout_s):
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += [
                        Listed(t.name, t.description or "", dict(t.input_schema or {}))
                        for t in page.tools
                    ]
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except TimeoutError:
            await self._broken(generation)
            raise MCPServerError(
                self.server.name,
                None,
                f"did not list its tools within {self.server.connect_timeout_s:g} s "
                "(connect_timeout_s)",
            ) from None
        except Exception as exc:
            await self._broken(generation)
            raise MCPServerError(
                self.server.name, None, f"listing its tools failed: {_cause(exc)}"
            ) from exc
        if generation == self._generation:
            self._listed = {t.name: t for t in tools}
        return tools

    async def call(self, listed: Listed, args: dict[str, Any]) -> Any:
        """The server's answer to `listed` called with `args`, once the server still offers
        it with the schema the run listed. `_Refused` where the server refused the call in
        a way the model can act on."""
        try:
            return await self._call(listed, args)
        except MCPServerError as exc:
            raise exc.about(listed.name) from exc.__cause__

    async def _call(self, listed: Listed, args: dict[str, Any]) -> Any:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        name = self.server.name
        current = self._listed if self._client is not None else None
        if current is None:
            current = {t.name: t for t in await self.listed()}
        now = current.get(listed.name)
        if now is None:
            raise MCPServerError(
                name,
                listed.name,
                "the server no longer offers this tool (it did when the run listed its tools)",
            )
        if _digest(now.input_schema) != _digest(listed.input_schema):
            raise MCPServerError(
                name,
                listed.name,
                "the tool's input schema changed since the run listed it; the model was "
                "shown the old one. Start a new run to use the new schema",
            )
        client, generation = await self.open()
        try:
            return await client.call_tool(listed.name, args)
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                await self._broken(generation)
                raise MCPServerError(name, listed.name, f"the call failed: {exc}") from exc
            raise _Refused(f"the server refused the call: {exc}") from exc  # the model's to fix
        except asyncio.CancelledError:
            current_task = asyncio.current_task()
            if current_task is not None and current_task.cancelling():
                raise  # our own cancellation (a timeout, the run cancelled)
            await self._broken(generation)
            raise MCPServerError(
                name, listed.name, "the connection dropped during the call"
            ) from None
        except RuntimeError as exc:  # the SDK checked a structured answer against its schema
            raise _Refused(f"its answer did not fit its own output schema: {exc}") from exc
        except Exception as exc:
            await self._broken(generation)
            raise MCPServerError(name, listed.name, f"the call failed: {_cause(exc)}") from exc


def _sdk(server: str) -> None:
    """The SDK is importable (it is an optional dependency), or a clear error."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError(
            f"MCP server {server!r}: MCP servers need the official SDK, which is not "
            "installed: pip install 'plait[mcp]'"
        ) from None


def _cause(exc: BaseException) -> str:
    """The innermost errors of what the SDK raised (it wraps them in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_cause(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
