"""`orchestrator.client` and `plait submit` / `plait watch` against a running service (the
fixtures of test_service.py), on SQLite and PostgreSQL: every call, errors that name the
status and the fields, retries that never make a second workflow, event streams resumed
after a dropped connection, and the command's exit statuses. Nothing waits on wall time: the
client's clock records its waits and returns at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import StoreFactory
from test_service import ACME, BETA, GATED, REGISTRY, SPEC, Api, Gate, _Lines, on_stores
from yarl import URL

import orchestrator.client
from executors import FunctionLLM, echo
from orchestrator import Engine, SystemClock, VirtualClock, WorkflowFinished
from orchestrator.cli._cli import main
from orchestrator.cli._clientcli import describe
from orchestrator.client import (
    Accepted,
    Client,
    ClientError,
    ResultView,
    StreamEvent,
    WorkflowView,
    _SSEParser,
)
from orchestrator.ext import Store
from orchestrator.service import Service, Tenant, hash_token, load_serve_config
from orchestrator.service._config import ServiceSettings
from orchestrator.service._serve import serve

ROOT = Path(__file__).resolve().parent.parent
RESULTS = {
    "facts": "Facts on kv caches",
    "loud": "HI HI",
    "draft": "From Facts on kv caches: ${x}",
    "all": "draft=From Facts on kv caches: ${x}|loud=HI HI",
}


class Instant(SystemClock):
    """A clock whose waits take no time: it records them, and `then(seconds)` lets a test
    move its own time on by as much."""

    def __init__(self, then: Callable[[float], None] | None = None) -> None:
        self.slept: list[float] = []
        self.then = then

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        if self.then is not None:
            self.then(seconds)
        await asyncio.sleep(0)


class Outage(SystemClock):
    """A client's clock whose time passes only as the client waits. After `down()`, once
    `outage_s` of it have passed, the client's next wait lasts until `back` is set: the
    service is down that long, then up again."""

    def __init__(self, outage_s: float = 4.0) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.outage_s = outage_s
        self.down_at: float | None = None
        self.waiting = asyncio.Event()
        self.back = asyncio.Event()

    def monotonic(self) -> float:
        return self.now

    def down(self) -> None:
        self.down_at = self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.down_at is not None and self.now - self.down_at >= self.outage_s:
            self.waiting.set()
            await self.back.wait()
        await asyncio.sleep(0)


def client(base: str, token: str | None = "acme-token", **kw: Any) -> Client:
    return Client(base, token, clock=kw.pop("clock", None) or Instant(), **kw)


class Proxy:
    """A TCP proxy in front of the service that the test steers: `cut()` drops the
    connections open now, `drop_answers = n` drops the next n answers (the request reaches
    the service, its answer never comes back), `close()` stops it. `received` holds what
    clients sent, headers included."""

    def __init__(self, target: str) -> None:
        url = URL(target)
        self.host, self.port = url.host or "127.0.0.1", url.port
        self.received = bytearray()
        self.drop_answers = 0
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._server.close()
        self.cut()
        await self._server.wait_closed()

    def cut(self) -> None:
        for pair in list(self._pairs):
            for writer in pair:
                writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, pair, asked=True),
                self._pipe(up_reader, writer, pair, asked=False),
            )
        finally:
            self._pairs.discard(pair)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, ...],
        *,
        asked: bool,
    ) -> None:
        try:
            while data := await source.read(65536):
                if asked:
                    self.received += data
                elif self.drop_answers:
                    self.drop_answers -= 1
                    return
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for writer in pair:
                writer.transport.abort()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- the Python client ------------------------------------------------------------------------


def test_submit_follow_read_add_cancel_and_list(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        async with client(api.base) as plait:
            accepted = await plait.submit(SPEC)
            assert isinstance(accepted, Accepted) and accepted.id.startswith("brief-")
            events = [event async for event in plait.events(accepted.id)]
            assert [e.id for e in events] == list(range(1, len(events) + 1))
            assert events[0].kind == "workflow_started" and events[-1].kind == "workflow_finished"
            finished = events[-1].typed()
            assert isinstance(finished, WorkflowFinished) and finished.status == "succeeded"
            result = await plait.result(accepted.id, wait=30)
            assert (result.status, result.finished, result.results) == (
                "succeeded",
                True,
                RESULTS,
            )
            view = await plait.get(accepted.id)
            assert isinstance(view, WorkflowView) and view.counts == {"done": 4}
            tail = [e async for e in plait.events(accepted.id, after=events[-3].id)]
            assert tail == events[-2:]
            loud = await plait.submit_task({"tool": "shout", "args": {"text": "é", "times": 10**5}})
            big = [e async for e in plait.events(loud.id) if e.kind == "task_succeeded"]
            assert big[0].data["result"] == " ".join(["É"] * 10**5)  # one line of 300 KB

            one = await plait.submit_task({"agent": "writer", "prompt": "hello"}, wait=30)
            assert isinstance(one, ResultView) and one.results == {"task": "hello"}
            later = await plait.submit_task({"function": "join", "labels": {"n": "1"}})
            assert isinstance(later, Accepted) and later.id.startswith("task-")

            gated = await plait.submit(GATED)
            added = await plait.add_tasks(
                gated.id, [{"id": "side", "tool": "shout", "args": {"text": "s"}}]
            )
            assert added == ["side"]
            assert (await plait.cancel(gated.id)).id == gated.id
            cancelled = await plait.result(gated.id, wait=30)
            assert cancelled.status == "cancelled" and "wait" in cancelled.failures
            with pytest.raises(ClientError) as refused:
                await plait.cancel(gated.id)
            assert refused.value.status == 409 and "finished already" in refused.value.error

            ids = {accepted.id, loud.id, one.id, later.id, gated.id}
            assert {w.id async for w in plait.list(page=1)} == ids  # four `next` pages
            assert [w.id async for w in plait.list(labels={"team": "search"})] == [accepted.id]
            assert [w.id async for w in plait.list(labels={"n": "1"})] == [later.id]
            assert [w.id async for w in plait.list(status="cancelled")] == [gated.id]
            assert len([w async for w in plait.list(limit=2, page=1)]) == 2

    on_stores(make_store, body)


def test_errors_carry_the_status_the_message_and_the_fields(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLAIT_TOKEN", raising=False)

    async def body(api: Api) -> None:
        store = api.engine.store
        assert store is not None
        async with client(api.base) as plait:
            # Checked here: nothing is sent.
            with pytest.raises(ClientError) as local:
                await plait.submit({**SPEC, "tasks": [], "name": "has space"})
            assert local.value.status is None and "nothing was sent" in local.value.error
            assert sorted(p.field for p in local.value.problems) == ["name", "tasks"]
            assert await store.workflows() == []
            with pytest.raises(ClientError) as local:
                await plait.add_tasks("x-1", [{"id": "a", "agent": "writer"}])
            assert [p.field for p in local.value.problems] == ["tasks[0]"]
            # Checked by the service: what only it knows.
            bad = {**SPEC, "tasks": [{"id": "a", "agent": "nobody", "prompt": "x"}]}
            with pytest.raises(ClientError) as refused:
                await plait.submit(bad)
            error = refused.value
            assert error.status == 422 and error.error == "the workflow cannot be built"
            assert error.problems[0].field == "tasks[0].agent"
            assert str(error).startswith("422: the workflow cannot be built; tasks[0].agent: ")
            assert "writer" in str(error)
            for call in (
                plait.get("nope-1"),
                plait.result("nope-1"),
                plait.cancel("nope-1"),
                anext(plait.events("nope-1")),
            ):
                with pytest.raises(ClientError) as missing:
                    await call
                assert (missing.value.status, missing.value.error) == (404, "no workflow 'nope-1'")
            # The same key again: the same workflow; with another spec: refused.
            first = await plait.submit(SPEC, idempotency_key="order-17")
            again = await plait.submit(SPEC, idempotency_key="order-17")
            assert again.id == first.id
            with pytest.raises(ClientError, match="different request") as reused:
                await plait.submit({**SPEC, "name": "other"}, idempotency_key="order-17")
            assert reused.value.status == 422
        for token, says in [("wrong-token", "not valid"), (None, "Authorization: Bearer")]:
            async with client(api.base, token) as stranger:
                with pytest.raises(ClientError, match=says) as denied:
                    await stranger.get(first.id)
                assert denied.value.status == 401
                assert "wrong-token" not in f"{denied.value} {stranger!r}"
        async with client(api.base, "beta-token") as other:
            with pytest.raises(ClientError) as theirs:
                await other.get(first.id)
            assert theirs.value.status == 404

    on_stores(make_store, body)


def test_a_lost_answer_is_sent_again_with_its_key_and_makes_one_workflow(
    make_store: StoreFactory,
) -> None:
    async def body(api: Api) -> None:
        store = api.engine.store
        assert store is not None
        clock = Instant()
        async with Proxy(api.base) as proxy, client(proxy.url, clock=clock) as plait:
            proxy.drop_answers = 1  # the service starts it; the answer is lost on the way
            accepted = await plait.submit(SPEC)
            assert proxy.drop_answers == 0 and len(clock.slept) == 1
            assert [row.id for row in await store.workflows()] == [accepted.id]
            keys = re.findall(rb"Idempotency-Key: (\S+)", bytes(proxy.received))
            assert len(keys) == 2 and keys[0] == keys[1]  # the same key for both tries
            result = await plait.result(accepted.id, wait=30)
            assert result.results == RESULTS
            # Adding tasks is not safe to send twice: a lost answer is an error.
            gated = await plait.submit(GATED)
            proxy.drop_answers = 1
            with pytest.raises(ClientError, match="no answer from the service"):
                await plait.add_tasks(gated.id, [{"id": "x", "function": "join"}])
            await proxy.close()
            slept = len(clock.slept)
            with pytest.raises(ClientError) as unreachable:
                await plait.get(accepted.id)
            assert unreachable.value.status is None
            assert f"no answer from the service at {proxy.url}" in str(unreachable.value)
            assert len(clock.slept) - slept == plait.retries  # bounded

    on_stores(make_store, body)


def test_events_resume_after_a_dropped_connection(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        assert Gate.opened is not None
        async with Proxy(api.base) as proxy, client(proxy.url) as plait:
            accepted = await plait.submit(GATED)
            seen: list[StreamEvent] = []
            # No heartbeat comes to wake a stream that missed an event: it would time out.
            async with asyncio.timeout(20):
                async for event in plait.events(accepted.id):
                    seen.append(event)
                    if event.kind == "task_started":
                        proxy.cut()  # mid-stream, while the task waits at the gate
                        Gate.opened.set()  # it ends before the stream is resumed
            assert [e.id for e in seen] == list(range(1, len(seen) + 1))  # none twice, none lost
            assert seen[-1].kind == "workflow_finished"
            assert seen[-1].data["status"] == "succeeded"
            started = next(e.id for e in seen if e.kind == "task_started")
            assert f"Last-Event-ID: {started}\r\n".encode() in proxy.received
        # A stream that cannot be resumed ends in an error once `reconnect_s` has passed.
        Gate.opened, Gate.reached = asyncio.Event(), asyncio.Event()
        clock = Outage()
        async with Proxy(api.base) as proxy, client(proxy.url, clock=clock) as plait:
            stuck = await plait.submit(GATED)
            with pytest.raises(ClientError, match="lost the event stream") as lost:
                async for event in plait.events(stuck.id):
                    if event.kind == "task_started":
                        await proxy.close()
            assert lost.value.status is None and "after=" in str(lost.value)
            assert "within 60 s (reconnect_s)" in str(lost.value)
            assert clock.slept[:6] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
            assert sum(clock.slept) <= plait.reconnect_s < sum(clock.slept) + 4.0

    on_stores(make_store, body, settings=ServiceSettings(heartbeat_s=3600))


@asynccontextmanager
async def service_on(store: Store, port: int, batch_dir: Path) -> AsyncIterator[str]:
    """A real service on `port` over `store`, started as `plait serve` starts (it resumes
    the store's unfinished workflows first) and stopped as it stops."""
    async with Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine:
        await engine.resume(REGISTRY, workflows=await store.unfinished())
        service = Service(engine, REGISTRY, (ACME, BETA), batch_dir=batch_dir)
        runner = web.AppRunner(service.app(), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            yield f"http://127.0.0.1:{port}/"
        finally:
            service.stop_accepting()
            await runner.cleanup()


async def first_of(*waits: Awaitable[Any]) -> None:
    """Until the first of `waits` is done (the others go on)."""
    futures = [asyncio.ensure_future(w) for w in waits]
    await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)


def test_events_follow_a_workflow_across_a_restart_of_the_service(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    """The service stops while a client follows a workflow, stays down 4 s of the client's
    time, and starts again on the same port and store: the client resumes and gets every
    event once, in order, to the end."""
    port = unused_port()

    async def main() -> tuple[list[StreamEvent], list[int]]:
        Gate.opened, Gate.reached = asyncio.Event(), asyncio.Event()
        clock = Outage(outage_s=4.0)
        seen: list[StreamEvent] = []
        started = asyncio.Event()
        base = f"http://127.0.0.1:{port}/"
        async with asyncio.timeout(60), make_store() as store, client(base, clock=clock) as plait:
            async with service_on(store, port, tmp_path):
                accepted = await plait.submit(GATED)

                async def follow() -> None:
                    async for event in plait.events(accepted.id):
                        seen.append(event)
                        if event.kind == "task_started":
                            started.set()

                following = asyncio.ensure_future(follow())
                await first_of(started.wait(), following)
            clock.down()  # the service has stopped
            await first_of(clock.waiting.wait(), following)  # the client waited out 4 s
            Gate.reached = asyncio.Event()
            async with service_on(store, port, tmp_path):  # started again on the same port
                clock.back.set()
                await first_of(Gate.reached.wait(), following)  # resumed, at the gate again
                Gate.opened.set()
                await following  # raises if the client gave up
            logged = [record.seq for record in await store.events(accepted.id)]
        return seen, logged

    seen, logged = asyncio.run(main())
    assert [e.id for e in seen] == logged == list(range(1, len(logged) + 1))
    assert seen[-1].kind == "workflow_finished" and seen[-1].data["status"] == "succeeded"
    assert [e.kind for e in seen].count("task_started") == 2  # before and after the restart


def test_a_stream_that_never_opened_says_the_service_cannot_be_reached() -> None:
    """Only a stream that was open is resumed for `reconnect_s`: the first connection is
    tried as any request, and no answer at all is said as such."""
    url = f"http://127.0.0.1:{unused_port()}/"

    async def main() -> tuple[ClientError, list[float]]:
        clock = Instant()
        async with client(url, clock=clock) as plait:
            with pytest.raises(ClientError) as failed:
                await anext(plait.events("brief-1"))
        return failed.value, clock.slept

    error, slept = asyncio.run(main())
    assert error.status is None and f"no answer from the service at {url}" in str(error)
    assert slept == [0.25, 0.5, 1.0]  # `retries` (3) tries more, as any request


def test_429_and_503_are_tried_again_after_the_retry_after_asked_for(
    make_store: StoreFactory,
) -> None:
    service_clock = VirtualClock()
    slow = Tenant("slow", hash_token("slow-token"), max_running=5, rate_per_s=0.5, burst=1)

    def later(seconds: float) -> None:  # the client's waits pass on the service's clock
        service_clock._now += seconds

    async def body(api: Api) -> None:
        api.service._tenants[slow.token_sha256] = slow
        clock = Instant(later)
        async with client(api.base, "slow-token", clock=clock) as plait:
            assert [w async for w in plait.list()] == []
            assert [w async for w in plait.list()] == []  # 429, Retry-After: 2, then 200
            assert clock.slept == [2.0]
            later(10)
            api.service.stop_accepting()
            with pytest.raises(ClientError) as closing:
                await plait.submit(SPEC)
            assert closing.value.status == 503 and closing.value.retry_after == 5
            assert clock.slept[1:] == [5.0] * plait.retries

    on_stores(make_store, body, clock=service_clock)


def test_server_sent_events_are_parsed_line_by_line() -> None:
    parser = _SSEParser()
    lines = [": heartbeat\n", "\n", "id: 7\r\n", "event: task_succeeded\n"]
    lines += ['data: {"a":\n', "data: 1}\n", "\n", "id: 8\n", "\n"]
    got = [e for e in map(parser.feed, lines) if e is not None]
    assert got == [StreamEvent(7, "task_succeeded", {"a": 1})]
    with pytest.raises(ClientError, match="not plait's"):
        for line in ["event: x\n", "data: {}\n", "\n"]:  # no id
            parser.feed(line)


def test_the_client_imports_the_models_but_not_the_server() -> None:
    code = "import sys, orchestrator.client; print('aiohttp.web' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
    assert set(orchestrator.client.__all__) == {
        "DEFAULT_URL", "WAIT_STEP", "Accepted", "AddTasks", "Client", "ClientError", "Problem",
        "ResultView", "SingleTask", "StreamEvent", "TaskSpec", "WorkflowSpec", "WorkflowView",
    }  # fmt: skip


# --- plait submit, plait watch ----------------------------------------------------------------


async def plait(*argv: str) -> tuple[int, str]:
    """`plait ARGV` in a thread (it runs its own event loop), beside the test's service."""
    out = io.StringIO()
    code = await asyncio.to_thread(main, list(argv), out)
    return code, out.getvalue()


def test_submit_and_watch_print_and_exit_as_the_workflow_ends(
    make_store: StoreFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PLAIT_TOKEN", "acme-token")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))

    async def body(api: Api) -> None:
        monkeypatch.setenv("PLAIT_URL", api.base)
        code, out = await plait("submit", str(spec))
        assert code == 0 and out.strip().startswith("brief-") and len(out.splitlines()) == 1
        run_id = out.strip()
        code, out = await plait("watch", run_id)
        lines = out.splitlines()
        assert code == 0 and lines[0].endswith(f"] workflow {run_id} started (batch)")
        assert any(line.endswith("] facts started (attempt 1)") for line in lines)
        assert any(" loud succeeded in " in line for line in lines)
        assert f"workflow {run_id} succeeded in " in lines[-1]
        code, out = await plait("submit", str(spec), "--watch", "--wait", "30", "--json")
        docs = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and docs[0]["status"] == "running"
        assert docs[1]["event"] == "workflow_started" and docs[-2]["event"] == "workflow_finished"
        assert docs[-1]["results"] == RESULTS
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(SPEC)))
        code, out = await plait("submit", "-", "--wait", "30", "--idempotency-key", "k1")
        assert code == 0 and json.loads(out.split("\n", 1)[1])["results"] == RESULTS
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(SPEC)))
        code, again = await plait("submit", "-", "--idempotency-key", "k1")
        assert again.strip() == out.split("\n", 1)[0]
        async with client(api.base) as c:
            gated = await c.submit(GATED)
            await c.cancel(gated.id)
        code, out = await plait("watch", gated.id)
        assert code == 1 and f"workflow {gated.id} cancelled in " in out.splitlines()[-1]
        assert "wait cancelled: " in out
        assert "Traceback" not in capsys.readouterr().err

    on_stores(make_store, body)


def test_bad_input_is_one_line_and_exit_2(
    make_store: StoreFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PLAIT_TOKEN", "acme-token")
    monkeypatch.setattr(orchestrator.client, "SystemClock", Instant)  # no waits between tries
    (tmp_path / "broken.json").write_text('{"name": "x",\n "tasks": [}')
    (tmp_path / "invalid.json").write_text(json.dumps({**SPEC, "priority": "urgent"}))
    unknown = {**SPEC, "tasks": [{"id": "a", "agent": "nobody", "prompt": "x"}]}
    (tmp_path / "unknown.json").write_text(json.dumps(unknown))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))

    async def body(api: Api) -> None:
        nowhere = f"http://127.0.0.1:{unused_port()}"
        cases = [
            (["submit", str(tmp_path / "missing.json")], "no spec file at"),
            (["submit", str(tmp_path / "broken.json")], "broken.json:2:12: the spec is not valid"),
            (["submit", str(tmp_path / "invalid.json")], "(nothing was sent); priority: "),
            (["submit", str(tmp_path / "unknown.json")], "422: the workflow cannot be built; "),
            (["submit", str(spec), "--token", "nope"], "401: the bearer token is not valid"),
            (["submit", str(spec), "--url", nowhere], f"no answer from the service at {nowhere}/"),
            (["watch", "nope-1"], "answered 404: no workflow 'nope-1'"),
            (["watch", "x", "--after", "-1"], "--after must be 0 or more"),
        ]  # fmt: skip
        for argv, says in cases:
            code, out = await plait(*argv, *([] if "--url" in argv else ["--url", api.base]))
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if "warning: --token" not in line]
            assert ("--token" in argv) == ("warning: --token can be read" in err)
            assert (code, out, len(lines)) == (2, "", 1), (argv, err)
            assert lines[0].startswith("plait: error: ") and says in lines[0], (argv, err)
        store = api.engine.store
        assert store is not None and await store.workflows() == []  # none of them started one

    on_stores(make_store, body)
    with pytest.raises(SystemExit) as usage:
        main(["submit", "spec.json", "--wait", "0"])
    assert usage.value.code == 2


def test_watch_describes_each_kind_of_event_in_a_line() -> None:
    def line(kind: str, **data: Any) -> str | None:
        return describe(StreamEvent(1, kind, {"workflow": "w-1", "task": "t", **data}))

    assert line("task_retrying", attempt=1, error="boom", delay=0.5) == (
        "t failed on attempt 1: boom; again in 0.5 s"
    )
    assert line("task_failed", attempts=3, error="boom") == "t failed after 3 attempt(s): boom"
    assert line("task_skipped", reason="a dependency failed") == "t skipped: a dependency failed"
    assert line("workflow_finished", status="failed", duration=2, slack=-1.5) == (
        "workflow w-1 failed in 2.00 s; deadline MISSED by 1.50 s"
    )
    assert line("task_added") is None and line("task_ready") is None


def test_the_python_example_of_docs_rest_runs_against_the_example_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = load_serve_config(ROOT / "examples" / "serve.toml")
    settings = config.service.model_copy(update={"port": 0, "store": str(tmp_path / "s.db")})
    config = dataclasses.replace(config, service=settings)
    text = (ROOT / "docs" / "rest.md").read_text()
    example = compile(re.findall(r"```python\n(.*?)```", text, flags=re.S)[0], "rest.md", "exec")

    async def main() -> None:
        stop, ready, said = asyncio.Event(), asyncio.Event(), _Lines()
        serving = asyncio.create_task(serve(config, out=said, stop=stop, ready=ready))
        await ready.wait()
        monkeypatch.setenv("PLAIT_URL", next(w for w in said.text().split() if "://" in w))
        try:
            await asyncio.to_thread(exec, example, {})  # it runs its own event loop
        finally:
            stop.set()
            await serving

    asyncio.run(main())
    out = capsys.readouterr().out
    assert "succeeded 2\n" in out and "404 no workflow 'no-such-workflow'" in out
