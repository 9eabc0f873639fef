"""Notifiers between processes (`orchestrator.ext.Notifier`): PostgreSQL LISTEN/NOTIFY, Redis
pub/sub. Open with `async with`. A notifier that loses its connection connects again in the
background and listens again; then it calls every listener with an empty payload ("look
again"), since what was sent meanwhile was missed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
import sqlalchemy as sa

from orchestrator import StoreError

_log = logging.getLogger("plait.notify")
Listener = Callable[[str], None]
_MAX_PAYLOAD = 7_000
"""PostgreSQL refuses payloads of 8,000 bytes or more; a notification is a hint anyway."""


class PgNotifier:
    """LISTEN/NOTIFY on a PostgreSQL database: one connection of its own, which listens and
    sends. `url`: the store's URL (`postgresql+asyncpg://...` or `postgresql://...`)."""

    def __init__(self, url: str, *, connect_timeout: float = 10.0) -> None:
        parsed = sa.make_url(url)
        if parsed.get_backend_name() != "postgresql":
            raise StoreError(
                f"PgNotifier needs a PostgreSQL URL, got {parsed.render_as_string()!r}"
            )
        self._dsn = parsed.set(drivername="postgresql").difference_update_query(["schema"])
        self._timeout = connect_timeout
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._listeners: dict[str, list[Listener]] = {}
        self._closing = False
        self._reconnecting: asyncio.Task[None] | None = None
        self.sent = 0
        self.received = 0
        self.reconnects = 0

    async def __aenter__(self) -> PgNotifier:
        await self._connection()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closing = True
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        try:
            dsn = self._dsn.render_as_string(hide_password=False)
            conn = await asyncpg.connect(dsn, timeout=self._timeout)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            raise StoreError(
                f"cannot reach PostgreSQL for notifications: {exc}", transient=True
            ) from exc
        for channel in self._listeners:
            await conn.add_listener(channel, self._deliver)
        conn.add_termination_listener(self._lost)
        self._conn = conn
        return conn

    def _lost(self, _conn: Any) -> None:
        """The listening connection closed (the server restarted, a proxy cut it): connect
        again in the background, then tell every listener to look again (notifications
        sent meanwhile were missed)."""
        if self._closing:
            return
        self._conn = None
        if self._reconnecting is None or self._reconnecting.done():
            loop = asyncio.get_running_loop()
            self._reconnecting = loop.create_task(self._reconnect(), name="plait-pg-notify")

    async def _reconnect(self) -> None:
        delay = 0.1
        while not self._closing:
            try:
                async with self._lock:
                    await self._connection()
            except StoreError as exc:
                _log.warning("notifications: cannot reconnect yet (%s)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.reconnects += 1
            for listeners in list(self._listeners.values()):
                _tell(listeners, "")
            return

    def _deliver(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        self.received += 1
        _tell(self._listeners.get(channel, ()), payload)

    async def notify(self, channel: str, payload: str = "") -> None:
        async with self._lock:
            conn = await self._connection()
            await conn.execute("SELECT pg_notify($1, $2)", channel, payload[:_MAX_PAYLOAD])
        self.sent += 1

    async def listen(self, channel: str, listener: Listener) -> None:
        first = channel not in self._listeners
        self._listeners.setdefault(channel, []).append(listener)
        if first and self._conn is not None and not self._conn.is_closed():
            async with self._lock:
                await self._conn.add_listener(channel, self._deliver)

    def unlisten(self, channel: str, listener: Listener) -> None:
        listeners = self._listeners.get(channel, [])
        if listener in listeners:
            listeners.remove(listener)


class RedisNotifier:
    """Pub/sub on a Redis server (`redis://host:6379/0`); needs the `redis` package
    (`pip install plait[cluster]`)."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0") -> None:
        try:
            import redis.asyncio as aioredis
        except ImportError as exc:  # pragma: no cover - installed with the cluster extra
            raise StoreError(
                "RedisNotifier needs the redis package: pip install 'plait[cluster]'"
            ) from exc
        self._redis = aioredis.from_url(url)
        self._url = url
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._listeners: dict[str, list[Listener]] = {}
        self.sent = 0
        self.received = 0

    async def __aenter__(self) -> RedisNotifier:
        try:
            await self._redis.ping()
        except Exception as exc:
            raise StoreError(f"cannot reach Redis at {self._url}: {exc}", transient=True) from exc
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        # A subscription before the first channel: the reader has something to read.
        await self._pubsub.subscribe("plait:hello")
        for channel in self._listeners:
            await self._pubsub.subscribe(channel)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
        with contextlib.suppress(Exception):
            await self._redis.aclose()

    async def _read(self) -> None:
        while True:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the connection broke: users poll meanwhile
                _log.warning("redis notifications interrupted: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else str(channel)
            data = message["data"]
            payload = data.decode() if isinstance(data, bytes) else str(data)
            self.received += 1
            _tell(self._listeners.get(channel, ()), payload)

    async def notify(self, channel: str, payload: str = "") -> None:
        try:
            await self._redis.publish(channel, payload)
        except Exception as exc:
            raise StoreError(
                f"cannot publish to Redis at {self._url}: {exc}", transient=True
            ) from exc
        self.sent += 1

    async def listen(self, channel: str, listener: Listener) -> None:
        first = channel not in self._listeners
        self._listeners.setdefault(channel, []).append(listener)
        if first and self._pubsub is not None:
            await self._pubsub.subscribe(channel)

    def unlisten(self, channel: str, listener: Listener) -> None:
        listeners = self._listeners.get(channel, [])
        if listener in listeners:
            listeners.remove(listener)


def _tell(listeners: list[Listener] | tuple[()], payload: str) -> None:
    """Call each listener; one that raises is logged and does not stop the others."""
    for listener in list(listeners):
        try:
            listener(payload)
        except Exception:
            _log.exception("a notification listener failed")
