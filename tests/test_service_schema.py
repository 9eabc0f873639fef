"""schemathesis against the service's own OpenAPI document: requests generated from it are
sent to a running service, which must never answer 5xx, and whose every answer must be
documented there (its status, its content type, its headers and its body's schema).

Generated names are rarely registered, so a generated spec is also sent with names the
registry has, and a generated workflow id is mostly that of a real workflow (finished,
running, or one to cancel), so that accepted submissions and answers about real workflows
are checked too, not only the 404s and 422s. The coverage phase still sends the odd names
and ids the document allows.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from test_service import join, shout, writer

from executors import FunctionLLM, echo
from memory import SQLStore
from orchestrator import Engine, Registry, TaskContext
from orchestrator.service import Service, Tenant, hash_token, openapi
from orchestrator.service._config import ServiceSettings


async def hold(ctx: TaskContext) -> str:
    """Runs until it is cancelled: a workflow that is still running."""
    await asyncio.Event().wait()
    return "never"


REGISTRY = Registry(writer, shout, join, hold, imports=False)
TENANT = Tenant("acme", hash_token("acme-token"), max_running=10**6, rate_per_s=1e6, burst=10**6)
AUTH = {"Authorization": "Bearer acme-token"}
# A short longest ?wait: a generated wait on the running workflow must not hold the test.
SETTINGS = ServiceSettings(max_wait_s=1)

CONFIG = schemathesis.Config.from_dict(
    {
        "auth": {"openapi": {"bearer": {"bearer": "acme-token"}}},
        # A spec can fit the schema and still be refused: a name the registry does not have,
        # a dependency on no task, a cycle. That is a documented 422, not valid data refused.
        "checks": {"positive_data_acceptance": {"enabled": False}},
        "request-timeout": 30,
    }
)
schema = schemathesis.openapi.from_dict(openapi(), config=CONFIG)
IDS: dict[str, str] = {}
"""The real workflows, by role (finished, running, cancel); filled in once the service runs."""


class Running:
    """The service on a real port, its event loop in a thread of its own: schemathesis
    calls it with `requests`, synchronously."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="service", daemon=True)

    def __enter__(self) -> Running:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        assert self.url, "the service did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with (
            SQLStore(self.path) as store,
            Engine(backends={"default": FunctionLLM(echo)}, store=store) as engine,
        ):
            batches = Path(self.path).parent / "batches"
            service = Service(engine, REGISTRY, (TENANT,), SETTINGS, batch_dir=batches)
            runner = web.AppRunner(service.app(), handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
            self.url = f"http://127.0.0.1:{port}"
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                service.stop_accepting()
                await runner.cleanup()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with Running(tmp_path_factory.mktemp("schema") / "store.db") as running:
        for role, task, wait in [
            ("finished", "join", "?wait=1"),
            ("running", "hold", ""),
            ("cancel", "hold", ""),  # its own, so that tasks are still added to "running"
        ]:
            r = requests.post(
                f"{running.url}/v1/tasks{wait}", json={"function": task}, headers=AUTH, timeout=30
            )
            assert r.status_code == (200 if wait else 202), r.text
            IDS[role] = r.json()["id"]
        yield running
    IDS.clear()


def _registered(body: Any) -> Any:
    """`body` naming what the registry has: the registered agent, tool or function in place
    of each generated one, arguments the tool takes, dependencies only on earlier tasks."""
    if not isinstance(body, dict):
        return body
    if isinstance(body.get("tasks"), list):
        seen: set[str] = set()
        tasks = []
        for generated in body["tasks"]:
            task = _registered(generated)
            if isinstance(task, dict):
                if isinstance(task.get("after"), list):
                    task["after"] = [a for a in task["after"] if a in seen]
                if isinstance(task.get("id"), str):
                    seen.add(task["id"])
            tasks.append(task)
        return {**body, "tasks": tasks}
    body = dict(body)
    for key, name in [("agent", "writer"), ("tool", "shout"), ("function", "join")]:
        if isinstance(body.get(key), str):
            body[key] = name
    if isinstance(body.get("tool"), str):
        body["args"] = {"text": "a b"}
    return body


@schema.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from([_registered(body), body])


@schema.hook
def flatmap_path_parameters(
    context: schemathesis.HookContext, parameters: Any
) -> st.SearchStrategy[Any]:
    if not IDS or not isinstance(parameters, dict) or "id" not in parameters:
        return st.just(parameters)
    assert context.operation is not None
    path, method = context.operation.path, context.operation.method.upper()
    if path.endswith("/events"):
        roles = ["finished"]  # a running workflow's stream goes on until it finishes
    elif method == "DELETE":
        roles = ["finished", "cancel"]
    else:
        roles = ["finished", "running"]
    return st.sampled_from([*({**parameters, "id": IDS[r]} for r in roles), parameters])


def models_take_what_the_document_does(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """A request the document calls valid is not refused as not fitting the schema: its 422
    is for what the registry lacks or a graph that cannot run, never a field's form."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return None
    if response.status_code != 422:
        return None
    body = response.json()
    # JSON Schema cannot say that a list must not hold a sibling's value.
    problems = [p for p in body["problems"] if not p["message"].endswith("after itself")]
    if body["error"] == "the request does not fit the schema" and problems:
        raise AssertionError(f"the document allows what the models refuse: {problems}")
    return None


@schema.parametrize()
# The service runs in a thread of this process and draws retry jitter from the global
# `random` while Hypothesis draws a case here; Hypothesis sees the global state move and
# takes it for a strategy that uses `random`.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_answer_is_documented(case: schemathesis.Case, service: Running) -> None:
    case.call_and_validate(
        base_url=service.url, additional_checks=[models_take_what_the_document_does]
    )


def test_answers_to_retries_waits_and_resumed_streams_are_documented(service: Running) -> None:
    """What generated requests rarely reach: a retried submission, a wait that ends with the
    result, tasks added to a running workflow, a stream resumed after its last event."""
    one = {"function": "join"}
    key = {**AUTH, "Idempotency-Key": "schema-retry"}
    tasks = schema["/v1/tasks"]["POST"]
    calls = [
        (tasks.Case(body=one, headers=key, query={"wait": 1}), 200),  # the result
        (tasks.Case(body=one, headers=key), 200),  # the same workflow, replayed
        (
            schema["/v1/workflows/{id}/tasks"]["POST"].Case(
                path_parameters={"id": IDS["running"]},
                body={"tasks": [{"id": "added-by-hand", "function": "join"}]},
                headers=AUTH,
            ),
            200,
        ),
        (
            schema["/v1/workflows/{id}/events"]["GET"].Case(
                path_parameters={"id": IDS["finished"]},
                headers={**AUTH, "Last-Event-ID": "1000"},
            ),
            200,  # nothing after it, and the stream ends
        ),
    ]
    for case, status in calls:
        response = case.call_and_validate(base_url=service.url)
        assert response.status_code == status, (case.formatted_path, response.text)
    assert response.text == ""
