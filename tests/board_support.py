"""What the blackboard's tests share: a clock set by hand, and the board's stores (in-process,
SQLite, PostgreSQL) opened on one database per test."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from agents import BoardStore, MemoryBoardStore
from memory import SQLBoardStore, SQLStore

PG = "127.0.0.1:5432"


class HandClock:
    """A `Clock` whose time moves only when the test says (`advance`): leases and deadlines
    are checked by `board.sweep()` at exactly the instant the test chose."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.t = start

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def monotonic(self) -> float:
        return self.t

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    def check_running_loop(self) -> None:
        pass


OpenStore = Callable[[], AbstractAsyncContextManager[BoardStore]]
"""Opens the test's board store; every call sees the same data (a second process, say)."""


def store_opener(kind: str, tmp_path: Path, pg_user: str | None) -> tuple[OpenStore, Any]:
    """(opener, cleanup coroutine function or None) for `kind`."""
    if kind == "memory":
        shared = MemoryBoardStore()

        @asynccontextmanager
        async def memory() -> AsyncIterator[BoardStore]:
            yield shared

        return memory, None
    if kind == "sqlite":
        target: str | Path = tmp_path / "board.db"
        schema = None
    else:
        target = f"postgresql+asyncpg://{pg_user}@{PG}/test"
        schema = f"plait_board_{os.getpid()}_{uuid.uuid4().hex[:10]}"

    @asynccontextmanager
    async def sql() -> AsyncIterator[BoardStore]:
        async with SQLStore(target, schema=schema) as store:
            yield SQLBoardStore(store)

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(f"postgresql://{pg_user}@{PG}/test")
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()

    return sql, (drop if schema else None)
