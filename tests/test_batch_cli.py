"""`plait batch run` as a user runs it: errors, and a batch killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.cli._cli import main

HERE = Path(__file__).resolve().parent
BACKEND = f"{HERE / 'batch_support.py'}:backends"


def write_rows(path: Path, n: int) -> Path:
    shared = "Instructions shared by every row. " * 8
    rows = [{"custom_id": f"r{i}", "system": shared, "prompt": f"row {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def plait(*args: str) -> int:
    return main(["batch", "run", *args])


def test_missing_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = plait("--input", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "o.jsonl"))
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [f"plait: error: no input file at '{tmp_path}/none.jsonl'"]


def test_missing_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.csv"
    src.write_text("custom_id,text\na,hello\n")
    code = plait("--input", str(src), "--output", str(tmp_path / "o.jsonl"))
    err = capsys.readouterr().err
    assert code == 2 and "no 'prompt' or 'messages' column (columns: custom_id, text)" in err
    assert "Traceback" not in err


def test_unwritable_output_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_rows(tmp_path / "in.jsonl", 2)
    log = tmp_path / "calls.log"
    os.environ["BATCH_CALL_LOG"] = str(log)
    try:
        code = plait("--input", str(src), "--output", str(tmp_path), "--backend", BACKEND)
    finally:
        del os.environ["BATCH_CALL_LOG"]
    err = capsys.readouterr().err
    assert code == 2 and "is a directory" in err
    assert not log.exists()


def test_openai_file_with_only_unsupported_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/responses", "body": {}}
    src.write_text(json.dumps(line) + "\n")
    code = plait("--input", str(src), "--output", str(tmp_path / "o.jsonl"))
    err = capsys.readouterr().err
    assert code == 2 and "url '/v1/responses' is not supported" in err


def test_malformed_row_and_factory_errors_fail_their_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "question": "a"}\n{broken\n{"id": 2, "question": "boom"}\n')
    out = tmp_path / "o.jsonl"
    summary = tmp_path / "s.json"
    code = plait(
        "--input", str(src), "--output", str(out), "--backend", BACKEND,
        "--workflow", f"{HERE / 'batch_support.py'}:per_row", "--summary-json", str(summary),
    )  # fmt: skip
    assert code == 1
    got = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert got["1"]["error"] is None
    assert got["row-1"]["error"]["code"] == "invalid_row"
    assert got["2"]["error"]["code"] == "workflow_factory_error"
    figures = json.loads(summary.read_text())
    assert figures["ok"] == 1 and figures["failed"] == 2 and len(figures["errors"]) == 2
    assert "rows: 3 (1 ok, 2 failed" in capsys.readouterr().out


def test_default_backend_is_the_simulator(tmp_path: Path) -> None:
    src = write_rows(tmp_path / "in.jsonl", 3)
    out = tmp_path / "o.jsonl"
    assert plait("--input", str(src), "--output", str(out), "--progress", "none") == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    assert all("Llama" in r["response"]["body"]["model"] for r in records)
    assert (tmp_path / "o.jsonl.plait.db").exists()


@pytest.mark.slow
def test_killed_batch_resumes_without_repeating_rows_or_calls(tmp_path: Path) -> None:
    n, kill_after = 60, 12
    src = write_rows(tmp_path / "in.jsonl", n)
    out = tmp_path / "out.jsonl"
    log = tmp_path / "calls.log"
    command = [
        sys.executable, "-c", "from orchestrator.cli._cli import main; raise SystemExit(main())",
        "batch", "run", "--input", str(src),
        "--output", str(out), "--backend", BACKEND, "--max-running", "4", "--progress", "none",
    ]  # fmt: skip
    env = {**os.environ, "BATCH_CALL_LOG": str(log), "BATCH_LATENCY": "0.05"}
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    try:
        # Wait on the output file itself: the kill comes once `kill_after` rows are written.
        deadline = time.monotonic() + 60
        while _rows_written(out) < kill_after:
            assert first.poll() is None, "the batch ended before it was killed"
            assert time.monotonic() < deadline, "the batch wrote too few rows"
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait()
    before = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()
              if line.endswith("}")]  # fmt: skip
    assert kill_after <= len(before) < n
    calls_before = log.read_text().splitlines()
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = Counter(r["custom_id"] for r in records)
    assert set(ids) == {f"r{i}" for i in range(n)} and set(ids.values()) == {1}
    assert all(r["error"] is None for r in records)
    calls_after = log.read_text().splitlines()[len(calls_before) :]
    # No row written before the kill was asked again; every other row at most once more.
    assert not {f"row {r[1:]}" for r in before} & set(calls_after)
    assert set(Counter(calls_after).values()) <= {1}
    assert len(calls_before) + len(calls_after) <= n + 4  # at most the in-flight were repeated
    assert "written from the store" in second.stdout


def _rows_written(path: Path) -> int:
    if not path.exists():
        return 0
    return path.read_bytes().count(b"\n")


@pytest.mark.parametrize(
    ("table", "wanted"),
    [
        ('[engine]\nadmission = "throughput"\n', None),
        ('[engine]\nadmission = "off"\n', None),
        ("", "default"),
    ],
)
def test_the_batch_engines_admission_comes_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table: str, wanted: str | None
) -> None:
    """`plait batch run --config` builds its engine with the file's admission mode (the
    deadline gate on under the default, off otherwise), as `plait run` and `plait serve` do."""
    from orchestrator.admission._gate import DEFAULT_GATE
    from orchestrator.batch import _cli as batch_cli

    settings = {"default": DEFAULT_GATE}
    real = batch_cli.run_batch
    seen: list[object] = []

    async def recording(job, **kw):  # type: ignore[no-untyped-def]
        async def watch(job) -> None:  # type: ignore[no-untyped-def]
            assert job.engine is not None
            seen.append(
                None if job.engine.urgency.gate is None else job.engine.urgency.gate.settings
            )

        return await real(job, **{**kw, "watch": watch})

    monkeypatch.setattr(batch_cli, "run_batch", recording)
    config = tmp_path / "plait.toml"
    config.write_text(table + '[backends.default]\nkind = "sim"\n')
    src = write_rows(tmp_path / "in.jsonl", 3)
    out = tmp_path / "out.jsonl"
    code = plait("--input", str(src), "--output", str(out), "--config", str(config))
    assert code == 0 and len(out.read_text().splitlines()) == 3
    assert seen == [None if wanted is None else settings[wanted]]


def test_retry_failed_runs_only_the_failed_rows_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 12
    src = write_rows(tmp_path / "in.jsonl", n)
    out = tmp_path / "out.jsonl"
    log = tmp_path / "calls.log"
    command = ["--input", str(src), "--output", str(out), "--backend", BACKEND]
    command += ["--progress", "none"]
    monkeypatch.setenv("BATCH_CALL_LOG", str(log))
    monkeypatch.setenv("BATCH_REFUSE", "row 3,row 7,row 8")
    assert plait(*command) == 1  # three rows failed for good (a 400 is not retried)
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in first if r["error"]) == ["r3", "r7", "r8"]
    assert "--retry-failed" in capsys.readouterr().out  # the way on is said
    calls = len(log.read_text().splitlines())
    assert calls == n

    # The same command again runs nothing: the failed rows are in the output.
    assert plait(*command) == 1
    assert len(log.read_text().splitlines()) == calls

    # The server takes them now: --retry-failed sends exactly the three failed rows again.
    monkeypatch.setenv("BATCH_REFUSE", "")
    capsys.readouterr()
    assert plait(*command, "--retry-failed") == 0
    again = log.read_text().splitlines()[calls:]
    assert sorted(again) == ["row 3", "row 7", "row 8"]
    assert "3 failed before and run again" in capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = Counter(r["custom_id"] for r in records)
    assert set(ids) == {f"r{i}" for i in range(n)} and set(ids.values()) == {1}
    assert all(r["error"] is None for r in records)
    # The rows that had succeeded are the very lines of the first run.
    kept = {r["custom_id"]: r for r in first if not r["error"]}
    assert all(r == kept[r["custom_id"]] for r in records if r["custom_id"] in kept)


def test_rows_with_text_no_store_keeps_fail_alone(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    rows = [
        '{"custom_id": "ok", "prompt": "fine"}',
        '{"custom_id": "sur", "prompt": "lone \\udcff"}',
        '{"custom_id": "nul", "messages": [{"role": "user", "content": "a \\u0000 b"}]}',
        '{"custom_id": "id \\ud800", "prompt": "fine too"}',
    ]
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    command = ["--input", str(src), "--output", str(out), "--backend", BACKEND]
    assert plait(*command, "--progress", "none") == 1
    records = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records["ok"]["error"] is None
    assert records["sur"]["error"]["code"] == "invalid_text"
    assert "lone surrogate" in records["sur"]["error"]["message"]
    assert "prompt" in records["sur"]["error"]["message"]
    assert "NUL" in records["nul"]["error"]["message"]
    assert "messages[0].content" in records["nul"]["error"]["message"]
    assert records["id \\ud800"]["error"]["code"] == "invalid_text"  # its id, escaped


def test_a_damaged_stored_run_costs_its_row_a_new_run_not_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    src = write_rows(tmp_path / "in.jsonl", 3)
    out = tmp_path / "out.jsonl"
    log = tmp_path / "calls.log"
    monkeypatch.setenv("BATCH_CALL_LOG", str(log))
    command = ["--input", str(src), "--output", str(out), "--backend", BACKEND]
    assert plait(*command, "--progress", "none") == 0
    with sqlite3.connect(tmp_path / "out.jsonl.plait.db") as db:
        (run_id,) = db.execute(
            'SELECT id FROM plait_workflows WHERE labels LIKE \'%"plait.batch.row": "1"%\''
        ).fetchone()
        db.execute(  # the row's first event no longer reads
            "UPDATE plait_events SET data = '{not json' WHERE workflow_id = ? AND seq = "
            "(SELECT min(seq) FROM plait_events WHERE workflow_id = ?)",
            (run_id, run_id),
        )
    out.write_text("")  # every row is written from the store again: row 1 cannot be
    calls = len(log.read_text().splitlines())
    assert plait(*command, "--progress", "none") == 0
    assert log.read_text().splitlines()[calls:] == ["row 1"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["r0", "r1", "r2"]
    assert all(r["error"] is None for r in records)
