"""Batch mode against the inputs a review found mishandled: another job's output, a changed
input, colliding custom_ids, sampled duplicates, bad field types, and a resumed run's exit
status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.batch import read_rows
from orchestrator.cli._cli import main

HERE = Path(__file__).resolve().parent
BACKEND = f"{HERE / 'batch_support.py'}:backends"


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def batch(*args: str) -> int:
    return main(["batch", "run", *args, "--backend", BACKEND, "--progress", "none"])


def out_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(autouse=True)
def _no_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_LATENCY", "0")


def test_a_changed_input_does_not_take_the_old_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.jsonl"
    first = write(
        tmp_path / "a.jsonl", [{"custom_id": f"r{i}", "prompt": f"old {i}"} for i in range(3)]
    )
    assert batch("--input", str(first), "--output", str(out)) == 0
    second = write(
        tmp_path / "b.jsonl", [{"custom_id": f"r{i}", "prompt": f"new {i}"} for i in range(3)]
    )
    # the old output is still there: refused, nothing run, nothing written
    before = out.read_text()
    assert batch("--input", str(second), "--output", str(out)) == 2
    assert "holds rows of another batch" in capsys.readouterr().err
    assert out.read_text() == before
    out.unlink()  # started again: the new prompts are asked, not the store's old answers
    assert batch("--input", str(second), "--output", str(out)) == 0
    answers = {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"]
               for r in out_lines(out)}  # fmt: skip
    assert answers == {f"r{i}": f"answer to new {i}" for i in range(3)}


def test_a_file_that_is_not_an_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "in.jsonl", [{"custom_id": "a", "prompt": "hi"}])
    precious = write(tmp_path / "precious.jsonl", [{"custom_id": "a", "data": 1}])
    assert batch("--input", str(src), "--output", str(precious)) == 2
    assert "is not a line plait batch writes" in capsys.readouterr().err
    assert out_lines(precious) == [{"custom_id": "a", "data": 1}]
    assert batch("--input", str(src), "--output", str(src)) == 2
    assert "is the input" in capsys.readouterr().err


def test_colliding_custom_ids_stay_unique_and_a_resume_keeps_every_row(tmp_path: Path) -> None:
    rows = [{"custom_id": "row-1", "prompt": "p0"}, {"prompt": "p1"},
            {"custom_id": "a", "prompt": "p2"}, {"custom_id": "a", "prompt": "p3"},
            {"custom_id": "a#3", "prompt": "p4"}, {"custom_id": "b"},
            {"custom_id": "b", "prompt": "p6"}]  # fmt: skip
    src = write(tmp_path / "in.jsonl", rows)
    ids = [r.custom_id for r in read_rows(str(src))]
    assert len(set(ids)) == len(ids)
    out = tmp_path / "out.jsonl"
    assert batch("--input", str(src), "--output", str(out)) == 1  # the repeats fail
    first = out_lines(out)
    out.write_text(json.dumps(first[0]) + "\n")  # a kill after one line
    assert batch("--input", str(src), "--output", str(out)) == 1
    again = out_lines(out)
    assert sorted(r["custom_id"] for r in again) == sorted(ids)
    ok = {r["custom_id"] for r in again if r["error"] is None}
    assert {"row-1", "a", "a#3"} <= ok  # the first of each id is answered


def test_sampled_duplicates_are_each_asked_and_no_dedup_asks_every_row(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    sampled = [{"custom_id": f"s{i}", "prompt": "same", "temperature": 1.0} for i in range(3)]
    greedy = [{"custom_id": f"g{i}", "prompt": "greedy"} for i in range(3)]
    src = write(tmp_path / "in.jsonl", sampled + greedy)
    import os

    os.environ["BATCH_CALL_LOG"] = str(log)
    try:
        assert batch("--input", str(src), "--output", str(tmp_path / "o1.jsonl")) == 0
        sent = log.read_text().splitlines()
        assert sent.count("same") == 3 and sent.count("greedy") == 1
        log.unlink()
        assert batch("--input", str(src), "--output", str(tmp_path / "o2.jsonl"), "--no-dedup") == 0
        sent = log.read_text().splitlines()
        assert sent.count("same") == 3 and sent.count("greedy") == 3
    finally:
        del os.environ["BATCH_CALL_LOG"]


def test_bad_field_types_fail_their_row_only(tmp_path: Path) -> None:
    rows = ['{"custom_id": "a", "prompt": "hi", "stop": 5}',
            '{"custom_id": "b", "prompt": "hi", "max_tokens": 1e999}',
            '{"custom_id": "c", "prompt": "hi", "temperature": "nan"}',
            {"custom_id": "d", "prompt": "fine"}]  # fmt: skip
    src = write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert batch("--input", str(src), "--output", str(out)) == 1
    errors = {r["custom_id"]: r["error"] for r in out_lines(out)}
    assert errors["d"] is None
    assert "stop" in errors["a"]["message"] and "max_tokens" in errors["b"]["message"]
    assert "temperature" in errors["c"]["message"]


def test_a_csv_with_large_cells_and_ragged_rows_is_read(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_text("custom_id,prompt\nbig," + "x" * 200_000 + "\nragged,hi,extra\n")
    rows = read_rows(str(src))
    assert rows[0].error is None and len(rows[0].request.messages[-1].content) == 200_000  # type: ignore[union-attr]


def test_a_json_array_file_is_read_as_rows_and_an_async_factory_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in.json"
    src.write_text(' [{"custom_id": "a", "prompt": "hi"}, {"custom_id": "b", "prompt": "yo"}, 3]')
    rows = read_rows(str(src))
    assert [r.custom_id for r in rows][:2] == ["a", "b"] and rows[2].error is not None
    factory = tmp_path / "flows.py"
    factory.write_text("async def per_row(row):\n    return None\n")
    code = batch("--input", str(src), "--output", str(tmp_path / "o.jsonl"),
                 "--workflow", f"{factory}:per_row")  # fmt: skip
    assert code == 2 and "is async" in capsys.readouterr().err
