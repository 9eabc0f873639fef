"""Events rebuild a run: what each task runs, its edges as they changed, its states and
results, from the event log alone (`rebuild`), checked against a golden log kept as a file.

Every task here is async (no worker thread, whose wall time the virtual clock would follow)
and no wait is random, so the log is the same on every run. Regenerate the golden log after
an intended change of the event format with
`PLAIT_REGOLD=1 .venv/bin/python -m pytest tests/test_replay.py` and review its diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents import Agent, Tool
from executors import FunctionLLM, echo
from orchestrator import (
    EVENT_ADAPTER,
    Engine,
    Event,
    Retry,
    RunResult,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.durability._replay import rebuild

GOLDEN = Path(__file__).parent / "golden" / "replay_run.jsonl"

researcher = Agent("researcher", "You summarise what is known about a topic.")


async def search(q: str) -> list[str]:
    return [f"{q}: paper 1", f"{q}: paper 2"]


SEARCH = Tool("search", search, "Find papers", {"type": "object"})


async def plan(ctx: TaskContext) -> list[str]:
    topics = ["kv cache", "batching"]
    for topic in topics:  # the DAG grows while it runs, and one addition is taken back
        ctx.workflow.add(f"research {topic}", researcher.ask(f"Topic: {topic}"), before=["write"])
    ctx.workflow.add("dropped", shout, after=["plan"])
    ctx.workflow.remove("dropped")
    ctx.workflow.add_edge("papers", "write")
    return topics


async def flaky(ctx: TaskContext) -> str:
    if ctx.attempt == 1:
        raise ConnectionError("first try fails")
    return f"worked at attempt {ctx.attempt}"


async def broken() -> None:
    raise ValueError("bad input")


async def shout() -> str:
    return "never runs"


async def write(ctx: TaskContext) -> str:
    return " | ".join(f"{k}={v}" for k, v in sorted(ctx.inputs.items()) if k != "plan")


def build() -> Workflow:
    wf = Workflow("replayed")
    wf.add("plan", plan)
    wf.add("papers", SEARCH.call({"q": "kv cache"}))
    wf.add("flaky", flaky, retry=Retry(attempts=2, jitter=0.0))  # no random wait
    wf.add("broken", broken)
    wf.add("after broken", shout, after=["broken"])
    wf.add("write", write, after=["plan", "flaky"], trigger="all_done")
    return wf


def run_it() -> tuple[Workflow, RunResult, list[Event]]:
    clock = VirtualClock()
    wf = build()

    async def main() -> tuple[RunResult, list[Event]]:
        llm = FunctionLLM(echo, latency=1.0, clock=clock)
        async with Engine(backends={"default": llm}, clock=clock) as engine:
            events = [event async for event in engine.iter(wf)]
            return await engine.run(Workflow("empty")), events

    _, events = clock.run(main())
    # engine.iter ran `wf` to its end; its RunResult is rebuilt from the engine's view:
    result = RunResult(
        workflow=wf.id,
        status="failed",
        results={t.id: wf.run_of(t.id).result for t in wf if wf.state(t.id) == "done"},
    )
    return wf, result, events


def dump(events: list[Event]) -> list[str]:
    return [EVENT_ADAPTER.dump_json(e).decode() for e in events]


def test_the_event_log_matches_the_golden_one() -> None:
    _, _, events = run_it()
    lines = dump(events)
    if os.environ.get("PLAIT_REGOLD"):
        GOLDEN.write_text("\n".join(lines) + "\n")
    assert lines == GOLDEN.read_text().splitlines()


def test_the_events_rebuild_the_run_after_a_round_trip_through_json() -> None:
    wf, result, events = run_it()
    restored = [EVENT_ADAPTER.validate_json(line) for line in dump(events)]
    image = rebuild(restored)
    assert image.status == "failed"
    assert set(image.tasks) == {t.id for t in wf}
    assert "dropped" not in image.tasks
    assert image.edges == set(wf.graph.edges)
    assert {t: i.state for t, i in image.tasks.items()} == {t.id: wf.state(t.id) for t in wf}
    assert image.results() == result.results
    assert image.unfinished() == []
    flaky_task, broken_task = image.tasks["flaky"], image.tasks["broken"]
    assert flaky_task.attempts == 2 and flaky_task.result == "worked at attempt 2"
    assert broken_task.error == "ValueError: bad input"
    assert image.tasks["after broken"].reason == "dependency 'broken' failed"


def test_each_action_is_described_by_what_it_runs() -> None:
    _, _, events = run_it()
    image = rebuild(events)
    papers = image.tasks["papers"].action
    assert (papers.kind, papers.name, papers.args) == (
        "tool",
        "search",
        {"args": {"q": "kv cache"}},
    )
    ask = image.tasks["research kv cache"].action
    assert (ask.kind, ask.name) == ("llm", "researcher")
    assert ask.args["prompt"] == "Topic: kv cache" and ask.args["backend"] == "default"
    plan_action = image.tasks["plan"].action
    assert plan_action.kind == "function" and plan_action.name.endswith(":plan")
    assert image.tasks["flaky"].options.retry == 2
    assert image.tasks["write"].options.trigger == "all_done"


def test_a_log_cut_mid_run_shows_what_would_run_again() -> None:
    _, _, events = run_it()
    cut = next(i for i, e in enumerate(events) if e.kind == "task_started" and e.task == "flaky")
    image = rebuild(events[: cut + 1])
    assert image.status is None
    assert image.tasks["flaky"].state == "running"
    assert "flaky" in image.unfinished() and "write" in image.unfinished()


def test_a_log_that_is_not_one_whole_run_is_refused() -> None:
    _, _, events = run_it()
    with pytest.raises(UsageError, match="begin with workflow_started"):
        rebuild(events[1:])
    with pytest.raises(UsageError, match="at least"):
        rebuild([])
    other = [e for e in events if e.kind == "workflow_started"]
    renamed = [*events[:3], type(other[0])(workflow="x", program=9, priority="batch",
                                           deadline=None, at=0.0)]  # fmt: skip
    with pytest.raises(UsageError, match="one run's events"):
        rebuild(renamed)


def test_an_event_of_a_task_never_added_is_refused() -> None:
    _, _, events = run_it()
    no_plan = [e for e in events if not (e.kind == "task_added" and e.task == "plan")]
    with pytest.raises(UsageError, match="'plan'.*never added"):
        rebuild(no_plan)


def test_a_log_written_before_the_idempotency_options_still_rebuilds() -> None:
    # Written by the release before `TaskOptions` had idempotent/idempotency_key: a store
    # keeps old logs, and resume must read them as they are.
    lines = (GOLDEN.parent / "replay_run_v2.jsonl").read_text().splitlines()
    old = rebuild(EVENT_ADAPTER.validate_json(line) for line in lines)
    new = rebuild(EVENT_ADAPTER.validate_json(line) for line in GOLDEN.read_text().splitlines())
    assert {t: i.state for t, i in old.tasks.items()} == {t: i.state for t, i in new.tasks.items()}
    assert old.results() == new.results()
    assert all(
        t.options.idempotent and t.options.idempotency_key is None for t in old.tasks.values()
    )
