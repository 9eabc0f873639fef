"""A store with damaged rows (written by hand, a bad disk, a bad migration): labels that are
not JSON, an event that is not, a log without its first event, a status no version wrote.
The service starts and resumes the rest; a damaged workflow reads as damaged, alone, and
every other one, and the list, read as before. Real stores (SQLite, PostgreSQL), damaged
with plain SQL; a real server over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import StoreFactory
from test_hostile_input import REGISTRY, Api, Gate, running

from executors import FunctionLLM, echo
from memory import SQLStore
from orchestrator import Engine

TASK = {"tool": "echo_text", "args": {"text": "hi"}}


async def _finished(api: Api, count: int) -> list[str]:
    ids = []
    for _ in range(count):
        status, data = await api.call("POST", "/v1/tasks?wait=30", TASK)
        assert status == 200 and data["status"] == "succeeded", data
        ids.append(data["id"])
    return ids


async def _sql(store: SQLStore, statement: str, **params: Any) -> None:
    async with store._engine(writer=True).begin() as conn:
        await conn.execute(sa.text(statement), params)


def test_damaged_labels_on_an_unfinished_row_do_not_stop_the_start(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        Gate.opened = asyncio.Event()
        async with make_store() as store:
            async with running(store) as api:
                bad, good = await _finished(api, 2)
            # JSON PostgreSQL's json type takes, and text only SQLite would keep.
            damaged = "[1]" if store.url.drivername.startswith("postgresql") else "[[["
            await _sql(store, "UPDATE plait_workflows SET status = 'running'")
            await _sql(
                store, "UPDATE plait_workflows SET labels = :l WHERE id = :i", l=damaged, i=bad
            )
            async with Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine:
                report = await engine.resume(REGISTRY)
                assert {p.workflow for p in report.plans} == {bad, good}
            async with running(store) as api:
                assert await api.ids() == sorted([bad, good])
                for run_id in (bad, good):
                    status, data = await api.call("GET", f"/v1/workflows/{run_id}")
                    assert status == 200, data
                await api.other_tenant_runs()

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "labels" in r.getMessage()]
    assert said and "damaged" in said[0], caplog.text


async def _events(api: Api, run_id: str) -> tuple[int, str]:
    async with api.http.get(f"{api.base}/v1/workflows/{run_id}/events", headers=A) as r:
        async with asyncio.timeout(30):
            return r.status, await r.text()


A = {"Authorization": "Bearer acme-token"}


def test_a_damaged_workflow_reads_as_damaged_and_alone(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        Gate.opened = asyncio.Event()
        async with make_store() as store:
            async with running(store) as api:
                bad_event, no_first, bogus, good = await _finished(api, 4)
            await _sql(
                store,
                "UPDATE plait_events SET data = '{not json' WHERE workflow_id = :i AND seq = 2",
                i=bad_event,
            )
            await _sql(
                store, "DELETE FROM plait_events WHERE workflow_id = :i AND seq = 1", i=no_first
            )
            await _sql(store, "UPDATE plait_workflows SET status = 'bogus' WHERE id = :i", i=bogus)
            async with running(store) as api:
                status, data = await api.call("GET", "/v1/workflows?limit=500")
                assert status == 200, data
                shown = {w["id"]: w["status"] for w in data["workflows"]}
                assert shown == {
                    bad_event: "succeeded",
                    no_first: "succeeded",
                    bogus: "failed",
                    good: "succeeded",
                }, shown
                for run_id in (bad_event, no_first):
                    for path in ("", "/result"):
                        status, data = await api.call("GET", f"/v1/workflows/{run_id}{path}")
                        assert status == 500, data
                        assert "stored log is damaged" in data["error"], data
                        assert run_id in data["error"], data
                # The stream sends the log's events as they are: one it cannot read ends it.
                status, text = await _events(api, bad_event)
                assert status == 200 and "HTTP/1.1" not in text, text
                assert "event: error" in text, text
                assert "stored log is damaged" in text, text
                status, text = await _events(api, no_first)
                assert status == 200 and "HTTP/1.1" not in text, text
                status, data = await api.call("GET", f"/v1/workflows/{good}/result")
                assert status == 200 and data["results"] == {"task": "hi"}, data
                status, data = await api.call("GET", f"/v1/workflows/{bogus}")
                assert status == 200 and data["status"] == "failed", data
                status, text = await _events(api, good)
                assert status == 200 and "task_succeeded" in text, text
                await api.healthy()
                await api.other_tenant_runs()

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    assert "Traceback" not in caplog.text, caplog.text
