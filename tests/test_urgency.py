"""The urgency controller decides and does not act: its classes, its plans, its imports."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import pytest
from test_layout import PACKAGE, _imports_at_run_time

from orchestrator.admission._controller import ServiceClass, UrgencyController
from orchestrator.admission._gate import DeadlineGate
from orchestrator.admission._knee import Headroom
from orchestrator.admission._scheduler import PriorityClass, ProgramView

_numbers = iter(range(1, 1_000_000))


@dataclass(eq=False)
class _Run:
    """A run as the controller sees it: a deadline and what is left of its path."""

    deadline: float | None = None
    priority_class: PriorityClass = "batch"
    remaining: float = 0.0
    least: float | None = None
    started_at: float = 0.0
    complete: bool = False
    late: str = "finish"
    guessed: bool = False
    workflow_name: str = "w"
    id: str = field(default_factory=lambda: f"run-{next(_numbers)}")

    def view(self, now: float) -> ProgramView:
        return ProgramView(
            next(_numbers),
            self.priority_class,
            0.0,
            self.deadline,
            self.remaining,
            self.remaining if self.least is None else self.least,
            self.guessed,
        )


def _controller(**kw: object) -> UrgencyController:
    settings: dict[str, object] = {
        "headroom": Headroom(),
        "gate": None,
        "default_estimate": 1.0,
    }
    settings.update(kw)
    return UrgencyController({"gpu": (64, None)}, frozenset(), **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        (_Run(priority_class="interactive"), "urgent"),
        (_Run(), "slack_rich"),
        # 100 s left for 10 s of work: past both 30 s and 4x the path
        (_Run(deadline=100.0, remaining=10.0), "slack_rich"),
        # 25 s of slack for 10 s of work: at least the path to spare, not past 30 s
        (_Run(deadline=35.0, remaining=10.0), "shareable"),
        # the same, but the path is only guessed: no time to spare is known
        (_Run(deadline=35.0, remaining=10.0, guessed=True), "tight"),
        # 5 s of slack for 10 s of work
        (_Run(deadline=15.0, remaining=10.0), "tight"),
        # late at this load (slack < 0) but within reach alone
        (_Run(deadline=8.0, remaining=10.0, least=5.0), "tight"),
        # out of reach even at the least its tasks took
        (_Run(deadline=4.0, remaining=10.0, least=5.0), "hopeless"),
    ],
)
def test_each_program_gets_one_service_class(run: _Run, expected: ServiceClass) -> None:
    controller = _controller()
    assert controller.service_class(run, 0.0) == expected
    assert controller.urgent(run, 0.0) == (expected in ("urgent", "tight", "shareable"))


def test_the_plan_says_when_urgent_work_comes_and_goes() -> None:
    controller = _controller()
    batch = _Run()
    controller.arrived(batch, 0.0)
    first = controller.decide(0.0)
    assert not first.urgent and not first.changed
    assert controller.caps("gpu", first.urgent) == (61, None)  # the reserve: 5% of 64 free

    query = _Run(deadline=15.0, remaining=10.0, priority_class="interactive")
    assert controller.arrived(query, 0.0)  # watched: it may be urgent
    second = controller.decide(0.0)
    assert second.urgent and second.changed
    held = controller.caps("gpu", second.urgent)
    assert held is not None and held[0] < 61  # slack-rich work held to a probe level

    assert controller.decide(0.0).changed is False  # nothing new
    assert controller.left(query, 1.0)
    third = controller.decide(1.0)
    assert not third.urgent and third.changed


def test_a_hopeless_run_is_told_once_and_remembered() -> None:
    controller = _controller()
    run = _Run(deadline=4.0, remaining=10.0, least=5.0, priority_class="interactive")
    controller.arrived(run, 0.0)
    plan = controller.decide(0.0)
    assert [(n.run, n.needs_s, n.at) for n in plan.hopeless] == [(run, 5.0, 0.0)]
    assert not plan.urgent  # hopeless work does not hold the rest back
    assert controller.decide(0.5).hopeless == []
    assert controller.hopeless_at(run) == 0.0


def test_a_late_cancel_run_is_shed_by_what_recent_runs_took() -> None:
    controller = _controller()
    for _ in range(5):
        done = _Run(deadline=100.0)
        controller.arrived(done, 0.0)
        controller.run_ended(done, 20.0, ok=True, now=20.0)
        controller.left(done, 20.0)
    quick = _Run(deadline=30.0, late="cancel")
    controller.arrived(quick, 30.0)
    assert controller.submitted_late_cancel(quick, 30.0, 30.0) is None
    short = _Run(deadline=40.0, late="cancel")
    controller.arrived(short, 30.0)
    shed = controller.submitted_late_cancel(short, 10.0, 30.0)
    assert shed is not None and shed.run is short and "20.0 s" in shed.reason
    assert shed.notice is not None and shed.notice.needs_s == 20.0


def test_the_gate_holds_runs_with_a_deadline_until_it_releases_them() -> None:
    controller = _controller(gate=DeadlineGate())
    run = _Run(deadline=10.0)
    controller.arrived(run, 0.0)
    assert controller.holds(run)
    released = controller.release(0.0)
    assert released.opened == [run] and released.shed == []
    assert not controller.holds(run)


def test_the_controller_never_reaches_the_engine() -> None:
    """Admission imports only itself and the model: nothing of the engine, the store, the
    cluster or the front ends (tests/test_layout.py holds every room to its layer)."""
    reached = {
        module.split(".")[1]
        for path in (PACKAGE / "admission").rglob("*.py")
        for module in _imports_at_run_time(path)
        if module.count(".") >= 2
    }
    assert reached <= {"admission", "model"}, f"admission imports {sorted(reached)}"
    assert "model" in reached  # the walk reads imports at all


def test_nothing_hands_the_controller_a_callback() -> None:
    """Its constructor takes data and settings only: no function into whoever acts."""
    for name, parameter in inspect.signature(UrgencyController).parameters.items():
        annotation = str(parameter.annotation)
        assert "Callable" not in annotation, f"UrgencyController({name}: {annotation})"
