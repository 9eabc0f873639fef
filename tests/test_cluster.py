"""Three `plait serve` processes on one PostgreSQL store share 300 workflows; one is killed
with SIGKILL mid-run; the other two take its runs over and every workflow finishes exactly
once (docs/scaling.md)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg
from conftest import PG_HOST

from orchestrator.service import hash_token

HERE = Path(__file__).resolve().parent
PLAIT = Path(sys.executable).parent / "plait"
TOKEN = "cluster-token"
CHAIN = {
    "name": "chain",
    "tasks": [
        {"id": "a", "function": "nap"},
        {"id": "b", "function": "nap", "after": ["a"]},
        {"id": "c", "function": "nap", "after": ["b"]},
    ],
}


def config(tmp_path: Path, name: str, url: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f"""
[service]
port = 0
store = "{url}"
registry = ["{HERE / "cluster_work.py"}"]
drain_s = 0
lease_s = 1.0
engine_id = "{name}"

[[tenants]]
name = "acme"
token_sha256 = "{hash_token(TOKEN)}"
max_running = 1000
rate_per_s = 10000
burst = 10000
"""
    )
    return path


class Engine:
    """One `plait serve` process, with the URL it listens on."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, url: str) -> None:
        self.name, self.process, self.url = name, process, url


async def launch(tmp_path: Path, name: str, store_url: str) -> Engine:
    env = {
        **os.environ,
        "PLAIT_TEST_NAP": "0.3",
        "PLAIT_TEST_GATE": str(tmp_path / "gate"),
        "PYTHONPATH": str(HERE),
    }
    process = await asyncio.create_subprocess_exec(
        str(PLAIT), "serve", "--config", str(config(tmp_path, name, store_url)),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    async with asyncio.timeout(60):
        while True:
            line = (await process.stdout.readline()).decode()
            seen.append(line)
            assert line, f"{name} exited before listening: {''.join(seen)}"
            if "listening on" in line:
                url = next(w for w in line.split() if w.startswith("http://"))
                return Engine(name, process, url)


async def drain(engine: Engine) -> None:
    """Keep reading an engine's output so its pipe never fills."""
    assert engine.process.stdout is not None
    while await engine.process.stdout.readline():
        pass


async def rows(pg: asyncpg.Connection) -> dict[str, tuple[str, str | None]]:
    found = await pg.fetch("SELECT id, status, owner FROM plait_workflows")
    return {r["id"]: (r["status"], r["owner"]) for r in found}


def test_three_engines_share_300_workflows_and_survive_one_killed(
    tmp_path: Path, pg_user: str
) -> None:
    schema = f"plait_cluster_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    store_url = f"postgresql+asyncpg://{pg_user}@{PG_HOST}/test?schema={schema}"

    async def main() -> None:
        engines = [await launch(tmp_path, f"e{i}", store_url) for i in (1, 2, 3)]
        readers = [asyncio.create_task(drain(e)) for e in engines]
        pg = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
        await pg.execute(f"SET search_path TO {schema}")
        try:
            submitted: dict[str, str] = {}  # run id -> the engine that took it
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as http:

                async def submit(i: int) -> None:
                    engine = engines[i % 3]
                    async with http.post(engine.url + "v1/workflows", json=CHAIN) as r:
                        assert r.status == 202, await r.text()
                        submitted[(await r.json())["id"]] = engine.name

                await asyncio.gather(*(submit(i) for i in range(300)))
            victim = engines[1]
            # Kill e2 once some of its runs have finished and others have not.
            async with asyncio.timeout(60):
                while True:
                    state = await rows(pg)
                    mine = [s for w, (s, _) in state.items() if submitted[w] == victim.name]
                    if any(s == "succeeded" for s in mine):
                        break
                    await asyncio.sleep(0.05)
            victim.process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            await victim.process.wait()
            left = {w for w, (s, _) in (await rows(pg)).items() if s != "succeeded"}
            orphans = {w for w in left if submitted[w] == victim.name}
            assert orphans, "the kill came too late: e2 had finished all its runs"
            async with asyncio.timeout(120):
                while True:
                    state = await rows(pg)
                    if len(state) == 300 and all(s != "running" for s, _ in state.values()):
                        break
                    await asyncio.sleep(0.1)
            took = time.monotonic() - killed_at
            assert Counter(s for s, _ in state.values()) == {"succeeded": 300}
            finishes = await pg.fetch(
                "SELECT workflow_id, count(*) AS n FROM plait_events "
                "WHERE kind = 'workflow_finished' GROUP BY workflow_id"
            )
            assert len(finishes) == 300 and {r["n"] for r in finishes} == {1}
            for w in orphans:
                assert state[w][1] in ("e1", "e3"), (w, state[w])
            # Each run's last step ran on what came before it, whichever engine ran it.
            last = {}
            for record in await pg.fetch(
                "SELECT workflow_id, data FROM plait_events WHERE kind = 'task_succeeded'"
            ):
                data = json.loads(record["data"])
                if data["task"] == "c":
                    last[record["workflow_id"]] = data["result"]
            assert len(last) == 300 and set(last.values()) == {"c after ['b']"}
            print(f"{len(orphans)} runs taken over; all finished {took:.1f} s after the kill")
        finally:
            for engine in engines:
                if engine.process.returncode is None:
                    engine.process.send_signal(signal.SIGTERM)
            for engine in engines:
                await engine.process.wait()
            for reader in readers:
                reader.cancel()
            await pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await pg.close()

    asyncio.run(main())


def test_any_engine_answers_for_a_workflow_another_runs(tmp_path: Path, pg_user: str) -> None:
    """A load balancer may send any request to any engine: a cancel and a `?wait=` sent to
    e2 for workflows e1 runs reach them (the cancel through LISTEN/NOTIFY), and a retry with
    the same Idempotency-Key finds the workflow the first request made on e1."""
    schema = f"plait_cluster_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    store_url = f"postgresql+asyncpg://{pg_user}@{PG_HOST}/test?schema={schema}"
    held = {"name": "held", "tasks": [{"id": "h", "function": "hold"}]}

    async def main() -> None:
        e1 = await launch(tmp_path, "e1", store_url)
        e2 = await launch(tmp_path, "e2", store_url)
        readers = [asyncio.create_task(drain(e)) for e in (e1, e2)]
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as http:
                ids = []
                for _ in range(2):
                    async with http.post(e1.url + "v1/workflows", json=held) as r:
                        assert r.status == 202
                        ids.append((await r.json())["id"])
                async with http.delete(e2.url + f"v1/workflows/{ids[0]}") as r:
                    assert r.status == 202, await r.text()
                async with http.get(e2.url + f"v1/workflows/{ids[0]}/result?wait=30") as r:
                    result = await r.json()
                assert result["status"] == "cancelled", result
                assert result["failures"]["h"] == "cancelled through the API"
                (tmp_path / "gate").write_text("")
                async with http.get(e2.url + f"v1/workflows/{ids[1]}/result?wait=30") as r:
                    result = await r.json()
                assert result["status"] == "succeeded" and result["results"] == {"h": "through"}
                async with http.delete(e2.url + f"v1/workflows/{ids[1]}") as r:
                    assert r.status == 409 and "finished already" in (await r.json())["error"]
                # A retry sent to another engine finds the workflow the first request made.
                key = {"Idempotency-Key": "once"}
                async with http.post(e1.url + "v1/workflows", json=held, headers=key) as r:
                    assert r.status == 202
                    first = (await r.json())["id"]
                async with http.post(e2.url + "v1/workflows", json=held, headers=key) as r:
                    assert r.status == 200 and (await r.json())["id"] == first
                other = {**held, "name": "other"}
                async with http.post(e2.url + "v1/workflows", json=other, headers=key) as r:
                    assert r.status == 422, await r.text()
        finally:
            for engine in (e1, e2):
                engine.process.send_signal(signal.SIGTERM)
                await engine.process.wait()
            for reader in readers:
                reader.cancel()
            pg = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
            await pg.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await pg.close()

    asyncio.run(main())
