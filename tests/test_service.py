"""The REST service against a running server: every endpoint, its errors, tenants kept apart,
idempotent submission, streams resumed with Last-Event-ID, and work accepted before a restart
finished after it. On SQLite and PostgreSQL (the service reads everything from the store).
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

import aiohttp
import pydantic
import pytest
from aiohttp.test_utils import TestServer
from conftest import StoreFactory

from agents import Agent, tool
from executors import FunctionLLM, echo
from orchestrator import Engine, Registry, TaskContext, VirtualClock
from orchestrator.ext import Store
from orchestrator.service import (
    AddTasks,
    Service,
    SingleTask,
    TaskSpec,
    Tenant,
    hash_token,
    load_serve_config,
    openapi,
)
from orchestrator.service._config import ServiceSettings
from orchestrator.service._serve import serve

writer = Agent("writer", "You write.")


@tool
def shout(text: str, times: int = 1) -> str:
    """Shout a text.

    Args:
        text: what to shout.
        times: how often.
    """
    return " ".join([text.upper()] * times)


def join(ctx: TaskContext) -> str:
    return "|".join(f"{k}={ctx.inputs[k]}" for k in sorted(ctx.inputs))


class Gate:
    """A function task that waits until the test opens the gate."""

    opened: ClassVar[asyncio.Event | None] = None
    reached: ClassVar[asyncio.Event | None] = None


async def gate(ctx: TaskContext) -> str:
    assert Gate.opened is not None and Gate.reached is not None
    Gate.reached.set()
    await Gate.opened.wait()
    return "opened"


REGISTRY = Registry(writer, shout, join, gate, imports=False)
ACME = Tenant("acme", hash_token("acme-token"), max_running=100, rate_per_s=1000, burst=1000)
BETA = Tenant("beta", hash_token("beta-token"), max_running=1, rate_per_s=1000, burst=1000)
A = {"Authorization": "Bearer acme-token"}
B = {"Authorization": "Bearer beta-token"}


@dataclass
class Api:
    http: aiohttp.ClientSession
    base: str
    service: Service
    engine: Engine

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, Any]:
        async with self.http.request(
            method, self.base + path, json=body, headers={**A, **(headers or {})}
        ) as r:
            text = await r.text()
            data = json.loads(text) if r.content_type == "application/json" else text
            return r.status, data, r.headers


@asynccontextmanager
async def running(
    store: Store, settings: ServiceSettings | None = None, **kw: Any
) -> AsyncIterator[Api]:
    async with (
        Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine,
        contextlib.AsyncExitStack() as stack,
    ):
        if "batch_dir" not in kw:
            kw["batch_dir"] = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        service = Service(engine, REGISTRY, (ACME, BETA), settings, **kw)
        server = TestServer(service.app(), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                yield Api(http, str(server.make_url("")), service, engine)
        finally:
            service.stop_accepting()
            Gate.opened and Gate.opened.set()
            await server.close()


def on_stores(make_store: StoreFactory, body: Callable[[Api], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        Gate.opened, Gate.reached = asyncio.Event(), asyncio.Event()
        async with make_store() as store, running(store, **kw) as api:
            await body(api)

    asyncio.run(main())


SPEC = {
    "name": "brief",
    "inputs": {"topic": "kv caches", "n": 2},
    "labels": {"team": "search"},
    "tasks": [
        {"id": "facts", "agent": "writer", "prompt": "Facts on ${inputs.topic}"},
        {"id": "loud", "tool": "shout", "args": {"text": "hi", "times": {"$input": "n"}}},
        {"id": "draft", "agent": "writer", "prompt": "From ${facts}: $${x}", "after": ["facts"]},
        {"id": "all", "function": "join", "after": ["draft", "loud"]},
    ],
}


def test_a_workflow_runs_and_is_read_back(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        status, accepted, headers = await api.call("POST", "/v1/workflows", SPEC)
        assert status == 202, accepted
        run_id = accepted["id"]
        assert run_id.startswith("brief-") and headers["Location"] == f"/v1/workflows/{run_id}"
        # Answered once recorded: the row is in the store already.
        assert (await api.engine.store.workflow(run_id)) is not None  # type: ignore[union-attr]
        status, result, _ = await api.call("GET", f"/v1/workflows/{run_id}/result?wait=30")
        assert status == 200 and result["status"] == "succeeded", result
        assert result["results"] == {
            "facts": "Facts on kv caches",
            "loud": "HI HI",
            "draft": "From Facts on kv caches: ${x}",
            "all": "draft=From Facts on kv caches: ${x}|loud=HI HI",
        }
        status, view, _ = await api.call("GET", f"/v1/workflows/{run_id}")
        assert status == 200
        assert view["labels"] == {"team": "search"} and view["counts"] == {"done": 4}
        tasks = {t["id"]: t for t in view["tasks"]}
        assert tasks["all"]["after"] == ["draft", "loud"] and tasks["all"]["kind"] == "function"
        assert tasks["loud"]["name"] == "shout" and tasks["facts"]["name"] == "writer"

    on_stores(make_store, body)


def test_one_task_with_wait_answers_with_its_result(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        status, result, _ = await api.call(
            "POST", "/v1/tasks?wait=30", {"agent": "writer", "prompt": "hello"}
        )
        assert status == 200 and result["results"] == {"task": "hello"}
        status, accepted, _ = await api.call("POST", "/v1/tasks", {"function": "join"})
        assert status == 202 and accepted["id"].startswith("task-")
        status, error, _ = await api.call("POST", "/v1/tasks?wait=-1", {"function": "join"})
        assert status == 400 and error["problems"][0]["field"] == "wait"
        for bad, says in [
            ({"agent": "writer"}, "needs a prompt"),
            ({"tool": "shout", "args": {"text": 3}}, "valid string"),
            ({"function": "join", "id": "x"}, "Extra inputs"),
        ]:
            status, error, _ = await api.call("POST", "/v1/tasks", bad)
            assert status == 422 and says in json.dumps(error), error

    on_stores(make_store, body)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"tasks": []}, "tasks", "at least 1"),
        ({"tasks": [{"id": "a", "agent": "writer"}]}, "tasks[0]", "needs a prompt"),
        ({"tasks": [{"id": "a", "tool": "shout", "function": "join"}]}, "tasks[0]", "exactly one"),
        ({"tasks": [{"id": "a", "agent": "nobody", "prompt": "x"}]}, "tasks[0].agent", "writer"),
        ({"tasks": [{"id": "a", "function": "os:system"}]}, "tasks[0].function", "no function"),
        ({"tasks": [{"id": "a", "tool": "shout", "args": {"times": 1}}]}, "tasks[0].args", "text"),
        ({"tasks": [{"id": "a", "function": "join", "after": ["b"]}]}, "tasks[0].after", "'b'"),
        (
            {"tasks": [
                {"id": "a", "agent": "writer", "prompt": "${b}"},
                {"id": "b", "function": "join"},
            ]},
            "tasks[0].prompt",
            "not a task this one runs after",
        ),
        ({"tasks": [{"id": "a", "agent": "writer", "prompt": "${inputs.z}"}]}, "tasks[0]", "'z'"),
        ({"tasks": [{"id": "a", "agent": "writer", "prompt": "${open"}]}, "tasks[0]", "closed"),
        (
            {"tasks": [
                {"id": "a", "function": "join", "after": ["b"]},
                {"id": "b", "function": "join", "after": ["a"]},
            ]},
            "tasks",
            "cycle: ",
        ),
        ({"tasks": [{"id": "a", "function": "join"}] * 2}, "tasks[1].id", "there already"),
        ({"labels": {"plait.mine": "x"}}, "labels", "service's own"),
        ({"name": "has space"}, "name", "pattern"),
        ({"priority": "urgent"}, "priority", "interactive"),
        ({"late": "drop"}, "late", "'finish' or 'cancel'"),
        ({"surprise": 1}, "surprise", "Extra"),
    ],
)  # fmt: skip
def test_a_bad_spec_is_refused_naming_the_field(
    make_store: StoreFactory, change: dict[str, Any], field: str, says: str
) -> None:
    async def body(api: Api) -> None:
        status, error, _ = await api.call("POST", "/v1/workflows", {**SPEC, **change})
        assert status == 422, error
        fields = [p["field"] for p in error["problems"]]
        assert any(f.startswith(field) for f in fields), error
        assert says in json.dumps(error), error
        # Nothing was started for it.
        assert api.engine.running() == 0
        assert await api.engine.store.workflows() == []  # type: ignore[union-attr]

    on_stores(make_store, body)


def test_bodies_that_are_not_json_or_too_big_get_4xx_and_the_service_goes_on(
    make_store: StoreFactory,
) -> None:
    async def body(api: Api) -> None:
        url = api.base + "/v1/workflows"
        json_type = {**A, "Content-Type": "application/json"}
        cases = [
            (b"{not json", json_type, 400, "not valid JSON"),
            (b'{"a":' * 50 + b"1" + b"}" * 50, json_type, 400, "nested deeper"),
            (b"[" * 100_000 + b"]" * 100_000, json_type, 413, "larger than the limit"),
            (b"{}", {**A, "Content-Type": "text/plain"}, 415, "send JSON"),
            (b"[1, 2]", json_type, 422, "schema"),
        ]
        for data, headers, code, says in cases:
            async with api.http.post(url, data=data, headers=headers) as r:
                got = await r.json()
                assert (r.status, says in got["error"]) == (code, True), got
        spec = {**SPEC, "tasks": [{"id": f"t{i}", "function": "join"} for i in range(6)]}
        status, error, _ = await api.call("POST", "/v1/workflows", spec)
        assert status == 422 and "at most 5 tasks" in error["problems"][0]["message"]
        status, _, _ = await api.call("POST", "/v1/workflows", SPEC)
        assert status == 202

    on_stores(make_store, body, settings=ServiceSettings(max_body_bytes=100_000, max_tasks=5))


def test_tokens_are_checked_and_tenants_see_only_their_own(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
            async with api.http.get(api.base + "/v1/workflows", headers=headers) as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        _, accepted, _ = await api.call("POST", "/v1/workflows", SPEC)
        run_id = accepted["id"]
        await api.call("GET", f"/v1/workflows/{run_id}/result?wait=30")
        for method, path in [
            ("GET", f"/v1/workflows/{run_id}"),
            ("GET", f"/v1/workflows/{run_id}/result"),
            ("GET", f"/v1/workflows/{run_id}/events"),
            ("DELETE", f"/v1/workflows/{run_id}"),
            ("POST", f"/v1/workflows/{run_id}/tasks"),
        ]:
            body = {"tasks": [{"id": "x", "function": "join"}]} if method == "POST" else None
            status, error, _ = await api.call(method, path, body, headers=B)
            assert status == 404 and error["error"] == f"no workflow {run_id!r}", (path, error)
        status, page, _ = await api.call("GET", "/v1/workflows", headers=B)
        assert page["workflows"] == []
        status, page, _ = await api.call("GET", "/v1/workflows")
        assert [w["id"] for w in page["workflows"]] == [run_id]

    on_stores(make_store, body)


def test_a_retried_submission_with_its_key_gets_the_same_workflow(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        key = {"Idempotency-Key": "order-17"}
        first, second = await asyncio.gather(
            api.call("POST", "/v1/workflows", SPEC, key),
            api.call("POST", "/v1/workflows", SPEC, key),
        )
        assert {first[0], second[0]} == {202, 200}
        assert first[1]["id"] == second[1]["id"]
        status, again, headers = await api.call("POST", "/v1/workflows", SPEC, key)
        assert (status, again["id"], headers["Idempotent-Replayed"]) == (
            200,
            first[1]["id"],
            "true",
        )
        status, error, _ = await api.call("POST", "/v1/workflows", {**SPEC, "name": "other"}, key)
        assert status == 422 and "different request" in error["error"]
        # The same key is another tenant's own.
        status, theirs, _ = await api.call("POST", "/v1/workflows", SPEC, {**key, **B})
        assert status == 202 and theirs["id"] != first[1]["id"]
        rows = await api.engine.store.workflows(tenant="acme")  # type: ignore[union-attr]
        assert len(rows) == 1
        status, view, _ = await api.call("GET", f"/v1/workflows/{first[1]['id']}")
        assert view["labels"] == {"team": "search"}  # the service's own labels are not shown
        # Once the store no longer keeps the workflow (retention), its key is free again.
        status, _, _ = await api.call("GET", f"/v1/workflows/{first[1]['id']}/result?wait=30")
        assert await api.engine.store.delete([first[1]["id"]]) == 1  # type: ignore[union-attr]
        status, fresh, _ = await api.call("POST", "/v1/workflows", SPEC, key)
        assert status == 202 and fresh["id"] != first[1]["id"]

    on_stores(make_store, body)


GATED = {"name": "gated", "tasks": [{"id": "wait", "function": "gate"}]}


def test_tasks_are_added_to_a_running_workflow_all_or_none(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        run_id = accepted["id"]
        path = f"/v1/workflows/{run_id}/tasks"
        bad = {
            "tasks": [
                {"id": "ok", "function": "join"},
                {"id": "no", "agent": "ghost", "prompt": "x"},
            ]
        }
        status, error, _ = await api.call("POST", path, bad)
        assert status == 422 and error["problems"][0]["field"] == "tasks[1].agent"
        more = {
            "inputs": {"who": "you"},
            "tasks": [
                {
                    "id": "after",
                    "agent": "writer",
                    "prompt": "${wait} ${inputs.who}",
                    "after": ["wait"],
                },
                {"id": "side", "tool": "shout", "args": {"text": "s"}},
            ],
        }
        status, added, _ = await api.call("POST", path, more)
        assert status == 200 and sorted(added["added"]) == ["after", "side"]
        status, error, _ = await api.call("POST", path, more)
        assert status == 422 and "there already" in error["problems"][0]["message"]
        assert Gate.opened is not None
        Gate.opened.set()
        _, result, _ = await api.call("GET", f"/v1/workflows/{run_id}/result?wait=30")
        assert result["results"] == {"wait": "opened", "after": "opened you", "side": "S"}
        assert sorted(result) == ["failures", "finished", "id", "results", "status"]
        status, error, _ = await api.call(
            "POST", path, {"tasks": [{"id": "z", "function": "join"}]}
        )
        assert status == 409 and "not running" in error["error"]

    on_stores(make_store, body)


def test_cancel_a_running_workflow_and_not_a_finished_one(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        run_id = accepted["id"]
        status, _, _ = await api.call("DELETE", f"/v1/workflows/{run_id}")
        assert status == 202
        _, result, _ = await api.call("GET", f"/v1/workflows/{run_id}/result?wait=30")
        assert result["status"] == "cancelled" and "wait" in result["failures"]
        status, error, _ = await api.call("DELETE", f"/v1/workflows/{run_id}")
        assert status == 409 and "finished already (cancelled)" in error["error"]
        status, error, _ = await api.call("DELETE", "/v1/workflows/nope-1")
        assert status == 404

    on_stores(make_store, body)


def test_a_late_cancel_workflow_is_given_up_when_its_deadline_passes(
    make_store: StoreFactory,
) -> None:
    async def body(api: Api) -> None:
        spec = {**GATED, "deadline_s": 0.01, "late": "cancel"}
        _, accepted, _ = await api.call("POST", "/v1/workflows", spec)
        _, result, _ = await api.call("GET", f"/v1/workflows/{accepted['id']}/result?wait=30")
        assert result["status"] == "cancelled"
        assert result["failures"]["wait"] == "deadline passed"

    on_stores(make_store, body)


def test_lists_page_and_filter(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        ids = []
        for i in range(5):
            spec = {**SPEC, "labels": {"n": str(i % 2)}}
            ids.append(
                (
                    await api.call(
                        "POST", "/v1/tasks?wait=30", {"function": "join", "labels": spec["labels"]}
                    )
                )[1]["id"]
            )
        seen: list[str] = []
        path: str | None = "/v1/workflows?limit=2"
        while path is not None:
            status, page, _ = await api.call("GET", path)
            assert status == 200 and len(page["workflows"]) <= 2
            assert all(w["counts"] is None and w["tasks"] is None for w in page["workflows"])
            seen += [w["id"] for w in page["workflows"]]
            path = page["next"] and page["next"].removeprefix(api.base.rstrip("/"))
        assert sorted(seen) == sorted(ids) and len(seen) == 5
        _, page, _ = await api.call("GET", "/v1/workflows?label=n=1&status=succeeded")
        assert sorted(w["id"] for w in page["workflows"]) == sorted([ids[1], ids[3]])
        status, error, _ = await api.call("GET", "/v1/workflows?status=weird&limit=0&label=x")
        assert status == 400
        assert sorted(p["field"] for p in error["problems"]) == ["label", "limit", "status"]

    on_stores(make_store, body)


async def events(
    api: Api, run_id: str, headers: dict[str, str] | None = None
) -> list[tuple[int, str]]:
    out = []
    async with api.http.get(
        api.base + f"/v1/workflows/{run_id}/events", headers={**A, **(headers or {})}
    ) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        block: dict[str, str] = {}
        async for raw in r.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if "id" in block:
                    out.append((int(block["id"]), block["event"]))
                    json.loads(block["data"])
                block = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                block[name] = value
    return out


def test_events_stream_live_and_resume_after_the_last_id(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        run_id = accepted["id"]
        live = asyncio.create_task(events(api, run_id))
        assert Gate.reached is not None and Gate.opened is not None
        await Gate.reached.wait()
        Gate.opened.set()
        got = await live  # ends by itself after workflow_finished
        assert [seq for seq, _ in got] == list(range(1, len(got) + 1))
        assert got[0][1] == "workflow_started" and got[-1][1] == "workflow_finished"
        tail = await events(api, run_id, {"Last-Event-ID": str(got[-3][0])})
        assert tail == got[-2:]
        # At or past the end of a finished workflow: the stream ends at once, empty.
        assert await events(api, run_id, {"Last-Event-ID": str(got[-1][0])}) == []
        assert await events(api, run_id, {"Last-Event-ID": "999999"}) == []
        status, _, _ = await api.call(
            "GET", f"/v1/workflows/{run_id}/events", headers={"Last-Event-ID": "x"}
        )
        assert status == 400

    on_stores(make_store, body)


def test_a_stream_resumed_after_the_last_event_ends_once_the_workflow_has(
    make_store: StoreFactory,
) -> None:
    """It sent heartbeats for ever: the end it waited for had been sent already."""

    async def body(api: Api) -> None:
        _, result, _ = await api.call("POST", "/v1/tasks?wait=30", {"function": "join"})
        last = (await events(api, result["id"]))[-1]
        assert last[1] == "workflow_finished"
        async with asyncio.timeout(5):  # a heartbeat is 15 s away
            for after in (last[0], last[0] + 100):
                assert await events(api, result["id"], {"Last-Event-ID": str(after)}) == []
        # A running one: the stream ends when it finishes, with nothing to send.
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        beyond = asyncio.create_task(events(api, accepted["id"], {"Last-Event-ID": "100"}))
        assert Gate.reached is not None and Gate.opened is not None
        await Gate.reached.wait()
        Gate.opened.set()
        async with asyncio.timeout(5):
            assert await beyond == []

    on_stores(make_store, body)


def test_rate_and_running_limits_answer_429_with_retry_after(make_store: StoreFactory) -> None:
    clock = VirtualClock()
    slow = Tenant("slow", hash_token("slow-token"), max_running=5, rate_per_s=0.5, burst=2)

    async def body(api: Api) -> None:
        api.service._tenants[slow.token_sha256] = slow
        headers = {"Authorization": "Bearer slow-token"}
        codes = [(await api.call("GET", "/v1/workflows", headers=headers))[0] for _ in range(3)]
        assert codes == [200, 200, 429]
        status, error, h = await api.call("GET", "/v1/workflows", headers=headers)
        assert status == 429 and h["Retry-After"] == "2" and "0.5 requests/s" in error["error"]
        clock._now += 2.0  # the bucket fills on the service's clock
        assert (await api.call("GET", "/v1/workflows", headers=headers))[0] == 200
        # beta may run one workflow at a time
        status, _, _ = await api.call("POST", "/v1/workflows", GATED, B)
        assert status == 202
        status, error, h = await api.call("POST", "/v1/workflows", GATED, B)
        assert status == 429 and "1 workflows running" in error["error"] and h["Retry-After"]

    on_stores(make_store, body, clock=clock)


def test_health_readiness_and_shutdown(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        async with api.http.get(api.base + "/healthz") as r:
            assert r.status == 200
        async with api.http.get(api.base + "/readyz") as r:
            assert r.status == 200 and (await r.json())["status"] == "ready"
        api.service.stop_accepting()
        async with api.http.get(api.base + "/readyz") as r:
            assert r.status == 503 and (await r.json())["reason"] == "shutting down"
        status, _, h = await api.call("POST", "/v1/workflows", SPEC)
        assert status == 503 and h["Retry-After"]

    on_stores(make_store, body)


def test_a_method_a_route_does_not_take_is_405_naming_those_it_does(
    make_store: StoreFactory,
) -> None:
    """The error body is the service's own; the Allow header was lost with aiohttp's."""

    async def body(api: Api) -> None:
        status, error, headers = await api.call("PUT", "/v1/workflows")
        assert status == 405 and error == {"error": "Method Not Allowed", "problems": []}
        assert sorted(headers["Allow"].split(",")) == ["GET", "HEAD", "POST"]

    on_stores(make_store, body)


def test_added_tasks_are_held_to_the_services_limits(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        more = {"tasks": [{"id": f"t{i}", "function": "join"} for i in range(6)]}
        status, error, _ = await api.call("POST", f"/v1/workflows/{accepted['id']}/tasks", more)
        assert status == 422 and "at most 5 tasks" in error["problems"][0]["message"]

    on_stores(make_store, body, settings=ServiceSettings(max_tasks=5))


@pytest.mark.parametrize(
    ("model", "body"),
    [
        (TaskSpec, {"id": "a", "agent": "w", "prompt": "x"}),
        (TaskSpec, {"id": "a", "tool": "t", "args": {"x": 1}}),
        (TaskSpec, {"id": "a"}),  # no action
        (TaskSpec, {"id": "a", "function": "f", "tool": "t"}),  # two
        (TaskSpec, {"id": "a", "agent": "w"}),  # an agent without its prompt
        (TaskSpec, {"id": "a", "tool": "t", "prompt": "x"}),  # a prompt without an agent
        (TaskSpec, {"id": "a", "function": "f", "args": {}}),  # args without a tool
        (TaskSpec, {"id": "a\x85b", "function": "f"}),  # white space to Rust's regexes only
        (TaskSpec, {"id": "a\ufeffb", "function": "f"}),  # white space to ECMA's only
        (SingleTask, {"function": "f", "labels": {"ok": "y"}, "inputs": {"ok": 1}}),
        (SingleTask, {"function": "f", "labels": {"-x": "y"}}),  # a label key's form
        (SingleTask, {"function": "f", "inputs": {"a b": 1}}),  # an input name's form
        (AddTasks, {"tasks": [{"id": "a", "function": "f"}], "inputs": {"a b": 1}}),
    ],
)
def test_the_document_and_the_models_agree_on_what_fits(
    model: type[pydantic.BaseModel], body: dict[str, Any]
) -> None:
    """The document allowed tasks with no action or two, any label key and input name, and
    disagreed with the models on what white space is."""
    import jsonschema_rs  # the validator schemathesis judges answers with

    document = jsonschema_rs.validator_for(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": f"#/components/schemas/{model.__name__}",
            "components": openapi()["components"],
        }
    )
    try:
        model.model_validate(body)
        fits = True
    except pydantic.ValidationError:
        fits = False
    assert document.is_valid(body) == fits


def test_the_document_describes_every_answers_body() -> None:
    """Tasks added, health, the events of a stream, a replayed single task (an `Accepted`
    with 200), and the 503 of reads that wait for the store had no or the wrong schema."""
    paths = openapi()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                assert "content" in answer, (path, method, status)
    one = paths["/v1/tasks"]["post"]["responses"]["200"]["content"]["application/json"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in one["schema"]["anyOf"]] == [
        "ResultView",
        "Accepted",
    ]
    for path in ("/v1/workflows/{id}", "/v1/workflows/{id}/result"):
        assert "503" in paths[path]["get"]["responses"]
    events = paths["/v1/workflows/{id}/events"]["get"]["responses"]["200"]["content"]
    assert events["text/event-stream"]["schema"]["required"] == ["id", "event", "data"]


@pytest.mark.parametrize("make_store", ["sqlite"], indirect=True)
def test_the_openapi_document_describes_every_route_and_model(make_store: StoreFactory) -> None:
    doc = openapi()
    assert doc["openapi"].startswith("3.1")
    routes = {(p, m) for p, ops in doc["paths"].items() for m in ops}
    assert ("/v1/workflows", "post") in routes and ("/v1/workflows/{id}/events", "get") in routes

    async def body(api: Api) -> None:
        served = {
            (route.resource.canonical, route.method.lower())
            for route in api.service.app().router.routes()
            if route.method != "HEAD" and route.resource is not None
        }
        assert routes == served  # every route the service answers, and nothing else

    on_stores(make_store, body)
    schemas = doc["components"]["schemas"]
    assert {"WorkflowSpec", "TaskSpec", "ErrorBody", "ResultView"} <= set(schemas)
    refs = {
        m.group(1)
        for m in __import__("re").finditer(r'"#/components/schemas/(\w+)"', json.dumps(doc))
    }
    assert refs <= set(schemas)


# --- the command: config, registry, restart ---------------------------------------------------

REGISTRY_MODULE = """
import asyncio
from pathlib import Path
from orchestrator import Registry, TaskContext

async def slow(ctx: TaskContext) -> str:
    flag = Path(__file__).with_name("go")
    while not flag.exists():
        await asyncio.sleep(0.01)
    return "done after restart"

registry = Registry(slow)
"""


def write_config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "reg.py").write_text(REGISTRY_MODULE)
    config = tmp_path / "serve.toml"
    config.write_text(
        f"""
[service]
port = 0
store = "s.db"
registry = ["reg.py"]
drain_s = 0
{extra}
[[tenants]]
name = "acme"
token_sha256 = "{hash_token("acme-token")}"
"""
    )
    return config


def test_accepted_work_survives_a_restart_of_the_service(tmp_path: Path) -> None:
    config = load_serve_config(write_config(tmp_path))

    async def start() -> tuple[asyncio.Task[None], asyncio.Event, str]:
        stop, ready = asyncio.Event(), asyncio.Event()
        out = _Lines()
        task = asyncio.create_task(serve(config, out=out, stop=stop, ready=ready))
        await ready.wait()
        url = next(w for w in out.text().split() if w.startswith("http://"))
        return task, stop, url

    async def main() -> None:
        task, stop, url = await start()
        long = {"name": "long", "tasks": [{"id": "s", "function": "slow"}]}
        key = {"Idempotency-Key": "before-the-restart"}
        async with aiohttp.ClientSession(headers=A) as http:
            async with http.post(url + "v1/workflows", json=long, headers=key) as r:
                assert r.status == 202
                run_id = (await r.json())["id"]
            stop.set()
            await task  # drain_s = 0: it stops with the workflow still running
            task, stop, url = await start()  # resumes it
            # The key is known to the new process: a retry gets the same workflow.
            async with http.post(url + "v1/workflows", json=long, headers=key) as r:
                assert r.status == 200 and (await r.json())["id"] == run_id
            other = {**long, "name": "x"}
            async with http.post(url + "v1/workflows", json=other, headers=key) as r:
                assert r.status == 422
            (tmp_path / "go").write_text("")
            async with http.get(url + f"v1/workflows/{run_id}/result?wait=30") as r:
                result = await r.json()
            assert result["results"] == {"s": "done after restart"}
            stop.set()
            await task

    asyncio.run(main())


class _Lines:
    """A text sink the serve loop prints to."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.parts)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("port = 99999\n", "service.port"),
        ("colour = 1\n", "unknown key 'colour'"),
    ],
)
def test_a_bad_service_config_names_the_key(tmp_path: Path, extra: str, says: str) -> None:
    from orchestrator import UsageError

    path = write_config(tmp_path, extra.replace("port = 99999\n", "").replace("colour = 1\n", ""))
    text = (
        path.read_text()
        .replace("[service]\n", "[service]\n" + extra)
        .replace("port = 0\n", "" if "port" in extra else "port = 0\n")
    )
    path.write_text(text)
    with pytest.raises(UsageError, match=says):
        load_serve_config(path)


def test_tenants_need_exactly_one_token_and_env_tokens_must_be_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator import UsageError

    path = tmp_path / "s.toml"
    path.write_text("[service]\n")
    with pytest.raises(UsageError, match="tenants: none"):
        load_serve_config(path)
    path.write_text('[[tenants]]\nname = "a"\n')
    with pytest.raises(UsageError, match="exactly one of token_sha256, token_env"):
        load_serve_config(path)
    path.write_text('[[tenants]]\nname = "a"\ntoken_env = "PLAIT_TEST_TOKEN"\n')
    monkeypatch.delenv("PLAIT_TEST_TOKEN", raising=False)
    with pytest.raises(UsageError, match="PLAIT_TEST_TOKEN is not set"):
        load_serve_config(path)
    monkeypatch.setenv("PLAIT_TEST_TOKEN", "secret")
    config = load_serve_config(path)
    assert config.tenants[0].token_sha256 == hash_token("secret")
    assert "secret" not in repr(config)


@pytest.mark.parametrize(
    ("extra", "gated"), [("", True), ('[engine]\nadmission = "throughput"\n', False)]
)
def test_the_services_deadline_gate_comes_from_its_config(
    tmp_path: Path, extra: str, gated: bool
) -> None:
    """`plait serve` builds its engine with the config's `[engine] admission`: under
    `throughput` there is no deadline gate, and the service's metrics have no `plait_gate_*`
    figures."""
    config = load_serve_config(write_config(tmp_path, extra))

    async def main() -> str:
        stop, ready = asyncio.Event(), asyncio.Event()
        out = _Lines()
        task = asyncio.create_task(serve(config, out=out, stop=stop, ready=ready))
        await ready.wait()
        url = next(w for w in out.text().split() if w.startswith("http://"))
        try:
            async with aiohttp.ClientSession(headers=A) as http, http.get(url + "metrics") as r:
                assert r.status == 200
                return await r.text()
        finally:
            stop.set()
            await task

    assert ("plait_gate_in_flight" in asyncio.run(main())) is gated
