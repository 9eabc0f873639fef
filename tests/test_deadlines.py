"""A workflow's deadline is visible: met or missed in its result, its events and the CLI."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator import (
    Engine,
    Event,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
    run_sync,
)
from orchestrator.cli._cli import main


def _slow(seconds: float) -> Workflow:
    async def work(ctx: TaskContext) -> int:
        await ctx.clock.sleep(seconds)
        return 1

    wf = Workflow("late")
    wf.add("work", work)
    return wf


def test_a_missed_deadline_shows_in_the_result_with_how_late() -> None:
    result = run_sync(_slow(4.0), clock=VirtualClock(), deadline=3)
    assert result.status == "succeeded"
    assert result.duration == pytest.approx(4.0)
    assert result.deadline_met is False
    assert result.slack == pytest.approx(-1.0)


def test_a_met_deadline_shows_the_time_to_spare() -> None:
    result = run_sync(_slow(2.0), clock=VirtualClock(), deadline=3)
    assert result.deadline_met is True
    assert result.slack == pytest.approx(1.0)
    assert run_sync(_slow(1.0), clock=VirtualClock()).deadline_met is None


def test_the_miss_is_an_event_at_the_moment_the_deadline_passes() -> None:
    clock = VirtualClock()

    async def main() -> list[Event]:
        async with Engine(clock=clock) as engine:
            return [e async for e in engine.iter(_slow(4.0), deadline=3)]

    events = clock.run(main())
    kinds = [e.kind for e in events]
    missed = next(e for e in events if e.kind == "deadline_missed")
    assert missed.at - events[0].at == pytest.approx(3.0)
    assert kinds.index("deadline_missed") < kinds.index("workflow_finished")
    finished = events[-1]
    assert finished.kind == "workflow_finished"
    assert finished.deadline_met is False and finished.slack == pytest.approx(-1.0)


def test_a_met_deadline_sends_no_miss() -> None:
    clock = VirtualClock()

    async def main() -> list[str]:
        async with Engine(clock=clock) as engine:
            return [e.kind async for e in engine.iter(_slow(1.0), deadline=3)]

    assert "deadline_missed" not in clock.run(main())


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "3"])
def test_a_bad_deadline_is_refused(bad: object) -> None:
    with pytest.raises(UsageError, match="deadline must be (a number of seconds|finite)"):
        run_sync(_slow(1.0), clock=VirtualClock(), deadline=bad)  # type: ignore[arg-type]


def _flow(tmp_path: Path) -> Path:
    path = tmp_path / "flow.py"
    path.write_text(
        "from orchestrator import TaskContext, Workflow\n"
        "CLOCK = 'virtual'\n"
        "async def work(ctx: TaskContext) -> int:\n"
        "    await ctx.clock.sleep(4.0)\n"
        "    return 1\n"
        "def workflows():\n"
        "    wf = Workflow('late')\n"
        "    wf.add('work', work)\n"
        "    return wf\n"
    )
    return path


def test_the_cli_sets_a_deadline_and_the_summary_says_missed(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["run", str(_flow(tmp_path)), "--deadline", "3"], out=out) == 0
    text = out.getvalue()
    assert "missed its deadline" in text
    assert "MISSED by 1.00 s" in text


def test_the_cli_deadline_comes_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "p.toml"
    config.write_text("[engine]\ndeadline = 5\n")
    out = io.StringIO()
    assert main(["run", str(_flow(tmp_path)), "--config", str(config)], out=out) == 0
    assert "met, 1.00 s to spare" in out.getvalue()
