"""docs/benchmarks.md is what bench/results/ renders; result records say where they come from."""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
from pathlib import Path

import _results
import mooncake_ceiling
import pytest
import report
from compare import compare, selected

PAGE = report.PAGE
RESULTS = report.RESULTS


def copies(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    page = tmp_path / "benchmarks.md"
    shutil.copyfile(PAGE, page)
    return results, page


def test_the_page_is_what_the_committed_results_render(capsys: pytest.CaptureFixture[str]) -> None:
    code = report.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_a_changed_figure_fails_the_check_with_a_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, page = copies(tmp_path)
    assert report.main(["--check", "--results", str(results), "--out", str(page)]) == 0
    record = json.loads((results / "demo.json").read_text())
    record["figures"]["rates"][0]["plait"]["mean_jct_s"] = 1234.5
    (results / "demo.json").write_text(json.dumps(record))

    code = report.main(["--check", "--results", str(results), "--out", str(page)])

    err = capsys.readouterr().err
    assert code == 1
    assert f"--- {page} (on disk)" in err
    assert "\n+| 0.12 | plait | 1,234.5 |" in err
    assert "is not what the results render; run `python bench/report.py`" in err
    assert page.read_text() == PAGE.read_text(), "--check writes nothing"


def test_rendering_writes_the_page_the_check_then_accepts(tmp_path: Path) -> None:
    results, page = copies(tmp_path)
    record = json.loads((results / "demo.json").read_text())
    record["figures"]["rates"][0]["plait"]["mean_jct_s"] = 1234.5
    (results / "demo.json").write_text(json.dumps(record))

    assert report.main(["--results", str(results), "--out", str(page)]) == 0
    assert "| 0.12 | plait | 1,234.5 |" in page.read_text()
    assert report.main(["--check", "--results", str(results), "--out", str(page)]) == 0


def test_a_missing_record_names_the_command_that_makes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, page = copies(tmp_path)
    (results / "deadlines-part2-seed3.json").unlink()

    code = report.main(["--check", "--results", str(results), "--out", str(page)])

    assert code == 2
    err = capsys.readouterr().err
    assert "deadlines-part2-seed3.json is missing" in err
    assert "run `python bench/deadlines.py --part 2 --seed 3`" in err


def test_a_record_without_a_figure_its_table_needs_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, page = copies(tmp_path)
    record = json.loads((results / "demo.json").read_text())
    del record["figures"]["rates"][1]["p95_jct_ratio"]
    (results / "demo.json").write_text(json.dumps(record))

    code = report.main(["--check", "--results", str(results), "--out", str(page)])

    assert code == 2
    assert "the table demo needs the figure 'p95_jct_ratio'" in capsys.readouterr().err


def test_every_record_names_its_command_commit_machine_and_date() -> None:
    for path in sorted(RESULTS.glob("*.json")):
        record = json.loads(path.read_text())
        name = _results.file_name(record["bench"], record["variant"])
        assert path.name == name, f"{path.name}: its bench and variant name {name}"
        assert record["command"].split()[0] in ("python", "make"), path.name
        assert record["date"][:4].isdigit(), path.name
        assert "figures" in record or "figures_from" in record, path.name
        if record["source"] == "run":
            assert len(record["commit"]) == 40, path.name
            assert {"cpu", "cores", "python", "load_avg"} <= record["machine"].keys(), path.name
        else:  # transcribed: the page it came from says so, and what it was measured on
            assert record["machine"]["description"], path.name


def test_a_bench_run_writes_its_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert mooncake_ceiling.main(["--results", str(tmp_path)]) == 0

    printed = json.loads(capsys.readouterr().out.splitlines()[-1])
    record = json.loads((tmp_path / "mooncake_ceiling.json").read_text())
    assert record["figures"] == printed
    assert record["command"] == f"python bench/mooncake_ceiling.py --results {tmp_path}"
    assert (record["commit"], record["dirty"]) == _results.git_commit()
    assert record["machine"]["cores"] >= 1 and record["machine"]["python"]
    assert record["machine"]["cpu"]
    when = datetime.datetime.strptime(record["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert when.year >= 2024
    assert record["source"] == "run"


def test_a_bench_called_from_python_writes_nothing_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_results, "RESULTS", tmp_path / "results")
    monkeypatch.delenv(_results.ENV, raising=False)
    assert mooncake_ceiling.main([]) == 0
    assert not (tmp_path / "results").exists()
    assert mooncake_ceiling.main(["--no-save", "--results", str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []


def test_result_files_are_named_by_the_options_that_differ_from_their_defaults() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--part", choices=("1", "2"))
    parser.add_argument("--lane", action="append", default=[])
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--plots", type=Path)
    _results.add_arguments(parser)

    def name(*argv: str) -> str:
        args = parser.parse_args(argv)
        return _results.file_name("b", _results.variant(parser, args, ignore=("plots",)))

    assert name() == "b.json"
    assert name("--seed", "0") == "b.json"
    assert name("--seed", "3", "--part", "1") == "b-part1-seed3.json"
    assert name("--no-vllm", "--quick", "--plots", "docs/img") == "b-no-vllm-quick.json"
    assert name("--lane", "2:128", "--lane", "2:-") == "b-lane2_128-lane2.json"
    assert name("--quick", "--results", "elsewhere", "--no-save") == "b-quick.json"


def test_compare_holds_each_figure_to_its_tolerance() -> None:
    base = {"interactive_attainment": 0.95, "batch_throughput_share": 0.77, "seed": 0}
    head = {"interactive_attainment": 0.94, "batch_throughput_share": 0.7801, "seed": 1}
    rows = {r["figure"]: r for r in compare("deadlines", base, head)}
    assert rows.keys() == {"interactive_attainment", "batch_throughput_share"}
    assert rows["interactive_attainment"]["ok"]  # 0.01 apart: within ±0.01
    assert not rows["batch_throughput_share"]["ok"]

    base = {"agents_full_mean_jct_ratio": 8.2, "agents_p95_jct_ratio": 3.0}
    head = {"agents_full_mean_jct_ratio": 8.2 * 1.019, "agents_p95_jct_ratio": 3.0 * 0.97}
    rows = {r["figure"]: r for r in compare("jct", base, head)}
    assert rows["agents_full_mean_jct_ratio"]["ok"] and not rows["agents_p95_jct_ratio"]["ok"]

    base = {"plait_us_per_task": 20.0, "asyncio_us_per_task": 5.0, "bytes_per_pending_task": 1000}
    head = {"plait_us_per_task": 21.2, "asyncio_us_per_task": 9.0, "bytes_per_pending_task": 1040}
    rows = {r["figure"]: r for r in compare("overhead", base, head)}
    assert not rows["plait_us_per_task"]["ok"]  # 6% more
    assert rows["bytes_per_pending_task"]["ok"]  # 4% more
    assert rows["asyncio_us_per_task"]["ok"] and rows["asyncio_us_per_task"]["info"]


def test_compare_fails_a_figure_that_one_side_lacks() -> None:
    rows = compare("batch", {"sim_speedup": 3.9}, {"sim_speedup": 3.9, "sim_naive_cache_hit": 0.3})
    assert [(r["figure"], r["ok"]) for r in rows] == [
        ("sim_speedup", True),
        ("sim_naive_cache_hit", False),
    ]


def test_compare_runs_the_named_benches_of_the_set() -> None:
    full = [b.name for b in selected(None, quick=False)]
    assert full == [
        *(f"deadlines-part1-seed{s}" for s in range(5)),
        "deadlines-quick",
        "deadlines-part2",
        "jct-quick",
        "batch",
        "overhead-quick",
    ]
    assert [b.name for b in selected("jct,batch", quick=False)] == ["jct-quick", "batch"]
    assert [b.name for b in selected("batch", quick=True)] == ["batch-quick"]
    with pytest.raises(SystemExit, match="--only nope: not in the set"):
        selected("jct,nope", quick=False)


def test_a_busy_machine_meets_time_targets_but_judges_no_miss_and_no_ratio() -> None:
    from _report_tables import met

    assert met(12.0, ok=True) == "met"
    assert met(80.0, ok=False) == "**not met**"
    assert met(12.0, ok=True, busy=True) == "met"  # the load only slowed it
    assert met(80.0, ok=False, busy=True) == "not judged (busy machine)"
    assert met(14.0, ok=True, busy=True, ratio=True) == "not judged (busy machine)"
    assert met(None, ok=False) == "not measured"


def test_make_demo_leaves_the_result_records_as_they_are() -> None:
    """`make demo` runs a bench for its printout: it must not rewrite the record the page is
    rendered from (a clone where the demo ran would then fail `report.py --check`)."""
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    benches = [line for line in recipe.splitlines() if "bench/" in line]
    assert benches, "the demo target runs no bench: update this test"
    assert all("--no-save" in line for line in benches), benches
