"""The service under hostile or careless clients: slow and surplus connections, bad HTTP,
many event streams, expensive reads. A real server on a free port, the real store, real
sockets; each test fails without the guard it pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import StoreFactory

from executors import FunctionLLM, echo
from memory import SQLStore
from orchestrator import Engine, Registry, TaskContext, VirtualClock
from orchestrator.durability._journal import read_log
from orchestrator.durability._replay import rebuild
from orchestrator.ext import EventRecord, Store
from orchestrator.service import Service, Tenant, hash_token
from orchestrator.service import _app as service_app
from orchestrator.service._app import _view
from orchestrator.service._config import ServiceSettings
from orchestrator.service._door import Door
from orchestrator.service._feeds import PAGE

ACME = Tenant("acme", hash_token("acme-token"), max_running=100, rate_per_s=1000, burst=1000)
A = {"Authorization": "Bearer acme-token"}


def work(text: str) -> str:
    return text


OPENED: asyncio.Event | None = None


async def hold(ctx: TaskContext) -> str:
    assert OPENED is not None
    await OPENED.wait()
    return "opened"


MORE: asyncio.Event | None = None
GO: asyncio.Event | None = None


async def hold_more(ctx: TaskContext) -> str:
    assert MORE is not None and GO is not None
    MORE.set()
    await GO.wait()
    return "went"


def noop(ctx: TaskContext) -> str:
    return "x"


def _secret(ctx: TaskContext) -> str:
    return "a module's own"


def megabyte(ctx: TaskContext) -> str:
    return "x" * 1_000_000


REGISTRY = Registry(work, hold, hold_more, noop, megabyte, _secret, imports=False)
HELD = {
    "name": "held",
    "tasks": [
        {"id": "wait", "function": "hold"},
        {"id": "then", "function": "hold", "after": ["wait"]},
    ],
}


class CountingStore(SQLStore):
    """The real SQLite store, counting the reads of each workflow's log."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads: dict[str, int] = {}
        self.after: list[int] = []
        self.limits: list[int | None] = []

    async def events(
        self, workflow: str, after_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        self.reads[workflow] = self.reads.get(workflow, 0) + 1
        self.after.append(after_seq)
        self.limits.append(limit)
        return await super().events(workflow, after_seq, limit)


@dataclass
class Served:
    http: aiohttp.ClientSession
    base: str
    host: str
    port: int
    service: Service
    door: Door


@asynccontextmanager
async def serving(
    store: Store, settings: ServiceSettings, clock: VirtualClock | None = None
) -> AsyncIterator[Served]:
    """The service as `plait serve` listens: through its door, on a free port."""
    async with (
        store,
        Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine,
        contextlib.AsyncExitStack() as stack,
    ):
        batch_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        service = Service(
            engine,
            REGISTRY,
            (ACME,),
            settings,
            batch_dir=batch_dir,
            clock=clock,
        )
        door = Door(
            max_connections=settings.max_connections,
            header_timeout_s=settings.header_timeout_s,
            counted=lambda reason: service.metrics.cut_off.labels(reason).inc(),
        )
        runner = web.AppRunner(service.app(), handle_signals=False, **door.runner_options())
        await runner.setup()
        try:
            await door.site(runner, "127.0.0.1", 0).start()
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
            async with aiohttp.ClientSession() as http:
                yield Served(http, f"http://127.0.0.1:{port}", "127.0.0.1", port, service, door)
        finally:
            service.stop_accepting()
            await runner.cleanup()


def sqlite(tmp: Path) -> SQLStore:
    return SQLStore(tmp / "store.db")


def lines(caplog: pytest.LogCaptureFixture, says: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if says in r.getMessage()]


async def closed_by_server(reader: asyncio.StreamReader) -> None:
    """Returns once the server has closed the connection."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(1024):
            pass


# --- slow and surplus connections -------------------------------------------------------------


def test_slow_headers_are_cut_off_and_healthz_answers_through_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """200 connections send half a request and stop; the cap is 50. /healthz answers
    meanwhile (a new connection closes the oldest that has not sent its headers), every slow
    one is closed, and each condition is one log line, not one per socket."""
    settings = ServiceSettings(header_timeout_s=2.0, max_connections=50)

    async def main() -> None:
        async with serving(sqlite(tmp_path), settings) as served:
            slow = []
            for _ in range(200):
                reader, writer = await asyncio.open_connection(served.host, served.port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                slow.append((reader, writer))
            async with served.http.get(served.base + "/healthz") as r:
                assert r.status == 200
            async with asyncio.timeout(30):  # a guard: the server closes them within 2 s
                await asyncio.gather(*(closed_by_server(r) for r, _ in slow))
            for _, writer in slow:
                writer.close()
            assert served.door.open <= 1
            async with served.http.get(served.base + "/healthz") as r:
                assert r.status == 200
            async with served.http.get(served.base + "/metrics") as r:
                text = await r.text()
            closed = {
                line.split('"')[1]: float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("plait_http_connections_closed_total{")
            }
            assert closed["cap"] >= 1 and closed["headers"] >= 1, closed
            assert closed["cap"] + closed["headers"] == 200, closed

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    assert len(lines(caplog, "max_connections")) == 1, caplog.text
    assert len(lines(caplog, "header_timeout_s")) <= 1, caplog.text
    assert len(caplog.records) <= 3, caplog.text


def test_a_slow_body_gets_408_and_the_handler_is_freed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServiceSettings(body_timeout_s=0.2, header_timeout_s=0.5)

    async def main() -> None:
        async with serving(sqlite(tmp_path), settings) as served:
            sent = []
            for _ in range(20):
                reader, writer = await asyncio.open_connection(served.host, served.port)
                writer.write(
                    b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme-token\r\n"
                    b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"fu'
                )
                sent.append((reader, writer))
            for reader, writer in sent:
                async with asyncio.timeout(30):
                    status = await reader.readline()
                assert status.split()[1] == b"408", status
                writer.close()

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    assert len(lines(caplog, "body_timeout_s")) == 1, caplog.text


def test_bad_http_is_logged_once_per_kind_and_never_quotes_the_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            for _ in range(30):
                reader, writer = await asyncio.open_connection(served.host, served.port)
                writer.write(
                    b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                    b"Authorization: Bearer sekrit\x01token\r\n\r\n"
                )
                status = await reader.readline()
                assert status.split()[1] == b"400", status
                writer.close()
            async with served.http.get(served.base + "/healthz") as r:
                assert r.status == 200

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert "sekrit" not in caplog.text
    assert len(lines(caplog, "bad HTTP requests")) == 1, caplog.text


def test_the_loops_accept_errors_are_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """asyncio logs `socket.accept() out of system resource` with a traceback at each retry
    while file descriptors run out: one line for the condition."""

    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()):
            loop = asyncio.get_running_loop()
            for _ in range(100):
                loop.call_exception_handler(
                    {
                        "message": "socket.accept() out of system resource",
                        "exception": OSError(24, "Too many open files"),
                    }
                )

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert len(lines(caplog, "cannot accept connections")) == 1, caplog.text
    assert "Traceback" not in caplog.text


def test_a_token_that_is_not_utf8_is_a_401(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(
                b"GET /v1/workflows HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                b"Connection: close\r\n\r\n"
            )
            answer = await reader.read()
            writer.close()
            assert answer.split()[1] == b"401", answer
            assert b"the bearer token is not valid" in answer

    with caplog.at_level(logging.INFO):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


# --- event streams ----------------------------------------------------------------------------


async def follow(served: Served, run_id: str, got: list[str], started: asyncio.Event) -> bool:
    """Follows the workflow's stream to its end (True), or is refused with 429 (False)."""
    async with served.http.get(served.base + f"/v1/workflows/{run_id}/events", headers=A) as r:
        if r.status == 429:
            await r.read()
            return False
        assert r.status == 200
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                got.append(line.removeprefix("event: "))
                if line == "event: task_started":
                    started.set()
    return True


def test_streams_of_one_workflow_share_one_read_per_new_event(tmp_path: Path) -> None:
    """20 streams on one workflow: each new event is read from the store once, not 20
    times, and every stream gets the whole log."""
    global OPENED
    n = 20

    async def main() -> None:
        global OPENED
        OPENED = asyncio.Event()
        store = CountingStore(tmp_path / "store.db")
        async with serving(store, ServiceSettings()) as served:
            async with served.http.post(served.base + "/v1/workflows", json=HELD, headers=A) as r:
                run_id = (await r.json())["id"]
            got: list[list[str]] = [[] for _ in range(n)]
            started = [asyncio.Event() for _ in range(n)]
            streams = [
                asyncio.create_task(follow(served, run_id, got[i], started[i])) for i in range(n)
            ]
            for event in started:
                await event.wait()
            before = store.reads[run_id]
            OPENED.set()
            await asyncio.gather(*streams)
            reads = store.reads[run_id] - before
            assert all(g == got[0] for g in got) and got[0][-1] == "workflow_finished", got
            finishing = got[0][got[0].index("task_started") + 1 :]
            # one read per new batch of events at most (and the end's), never one per stream
            assert reads <= len(finishing) + 1 < n, (reads, finishing)

    asyncio.run(main())


async def held_with_two_streams(served: Served) -> str:
    """ACME allowed two streams (and two waits), and the id of a HELD workflow it submitted."""
    served.service._tenants[ACME.token_sha256] = dataclasses.replace(ACME, max_streams=2)
    async with served.http.post(served.base + "/v1/workflows", json=HELD, headers=A) as r:
        run_id: str = (await r.json())["id"]
    return run_id


def test_a_tenant_over_its_streams_gets_429_and_others_go_on(tmp_path: Path) -> None:
    global OPENED

    async def main() -> None:
        global OPENED
        OPENED = asyncio.Event()
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            run_id = await held_with_two_streams(served)
            url = served.base + f"/v1/workflows/{run_id}/events"
            got: list[list[str]] = [[], []]
            started = [asyncio.Event(), asyncio.Event()]
            open_ = [
                asyncio.create_task(follow(served, run_id, got[i], started[i])) for i in (0, 1)
            ]
            for event in started:
                await event.wait()
            async with served.http.get(url, headers=A) as r:
                error = await r.json()
                assert r.status == 429 and r.headers["Retry-After"], error
                assert "2 event streams" in error["error"] and "max_streams" in error["error"]
            open_[0].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await open_[0]
            third: list[str] = []
            while True:  # 429 until the server has seen the client go
                started_third = asyncio.Event()
                again = asyncio.create_task(follow(served, run_id, third, started_third))
                waiting = asyncio.create_task(started_third.wait())
                await asyncio.wait([again, waiting], return_when=asyncio.FIRST_COMPLETED)
                waiting.cancel()
                if not again.done() or again.result():
                    break
            OPENED.set()
            await asyncio.gather(open_[1], again)
            assert third[-1] == "workflow_finished"

    asyncio.run(main())


# --- expensive reads --------------------------------------------------------------------------


def wide(n: int) -> dict[str, Any]:
    return {"name": "wide", "tasks": [{"id": f"t{i}", "function": "noop"} for i in range(n)]}


async def rebuilt(store: Store, run_id: str) -> dict[str, Any]:
    """The view as rebuilt from the whole log."""
    row = await store.workflow(run_id)
    assert row is not None
    events, _ = await read_log(store, run_id)
    view: dict[str, Any] = _view(row, rebuild(events)).model_dump(mode="json")
    return view


def test_a_workflows_view_is_read_from_its_log_once_and_is_the_rebuilt_one(
    tmp_path: Path,
) -> None:
    """GET of a finished 1,500-task workflow: the first reads its log, the next ones
    nothing; a running one's GET reads only the events after those it has."""
    global OPENED

    async def main() -> None:
        global OPENED
        OPENED = asyncio.Event()
        store = CountingStore(tmp_path / "store.db")
        async with serving(store, ServiceSettings()) as served:
            url = served.base + "/v1/workflows"
            async with served.http.post(url, json=wide(1500), headers=A) as r:
                run_id = (await r.json())["id"]
            async with served.http.get(f"{url}/{run_id}/result?wait=60", headers=A) as r:
                assert (await r.json())["status"] == "succeeded"
            views = []
            before = store.reads.get(run_id, 0)
            for _ in range(5):
                async with served.http.get(f"{url}/{run_id}", headers=A) as r:
                    views.append(await r.json())
            assert store.reads[run_id] - before <= 1
            expected = await rebuilt(store, run_id)
            assert all(v == expected for v in views)
            assert views[0]["counts"] == {"done": 1500}
            # running: each GET reads the events after those it has, not the whole log
            async with served.http.post(url, json=HELD, headers=A) as r:
                held = (await r.json())["id"]
            seen = []
            for _ in range(3):
                store.after.clear()
                async with served.http.get(f"{url}/{held}", headers=A) as r:
                    view = await r.json()
                seen.append(list(store.after))
                assert view == await rebuilt(store, held)
            assert view["counts"] == {"running": 1, "pending": 1}
            assert seen[0] == [0] and all(a and min(a) > 0 for a in seen[1:]), seen
            # tasks added while it runs: their events re-render those tasks only
            global MORE, GO
            MORE, GO = asyncio.Event(), asyncio.Event()
            more = {"tasks": [{"id": "more", "function": "hold_more"}]}
            async with served.http.post(f"{url}/{held}/tasks", json=more, headers=A) as r:
                assert r.status == 200, await r.text()
            await MORE.wait()
            async with served.http.get(f"{url}/{held}", headers=A) as r:
                view = await r.json()
            assert view == await rebuilt(store, held)
            assert view["counts"] == {"running": 2, "pending": 1}
            heard: asyncio.Queue[Any] = asyncio.Queue()
            served.service.engine.bus.subscribe(held, heard)
            assert GO is not None
            GO.set()  # "more" ends; the rest wait
            while (await heard.get()).kind != "task_succeeded":
                pass
            async with served.http.get(f"{url}/{held}", headers=A) as r:
                view = await r.json()
            assert view == await rebuilt(store, held)
            assert view["counts"] == {"running": 1, "pending": 1, "done": 1}
            OPENED.set()
            async with served.http.get(f"{url}/{held}/result?wait=60", headers=A) as r:
                assert (await r.json())["status"] == "succeeded"
            async with served.http.get(f"{url}/{held}", headers=A) as r:
                view = await r.json()
            assert view == await rebuilt(store, held) and view["counts"] == {"done": 3}

    asyncio.run(main())


def test_a_long_log_is_replayed_in_bounded_pages_every_event_in_order(tmp_path: Path) -> None:
    """The stream of a finished 600-task workflow (1,200-odd events) sends every event once,
    in order, and reads the log PAGE records at a time: a long replay never holds the loop
    for the whole log."""

    async def main() -> None:
        store = CountingStore(tmp_path / "store.db")
        async with serving(store, ServiceSettings()) as served:
            url = served.base + "/v1/workflows"
            async with served.http.post(url, json=wide(600), headers=A) as r:
                run_id = (await r.json())["id"]
            async with served.http.get(f"{url}/{run_id}/result?wait=60", headers=A) as r:
                assert (await r.json())["status"] == "succeeded"
            last = await store.last_seq(run_id)
            store.after.clear()
            store.limits.clear()
            ids = []
            async with served.http.get(f"{url}/{run_id}/events", headers=A) as r:
                assert r.status == 200
                async for raw in r.content:
                    if raw.startswith(b"id: "):
                        ids.append(int(raw.removeprefix(b"id: ")))
            assert ids == list(range(1, last + 1))
            assert last > 2 * PAGE
            assert store.limits == [PAGE] * (last // PAGE + 1), store.limits
            assert store.after == [PAGE * i for i in range(last // PAGE + 1)]

    asyncio.run(main())


def test_a_large_result_is_encoded_off_the_loop_and_weighs_by_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow with 8 MB of results: its result's JSON is made in a worker thread (the
    loop serves others meanwhile), and each read of it weighs 1 + 8 tokens, so a tenant with
    a burst of 30 is refused at its fifth read, not its thirtieth; a small result still
    weighs 1 and is encoded in place."""
    clock = VirtualClock()
    threads: list[str] = []
    encode = service_app._encode

    def watched(model: Any) -> str:
        threads.append(threading.current_thread().name)
        return encode(model)

    monkeypatch.setattr(service_app, "_encode", watched)
    big = {"name": "big", "tasks": [{"id": f"m{i}", "function": "megabyte"} for i in range(8)]}

    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings(), clock=clock) as served:
            tenant = Tenant("big", hash_token("big-token"), 10, rate_per_s=1, burst=30)
            served.service._tenants[tenant.token_sha256] = tenant
            headers = {"Authorization": "Bearer big-token"}
            url = served.base + "/v1/workflows"
            async with served.http.post(url, json=big, headers=headers) as r:
                run_id = (await r.json())["id"]
            refused = None
            for n in range(30):
                async with served.http.get(f"{url}/{run_id}/result?wait=60", headers=headers) as r:
                    if r.status == 429:
                        refused = n, (await r.json())["error"]
                        break
                    answer = await r.json()
                    assert answer["status"] == "succeeded"
                    assert answer["results"] == {f"m{i}": "x" * 1_000_000 for i in range(8)}
            # 29 tokens after the submission; each read takes 1, then 8 once read
            assert refused is not None and refused[0] == 4, refused
            assert threads and all(t != threading.main_thread().name for t in threads), threads
            # a small result: one token, encoded on the loop
            threads.clear()
            async with served.http.post(url, json=wide(1), headers=A) as r:
                small = (await r.json())["id"]
            async with served.http.get(f"{url}/{small}/result?wait=60", headers=A) as r:
                assert (await r.json())["status"] == "succeeded"
            assert threads == []

    asyncio.run(main())


def test_expensive_requests_weigh_more_in_the_rate_limit(tmp_path: Path) -> None:
    """A burst of 30 tokens and no time passing (a virtual clock): after its submission and
    result, a tenant reads its one-task workflow 28 times, its 2,000-task one 9 times (each
    read weighs 3); lists of 500 go 5 times, of 10 30 times; event streams 3 times."""
    clock = VirtualClock()

    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings(), clock=clock) as served:
            tenants = served.service._tenants

            async def until_429(path: str, name: str) -> int:
                headers = {"Authorization": f"Bearer {name}-token"}
                for n in range(100):
                    async with served.http.get(served.base + path, headers=headers) as r:
                        await r.read()
                        if r.status == 429:
                            assert r.headers["Retry-After"]
                            return n
                        assert r.status == 200
                raise AssertionError("never refused")

            async def tenant_with(tasks: int | None, name: str) -> str:
                tenant = Tenant(name, hash_token(f"{name}-token"), 10, rate_per_s=1, burst=30)
                tenants[tenant.token_sha256] = tenant
                if tasks is None:
                    return ""
                headers = {"Authorization": f"Bearer {name}-token"}
                url = served.base + "/v1/workflows"
                async with served.http.post(url, json=wide(tasks), headers=headers) as r:
                    run_id: str = (await r.json())["id"]
                async with served.http.get(f"{url}/{run_id}/result?wait=60", headers=headers) as r:
                    assert (await r.json())["status"] == "succeeded"
                return run_id

            small = await tenant_with(1, "small")
            assert await until_429(f"/v1/workflows/{small}", "small") == 28
            large = await tenant_with(2000, "large")
            assert await until_429(f"/v1/workflows/{large}", "large") == 9
            await tenant_with(None, "lists")
            assert await until_429("/v1/workflows?limit=500", "lists") == 5
            await tenant_with(None, "short")
            assert await until_429("/v1/workflows?limit=10", "short") == 30
            streams = await tenant_with(1, "streams")
            assert await until_429(f"/v1/workflows/{streams}/events", "streams") == 2

    asyncio.run(main())


# --- plait serve's own settings ---------------------------------------------------------------


def test_plait_serve_applies_retention_by_default_and_as_configured(tmp_path: Path) -> None:
    """Without a word in the config, finished workflows are compacted after an hour and
    deleted after a week; `[service.retention]` sets it (here: deleted at once)."""
    from test_service import _Lines, write_config

    from orchestrator import Retention
    from orchestrator.service import load_serve_config
    from orchestrator.service._serve import serve

    assert load_serve_config(write_config(tmp_path)).service.retention.policy() == Retention()
    extra = "[service.retention]\ndelete_after_s = 0\nevery_s = 0.1\n"
    config = load_serve_config(write_config(tmp_path, extra))

    async def main() -> None:
        stop, ready, out = asyncio.Event(), asyncio.Event(), _Lines()
        task = asyncio.create_task(serve(config, out=out, stop=stop, ready=ready))
        await ready.wait()
        url = next(w for w in out.text().split() if w.startswith("http://"))
        (tmp_path / "go").write_text("")
        async with aiohttp.ClientSession(headers=A) as http:
            async with http.post(url + "v1/tasks?wait=30", json={"function": "slow"}) as r:
                run_id = (await r.json())["id"]
            for _ in range(600):  # the sweeper runs every 0.1 s
                async with http.get(url + f"v1/workflows/{run_id}") as r:
                    if r.status == 404:
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the finished workflow was never deleted")
        stop.set()
        await task

    asyncio.run(main())


def test_idempotency_keys_in_memory_are_bounded_and_the_store_has_the_rest(
    make_store: StoreFactory,
) -> None:
    """With room for 3 keys in memory, 6 keyed submissions keep 3; a retry of the first
    still gets its workflow (found in the store), and another body under its key a 422."""

    async def main() -> None:
        async with serving(make_store(), ServiceSettings()) as served:
            served.service._known.limit = 3
            url = served.base + "/v1/tasks"
            ids = []
            for i in range(6):
                headers = {**A, "Idempotency-Key": f"k{i}"}
                async with served.http.post(url, json={"function": "noop"}, headers=headers) as r:
                    assert r.status == 202
                    ids.append((await r.json())["id"])
            assert len(served.service._known) == 3
            first = {**A, "Idempotency-Key": "k0"}
            async with served.http.post(url, json={"function": "noop"}, headers=first) as r:
                assert r.status == 200 and (await r.json())["id"] == ids[0]
                assert r.headers["Idempotent-Replayed"] == "true"
            async with served.http.post(url, json={"function": "hold"}, headers=first) as r:
                assert r.status == 422
            assert len(served.service._known) == 3

    asyncio.run(main())


def test_a_function_named_with_an_underscore_is_not_callable_over_rest(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            for name in ("_secret", "test_service_abuse:_secret", "noop._x"):
                body = {"function": name}
                async with served.http.post(served.base + "/v1/tasks", json=body, headers=A) as r:
                    error = await r.json()
                    assert r.status == 422, error
                    assert error["problems"][0]["field"] == "tasks[0].function"
                    assert "_secret" not in error["problems"][0]["message"].split("it has:")[1]

    asyncio.run(main())


def test_count_limits_answer_422_and_the_docs_say_what_the_service_does(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings(max_tasks=5)) as served:
            url = served.base + "/v1/workflows"
            for body, field in [
                (wide(6), "tasks"),
                ({**wide(1), "name": "n" * 101}, "name"),
            ]:
                async with served.http.post(url, json=body, headers=A) as r:
                    error = await r.json()
                    assert r.status == 422 and error["problems"][0]["field"] == field, error
            async with served.http.post(url, json={**wide(1), "name": "n" * 100}, headers=A) as r:
                assert r.status == 202

    asyncio.run(main())
    docs = (Path(__file__).parents[1] / "docs" / "rest.md").read_text()
    limits = " ".join(docs.split("\nLimits (")[1].split("\n\n")[0].split())
    assert "(`422`, naming `tasks`)" in limits and "a workflow name of 100 characters" in limits
    assert limits.count("`413`") == 1 and "`max_body_bytes` (4 MiB; `413`)" in limits


def test_a_tenants_waiting_requests_are_capped_and_the_next_is_answered_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `?wait=` holds a connection: past `max_streams` of them a tenant's next wait is
    answered at once (the run still running), so its waits cannot fill the connection cap."""
    global OPENED

    async def main() -> None:
        global OPENED
        OPENED = asyncio.Event()
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            run_id = await held_with_two_streams(served)
            url = served.base + f"/v1/workflows/{run_id}/result?wait=60"

            async def result() -> dict[str, Any]:
                async with served.http.get(url, headers=A) as r:
                    assert r.status == 200
                    body: dict[str, Any] = await r.json()
                    return body

            both = asyncio.Event()
            follow = served.service._follow

            async def counted(run_id: str, seconds: float) -> bool:
                if served.service._waits.get("acme") == 2:
                    both.set()
                return await follow(run_id, seconds)

            monkeypatch.setattr(served.service, "_follow", counted)
            held = [asyncio.create_task(result()) for _ in range(2)]
            await both.wait()
            async with asyncio.timeout(30):  # a guard: without the cap this waits for OPENED
                third = await result()
            assert third["finished"] is False and third["status"] == "running"
            OPENED.set()
            assert [view["finished"] for view in await asyncio.gather(*held)] == [True, True]
            assert "acme" not in served.service._waits

    with caplog.at_level(logging.INFO, logger="plait.serve"):
        asyncio.run(main())
    assert len(lines(caplog, "waiting requests (?wait=), its max_streams")) == 1
