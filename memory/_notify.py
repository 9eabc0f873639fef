"""Notifiers between processes (`orchestrator.Notifier`): PostgreSQL LISTEN/NOTIFY, Redis
pub/sub. Open with `async with`; a notifier that loses its connection reconnects on the
next notify and re-listens, and meanwhile its users fall back on their polling."""

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
        self.sent = 0
        self.received = 0

    async def __aenter__(self) -> PgNotifier:
        await self._connection()
        return self

    async def __aexit__(self, *exc: Any) -> None:
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
        self._conn = conn
        return conn

    def _deliver(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        self.received += 1
        for listener in list(self._listeners.get(channel, ())):
            listener(payload)

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
            for listener in list(self._listeners.get(channel, ())):
                listener(payload)

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
