"""A batch through a backend outage: rows wait for a model server that goes down and comes
back (over real HTTP, on the virtual clock), and `--retry-failed` runs again only the rows
that failed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from agents import Agent
from executors import FunctionLLM, OpenAIBackend, Router, SimHTTP, SimServer
from orchestrator import Breaker, Engine, Hints, Limits, LLMRequest, VirtualClock, Workflow
from orchestrator.batch import (
    BATCH_BREAKER,
    BatchJob,
    BatchProgress,
    ParquetSink,
    read_rows,
    run_batch,
    sink_for,
)
from orchestrator.batch._cli import _line
from orchestrator.engine._resilience import CircuitBreaker
from orchestrator.ext import BackendRequestError, BackendUnavailableError, running_clock

ROWS = 300
AGENT = Agent("a", "You answer.")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def write_rows(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(count)))
    return path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _serve(front: SimHTTP, port: int = 0) -> web.AppRunner:
    # A short shutdown: stopping the server cuts its requests off, as a crash would.
    runner = web.AppRunner(front.app(), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def run_through_outage(
    tmp_path: Path,
    *,
    down_s: float,
    breaker: Breaker | None = None,
    router: bool = False,
    rows: int = ROWS,
) -> tuple[Any, BatchJob, list[BatchProgress]]:
    """`rows` rows on one simulated server over HTTP, stopped after 50 rows are written and
    started again on its port `down_s` seconds later; `router`: behind a `Router`."""
    clock = VirtualClock()
    job = BatchJob(
        read_rows(str(write_rows(tmp_path / "in.jsonl", rows))),
        sink_for(str(tmp_path / "out.jsonl")),
        max_running=64,
    )
    seen: list[BatchProgress] = []

    async def watch(j: BatchJob) -> None:
        while True:
            await running_clock().sleep(1.0)
            seen.append(j.progress())

    async def main() -> Any:
        async with contextlib.AsyncExitStack() as stack:
            sim = await stack.enter_async_context(SimServer("h100-llama3-8b", seed=1))
            front = SimHTTP(sim)
            runner = await _serve(front)
            port = runner.addresses[0][1]
            llm = OpenAIBackend(
                f"http://127.0.0.1:{port}/v1",
                dialect="sim",
                timeout_s=5.0,
                local=True,  # the server shares this test's (virtual) clock
                model=MODEL,
            )
            if router:
                llm = await stack.enter_async_context(
                    Router({"s0": llm}, health_interval_s=1.0, health_timeout_s=1.0)
                )

            async def outage() -> None:
                await job.written(50)
                await runner.cleanup()
                await clock.sleep(down_s)
                stack.push_async_callback((await _serve(front, port)).cleanup)

            kw: dict[str, Any] = {} if breaker is None else {"breaker": breaker}
            async with asyncio.TaskGroup() as tg:
                outage_task = tg.create_task(outage())
                summary = await run_batch(
                    job,
                    backends={"default": llm},
                    clock=clock,
                    limits={"default": Limits(max_in_flight=32)},
                    watch=watch,
                    **kw,
                )
                outage_task.cancel()  # done by now, unless the batch ended first
            return summary

    return clock.run(main()), job, seen


def test_rows_wait_for_a_backend_that_comes_back(tmp_path: Path) -> None:
    summary, job, seen = run_through_outage(tmp_path, down_s=12.0)
    got = lines(tmp_path / "out.jsonl")
    assert len(got) == ROWS and len({r["custom_id"] for r in got}) == ROWS
    assert [r for r in got if r["error"]] == []
    assert summary.ok == ROWS and summary.failed == 0 and summary.all_ok
    # While the server was down, progress said which backend the rows wait for, and since
    # when; once it was back, nothing waited.
    waiting = [p.waiting for p in seen if p.waiting]
    assert waiting, seen
    assert all(set(w) == {"default"} for w in waiting)
    downs = [w["default"] for w in waiting]
    assert max(downs) >= 10.0 and downs == sorted(downs)
    assert job.progress().waiting == {}


def test_rows_wait_for_a_router_whose_every_replica_went_down(tmp_path: Path) -> None:
    summary, job, seen = run_through_outage(tmp_path, down_s=12.0, router=True, rows=120)
    got = lines(tmp_path / "out.jsonl")
    assert len(got) == 120 and [r for r in got if r["error"]] == []
    assert summary.ok == 120
    assert any(p.waiting.get("default", 0.0) >= 10.0 for p in seen), seen
    assert job.progress().waiting == {}


def test_rows_fail_once_the_backend_is_down_longer_than_the_wait(tmp_path: Path) -> None:
    wait = replace(BATCH_BREAKER, wait_s=60.0)
    summary, _, seen = run_through_outage(tmp_path, down_s=3600.0, breaker=wait)
    got = lines(tmp_path / "out.jsonl")
    assert len(got) == ROWS
    failed = [r for r in got if r["error"]]
    assert failed and summary.ok >= 50 and summary.ok + len(failed) == ROWS
    messages = {r["error"]["message"] for r in failed}
    assert all("is down for longer than calls wait for it" in m for m in messages)
    assert len(summary.errors) == 1, summary.errors  # one kind of error, counted once
    # Bounded: once the backend has been down a minute, the rest fail without waiting.
    assert 60.0 <= summary.wall_s < 60.0 + 2 * BATCH_BREAKER.cooldown_s
    assert max(p.waiting.get("default", 0.0) for p in seen) < 60.0 + BATCH_BREAKER.cooldown_s


def test_a_call_alone_on_a_backend_that_goes_down_waits_for_it() -> None:
    """One call at a time: the circuit opens with the call's last attempt (a batch opens it
    after as many failures as a call has attempts), so the call waits, not fails."""
    clock = VirtualClock()
    down = (5.0, 40.0)
    tried: list[float] = []

    def answer(request: LLMRequest, hints: Hints) -> str:
        now = running_clock().monotonic()
        tried.append(now)
        if down[0] <= now < down[1]:
            raise BackendUnavailableError("connection refused")
        return "ok"

    async def main() -> list[Any]:
        llm = FunctionLLM(answer, latency=1.0)
        async with Engine(backends={"default": llm}, breaker=BATCH_BREAKER) as engine:
            out = []
            for i in range(10):
                wf = Workflow(f"w{i}")
                wf.add("ask", AGENT.ask(f"q{i}"))
                out.append((await engine.run(wf)).results.get("ask"))
            return out

    assert clock.run(main()) == ["ok"] * 10
    during = [t for t in tried if down[0] <= t < down[1]]
    # Sent to the dead backend: the failures that opened the circuit, then a probe a cooldown.
    cooldowns = (down[1] - down[0]) / BATCH_BREAKER.cooldown_s
    assert BATCH_BREAKER.failures <= len(during) <= BATCH_BREAKER.failures + cooldowns + 1


def test_progress_line_says_which_backend_rows_wait_for() -> None:
    p = BatchProgress(10, 2, 0, 8, 0, 0, 0, 0, 5.0, waiting={"default": 12.4})
    assert "waiting for backend 'default' (down 12 s)" in _line(p)
    assert "waiting" not in _line(replace(p, waiting={}))


def test_retry_failed_into_parquet_keeps_one_row_each(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"custom_id": c, "prompt": c}) + "\n" for c in "abcde"))
    out = tmp_path / "out.parquet"

    def refuse(*prompts: str) -> FunctionLLM:
        def answer(request: LLMRequest, hints: Hints) -> str:
            if request.messages[-1].content in prompts:
                raise BackendRequestError("refused", status=400)
            return "re: " + request.messages[-1].content

        return FunctionLLM(answer)

    def run(llm: FunctionLLM, **kw: Any) -> Any:
        job = BatchJob(read_rows(str(src)), ParquetSink(str(out), row_group=2), **kw)
        clock = VirtualClock()
        return clock.run(run_batch(job, backends={"default": llm}, clock=clock))

    first = run(refuse("b", "d"))
    assert first.failed == 2
    llm = refuse()
    again = run(llm, retry_failed=True)
    assert sorted(c.request.messages[-1].content for c in llm.calls) == ["b", "d"]
    assert again.retried == 2 and again.ok == 2 and again.skipped == 3 and again.all_ok
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["custom_id"] for r in rows) == list("abcde")
    assert {r["status"] for r in rows} == {"ok"}


def test_a_circuit_says_how_long_its_backend_has_been_down() -> None:
    cb = CircuitBreaker(failures=2, cooldown_s=10.0, wait_s=60.0)
    cb.failed(3.0)
    assert cb.down_for(4.0) is None  # closed: not down yet
    cb.failed(5.0)
    assert cb.down_for(9.0) == 6.0  # since the first failure of the run that opened it
    assert cb.acquire(15.0) is None  # the probe
    cb.failed(15.0)
    assert cb.down_for(20.0) == 17.0
    cb.succeeded()
    assert cb.down_for(21.0) is None
