"""The benchmarks' command lines fail in one line when a baseline is not installed."""

from __future__ import annotations

import sys

import pytest
from _langgraph_durable import main as langgraph_durable_main
from overhead import main


@pytest.mark.parametrize("runner", ["langgraph", "ray"])
def test_overhead_without_the_bench_extra_is_one_line(
    runner: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, runner, None)  # `import runner` now raises ImportError
    with pytest.raises(SystemExit) as exit_:
        main(["--only", f"plait,{runner}", "--quick"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"overhead.py: error: {runner} not installed; run `make bench`")
    assert err.count("\n") == 1


def test_langgraph_durable_without_the_saver_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.sqlite", None)
    with pytest.raises(SystemExit) as exit_:
        langgraph_durable_main(["--quick"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("_langgraph_durable.py: error: langgraph-checkpoint-sqlite not installed")
    assert err.count("\n") == 1
