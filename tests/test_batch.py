"""Batch mode in-process: formats, output, planning, deduplication (orchestrator.batch)."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path
from typing import Any

import pytest

from agents import Agent
from executors import FunctionLLM
from orchestrator import Hints, LLMRequest, UsageError, VirtualClock, Workflow
from orchestrator.batch import (
    BatchJob,
    Coalescing,
    JsonlSink,
    ParquetSink,
    plan,
    read_rows,
    run_batch,
    sink_for,
)

SYSTEM = "You are an analyst. " * 10


def reply(request: LLMRequest, hints: Hints) -> str:
    return "re: " + request.messages[-1].content


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def run(job: BatchJob, llm: FunctionLLM, **kw: Any) -> Any:
    clock = VirtualClock()
    return clock.run(run_batch(job, backends={"default": llm}, clock=clock, **kw))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_rows_give_openai_batch_output(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"custom_id": "a", "prompt": "one", "system": SYSTEM, "max_tokens": 50},
            {"id": "b", "messages": [{"role": "user", "content": "two"}]},
            {"prompt": "three", "model": "m2"},
        ],
    )
    out = tmp_path / "out.jsonl"
    summary = run(BatchJob(read_rows(str(src)), sink_for(str(out))), FunctionLLM(reply))
    got = {r["custom_id"]: r for r in lines(out)}
    assert set(got) == {"a", "b", "row-2"}
    body = got["a"]["response"]["body"]
    assert got["a"]["error"] is None and got["a"]["response"]["status_code"] == 200
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "re: one"}
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    assert got["row-2"]["response"]["body"]["model"] == "m2"
    assert summary.ok == 3 and summary.failed == 0
    assert summary.prompt_tokens == sum(
        r["response"]["body"]["usage"]["prompt_tokens"] for r in got.values()
    )


def test_csv_input_and_messages_as_json_text(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    with src.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["custom_id", "prompt", "messages", "max_tokens"])
        w.writerow(["x", "hello", "", "20"])
        w.writerow(["y", "", json.dumps([{"role": "user", "content": "hi"}]), ""])
        w.writerow(["z", "bad", "", "many"])
    out = tmp_path / "out.jsonl"
    run(BatchJob(read_rows(str(src)), sink_for(str(out))), FunctionLLM(reply))
    got = {r["custom_id"]: r for r in lines(out)}
    assert got["x"]["response"]["body"]["choices"][0]["message"]["content"] == "re: hello"
    assert got["y"]["response"]["body"]["choices"][0]["message"]["content"] == "re: hi"
    assert got["z"]["response"] is None
    assert got["z"]["error"]["code"] == "invalid_row"
    assert "max_tokens must be a whole number" in got["z"]["error"]["message"]


def test_openai_batch_format_is_detected(tmp_path: Path) -> None:
    def line(cid: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": cid, "method": "POST", "url": url, "body": body}

    chat = {"model": "gpt", "messages": [{"role": "user", "content": "q"}], "max_tokens": 9}
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [
            line("c", "/v1/chat/completions", chat),
            line("t", "/v1/completions", {"model": "gpt", "prompt": "complete me"}),
            line("e", "/v1/embeddings", {"input": "x"}),
        ],
    )
    out = tmp_path / "out.jsonl"
    llm = FunctionLLM(reply)
    run(BatchJob(read_rows(str(src)), sink_for(str(out))), llm)
    got = {r["custom_id"]: r for r in lines(out)}
    assert got["c"]["response"]["body"]["choices"][0]["message"]["content"] == "re: q"
    assert llm.calls[0].request.max_tokens == 9 or llm.calls[1].request.max_tokens == 9
    assert got["t"]["response"]["body"]["object"] == "text_completion"
    assert got["t"]["response"]["body"]["choices"][0]["text"] == "re: complete me"
    assert got["e"]["error"]["code"] == "unsupported_url"
    assert "'/v1/embeddings'" in got["e"]["error"]["message"]
    assert "/v1/chat/completions" in got["e"]["error"]["message"]


def test_openai_file_of_only_unsupported_urls_is_refused(tmp_path: Path) -> None:
    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {}}],
    )
    with pytest.raises(UsageError, match=r"'/v1/embeddings' is not supported.*chat/completions"):
        read_rows(str(src))


def test_parquet_in_and_out(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"custom_id": f"p{i}", "prompt": f"n{i}"} for i in range(5)]), src
    )
    out = tmp_path / "out.parquet"
    sink = ParquetSink(str(out), row_group=2)
    run(BatchJob(read_rows(str(src)), sink), FunctionLLM(reply))
    table = pq.read_table(out)
    assert table.column_names == [
        "custom_id", "status", "output", "prompt_tokens", "completion_tokens",
        "cached_tokens", "error",
    ]  # fmt: skip
    rows = {r["custom_id"]: r for r in table.to_pylist()}
    assert rows["p3"]["output"] == "re: n3" and rows["p3"]["status"] == "ok"
    assert pq.ParquetFile(out).num_row_groups == 3  # groups of 2 as they filled
    assert not sink.journal.exists()  # closed properly: the journal is gone


def test_output_is_written_as_rows_finish(tmp_path: Path) -> None:
    """Each row is on disk before the next one is answered."""
    out = tmp_path / "out.jsonl"
    seen: list[int] = []

    def answer(request: LLMRequest, hints: Hints) -> str:
        seen.append(len(out.read_text().splitlines()) if out.exists() else 0)
        return "ok"

    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(4)])
    job = BatchJob(read_rows(str(src)), JsonlSink(str(out)), max_running=1)
    run(job, FunctionLLM(answer, latency=1.0))
    assert seen == [0, 1, 2, 3]


def test_identical_calls_are_computed_once(tmp_path: Path) -> None:
    rows = [{"custom_id": f"r{i}", "prompt": "same", "system": SYSTEM} for i in range(4)]
    rows.append({"custom_id": "other", "prompt": "different"})
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    llm = FunctionLLM(reply, latency=1.0)
    job = BatchJob(read_rows(str(src)), sink_for(str(out)))
    assert job.plan.duplicates == 3
    summary = run(job, llm)
    assert len(llm.calls) == 2
    got = {r["custom_id"]: r for r in lines(out)}
    assert len(got) == 5
    texts = {got[f"r{i}"]["response"]["body"]["choices"][0]["message"]["content"] for i in range(4)}
    assert texts == {"re: same"}
    assert summary.deduplicated == 3


def test_coalescing_backend_dedups_inside_per_row_workflows() -> None:
    """Per-row workflows that make the same call: the wrapper sends it once."""
    clock = VirtualClock()
    llm = FunctionLLM(reply, latency=1.0, clock=clock)
    backend = Coalescing(llm)
    request = LLMRequest((), "m")

    async def main() -> list[str]:
        from orchestrator import Message

        req = LLMRequest((Message("user", "shared step"),), "m")
        answers = await asyncio.gather(*(backend.complete(req, Hints("p")) for _ in range(5)))
        again = await backend.complete(req, Hints("p"))
        return [a.text for a in [*answers, again]]

    texts = clock.run(main())
    assert texts == ["re: shared step"] * 6
    assert len(llm.calls) == 1
    assert backend.stats().coalesced == 5
    assert request.model == "m"


def test_plan_puts_sharers_side_by_side(tmp_path: Path) -> None:
    docs = [f"document {d} " * 40 for d in range(3)]
    # Question-major, as a table usually is: doc 0, 1, 2, then again.
    rows = [{"custom_id": f"q{q}d{d}", "prompt": f"{docs[d]} question {q}"} for q in range(3)
            for d in range(3)]  # fmt: skip
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    read = read_rows(str(src))
    p = plan(read)
    order = [read[i].custom_id for i in p.order]
    for d in range(3):
        positions = [order.index(f"q{q}d{d}") for q in range(3)]
        assert max(positions) - min(positions) == 2  # the document's rows are adjacent
    assert p.groups == 3 and p.largest_group == 3
    assert p.shared_prefix_tokens >= 6 * 100  # each document computed once, shared twice
    assert p.bound_prompt_tokens == p.prompt_tokens - p.shared_prefix_tokens


def test_rows_run_in_plan_order(tmp_path: Path) -> None:
    rows = [{"custom_id": f"{q}{d}", "prompt": f"doc{d} " * 50 + f"q{q}"} for q in "ab"
            for d in range(3)]  # fmt: skip
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    llm = FunctionLLM(reply, latency=1.0)
    run(BatchJob(read_rows(str(src)), sink_for(str(tmp_path / "o.jsonl")), max_running=1), llm)
    sent = [c.request.messages[-1].content.split()[0] for c in llm.calls]
    assert sent == ["doc0", "doc0", "doc1", "doc1", "doc2", "doc2"]


def test_workflow_factory_rows_and_a_factory_that_raises(tmp_path: Path) -> None:
    import batch_support

    src = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": 1, "question": "why"}, {"id": 2, "question": "boom"}, {"id": 3, "question": "how"}],
    )
    out = tmp_path / "out.jsonl"
    job = BatchJob(
        read_rows(str(src), llm_rows=False), sink_for(str(out)), factory=batch_support.per_row
    )
    summary = run(job, FunctionLLM(reply))
    got = {r["custom_id"]: r for r in lines(out)}
    assert got["1"]["response"]["body"]["outputs"] == {"shout": "RE: Q: WHY"}
    assert got["1"]["response"]["body"]["usage"]["prompt_tokens"] > 0
    assert got["2"]["error"]["code"] == "workflow_factory_error"
    assert "ValueError: this row cannot be planned" in got["2"]["error"]["message"]
    assert got["3"]["error"] is None
    assert summary.ok == 2 and summary.failed == 1


def test_progress_snapshot_while_running(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(6)])
    job = BatchJob(read_rows(str(src)), sink_for(str(tmp_path / "o.jsonl")), max_running=2)
    snapshots = []

    async def watch(j: BatchJob) -> None:
        from orchestrator.ext import running_clock

        while True:
            await running_clock().sleep(1.0)
            snapshots.append(j.progress())

    run(job, FunctionLLM(reply, latency=1.0), watch=watch)
    assert snapshots and snapshots[0].total == 6
    assert any(s.running == 2 for s in snapshots)
    final = job.progress()
    assert final.done == 6 and final.running == 0 and final.eta_s == 0.0
    assert final.prompt_tokens > 0 and final.tokens_per_s > 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"custom_id": "a", "text": "no prompt"}], "no 'prompt' or 'messages' column"),
        ([], "has no rows"),
    ],
)
def test_bad_input_files(tmp_path: Path, content: list[Any], message: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", content)
    with pytest.raises(UsageError, match=message):
        read_rows(str(src))


def test_missing_input_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no input file at"):
        read_rows(str(tmp_path / "absent.jsonl"))
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(UsageError, match="--format"):
        read_rows(str(tmp_path / "x.txt"))


def test_unwritable_output_is_refused_before_work(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "p"}])
    llm = FunctionLLM(reply)
    job = BatchJob(read_rows(str(src)), sink_for(str(tmp_path / "no" / "out.jsonl")))
    with pytest.raises(UsageError, match="no directory"):
        run(job, llm)
    assert llm.calls == []


def test_a_row_in_the_output_is_skipped(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"custom_id": c, "prompt": c} for c in "abc"])
    out = tmp_path / "out.jsonl"
    job = BatchJob(read_rows(str(src)), sink_for(str(out)))
    done = {"id": f"batch_req_{job.job_id}_1", "custom_id": "b", "response": None,
            "error": {"code": "c", "message": "m"}}  # fmt: skip
    out.write_text(json.dumps(done) + "\n" + '{"custom_id": "c", "resp')  # last line cut
    llm = FunctionLLM(reply)
    summary = run(job, llm)
    assert sorted(r["custom_id"] for r in lines(out)) == ["a", "b", "c"]
    assert len(llm.calls) == 2 and summary.skipped == 1
    assert summary.skipped_failed == 1 and not summary.all_ok  # b failed before: still failed


def test_workflow_input_of_a_factory_gets_the_row(tmp_path: Path) -> None:
    got: list[dict[str, Any]] = []

    def factory(row: dict[str, Any]) -> Workflow:
        got.append(row)
        wf = Workflow("w")
        wf.add("a", Agent("x", "s").ask(str(row["q"])))
        return wf

    src = write_jsonl(tmp_path / "in.jsonl", [{"q": 1, "extra": "e"}])
    run(BatchJob(read_rows(str(src), llm_rows=False), sink_for(str(tmp_path / "o.jsonl")),
                 factory=factory), FunctionLLM(reply))  # fmt: skip
    assert got == [{"q": 1, "extra": "e"}]


def test_openai_body_fields_plait_does_not_read_go_to_the_server(tmp_path: Path) -> None:
    def line(custom_id: str, **body: Any) -> str:
        base = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": base}
        )

    path = tmp_path / "in.jsonl"
    lines = [line("a", ignore_eos=True, min_tokens=3), line("b", stream=True), line("c", n=2)]
    path.write_text("\n".join(lines) + "\n")
    a, b, c = read_rows(str(path))
    assert a.error is None and a.request is not None
    assert dict(a.request.extra_body) == {"ignore_eos": True, "min_tokens": 3}
    assert b.error is not None and "stream" in b.error
    assert c.error is not None and "body.n" in c.error


def test_a_jobs_rows_carry_its_tenants_cache_salt_and_none_without_one(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    salts: dict[str | None, set[str | None]] = {}
    for tenant in ("acme", None):
        llm = FunctionLLM(reply)
        out = tmp_path / f"out-{tenant}.jsonl"
        run(BatchJob(read_rows(str(src)), sink_for(str(out)), tenant=tenant), llm)
        salts[tenant] = {call.hints.cache_salt for call in llm.calls}
    (salt,) = salts["acme"]  # one salt, the tenant's, on each of its rows
    assert salt is not None and "acme" not in salt
    assert salts[None] == {None}  # `plait batch run`: no tenant, no salt, shared as before
