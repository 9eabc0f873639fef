"""`/v1/batches`: batch jobs over REST, on SQLite and PostgreSQL: created, followed, read,
cancelled, isolated between tenants (their rows stored and looked up under each tenant, and
salted apart in the prefix cache), refused with the field and the limit, counted on
/metrics, and gone on with by a restarted service."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from conftest import MemoryStore, StoreFactory, run

from agents import Agent
from executors import FunctionLLM, SimServer
from memory import SQLStore
from orchestrator import (
    Engine,
    Hints,
    LLMBackend,
    LLMRequest,
    Message,
    Registry,
    Retention,
    VirtualClock,
    Workflow,
)
from orchestrator.batch import JOB_LABEL, RowCall
from orchestrator.batch._job import ROW_LABEL, job_runs
from orchestrator.service import Service, Tenant, hash_token
from orchestrator.service._batches import BatchError, Batches, batch_runs
from orchestrator.service._config import ServiceSettings

ACME = Tenant("acme", hash_token("acme-token"), max_running=100, rate_per_s=1000, burst=1000)
BETA = Tenant("beta", hash_token("beta-token"), max_running=100, rate_per_s=1000, burst=1000)
A = {"Authorization": "Bearer acme-token"}
B = {"Authorization": "Bearer beta-token"}


REGISTRY = Registry(Agent("writer", "You write."), imports=False)


@dataclass
class Replies:
    """An LLM that answers upper-cased, each call once its prompt is let through: prompts
    in `held` wait until `release()`. `asked` counts calls by prompt."""

    held: set[str] = field(default_factory=set)
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)
    asked: dict[str, int] = field(default_factory=dict)

    async def __call__(self, request: LLMRequest, hints: Hints) -> str:
        prompt = request.messages[-1].content
        self.asked[prompt] = self.asked.get(prompt, 0) + 1
        if prompt in self.held:
            self.waiting.set()
            await self.opened.wait()
        return prompt.upper()

    def release(self) -> None:
        self.opened.set()


@dataclass
class Api:
    http: aiohttp.ClientSession
    base: str
    service: Service

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.http.request(
            method, self.base + path, json=body, headers=A if headers is None else headers
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if r.content_type == "application/json" else text

    async def finished(self, batch_id: str, tenant: str = "acme") -> dict[str, Any]:
        """The batch once its job has ended (its task awaited: an event, not a poll)."""
        batch = self.service.batches.get(tenant, batch_id)
        assert batch.task is not None
        await asyncio.shield(batch.task)
        headers = {"acme": A, "beta": B}[tenant]
        status, view = await self.call("GET", f"/v1/batches/{batch_id}", headers=headers)
        assert status == 200
        return dict(view)

    async def output(self, batch_id: str, headers: dict[str, str] = A) -> list[dict[str, Any]]:
        status, text = await self.call("GET", f"/v1/batches/{batch_id}/output", headers=headers)
        assert status == 200
        return [json.loads(line) for line in str(text).splitlines()]


@asynccontextmanager
async def running(
    store: Any,
    batch_dir: Path,
    replies: Replies,
    settings: ServiceSettings | None = None,
    *,
    resume: bool = False,
    tenants: tuple[Tenant, ...] = (ACME, BETA),
    backend: LLMBackend | None = None,
) -> AsyncIterator[Api]:
    backends = {"default": backend or FunctionLLM(replies)}
    async with Engine(backends=backends, store=store) as engine:
        if resume:  # what `plait serve` does at its start
            skip = await batch_runs(store, batch_dir)
            unfinished = [w for w in await store.unfinished() if w not in skip]
            await engine.resume(REGISTRY, workflows=unfinished)
        service = Service(engine, REGISTRY, tenants, settings, batch_dir=batch_dir)
        server = TestServer(service.app(), host="127.0.0.1")
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http:
                yield Api(http, str(server.make_url("")), service)
        finally:
            service.stop_accepting()
            await server.close()


def openai_line(custom_id: str, prompt: str, url: str = "/v1/chat/completions") -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 64}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_a_batch_runs_each_row_once_and_reports_progress_and_summary(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    async def body() -> None:
        rows = [openai_line(f"r{i}", f"question {i}") for i in range(6)]
        rows.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions"})
        async with make_store() as store, running(store, tmp_path, Replies()) as api:
            status, view = await api.call("POST", "/v1/batches", {"rows": rows})
            assert status == 202, view
            assert view["state"] == "running" and view["total"] == 7
            done = await api.finished(view["id"])
            out = await api.output(view["id"])
        assert done["state"] == "completed"
        assert done["progress"]["done"] == 6 and done["progress"]["failed"] == 1
        assert done["summary"]["ok"] == 6 and done["summary"]["failed"] == 1
        by_id = {line["custom_id"]: line for line in out}
        assert len(out) == 7 and set(by_id) == {f"r{i}" for i in range(6)} | {"bad"}
        answer = by_id["r3"]["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == "QUESTION 3"
        assert by_id["bad"]["response"] is None and "body" in by_id["bad"]["error"]["message"]

    run(body())


def test_duplicate_rows_are_asked_once(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        replies = Replies()
        rows = [openai_line(f"r{i}", "the same question") for i in range(4)]
        async with make_store() as store, running(store, tmp_path, replies) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            done = await api.finished(view["id"])
        assert done["progress"]["done"] == 4
        assert replies.asked == {"the same question": 1}

    run(body())


def test_another_tenant_gets_404_for_a_batch(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        async with make_store() as store, running(store, tmp_path, Replies()) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": [openai_line("x", "q")]})
            batch = view["id"]
            for method, path in (
                ("GET", f"/v1/batches/{batch}"),
                ("GET", f"/v1/batches/{batch}/output"),
                ("DELETE", f"/v1/batches/{batch}"),
            ):
                status, body = await api.call(method, path, headers=B)
                assert status == 404, (method, path, body)
            status, listed = await api.call("GET", "/v1/batches", headers=B)
            assert status == 200 and listed["batches"] == []
            status, listed = await api.call("GET", "/v1/batches")
            assert [b["id"] for b in listed["batches"]] == [batch]
            await api.finished(batch)

    run(body())


def test_bad_batches_are_refused_naming_the_field(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        settings = ServiceSettings(max_batch_rows=3)
        async with make_store() as store, running(store, tmp_path, Replies(), settings) as api:
            status, body = await api.call("POST", "/v1/batches", {"rows": []})
            assert status == 422 and body["problems"][0]["field"] == "rows"
            status, body = await api.call("POST", "/v1/batches", {"rows": "nope"})
            assert status == 422 and body["problems"][0]["field"] == "rows"
            status, body = await api.call("POST", "/v1/batches", {"rows": [{}], "extra": 1})
            assert status == 422 and body["problems"][0]["field"] == "extra"
            many = [openai_line(f"r{i}", "q") for i in range(4)]
            status, body = await api.call("POST", "/v1/batches", {"rows": many})
            assert status == 422 and body["problems"] == [
                {"field": "rows", "message": "4 rows is more than the limit of 3"}
            ]
            status, body = await api.call("GET", "/v1/batches?state=done")
            assert status == 400 and body["problems"][0]["field"] == "state"
            status, body = await api.call("GET", "/v1/batches/batch-nope")
            assert status == 404
            status, body = await api.call("POST", "/v1/batches", {"rows": [{}]})
            assert status == 400 and body["problems"][0]["field"] == "rows", body
            status, body = await api.call("POST", "/v1/batches", {"rows": [{}]}, headers={})
            assert status == 401

    run(body())
    assert list(tmp_path.glob("batch-*")) == []  # nothing refused left a folder


def test_an_unsupported_url_fails_its_row_only(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        rows = [openai_line("ok", "q"), openai_line("emb", "q2", url="/v1/embeddings")]
        async with make_store() as store, running(store, tmp_path, Replies()) as api:
            status, view = await api.call("POST", "/v1/batches", {"rows": rows})
            assert status == 202, view
            await api.finished(view["id"])
            out = {line["custom_id"]: line for line in await api.output(view["id"])}
            assert out["ok"]["error"] is None
            assert "/v1/embeddings" in out["emb"]["error"]["message"]
            only_bad = [openai_line("emb", "q2", url="/v1/embeddings")]
            status, refused = await api.call("POST", "/v1/batches", {"rows": only_bad})
            assert status == 400 and "/v1/embeddings" in refused["error"], refused

    run(body())


def test_cancel_stops_the_rows_not_yet_done(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        replies = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow")]
        async with make_store() as store, running(store, tmp_path, replies) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            await replies.waiting.wait()
            status, cancelled = await api.call("DELETE", f"/v1/batches/{view['id']}")
            assert status == 202 and cancelled["state"] == "cancelled"
            status, again = await api.call("GET", f"/v1/batches/{view['id']}")
            assert again["state"] == "cancelled"
            replies.release()
        meta = json.loads((tmp_path / view["id"] / "batch.json").read_text())
        assert meta["state"] == "cancelled"  # a restart does not start it again

    run(body())


def test_metrics_show_the_running_batches(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        replies = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow"), openai_line("c", "c")]
        async with make_store() as store, running(store, tmp_path, replies) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            await replies.waiting.wait()
            batch = api.service.batches.get("acme", view["id"])
            assert batch.job is not None
            await batch.job.written(2)  # the two others
            status, text = await api.call("GET", "/metrics")
            replies.release()
            await api.finished(view["id"])
        assert status == 200
        lines = str(text).splitlines()
        assert 'plait_batches{state="running"} 1.0' in lines
        assert 'plait_batch_rows{state="running"} 1.0' in lines
        assert 'plait_batch_rows{state="done"} 2.0' in lines

    run(body())


def test_a_restarted_service_goes_on_with_a_batch(tmp_path: Path, make_store: StoreFactory) -> None:
    async def body() -> None:
        first = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow")]
        async with make_store() as store, running(store, tmp_path, first) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            await first.waiting.wait()
            batch = api.service.batches.get("acme", view["id"])
            assert batch.job is not None
            await batch.job.written(1)
        # the service stopped with "slow" running: its folder says running, its row is in the store
        meta = json.loads((tmp_path / view["id"] / "batch.json").read_text())
        assert meta["state"] == "running"
        second = Replies()
        async with make_store() as store, running(store, tmp_path, second, resume=True) as api:
            done = await api.finished(view["id"])
            out = await api.output(view["id"])
        assert done["state"] == "completed"
        assert sorted(line["custom_id"] for line in out) == ["fast", "slow"]  # each once
        assert second.asked == {"slow": 1}  # the finished row was not asked again

    run(body())


def test_a_cancelled_batch_is_not_run_again_after_a_restart(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    async def body() -> None:
        first = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow")]
        async with make_store() as store, running(store, tmp_path, first) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            await first.waiting.wait()
            status, _ = await api.call("DELETE", f"/v1/batches/{view['id']}")
            assert status == 202
        second = Replies()
        async with make_store() as store, running(store, tmp_path, second, resume=True) as api:
            status, again = await api.call("GET", f"/v1/batches/{view['id']}")
        assert status == 200 and again["state"] == "cancelled"
        assert "slow" not in second.asked  # neither the batch nor the service's resume ran it

    run(body())


def test_a_tenant_runs_at_most_its_limit_of_batches(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    one_at_a_time = Tenant(
        "acme", hash_token("acme-token"), 100, rate_per_s=1000, burst=1000, max_batches=1
    )

    async def post(api: Api, custom_id: str, prompt: str, headers: dict[str, str]) -> Any:
        body = {"rows": [openai_line(custom_id, prompt)]}
        async with api.http.post(api.base + "/v1/batches", json=body, headers=headers) as r:
            return r.status, r.headers.get("Retry-After"), await r.json()

    async def body() -> None:
        held = Replies(held={"slow"})
        tenants = (one_at_a_time, BETA)
        async with make_store() as store, running(store, tmp_path, held, tenants=tenants) as api:
            status, _, first = await post(api, "s", "slow", A)
            assert status == 202
            status, retry, refused = await post(api, "x", "x", A)
            assert status == 429 and retry == "30" and "limit" in refused["error"]
            status, _, _ = await post(api, "y", "y", B)
            assert status == 202  # another tenant's limit is its own
            held.release()
            await api.finished(first["id"])
            status, _, _ = await post(api, "z", "z", A)
            assert status == 202  # one finished: room again

    run(body())


def _folder(batch_dir: Path, name: str, meta: Any, rows: list[Any] | None = None) -> Path:
    folder = batch_dir / name
    folder.mkdir(parents=True)
    if isinstance(meta, bytes):
        (folder / "batch.json").write_bytes(meta)
    else:
        (folder / "batch.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    if rows is not None:
        (folder / "input.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _meta(name: str, state: str = "running", **more: Any) -> dict[str, Any]:
    return {"id": name, "tenant": "acme", "created": 1.7e9, "total": 1, "state": state, **more}


def test_damaged_batch_folders_are_reported_and_the_rest_start(
    tmp_path: Path, make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    line = openai_line("r0", "hello")
    _folder(tmp_path, "batch-good", _meta("batch-good"), [line])
    _folder(tmp_path, "batch-json", "{not json")
    _folder(tmp_path, "batch-encoding", b'\xff\xfe{"id": "batch-encoding"}')
    _folder(tmp_path, "batch-fields", {"id": "batch-fields", "tenant": "acme"})
    _folder(tmp_path, "batch-types", _meta("batch-types", created="yesterday", total=None))
    _folder(tmp_path, "batch-state", _meta("batch-state", state="paused"))
    _folder(tmp_path, "batch-notmine", _meta("batch-other"))
    bad_input = _folder(tmp_path, "batch-input", _meta("batch-input"))
    (bad_input / "input.jsonl").write_bytes(b'{"custom_id": "x", "prompt": "\xff\xfe"}\n')
    bad_output = _folder(tmp_path, "batch-output", _meta("batch-output"), [line])
    (bad_output / "output.jsonl").write_text("this is not a record\n")

    async def body() -> None:
        replies = Replies(held={"hello"})
        async with make_store() as store, running(store, tmp_path, replies, resume=True) as api:
            await replies.waiting.wait()
            # Created long ago, but running: a sweep leaves it (and the others, just found).
            assert await api.service.batches.sweep() == 0
            replies.release()
            done = await api.finished("batch-good")
            assert done["state"] == "completed" and done["progress"]["done"] == 1
            status, listed = await api.call("GET", "/v1/batches?limit=100")
            assert status == 200
            states = {b["id"]: (b["state"], b["error"]) for b in listed["batches"]}
            bad_output_batch = api.service.batches.get("acme", "batch-output")
            if bad_output_batch.task is not None:
                await asyncio.shield(bad_output_batch.task)
            status, view = await api.call("GET", "/v1/batches/batch-output")
            assert status == 200 and view["state"] == "failed", view
            assert "not a line plait batch writes" in view["error"]
        assert set(states) == {
            "batch-good", "batch-fields", "batch-types", "batch-state", "batch-input",
            "batch-output",
        }  # fmt: skip
        for name in ("batch-fields", "batch-types", "batch-state"):
            state, error = states[name]
            assert state == "failed" and "batch.json is damaged" in error, (name, error)
        assert "created" in states["batch-types"][1] and "total" in states["batch-types"][1]
        assert "state" in states["batch-state"][1]
        assert states["batch-input"][0] == "failed"
        assert "input cannot be read" in states["batch-input"][1]
        assert replies.asked == {"hello": 1}

    with caplog.at_level("ERROR", logger="plait.serve"):
        run(body())
    said = "\n".join(r.getMessage() for r in caplog.records)
    for name in ("json", "encoding", "fields", "types", "state", "notmine", "input"):
        assert str(tmp_path / f"batch-{name}") in said, name


def test_finished_batch_folders_are_removed_after_retention(tmp_path: Path) -> None:
    clock = VirtualClock()
    now = clock.now()
    hour = 3600.0
    _folder(tmp_path, "batch-old", _meta("batch-old", "completed", finished=now - 2 * hour))
    _folder(tmp_path, "batch-recent", _meta("batch-recent", "failed", finished=now - 600))
    legacy = _folder(tmp_path, "batch-legacy", _meta("batch-legacy", "cancelled"))
    # No time of its end in it (written before it was kept): its batch.json's, then.
    os.utime(legacy / "batch.json", (now - 2 * hour, now - 2 * hour))
    _folder(tmp_path, "batch-other", {"id": "batch-other"})  # damaged: left alone
    left: list[set[str]] = []

    def folders() -> set[str]:
        return {p.name for p in tmp_path.iterdir()}

    async def main() -> None:
        # The engine is not entered: only finished batches here, none is run (and its
        # store, one that can retain as retention= needs, is never opened).
        engine = Engine(
            backends={"default": FunctionLLM(Replies())},
            store=SQLStore(tmp_path / "unopened.db"),
            retention=Retention(delete_after=hour, every=60.0),
        )
        batches = Batches(engine, tmp_path, max_rows=10, clock=clock)
        assert batches.keep_s == hour  # as long as the engine keeps finished runs
        await batches.start()
        await clock.sleep(1.0)
        left.append(await asyncio.to_thread(folders))
        with pytest.raises(BatchError):
            batches.get("acme", "batch-old")  # gone: 404
        assert batches.get("acme", "batch-recent").state == "failed"
        await clock.sleep(hour - 600)  # the recent one is past an hour now
        left.append(await asyncio.to_thread(folders))
        await batches.close()

    clock.run(main())
    assert left[0] == {"batch-recent", "batch-other"}
    assert left[1] == {"batch-other"}


def test_without_retention_batch_folders_are_kept_a_week(tmp_path: Path) -> None:
    engine = Engine(backends={"default": FunctionLLM(Replies())}, store=MemoryStore())
    batches = Batches(engine, tmp_path, max_rows=10, clock=VirtualClock())
    assert batches.keep_s == Retention().delete_after == 7 * 86400.0


def test_the_rows_of_an_unreadable_batch_are_not_run_after_a_restart(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    async def body() -> None:
        first = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow")]
        async with make_store() as store, running(store, tmp_path, first) as api:
            _, view = await api.call("POST", "/v1/batches", {"rows": rows})
            await first.waiting.wait()
        (tmp_path / view["id"] / "batch.json").write_text("{not json")
        async with make_store() as store:
            unfinished = set(await store.unfinished())
            # What `plait serve` leaves out of its resume at start: the batch's own rows.
            skip = await batch_runs(store, tmp_path)
        assert unfinished and unfinished <= skip  # the held row is not run as a stray

    run(body())


# --- tenants: rows stored, looked up and salted under the batch's tenant ---------------------


async def _labelled_run(engine: Engine, tenant: str | None, batch_id: str, row: int, q: str) -> str:
    """A finished run of `tenant` labelled as row `row` of batch `batch_id` (as no request
    can label one: `plait.` labels are the service's), answering `q` upper-cased."""
    wf = Workflow(f"row-{row}")
    wf.add("call", RowCall(LLMRequest((Message("user", q),), "m", max_tokens=8)))
    labels = {JOB_LABEL: batch_id, ROW_LABEL: str(row)}
    result = await engine.submit(wf, tenant=tenant, labels=labels)
    assert result.ok
    return wf.id


def _answers(out: list[dict[str, Any]]) -> dict[str, str]:
    return {
        line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
        for line in out
    }


def test_batch_rows_are_stored_and_looked_up_under_the_batchs_tenant(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    async def body() -> None:
        first = Replies(held={"slow"})
        rows = [openai_line("fast", "fast"), openai_line("slow", "slow")]
        async with make_store() as store, running(store, tmp_path, first) as api:
            _, a = await api.call("POST", "/v1/batches", {"rows": rows})
            _, b = await api.call("POST", "/v1/batches", {"rows": rows[:1]}, headers=B)
            await api.finished(b["id"], "beta")
            await first.waiting.wait()
            job = api.service.batches.get("acme", a["id"]).job
            assert job is not None
            await job.written(1)
            stored_a = await store.workflows(labels={JOB_LABEL: a["id"]})
            stored_b = await store.workflows(labels={JOB_LABEL: b["id"]})
            assert [r.tenant for r in stored_a] == ["acme", "acme"]
            assert [r.tenant for r in stored_b] == ["beta"]
            for headers, count in ((A, 2), (B, 0)):  # the tenant's workflows, its alone
                path = f"/v1/workflows?label={JOB_LABEL}={a['id']}"
                status, listed = await api.call("GET", path, headers=headers)
                assert status == 200 and len(listed["workflows"]) == count, listed
            # A run of another tenant carrying acme's batch's labels (row 1, "slow"):
            forged = await _labelled_run(api.service.engine, "beta", a["id"], 1, "forged")
            found = await job_runs(store, a["id"], tenant="acme")
            assert forged not in {r.id for r in found} and len(found) == 2
        # Restarted with "slow" unfinished: acme's batch resumes its own run of the row, and
        # never takes beta's (newer, finished) run for its answer.
        second = Replies()
        async with make_store() as store, running(store, tmp_path, second, resume=True) as api:
            done = await api.finished(a["id"])
            out = await api.output(a["id"])
            assert await store.workflow(forged) is not None  # still there, beta's
        assert done["state"] == "completed"
        assert _answers(out) == {"fast": "FAST", "slow": "SLOW"}
        assert second.asked == {"slow": 1}

    run(body())


def test_a_batch_begun_before_rows_had_a_tenant_resumes_its_untenanted_rows(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    """A batch a service began before it stored rows under the batch's tenant: its rows
    have no tenant. Run again, it writes the finished one from the store, resumes the
    unfinished one, and still takes no other tenant's run for one of its rows."""
    name = "batch-00000000000000aa"
    lines = [openai_line("fast", "fast"), openai_line("slow", "slow")]
    _folder(tmp_path, name, _meta(name, total=2), lines)  # its batch.json has no tenant_rows

    async def body() -> None:
        first = Replies(held={"slow"})
        async with make_store() as store:
            async with Engine(backends={"default": FunctionLLM(first)}, store=store) as engine:
                await _labelled_run(engine, None, name, 0, "fast")
                wf = Workflow("row-1")
                wf.add("call", RowCall(LLMRequest((Message("user", "slow"),), "m")))
                engine.submit(wf, labels={JOB_LABEL: name, ROW_LABEL: "1"})
                await first.waiting.wait()  # stopped with it running, as a killed service
            async with Engine(backends={"default": FunctionLLM(Replies())}, store=store) as other:
                await _labelled_run(other, "beta", name, 0, "forged")
        second = Replies()
        async with make_store() as store, running(store, tmp_path, second, resume=True) as api:
            done = await api.finished(name)
            out = await api.output(name)
        assert done["state"] == "completed" and done["summary"]["from_store"] == 1
        assert done["summary"]["resumed"] == 1
        assert _answers(out) == {"fast": "FAST", "slow": "SLOW"}
        assert second.asked == {"slow": 1}  # resumed once; "fast" not asked again

    run(body())


PREFIX = "You are reviewing the quarterly report of a logistics company. " * 20  # ~300 tokens


def _line(custom_id: str, question: str) -> dict[str, Any]:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"{PREFIX}{question}"}],
        "max_tokens": 2,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_a_tenants_batch_gets_no_cache_hits_from_another_tenants_batch(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    """On a server that salts its prefix cache (the simulator, as vLLM): rows of one
    tenant's batches share cached prefixes; another tenant's batch sending the same prompt
    finds none of it cached, so learns nothing of what the first sent."""

    async def cached(api: Api, rows: list[dict[str, Any]], tenant: str) -> dict[str, int]:
        headers = {"acme": A, "beta": B}[tenant]
        status, view = await api.call("POST", "/v1/batches", {"rows": rows}, headers=headers)
        assert status == 202, view
        assert (await api.finished(view["id"], tenant))["progress"]["done"] == len(rows)
        return {
            line["custom_id"]: line["response"]["body"]["usage"]["prompt_tokens_details"][
                "cached_tokens"
            ]
            for line in await api.output(view["id"], headers)
        }

    async def body() -> None:
        sim = SimServer("h100-llama3-8b")
        async with (
            sim,
            make_store() as store,
            running(store, tmp_path, Replies(), backend=sim) as api,
        ):
            rows = [_line("a0", "What was the revenue?"), _line("a1", "Who audited it?")]
            within = await cached(api, rows, "acme")
            other = await cached(api, [_line("b0", "What was the revenue?")], "beta")
            again = await cached(api, [_line("a2", "What was the revenue?")], "acme")
        # One row of the batch computed the prefix, the other found it cached.
        assert min(within.values()) == 0 and max(within.values()) > 250
        assert other == {"b0": 0}  # beta's salt: nothing of acme's
        assert again["a2"] > 250  # acme's later batch: its own prefix, still cached

    run(body())


def test_batch_rows_do_not_count_toward_the_running_limit(
    tmp_path: Path, make_store: StoreFactory
) -> None:
    two = Tenant("acme", hash_token("acme-token"), max_running=2, rate_per_s=1000, burst=1000)
    spec = {"name": "held", "tasks": [{"id": "a", "agent": "writer", "prompt": "held"}]}

    async def body() -> None:
        replies = Replies(held={"held"})
        rows = [openai_line(f"r{i}", "held") for i in range(3)]
        rows[1]["body"]["max_tokens"] = 32  # three calls, none the same: none deduplicated
        rows[2]["body"]["max_tokens"] = 16
        tenants = (two, BETA)
        async with make_store() as store, running(store, tmp_path, replies, tenants=tenants) as api:
            _, batch = await api.call("POST", "/v1/batches", {"rows": rows})
            await replies.waiting.wait()
            assert api.service.engine.running("acme") == 3  # every row, held
            status, first = await api.call("POST", "/v1/workflows", spec)
            assert status == 202, first  # one of two: max_running - 1 workflows running
            status, second = await api.call("POST", "/v1/workflows", spec)
            assert status == 202, second
            status, refused = await api.call("POST", "/v1/workflows", spec)
            assert status == 429 and "2 workflows running" in refused["error"], refused
            replies.release()
            await api.finished(batch["id"])

    run(body())
