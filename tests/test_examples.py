"""Every example runs end to end (on the virtual clock) and does what its docstring says."""

from __future__ import annotations

import asyncio
import importlib.util
import io
from pathlib import Path
from types import ModuleType

import pytest

from orchestrator import Engine, RunResult, SystemClock, VirtualClock, Workflow
from orchestrator.cli._cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(
    module: ModuleType, workflows: list[Workflow], backends: str = "backends"
) -> tuple[list[RunResult], VirtualClock]:
    clock = VirtualClock()

    async def go() -> list[RunResult]:
        async with Engine(backends=getattr(module, backends)(clock)) as engine:
            handles = [engine.submit(wf) for wf in workflows]
            return [await h for h in handles]

    return clock.run(go()), clock


def test_research_team_planner_adds_topics_and_the_writer_uses_every_note() -> None:
    module = load("research_team")
    [result], _ = run(module, [module.research(module.QUESTIONS[0])], "fake_backends")
    assert result.ok
    topics = result["spawn"]
    assert 3 <= len(topics) <= 5
    assert {f"research:{t}" for t in topics} <= set(result.results)
    report = result["write"]
    for topic in topics:
        assert f"Notes on {topic}" in report
    assert result.llm_calls == len(topics) + 2


def test_map_reduce_summarises_every_document_then_reduces() -> None:
    module = load("map_reduce")
    documents = [f"doc {i}: value {i}" for i in range(25)]
    [result], clock = run(module, [module.map_reduce(documents)])
    assert result.ok
    assert result["reduce"] == "25 summaries combined."
    assert result["map3"] == "Summary: value 3"
    # 25 maps run side by side (the default backend admits 32 at once), then the reducer.
    assert clock.monotonic() == 1.0


def test_writer_critic_stops_on_approval() -> None:
    module = load("writer_critic")
    [result], _ = run(module, [module.writer_critic("Describe plait.")])
    decision = module.final(result.results)
    assert decision == {"round": 3, "approved": True, "draft": decision["draft"]}
    assert decision["draft"].startswith("Draft v3")


def test_writer_critic_stops_after_max_rounds_without_approval() -> None:
    module = load("writer_critic")
    [result], _ = run(module, [module.writer_critic("Describe plait.", max_rounds=2)])
    decision = module.final(result.results)
    assert decision["round"] == 2 and decision["approved"] is False
    assert "draft3" not in result.results


def test_cli_runs_the_research_team_and_prints_a_summary() -> None:
    out = io.StringIO()
    assert main(["run", str(EXAMPLES / "research_team.py")], out=out) == 0
    text = out.getvalue()
    assert "research-0 succeeded" in text
    assert "4 workflow(s), 4 succeeded" in text
    assert "calls" in text and "prompt tok" in text
    # The run was on the simulated GPU, and the researchers' shared prompt was cached.
    assert "simulated h100-llama3-8b" in text
    hits = int(
        text.split("backend 'default': simulated h100-llama3-8b: ")[1].split()[2].replace(",", "")
    )
    assert hits > 0


def test_cli_reports_a_missing_file_and_a_module_without_workflows(tmp_path: Path) -> None:
    assert main(["run", str(tmp_path / "nope.py")], out=io.StringIO()) == 2
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    assert main(["run", str(empty)], out=io.StringIO()) == 2


def test_cli_exits_nonzero_when_a_workflow_fails(tmp_path: Path) -> None:
    flow = tmp_path / "failing.py"
    flow.write_text(
        "from orchestrator import Workflow\n"
        "CLOCK = 'virtual'\n"
        "def boom():\n"
        "    raise RuntimeError('disk full')\n"
        "def workflows():\n"
        "    wf = Workflow('failing')\n"
        "    wf.add('boom', boom)\n"
        "    return wf\n"
    )
    out = io.StringIO()
    assert main(["run", str(flow)], out=out) == 1
    assert "failing/boom failed: RuntimeError: disk full" in out.getvalue()


def test_cli_shows_call_retries(tmp_path: Path) -> None:
    flow = tmp_path / "flaky.py"
    flow.write_text(
        "from agents import Agent\n"
        "from orchestrator import LLMResponse, Usage, Workflow\n"
        "from orchestrator.ext import BackendOverloadedError\n"
        "CLOCK = 'virtual'\n"
        "class Flaky:\n"
        "    def __init__(self):\n"
        "        self.calls = 0\n"
        "    async def complete(self, request, hints):\n"
        "        self.calls += 1\n"
        "        if self.calls == 1:\n"
        "            raise BackendOverloadedError('busy', status=429, retry_after=2.0)\n"
        "        return LLMResponse('fine', Usage(prompt_tokens=3, completion_tokens=1))\n"
        "def backends(clock):\n"
        "    return {'default': Flaky()}\n"
        "def workflows():\n"
        "    wf = Workflow('flaky')\n"
        "    wf.add('ask', Agent('a', 'be brief').ask('hi'))\n"
        "    return wf\n"
    )
    out = io.StringIO()
    assert main(["run", str(flow)], out=out) == 0
    text = out.getvalue()
    assert "flaky/ask: call to 'default' failed on attempt 1" in text
    assert "1 LLM call(s) retried after a backend error" in text


def test_tool_agent_reads_the_table_through_its_tools_and_answers_in_the_schema() -> None:
    module = load("tool_agent")
    results, _ = run(module, module.workflows(), "fake_backends")
    first, second = (r["finding"] for r in results)
    assert isinstance(first, module.Finding) and isinstance(second, module.Finding)
    quarter = {r: sum(module.SALES[r][m] for m in ("jan", "feb", "mar")) for r in module.REGIONS}
    best = max(quarter, key=lambda r: quarter[r])
    assert (first.region, first.total) == (best, round(quarter[best], 1))
    west = sum(module.SALES["west"][m] for m in ("apr", "may", "jun"))
    assert (second.region, second.total) == ("west", round(west, 1))
    # Turn 1 lists the regions; turn 2 reads all four at once (four parallel tool tasks).
    assert sum(1 for t in results[0].results if ".monthly_sales" in t) == 4


def test_tool_agent_runs_on_the_simulated_server_with_plait_run() -> None:
    out = io.StringIO()
    assert main(["run", str(EXAMPLES / "tool_agent.py")], out=out) == 0
    assert "2 workflow(s), 2 succeeded" in out.getvalue()


def test_data_discovery_awards_each_question_to_the_partition_that_holds_it() -> None:
    module = load("data_discovery")
    clock = VirtualClock()

    async def go() -> RunResult:
        async with module.lifespan(), Engine(backends=module.fake_backends(clock)) as engine:
            return await engine.run(module.workflows())

    result = clock.run(go())
    assert result.ok, result.failures
    answers = result["coordinate"]
    assert [answers[q]["by"] for q in module.QUESTIONS] == [
        "sales",
        "logistics",
        "people",
        "search",  # no partition holds suppliers: the search agent's low bid wins
    ]
    assert answers[module.QUESTIONS[0]]["summary"] == "Join orders and refunds on id."
    # Each award ran as a task of the coordinator's workflow.
    assert sum(1 for task in result.results if task.startswith("board/")) == 4


def test_data_discovery_runs_with_plait_run() -> None:
    out = io.StringIO()
    assert main(["run", str(EXAMPLES / "data_discovery.py")], out=out) == 0
    assert "1 workflow(s), 1 succeeded" in out.getvalue()


def test_team_memory_reuses_approved_work_in_its_second_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_MEMORY", str(tmp_path / "memory.db"))
    module = load("team_memory")

    async def once() -> RunResult:
        clock = SystemClock()  # memory is real I/O; the fake model answers at once
        backends = module.fake_backends(clock, latency=0.0)
        async with module.lifespan(), Engine(backends=backends, clock=clock) as engine:
            return await engine.run(module.workflows())

    first = asyncio.run(once())
    assert first.ok, first.failures
    assert first["dispatch"] == {
        "list the policies": "worked",
        "compare them": "worked",
        "recommend one": "worked",
    }
    assert first.llm_calls == 1 + 3 * 2  # the plan, then work and review per step

    second = asyncio.run(once())
    assert second.ok, second.failures
    # The critic approved two steps in the first run: remembered, not paid for again. It
    # sent "compare them" back, so that one is worked again.
    assert second["dispatch"] == {
        "list the policies": "memory",
        "compare them": "worked",
        "recommend one": "memory",
    }
    assert second.llm_calls == 1 + 2
    assert "Done: list the policies." in second["report"]


def test_team_memory_runs_twice_with_plait_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_MEMORY", str(tmp_path / "memory.db"))
    calls = []
    for _ in range(2):
        out = io.StringIO()
        assert main(["run", str(EXAMPLES / "team_memory.py")], out=out) == 0
        row = next(line for line in out.getvalue().splitlines() if line.startswith("team-memory "))
        calls.append(int(row.split()[6]))
    assert calls[1] < calls[0]
