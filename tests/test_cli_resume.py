"""`plait run --store` and `plait resume`: a run killed mid-way (a real os._exit, in a
subprocess) goes on from the store, keeping what had finished; bad input is one line."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli._cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "durable_pipeline.py"
PLAIT = [sys.executable, "-c", "from orchestrator.cli._cli import main; raise SystemExit(main())"]


def plait(*args: str, crash: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CRASH", "PLAIT_STORE")}
    if crash:
        env["CRASH"] = "1"
    return subprocess.run(
        [*PLAIT, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_a_killed_run_is_resumed_from_the_store(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.db")
    killed = plait("run", str(EXAMPLE), "--store", store, crash=True)
    assert killed.returncode == 137, killed.stderr
    assert "killing the process now" in killed.stdout

    dry = plait("resume", str(EXAMPLE), "--store", store, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    # The summaries' LLM results were committed before the checkpoint that crashed
    # started (an LLM result is durable before anything uses it): only the brief is left.
    assert "keeps 7 finished task(s)" in dry.stdout
    assert "would run again 1 that had started (checkpoint) and 1 that had not" in dry.stdout
    assert "at most 1 LLM call(s)" in dry.stdout

    done = plait("resume", str(EXAMPLE), "--store", store)
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout
    assert " 9/9 " in done.stdout  # every task of the run, those kept included
    again = plait("resume", str(EXAMPLE), "--store", store)
    assert again.returncode == 0
    assert "nothing to resume" in again.stdout


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue(), capsys.readouterr().err


def test_resume_without_a_store_says_how_to_name_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLAIT_STORE", raising=False)
    code, _, err = run_main(["resume", str(EXAMPLE)], capsys)
    assert code == 2
    assert err.strip() == "plait: error: plait resume needs --store PATH_OR_URL (or $PLAIT_STORE)"


def test_a_bad_decision_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_main(
        ["resume", str(EXAMPLE), "--store", str(tmp_path / "x.db"), "--decide", "wf/t=maybe"],
        capsys,
    )
    assert code == 2
    assert "write RUN/TASK=rerun or RUN/TASK=fail" in err


def test_a_file_that_is_not_a_store_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("these are not the runs you are looking for\n" * 100)
    code, _, err = run_main(["resume", str(EXAMPLE), "--store", str(junk)], capsys)
    assert code == 1
    assert err.count("\n") == 1 and "is not a SQLite database" in err
    assert junk.read_text().startswith("these are not")  # nothing was written over it


def test_an_empty_store_has_nothing_to_resume(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_main(
        ["resume", str(EXAMPLE), "--store", str(tmp_path / "new.db"), "--dry-run"], capsys
    )
    assert code == 0
    assert "nothing to resume" in out


def test_a_store_on_the_virtual_clock_is_refused_with_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    module = ROOT / "examples" / "writer_critic.py"  # CLOCK = "virtual"
    store = tmp_path / "runs.db"
    code, _, err = run_main(["run", str(module), "--store", str(store)], capsys)
    assert code == 2
    assert "--store needs the system clock" in err and "add --clock system" in err
    assert not store.exists()  # refused before anything was opened


NESTED = """
from orchestrator import Workflow


def make() -> Workflow:
    wf = Workflow("nested")

    def step() -> str:
        return "made inside make()"

    wf.add("step", step)
    return wf


def workflows() -> list[Workflow]:
    return [make()]
"""


def test_run_with_a_store_refuses_a_function_defined_inside_a_function(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    module = tmp_path / "nested.py"
    module.write_text(NESTED)
    store = tmp_path / "runs.db"
    code, out, err = run_main(["run", str(module), "--store", str(store)], capsys)
    assert code == 2, out
    assert err.count("\n") == 1
    assert "task 'step' of workflow 'nested' could not be resumed from --store" in err
    assert "make.<locals>.step was defined inside a function" in err
    assert f"define it at the top level of {module}" in err
    assert not store.exists()  # refused before anything ran
    # Without a store nothing needs to be found again: it runs.
    assert run_main(["run", str(module)], capsys)[0] == 0


def test_the_research_team_example_runs_and_resumes_from_its_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The flagship example follows the rule: a run cut short while its writer was at work
    is rebuilt from the store, keeps what had finished and sends only the writer's call."""
    from executors import FunctionLLM
    from orchestrator import Engine, LLMRequest
    from orchestrator.cli._cli import check_resumable, load_module, open_store, registry_of

    path = str(ROOT / "examples" / "research_team.py")
    team = load_module(path)
    check_resumable(team.workflows(), registry_of(team), path)  # what `run --store` checks
    store_path = str(tmp_path / "runs.db")

    async def first_life() -> str:
        writing = asyncio.Event()

        async def reply(request: LLMRequest, hints: Any) -> str:
            if request.messages[0].content.startswith("You write"):
                writing.set()
                await asyncio.Event().wait()  # the process dies while the writer works
            return str(team.fake_reply(request, hints))

        async with (
            open_store(store_path) as store,
            Engine(backends={"default": FunctionLLM(reply)}, store=store) as engine,
        ):
            handle = engine.submit(team.research(team.QUESTIONS[0]))
            await writing.wait()
            assert engine.journal is not None
            await engine.journal.durable()  # the writer's task_started is in the store
        return handle.id

    run_id = asyncio.run(first_life())
    code, out, err = run_main(["resume", path, "--store", store_path, "--dry-run"], capsys)
    assert code == 0, err
    assert "would run again 1 that had started (write) and 0 that had not" in out

    async def second_life() -> tuple[Any, int]:
        llm = FunctionLLM(team.fake_reply)
        async with (
            open_store(store_path) as store,
            Engine(backends={"default": llm}, store=store) as engine,
        ):
            report = await engine.resume(registry_of(team))
            assert [h.id for h in report.runs] == [run_id]
            return await report.runs[0], len(llm.calls)

    result, calls = asyncio.run(second_life())
    assert result.ok
    assert calls == 1  # the writer's; the planner's and the researchers' were kept
    for topic in result["spawn"]:
        assert f"Notes on {topic}" in result["write"]
