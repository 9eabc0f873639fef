"""The process the crash harness kills (bench/crash.py): it opens the store, resumes whatever
an earlier process left unfinished, submits the workflows of its list that the store has
never seen, and awaits them all.

It runs forked from a server process that has imported plait once (`multiprocessing`'s
forkserver, preloaded with this module), so a restart after a kill costs a fork, not the
seconds of importing openai, SQLAlchemy and Alembic again. What it tells the harness goes
through a pipe: ("resuming",) once its engine is up, ("resumed", runs, unresumable) once
`resume()` has answered, ("submitted", n), ("committed", calls, seconds) after each commit
(with the LLM call records it held and how long it took), and ("done", failures) before it
exits 0.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from _crash_work import REGISTRY_ENTRIES, build

from executors import OpenAIBackend
from memory import SQLStore
from orchestrator import Engine, Limits, Registry, RunHandle
from orchestrator.ext import StoreBatch

EXIT_FAILED = 3
"""The child ran to its end but some workflow did not succeed."""


@dataclass(frozen=True)
class ChildSpec:
    """What one child process runs. `epoch` is its generation (0 for the first), sent as its
    API key, so the server's log says which process sent each request."""

    store: str
    schema: str | None
    server: str
    names: tuple[str, ...]
    epoch: int
    max_in_flight: int = 64


class TellingStore(SQLStore):
    """The SQL store, telling the harness after each commit how many LLM call records it
    held and how long it took: a kill can then land just after replies became durable,
    which is when a resumed run must answer them from the store instead of sending them."""

    def __init__(self, target: str, *, schema: str | None, tell: Connection) -> None:
        super().__init__(target, schema=schema)
        self._tell = tell

    async def append(self, batch: StoreBatch) -> None:
        started = time.perf_counter()
        await super().append(batch)
        self._tell.send(("committed", len(batch.calls), time.perf_counter() - started))


async def run(spec: ChildSpec, tell: Connection) -> list[str]:
    """Resume and submit everything; return the names of workflows that did not succeed."""
    async with (
        TellingStore(spec.store, schema=spec.schema, tell=tell) as store,
        OpenAIBackend(spec.server, dialect="openai", api_key=f"epoch-{spec.epoch}") as llm,
        Engine(
            backends={"default": llm},
            store=store,
            limits={"default": Limits(max_in_flight=spec.max_in_flight)},
        ) as engine,
    ):
        tell.send(("resuming",))
        report = await engine.resume(registry=Registry(*REGISTRY_ENTRIES))
        unresumable = [f"{p.workflow}: {p.error}" for p in report.failed]
        unresumable += [f"{p.workflow}: waits for a decision" for p in report.needs_decision]
        tell.send(("resumed", len(report.runs), unresumable))
        handles: list[RunHandle] = list(report.runs)
        # Every run ever started has a row (written in the commit of its first event), so
        # the names listed are those a resume or an earlier process already owns.
        known = {row.name for row in await store.workflows(limit=len(spec.names) * 4 + 100)}
        handles += [engine.submit(build(name)) for name in spec.names if name not in known]
        tell.send(("submitted", len(handles)))
        results = await asyncio.gather(*handles)
    return [r.workflow for r in results if r.status != "succeeded"]


def main(spec: ChildSpec, tell: Connection) -> None:
    """The child's entry point (a `multiprocessing` target)."""
    try:
        failed = asyncio.run(run(spec, tell))
    except BaseException:
        traceback.print_exc()
        tell.send(("error", traceback.format_exc()))
        sys.exit(1)
    tell.send(("done", failed))
    if failed:
        print(f"crash child: {len(failed)} workflows did not succeed", file=sys.stderr)
        sys.exit(EXIT_FAILED)
