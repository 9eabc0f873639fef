"""Peer messages survive a receiver that is killed: a real process receives from a mailbox
in the store (a SQLite file, or the local PostgreSQL), acknowledges some messages, and is
SIGKILLed while it holds the rest; a new receiver then gets every message not acknowledged,
at least once and in each sender's order, and never one that was acknowledged.

The test follows the receiver through its stdout (each line written once the step is
done), never by sleeping; the new receiver waits in `receive`, which wakes when the dead
receiver's leases run out."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PG_HOST

from agents import Address, Delivery, PostOffice
from memory import SQLMailStore, SQLStore

ROOT = Path(__file__).resolve().parent.parent
READER = Address("acme", "wf-1", "reader")
ALICE = READER.peer("alice")
BOB = READER.peer("bob")
VISIBILITY_S = 2.0
ACKED = {("alice", 1), ("alice", 2), ("alice", 4), ("bob", 1)}
"""What the receiver acknowledges before it dies: alice 4 out of order, past alice 3."""


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str | None]]:
    if request.param == "sqlite":
        yield str(tmp_path / "mail.db"), None
        return
    user = request.getfixturevalue("pg_user")
    schema = f"plait_mailcrash_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    yield f"postgresql+asyncpg://{user}@{PG_HOST}/test", schema

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(f"postgresql://{user}@{PG_HOST}/test")
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()

    asyncio.run(drop())


async def send_all(target: str, schema: str | None) -> None:
    async with SQLStore(target, schema=schema) as store:
        office = PostOffice(SQLMailStore(store))
        for n in range(1, 7):
            await office.send(ALICE, READER, {"n": n, "ack": ("alice", n) in ACKED})
            if n <= 4:
                await office.send(BOB, READER, {"n": n, "ack": ("bob", n) in ACKED})


def run_receiver_until_killed(target: str, schema: str | None) -> list[object]:
    """The receiver's report, up to `ready`; then it is SIGKILLed."""
    argv = [sys.executable, str(ROOT / "tests" / "_mail_receiver.py")]
    argv += [target, schema or "-", str(VISIBILITY_S)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lines: list[object] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env) as child:
        assert child.stdout is not None
        try:
            for text in child.stdout:
                line = json.loads(text)
                if line == "ready":
                    break
                lines.append(line)
            else:
                raise AssertionError(f"the receiver ended without `ready` (rc {child.wait()})")
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    return lines


async def receive_the_rest(target: str, schema: str | None, expect: int) -> list[Delivery]:
    async with SQLStore(target, schema=schema) as store:
        office = PostOffice(SQLMailStore(store), poll_s=0.25)
        got: list[Delivery] = []
        # The first wait ends when the dead receiver's leases run out; one that finds
        # nothing in 3 leases' time means something was lost.
        while len({d.id for d in got}) < expect:
            batch = await office.receive(READER, limit=3, wait_s=3 * VISIBILITY_S)
            if not batch:
                break
            got.extend(batch)
            await office.ack(*batch)
        assert await office.receive(READER, wait_s=0) == []  # every lease has run out
        return got


def test_a_killed_receivers_unacknowledged_messages_come_to_the_next(
    target: tuple[str, str | None],
) -> None:
    url, schema = target
    asyncio.run(send_all(url, schema))
    report = run_receiver_until_killed(url, schema)
    held = {tuple(line["got"]) for line in report if isinstance(line, dict) and "got" in line}
    acked = {tuple(line["acked"]) for line in report if isinstance(line, dict) and "acked" in line}
    assert acked == ACKED
    # It got alice 1-6 and bob 1-2; bob 3 and 4 waited behind bob 2, which it held.
    assert held == {("alice", n) for n in range(1, 7)} | {("bob", 1), ("bob", 2)}

    unacked = {("alice", 3), ("alice", 5), ("alice", 6), ("bob", 2), ("bob", 3), ("bob", 4)}
    got = asyncio.run(receive_the_rest(url, schema, len(unacked)))
    ids = [(d.id.sender.agent, d.id.seq) for d in got]
    assert set(ids) == unacked  # every one not acknowledged, none that was
    for sender in ("alice", "bob"):
        seqs = [seq for agent, seq in ids if agent == sender]
        assert seqs == sorted(seqs)  # each sender's order
    attempts = {(d.id.sender.agent, d.id.seq): d.attempt for d in got}
    assert attempts == {key: 2 if key in held else 1 for key in unacked}
