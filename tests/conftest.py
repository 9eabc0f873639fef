from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from memory import SQLStore
from orchestrator import VirtualClock
from orchestrator.ext import EventRecord, Store, StoreBatch, StoreSize, WorkflowRow, WorkflowStatus

T = TypeVar("T")


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def vrun(clock: VirtualClock) -> Callable[[Coroutine[Any, Any, T]], T]:
    """Run a coroutine on the test's virtual clock (time jumps whenever everything waits)."""
    return clock.run


# --- stores: the same tests on SQLite and on the local PostgreSQL ----------------------------

PG_HOST = "127.0.0.1:5432"


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _pg_user() -> str | None:
    import asyncpg

    for user in ("postgres", getpass.getuser()):
        try:
            conn = await asyncpg.connect(f"postgresql://{user}@{PG_HOST}/test", timeout=5)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            continue
        await conn.close()
        return user
    return None


def _find_pg_user() -> str | None:
    user = run(_pg_user())
    if user is None and shutil.which("pg_ctlcluster") and Path("/etc/postgresql").is_dir():
        for version in os.listdir("/etc/postgresql"):
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"],
                capture_output=True,
                check=False,
            )
        user = run(_pg_user())
    return user


@pytest.fixture(scope="session")
def pg_user() -> str:
    user = _find_pg_user()
    if user is None:
        pytest.skip(f"no PostgreSQL at {PG_HOST} (database test, user postgres or current)")
    return user


StoreFactory = Callable[..., SQLStore]


@pytest.fixture(params=["sqlite", "postgresql"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds unopened stores on one database: every call sees the same data."""
    if request.param == "sqlite":
        path = tmp_path / "store.db"
        yield lambda **kw: SQLStore(path, **kw)
        return
    user = request.getfixturevalue("pg_user")
    url = f"postgresql+asyncpg://{user}@{PG_HOST}/test"
    name = f"plait_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    yield lambda **kw: SQLStore(url, schema=name, **kw)

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(f"postgresql://{user}@{PG_HOST}/test")
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()

    run(drop())


class MemoryStore(Store):
    """A real in-memory `Store` (tests of the journal and the engine): the event log alone,
    no feature beyond it (no retention, leases, cancel requests or keys); keeps everything in
    dicts; `hold()` makes the next commits wait for `release()`; `fail_with` fails the next
    commits, `fail_after=N` every commit after the first N (a disk that fills);
    `committed` is set by each commit that went through."""

    def __init__(self, *, fail_after: int | None = None) -> None:
        self.batches: list[StoreBatch] = []
        self.rows: dict[str, WorkflowRow] = {}
        self.log: dict[str, list[EventRecord]] = {}
        self.blobs: dict[str, bytes] = {}
        self.calls: dict[tuple[str, str], str] = {}
        self.entered = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self.fail_with: Exception | None = None
        self.fail_after = fail_after
        self.committed = asyncio.Event()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def append(self, batch: StoreBatch) -> None:
        self.entered.set()
        await self._gate.wait()
        self.entered.clear()
        if self.fail_with is not None:
            raise self.fail_with
        if self.fail_after is not None and len(self.batches) >= self.fail_after:
            raise OSError(28, "No space left on device")
        for record in batch.events:
            log = self.log.setdefault(record.workflow, [])
            assert record.seq == len(log) + 1, "seq must continue without gaps"
            log.append(record)
        for row in batch.workflows:
            self.rows[row.id] = row
        self.blobs.update(batch.payloads)
        for call in batch.calls:
            self.calls.setdefault((call.program, call.request_hash), call.digest)
        self.batches.append(batch)
        self.committed.set()

    async def events(
        self, workflow: str, after_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        log = self.log.get(workflow, [])
        return log[after_seq : None if limit is None else after_seq + limit]

    async def last_seq(self, workflow: str) -> int:
        return len(self.log.get(workflow, []))

    async def payloads(self, digests: Sequence[str]) -> dict[str, bytes]:
        return {d: self.blobs[d] for d in digests if d in self.blobs}

    async def workflow(self, workflow: str) -> WorkflowRow | None:
        return self.rows.get(workflow)

    async def workflows(
        self,
        *,
        status: WorkflowStatus | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[WorkflowRow]:
        wanted = dict(labels or {}).items()
        rows = [
            r
            for r in reversed(self.rows.values())
            if status in (None, r.status)
            and tenant in (None, r.tenant)
            and wanted <= dict(r.labels).items()
        ]
        return rows[offset : offset + limit]

    async def unfinished(self) -> list[str]:
        return [r.id for r in self.rows.values() if r.status in ("pending", "running")]

    async def find_call(self, program: str, request_hash: str) -> bytes | None:
        digest = self.calls.get((program, request_hash))
        return None if digest is None else self.blobs[digest]

    async def size(self) -> StoreSize:
        return StoreSize(
            workflows=len(self.rows),
            events=sum(map(len, self.log.values())),
            payloads=len(self.blobs),
            calls=len(self.calls),
            event_bytes=sum(len(e.data) for log in self.log.values() for e in log),
            payload_bytes=sum(map(len, self.blobs.values())),
        )

    @property
    def committed_events(self) -> int:
        return sum(map(len, self.log.values()))
