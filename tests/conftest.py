from __future__ import annotations

import asyncio
import getpass
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from memory import SQLStore
from orchestrator import VirtualClock

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
