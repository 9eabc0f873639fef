"""A database that goes away mid-run: the run pauses while the journal tries its commit
again, and goes on when the database is back, with nothing lost. A real PostgreSQL behind a
TCP proxy that the test cuts and restores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid

from conftest import PG_HOST

from memory import SQLStore
from orchestrator import Engine, TaskContext, Workflow


class Proxy:
    """Forwards TCP to the database until `cut()`: then every connection is closed and new
    ones are refused (as a database that went away) until `restore()`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.up = True
        self.refused = asyncio.Event()
        self._pipes: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        self.up = False
        for writer in list(self._pipes):
            writer.close()

    def restore(self) -> None:
        self.up = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            self.refused.set()
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._pipes.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while self.up and (data := await reader.read(65536)):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._pipes.discard(writer)


async def wait_at(gate: asyncio.Event, reached: asyncio.Event) -> str:
    reached.set()
    await gate.wait()
    return "through"


def test_a_run_pauses_while_postgresql_is_away_and_goes_on_when_it_is_back(
    pg_user: str,
) -> None:
    async def main() -> None:
        host, port = PG_HOST.split(":")
        proxy = Proxy(host, int(port))
        local = await proxy.start()
        schema = f"plait_outage_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        gate, reached = asyncio.Event(), asyncio.Event()

        async def hold(ctx: TaskContext) -> str:
            return await wait_at(gate, reached)

        wf = Workflow("outage")
        wf.add("before", lambda: 1)
        wf.add("hold", hold, after=["before"])
        for i in range(20):
            wf.add(f"after {i}", lambda: 2, after=["hold"])
        url = f"postgresql+asyncpg://{pg_user}@127.0.0.1:{local}/test"
        try:
            async with SQLStore(url, schema=schema) as store:
                async with Engine(store=store) as engine:
                    handle = engine.submit(wf)
                    await reached.wait()
                    assert engine.journal is not None
                    await engine.journal.durable()
                    proxy.cut()  # the database goes away with the run half done
                    gate.set()  # ... and the run goes on making events
                    await proxy.refused.wait()  # the journal tried to reach it again
                    waiting = asyncio.ensure_future(handle.result())
                    await asyncio.sleep(0)
                    assert engine.journal.outage and not waiting.done()  # paused, not failed
                    proxy.restore()
                    result = await waiting
                    assert engine.journal.outages >= 1
                assert result.status == "succeeded" and len(result.results) == 22
                records = await store.events(result.workflow)
                assert [r.seq for r in records] == list(range(1, len(records) + 1))
                assert records[-1].kind == "workflow_finished"
                row = await store.workflow(result.workflow)
                assert row is not None and row.status == "succeeded"
        finally:
            await proxy.close()
            import asyncpg

            conn = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

    asyncio.run(main())
