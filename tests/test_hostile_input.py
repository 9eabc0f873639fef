"""The REST service under input it cannot store: a lone surrogate or NUL anywhere in a body,
a header or a label, NaN, and results the store cannot hold. Each is refused with a 400 naming
the field, or fails its own task; no request leaves half a workflow behind, and the service
and every other tenant's work go on. A real server and real stores (SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from conftest import MemoryStore, StoreFactory

from agents import Agent, tool
from executors import FunctionLLM, echo
from orchestrator import Engine, Registry, TaskContext, UsageError, VirtualClock, Workflow
from orchestrator.durability._journal import Journal, read_log
from orchestrator.engine._durable import Durability
from orchestrator.ext import Store, read_events
from orchestrator.model._events import TaskSucceeded
from orchestrator.service import Service, Tenant, hash_token


@tool
def echo_text(text: str) -> str:
    """Give the text back.

    Args:
        text: any text.
    """
    return text


@tool
def nested(depth: int) -> Any:
    """Give back a list nested `depth` deep.

    Args:
        depth: how deep.
    """
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def surrogate() -> str:
    return "\udcff"


def not_a_number() -> float:
    return float("nan")


class Gate:
    opened: ClassVar[asyncio.Event | None] = None


async def gate() -> str:
    assert Gate.opened is not None
    await Gate.opened.wait()
    return "opened"


lost = Agent("lost", "You are on a backend this engine does not have.", backend="missing")
REGISTRY = Registry(echo_text, nested, surrogate, not_a_number, gate, lost, imports=False)
ACME = Tenant("acme", hash_token("acme-token"), max_running=100, rate_per_s=1000, burst=1000)
BETA = Tenant("beta", hash_token("beta-token"), max_running=100, rate_per_s=1000, burst=1000)
A = {"Authorization": "Bearer acme-token"}
B = {"Authorization": "Bearer beta-token"}


@dataclass
class Api:
    http: aiohttp.ClientSession
    base: str

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        # aiohttp writes JSON with ensure_ascii: "\udcff" and NUL travel as valid escapes.
        async with self.http.request(
            method, self.base + path, json=body, headers=headers or A
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if r.content_type == "application/json" else text

    async def raw(self, head: bytes, body: bytes) -> tuple[int, Any]:
        """One request written byte for byte (a header no client library would send)."""
        url = urlsplit(self.base)
        assert url.hostname is not None and url.port is not None
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])

    async def ids(self, headers: dict[str, str] | None = None) -> list[str]:
        status, data = await self.call("GET", "/v1/workflows", headers=headers)
        assert status == 200, data
        return sorted(w["id"] for w in data["workflows"])

    async def healthy(self) -> None:
        async with self.http.get(self.base + "/readyz") as r:
            assert r.status == 200, await r.text()

    async def other_tenant_runs(self) -> None:
        status, data = await self.call(
            "POST", "/v1/tasks?wait=30", {"tool": "echo_text", "args": {"text": "ok"}}, B
        )
        assert status == 200 and data["status"] == "succeeded", data
        assert data["results"] == {"task": "ok"}


@asynccontextmanager
async def running(store: Store) -> AsyncIterator[Api]:
    async with (
        Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine,
        contextlib.AsyncExitStack() as stack,
    ):
        batch_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        service = Service(engine, REGISTRY, (ACME, BETA), batch_dir=batch_dir)
        server = TestServer(service.app(), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                yield Api(http, str(server.make_url("")))
        finally:
            service.stop_accepting()
            if Gate.opened is not None:
                Gate.opened.set()
            await server.close()


def on_stores(make_store: StoreFactory, body: Callable[[Api], Awaitable[None]]) -> None:
    async def main() -> None:
        Gate.opened = asyncio.Event()
        async with make_store() as store, running(store) as api:
            await body(api)

    asyncio.run(main())


GATED = {"name": "held", "tasks": [{"id": "g", "function": "gate"}]}

BAD_BODIES: dict[str, tuple[str, Any, str]] = {
    "tool argument": (
        "/v1/tasks",
        {"tool": "echo_text", "args": {"text": "\udcff"}},
        "args.text",
    ),
    "NUL in an input": (
        "/v1/workflows",
        {**GATED, "inputs": {"x": ["fine", "a\x00b"]}},
        "inputs.x[1]",
    ),
    "label value": ("/v1/workflows", {**GATED, "labels": {"team": "a\x00b"}}, "labels.team"),
    "label key": ("/v1/workflows", {**GATED, "labels": {"t\udcffm": "x"}}, "labels.t\\udcffm"),
    "NaN": ("/v1/workflows", {**GATED, "inputs": {"x": float("nan")}}, "inputs.x"),
    "added task": (
        "/v1/workflows/{id}/tasks",
        {"tasks": [{"id": "e", "tool": "echo_text", "args": {"text": "\udcff"}}]},
        "tasks[0].args.text",
    ),
    "batch row": (
        "/v1/batches",
        {"rows": [{"prompt": "hi"}, {"prompt": "\udcff"}]},
        "rows[1].prompt",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_text_the_store_cannot_hold_is_refused_with_its_field_and_nothing_is_kept(
    case: str, make_store: StoreFactory
) -> None:
    path, body, field = BAD_BODIES[case]

    async def check(api: Api) -> None:
        status, data = await api.call("POST", "/v1/workflows", GATED)
        assert status == 202, data
        held = data["id"]
        status, data = await api.call("POST", path.format(id=held), body)
        assert status == 400, data
        assert [p["field"] for p in data["problems"]] == [field], data
        assert await api.ids() == [held]
        status, data = await api.call("GET", f"/v1/workflows/{held}")
        assert status == 200 and [t["id"] for t in data["tasks"]] == ["g"], data
        status, data = await api.call("GET", "/v1/batches")
        assert status == 200 and data["batches"] == [], data
        await api.healthy()
        await api.other_tenant_runs()

    on_stores(make_store, check)


@pytest.mark.parametrize("depth", [50, 5000])
def test_a_body_nested_too_deeply_names_where(depth: int, make_store: StoreFactory) -> None:
    async def check(api: Api) -> None:
        inner = b"[" * depth + b"]" * depth
        raw = b'{"tool": "echo_text", "args": {"text": ' + inner + b"}}"
        async with api.http.post(
            api.base + "/v1/tasks", data=raw, headers={**A, "Content-Type": "application/json"}
        ) as r:
            status, data = r.status, await r.json()
        assert status == 400, data
        (problem,) = data["problems"]
        assert problem["field"] == "args.text" + "[0]" * 38, problem
        assert "nested deeper than 40 levels" in problem["message"]
        assert await api.ids() == []
        await api.other_tenant_runs()

    on_stores(make_store, check)


def test_a_blank_idempotency_key_is_refused_as_blank(make_store: StoreFactory) -> None:
    async def check(api: Api) -> None:
        body = {"tool": "echo_text", "args": {"text": "hi"}}
        status, data = await api.call("POST", "/v1/tasks", body, {**A, "Idempotency-Key": "   "})
        assert status == 400, data
        assert "Idempotency-Key must not be blank" in data["error"], data
        assert await api.ids() == []

    on_stores(make_store, check)


def test_a_non_utf8_idempotency_key_is_refused_by_name(make_store: StoreFactory) -> None:
    async def check(api: Api) -> None:
        body = json.dumps({"tool": "echo_text", "args": {"text": "hi"}}).encode()
        status, data = await api.raw(
            b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme-token\r\n"
            b"Content-Type: application/json\r\nIdempotency-Key: k\xff\xfe\r\n",
            body,
        )
        assert status == 400, data
        assert [p["field"] for p in data["problems"]] == ["Idempotency-Key"], data
        assert await api.ids() == []
        await api.healthy()
        await api.other_tenant_runs()

    on_stores(make_store, check)


@pytest.mark.parametrize("function", ["surrogate", "not_a_number"])
def test_a_result_the_store_cannot_hold_fails_its_task_and_the_service_goes_on(
    function: str, make_store: StoreFactory
) -> None:
    async def check(api: Api) -> None:
        status, data = await api.call("POST", "/v1/tasks?wait=30", {"function": function})
        assert status == 200 and data["status"] == "failed", data
        assert "ResultNotSerializableError: task 'task'" in data["failures"]["task"], data
        status, view = await api.call("GET", f"/v1/workflows/{data['id']}")
        assert status == 200 and view["tasks"][0]["state"] == "failed", view
        await api.healthy()
        await api.other_tenant_runs()

    on_stores(make_store, check)


@pytest.mark.parametrize("depth", [200, 5000])
def test_a_result_nested_too_deeply_fails_its_task_by_name_and_the_service_goes_on(
    depth: int, make_store: StoreFactory
) -> None:
    async def check(api: Api) -> None:
        body = {"tool": "nested", "args": {"depth": depth}}
        status, data = await api.call("POST", "/v1/tasks?wait=30", body)
        assert status == 200 and data["status"] == "failed", data
        failure = data["failures"]["task"]
        assert "ResultNotSerializableError: task 'task'" in failure, failure
        assert "result[0][0]" in failure and "nested more than 64 levels deep" in failure
        assert "RecursionError" not in failure
        for path in (f"/v1/workflows/{data['id']}", f"/v1/workflows/{data['id']}/result"):
            status, view = await api.call("GET", path)
            assert status == 200 and view["status"] == "failed", view
        await api.healthy()
        await api.other_tenant_runs()

    on_stores(make_store, check)


def test_a_run_with_a_result_nested_too_deeply_resumes_after_a_restart(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        Gate.opened = asyncio.Event()
        wf = Workflow("deep")
        wf.add("deep", nested.call({"depth": 200}))
        wf.add("g", gate)
        async with make_store() as store:
            async with Engine(store=store) as engine:
                run_id = engine.submit(wf).id
                assert engine.journal is not None
                while "task_failed" not in [r.kind for r in await store.events(run_id)]:
                    await engine.journal.durable()
            Gate.opened.set()  # the engine went with `g` still waiting: as a crash leaves it
            async with Engine(store=store) as engine:
                report = await engine.resume(REGISTRY)
                assert [h.id for h in report.runs] == [run_id], report
                result = await report.runs[0]
            assert result["g"] == "opened"
            assert "nested more than 64 levels deep" in result.failures["deep"]
            events, _ = await read_log(store, run_id)
            assert events[-1].kind == "workflow_finished"

    asyncio.run(main())


def test_a_workflow_the_engine_refuses_leaves_nothing_behind(make_store: StoreFactory) -> None:
    """`lost` runs on a backend the engine does not have: the engine refuses the workflow
    after it began to record it; nothing of it stays, now or after a restart."""

    async def check(api: Api) -> None:
        spec = {"name": "refused", "tasks": [{"id": "a", "agent": "lost", "prompt": "hi"}]}
        status, data = await api.call("POST", "/v1/workflows", spec)
        assert 400 <= status < 600 and status != 500, data
        assert await api.ids() == []
        await api.healthy()

    on_stores(make_store, check)


def test_add_tasks_with_one_task_refused_adds_none(make_store: StoreFactory) -> None:
    async def check(api: Api) -> None:
        status, data = await api.call("POST", "/v1/workflows", GATED)
        held = data["id"]
        body = {
            "tasks": [
                {"id": "fine", "tool": "echo_text", "args": {"text": "x"}},
                {"id": "refused", "agent": "lost", "prompt": "hi", "after": ["fine"]},
            ]
        }
        status, data = await api.call("POST", f"/v1/workflows/{held}/tasks", body)
        assert status == 409, data
        status, data = await api.call("GET", f"/v1/workflows/{held}")
        assert status == 200 and [t["id"] for t in data["tasks"]] == ["g"], data
        assert Gate.opened is not None
        Gate.opened.set()
        status, data = await api.call("GET", f"/v1/workflows/{held}/result?wait=30")
        assert status == 200 and data["results"] == {"g": "opened"}, data

    on_stores(make_store, check)


# --- in process: a run is recorded whole or not at all ------------------------------------


def test_a_workflow_whose_arguments_the_log_cannot_hold_is_refused_before_it_is_stored(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with make_store() as store, Engine(store=store) as engine:
            wf = Workflow("args")
            wf.add("fine", echo_text.call({"text": "fine"}))
            wf.add("bad", echo_text.call({"text": "a\udcffb"}))
            with pytest.raises(UsageError, match=r"task 'bad': (args\.)+text: .*lone surrogate"):
                engine.submit(wf)
            labelled = Workflow("labels")
            labelled.add("one", lambda: 1)
            with pytest.raises(UsageError, match=r"labels\.team: .*NUL"):
                engine.submit(labelled, labels={"team": "a\x00b"})
            later = Workflow("later")
            later.add("one", lambda: 1)
            assert (await engine.run(later))["one"] == 1
            assert [row.name for row in await store.workflows()] == ["later"]

    asyncio.run(main())


def test_a_run_refused_while_it_starts_is_withdrawn_from_the_journal() -> None:
    """What a refused start appended never reaches the store; other records do."""

    async def main() -> None:
        store = MemoryStore()
        journal = Journal(store)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(journal.run())
            journal.append("kept", "workflow_started", 0.0, {"n": 1})
            journal.append("refused", "workflow_started", 0.0, {"n": 1})
            journal.append("refused", "task_added", 0.0, {"n": 2})
            journal.append("kept", "task_added", 0.0, {"n": 2})
            journal.withdraw("refused")
            assert journal.appended == 2
            await journal.durable()
            journal.append("refused", "workflow_started", 1.0, {"n": 3})
            await journal.close()
        assert [(e.seq, e.kind) for e in await store.events("kept")] == [
            (1, "workflow_started"),
            (2, "task_added"),
        ]
        assert [(e.seq, e.data) for e in await store.events("refused")] == [(1, '{"n":3}')]

    asyncio.run(main())


def test_a_label_filter_the_store_cannot_hold_is_refused(make_store: StoreFactory) -> None:
    """A NUL in a label filter (PostgreSQL refuses it in any query) is a 400; bytes that are
    not UTF-8 in a query reach the service as U+FFFD, which can be stored."""

    async def check(api: Api) -> None:
        async with api.http.get(f"{api.base}/v1/workflows?label=team%3Da%00b", headers=A) as r:
            data = await r.json()
            assert r.status == 400, data
        assert [p["field"] for p in data["problems"]] == ["label"], data
        await api.healthy()

    on_stores(make_store, check)


def test_a_task_added_while_running_that_the_log_cannot_hold_fails_the_task_that_adds_it(
    make_store: StoreFactory,
) -> None:
    async def grow(ctx: TaskContext) -> str:
        ctx.workflow.add("echo", echo_text.call({"text": "\udcff"}))
        return "grown"

    async def main() -> None:
        async with make_store() as store, Engine(store=store) as engine:
            wf = Workflow("grows")
            wf.add("grow", grow)
            wf.add("other", lambda: "fine")
            result = await engine.run(wf)
            assert (
                "task 'echo': args.args.text: it holds a lone surrogate" in result.failures["grow"]
            ), result.failures
            assert result["other"] == "fine"
            added = [e for e in await read_events(store, result.workflow) if "task" in e]
            assert "echo" not in {e["task"] for e in added}

    asyncio.run(main())


def test_an_event_that_cannot_be_encoded_is_stored_escaped_and_the_engine_goes_on() -> None:
    """The last guard: were a check before the event to miss something, the record is kept
    with the text escaped instead of stopping every run."""

    async def main() -> None:
        store = MemoryStore()
        durable = Durability(store, VirtualClock(), {}, lambda: None, patience_s=1)
        async with asyncio.TaskGroup() as tg:
            durable.start(tg)
            event = TaskSucceeded(
                workflow="w", task="t", duration=0.0, result={"text": "a\udcffb"}, at=1.0
            )
            durable.record("w", event)
            await durable.close()
        assert durable.error is None
        (stored,) = await store.events("w")
        assert json.loads(stored.data)["result"] == {"text": "a\\udcffb"}

    asyncio.run(main())


@pytest.mark.parametrize("depth", [300, 5000])
def test_an_event_nested_too_deeply_is_stored_so_the_log_reads_back(
    depth: int, make_store: StoreFactory
) -> None:
    """The last guard keeps what lies too deep as a note, so the log stays readable."""

    async def main() -> None:
        async with make_store() as store:
            durable = Durability(store, VirtualClock(), {}, lambda: None, patience_s=1)
            async with asyncio.TaskGroup() as tg:
                durable.start(tg)
                result = nested.fn(depth)
                event = TaskSucceeded(workflow="w", task="t", duration=0.0, result=result, at=1.0)
                durable.record("w", event)
                await durable.close()
            assert durable.error is None
            (read,), seq = await read_log(store, "w")
            assert seq == 1 and isinstance(read, TaskSucceeded)
            kept = json.dumps(read.result)  # the event holding it is one level
            assert kept.count("[") == 63 and "nested more than 64 levels deep" in kept

    asyncio.run(main())
