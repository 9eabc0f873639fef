"""The service's listening socket: a cap on open connections, a deadline for a request's
headers, and logs that say once what happens a thousand times.

A client that opens many connections and sends its headers a byte at a time (slow-loris)
would hold a connection, and a file descriptor, each for as long as it likes. Here a
connection that has not sent its first request's headers within `header_timeout_s` is
closed, as is a kept-alive one idle for that long; at `max_connections` a new connection
closes the oldest one still sending its first headers, or is closed at once when every
connection has sent a request. A condition (connections refused, headers late, bad HTTP,
no file descriptor left to accept with) is logged when it starts and then at most once a
minute with a count, never once per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

_log = logging.getLogger("plait.serve")
NOTE_EVERY_S = 60.0
"""A condition that goes on is logged again at most this often, with its count."""
_FD_RESERVE = 256
"""File descriptors kept for the store, the backends' connections and batch files."""


def default_max_connections() -> int:
    """Connections to keep open at most: the process's open-file limit less what the store,
    the backends and batch files need, so that accepting never fails for want of one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, soft - _FD_RESERVE)


def raise_open_file_limit() -> None:
    """Raise the soft open-file limit to the hard one (as Go's runtime does): the soft
    default of 1024 would cap the service at a few hundred clients."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        # not allowed here: the derived cap follows the soft limit
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Notes:
    """Log lines of a condition that may repeat: the first at once, then at most one per
    `every_s` with how many were held back."""

    def __init__(self, log: logging.Logger = _log, every_s: float = NOTE_EVERY_S) -> None:
        self.log, self.every_s = log, every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def note(self, key: str, level: int, message: str, *args: object) -> None:
        now = asyncio.get_running_loop().time()
        last = self._last.get(key)
        if last is not None and now - last < self.every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        if held:
            message += f" ({held} more in the last {self.every_s:g} s)"
        self.log.log(level, message, *args)


class _HttpLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log for the service: a bad request is one line per condition,
    naming its kind but never its text, which quotes the raw line (a bearer token with it)."""

    def __init__(self, notes: Notes) -> None:
        super().__init__(logging.getLogger("plait.serve.http"), {})
        self.notes = notes

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        found = kwargs.get("exc_info")
        exc = sys.exc_info()[1] if found is True else found
        if isinstance(exc, HttpProcessingError):
            kind = type(exc).__name__
            self.notes.note(
                f"http:{kind}",
                logging.WARNING,
                "bad HTTP requests (%s): answered %d and closed",
                kind,
                exc.code,
            )
            return
        if isinstance(exc, RequestPayloadError):
            # the rest of a body, read after its request was answered (a 400 said why)
            self.logger.debug("the rest of an answered request's body is unreadable: %s", exc)
            return
        if level < logging.WARNING:
            self.logger.log(level, msg, *args, **kwargs)
            return
        text = str(msg) % args if args else str(msg)
        if isinstance(exc, BaseException):
            text += f": {type(exc).__name__}: {exc}"
        self.notes.note(f"http:{msg}", level, "%s", text)

    def process(
        self, msg: object, kwargs: MutableMapping[str, Any]
    ) -> tuple[object, MutableMapping[str, Any]]:
        return msg, kwargs


class Door:
    """Who may connect: made from the `[service]` settings, it gives the runner's options
    (`runner_options()`) and the site that listens (`site()`)."""

    def __init__(
        self,
        *,
        max_connections: int | None = None,
        header_timeout_s: float = 10.0,
        counted: Callable[[str], None] | None = None,
    ) -> None:
        """`counted(reason)`: told of each connection closed at the cap ("cap") or for its
        headers ("headers"), as a metric counts them."""
        self.max_connections = max_connections or default_max_connections()
        self.header_timeout_s = header_timeout_s
        self.counted = counted
        self.notes = Notes()
        self._open: dict[RequestHandler, _Guarded] = {}
        self._first: dict[RequestHandler, asyncio.TimerHandle] = {}
        """Connections whose first request's headers are not in yet, oldest first."""
        self._handler: RequestHandler | None = None
        self._previous: Any = None

    @property
    def open(self) -> int:
        return len(self._open)

    def runner_options(self) -> dict[str, Any]:
        """`web.AppRunner` keyword arguments: an idle kept-alive connection (and a later
        request's headers on it) has `header_timeout_s`, as has the rest of a body left
        unread by an early answer (a 408, a 413); aiohttp logs through `Notes`."""
        return {
            "keepalive_timeout": self.header_timeout_s,
            "lingering_time": min(10.0, self.header_timeout_s),
            "logger": _HttpLog(self.notes),
        }

    def site(self, runner: web.AppRunner, host: str, port: int) -> web.BaseSite:
        return _Site(runner, host, port, self)

    # --- connections ------------------------------------------------------------------------

    def _opened(self, guarded: _Guarded) -> bool:
        if len(self._open) >= self.max_connections:
            oldest = next(iter(self._first), None)
            self.notes.note(
                "cap",
                logging.WARNING,
                "%d connections open, the limit (max_connections): closing the oldest that "
                "has not sent a request, or else the new one",
                self.max_connections,
            )
            if self.counted is not None:
                self.counted("cap")
            if oldest is None:
                return False
            self._close(oldest)
        inner = guarded.inner
        self._open[inner] = guarded
        loop = asyncio.get_running_loop()
        self._first[inner] = loop.call_later(self.header_timeout_s, self._late, inner)
        return True

    def _late(self, inner: RequestHandler) -> None:
        if inner in self._first:
            self.notes.note(
                "headers",
                logging.WARNING,
                "closing connections that sent no whole request headers within %g s "
                "(header_timeout_s)",
                self.header_timeout_s,
            )
            if self.counted is not None:
                self.counted("headers")
            self._close(inner)

    def _close(self, inner: RequestHandler) -> None:
        guarded = self._open.pop(inner, None)
        timer = self._first.pop(inner, None)
        if timer is not None:
            timer.cancel()
        if guarded is not None and guarded.transport is not None:
            guarded.transport.abort()

    def _closed(self, inner: RequestHandler) -> None:
        self._open.pop(inner, None)
        timer = self._first.pop(inner, None)
        if timer is not None:
            timer.cancel()

    def _headers_in(self, inner: RequestHandler) -> None:
        timer = self._first.pop(inner, None)
        if timer is not None:
            timer.cancel()

    # --- the listening socket ---------------------------------------------------------------

    def _start(self, server: web.Server) -> None:
        made = server.request_factory

        def request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
            self._headers_in(protocol)  # the request line and headers are in
            return made(message, payload, protocol, writer, task)

        server.request_factory = request
        loop = asyncio.get_running_loop()
        self._previous = loop.get_exception_handler()
        loop.set_exception_handler(self._loop_error)

    def _stop(self) -> None:
        for timer in self._first.values():
            timer.cancel()
        self._first.clear()
        asyncio.get_running_loop().set_exception_handler(self._previous)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            # asyncio says so with a traceback each time it tries again
            self.notes.note(
                "accept",
                logging.ERROR,
                "cannot accept connections: %s (%d open); raise the open-file limit or "
                "lower max_connections",
                context.get("exception"),
                len(self._open),
            )
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


class _Guarded(asyncio.Protocol):
    """One connection as the door sees it, in front of aiohttp's protocol."""

    def __init__(self, door: Door, inner: RequestHandler) -> None:
        self.door, self.inner = door, inner
        self.transport: asyncio.Transport | None = None
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.door._opened(self):
            transport.abort()
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self.admitted:
            self.inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.admitted:
            self.door._closed(self.inner)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()


class _Site(web.BaseSite):
    """A TCP site whose connections go through the door."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, door: Door) -> None:
        super().__init__(runner)
        self._host, self._port, self._door = host, port, door

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        door = self._door
        door._start(server)
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(door, server()), self._host, self._port
        )

    async def stop(self) -> None:
        await super().stop()
        self._door._stop()
