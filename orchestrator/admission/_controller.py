"""The urgency controller: classifies live programs and decides admission; the engine acts.

Once per round the engine asks it what to do and applies the answer: which runs the
deadline gate lets in and which waiting runs to shed (`release`), then whether urgent work
is around, which runs have just become hopeless, and how many calls each LLM backend takes
from slack-rich work (`decide`). Between rounds the engine tells it what happened (runs
arrived and ended, tasks ended). It holds what it learns (task durations, run times, each
backend's throughput knee, the gate's fit) and a record per run with a deadline; it never
imports or calls the engine, and is handed no callback into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from ..model._llm import URGENT_CLASSES, ServiceClass
from ._gate import DeadlineGate, Gated, GateStats, RunGate
from ._knee import (
    DEFAULT_HEADROOM,
    Headroom,
    KneeController,
    KneeStats,
    reserve_cap,
    slack_rich,
)
from ._learned import Durations, RunTimes
from ._scheduler import PriorityClass, ProgramView, alone_slack_of, slack_of

SHARE_MARGIN = 1.0
"""A program with a deadline is `shareable` while its slack is at least this many times its
remaining critical path: it would still make its deadline if the rest took twice as long."""


class Judged(Protocol):
    """What classifying a program needs (a run, or a program as the call path sees it)."""

    @property
    def priority_class(self) -> PriorityClass: ...

    @property
    def deadline(self) -> float | None: ...

    def view(self, now: float) -> ProgramView: ...


class Live(Gated, Protocol):
    """What the controller reads of a live run (a run implements it)."""

    @property
    def id(self) -> str: ...

    @property
    def priority_class(self) -> PriorityClass: ...

    @property
    def workflow_name(self) -> str: ...

    def view(self, now: float) -> ProgramView: ...

    def __hash__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Hopeless:
    """A run found unable to meet its deadline: it needs `needs_s` seconds from `at`."""

    run: Live
    needs_s: float
    at: float


@dataclass(frozen=True, slots=True)
class Shed:
    """A run to cancel before it costs anything, and why; `notice`: to tell first that it
    was found hopeless (None: told already)."""

    run: Live
    reason: str
    notice: Hopeless | None = None


@dataclass(slots=True)
class Release:
    """What the deadline gate decided this round: runs to shed (first), and runs to let in."""

    shed: list[Shed] = field(default_factory=list)
    opened: list[Live] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    """What admission does this round.

    `urgent`: urgent work is around. `changed`: that differs from the last round's answer,
    so work held back by the old caps must be looked at again. `hopeless`: runs found
    hopeless this round (each told once). The caps follow from `urgent`: `caps(backend)`."""

    urgent: bool = False
    changed: bool = False
    hopeless: list[Hopeless] = field(default_factory=list)


@dataclass(slots=True)
class _Record:
    """What the controller keeps of one run that may be urgent."""

    hopeless_at: float | None = None


class UrgencyController:
    """Decides admission from deadlines and what it learned; see the module docstring.

    `limits`: per LLM backend, its in-flight limit and an optional fixed cap on slack-rich
    work while urgent work is around (`Limits.batch_in_flight`). `keeps_lanes`: backends
    that keep urgent work apart themselves (a router's lanes): they get no knee, only the
    reserve. `headroom` None: nothing is held back but a fixed cap."""

    def __init__(
        self,
        limits: Mapping[str, tuple[int, int | None]],
        keeps_lanes: frozenset[str],
        *,
        headroom: Headroom | None,
        gate: DeadlineGate | None,
        default_estimate: float,
    ) -> None:
        self.headroom = headroom
        self._margins = headroom or DEFAULT_HEADROOM
        self.gate = None if gate is None else RunGate(gate)
        """The deadline gate's state (docs/admission.md)."""
        self.knees = {
            name: KneeController(name, limit, self._margins, fixed)
            for name, (limit, fixed) in limits.items()
            if fixed is not None or (headroom is not None and name not in keeps_lanes)
        }
        """Per LLM backend, its learned throughput knee (fed by the call path)."""
        # A backend that keeps urgent work apart itself gets no knee, but slack-rich work
        # still leaves the reserve free there: an urgent call that comes while batch calls
        # fill the limit starts at once, not when one of them ends.
        self.reserve_caps = {
            name: reserve_cap(limit, headroom)
            for name, (limit, _) in limits.items()
            if headroom is not None and name not in self.knees and name in keeps_lanes
        }
        self.durations = Durations(default_estimate)
        """What each kind of task has taken lately: the `slack` policy's estimates of what a
        run has left (and so which deadlines are hopeless) for tasks without `estimate=`."""
        self.run_times = RunTimes()
        """What recent runs with a deadline took, per workflow name: a `late="cancel"` run
        whose deadline is shorter than most of them took is shed at once."""
        self._watched: dict[Live, _Record] = {}
        """Runs that may be urgent (interactive, or with a deadline)."""
        self._urgent = False

    # --- what happened -----------------------------------------------------------------------

    def arrived(self, run: Live, now: float) -> bool:
        """A run was submitted; True if it may be urgent work (caps may change)."""
        watched = run.deadline is not None or run.priority_class == "interactive"
        if watched:
            self._watched[run] = _Record()
        if self.gate is not None and run.deadline is not None:
            self.gate.arrive(run, now)
        return watched

    def left(self, run: Live, now: float) -> bool:
        """A run is gone (finished, refused or stopped); True if it was watched."""
        if self.gate is not None and run.deadline is not None:
            self.gate.withdraw(run, now)
        return self._watched.pop(run, None) is not None

    def task_ended(self, kind: str, seconds: float) -> None:
        """A task of `kind` (`task_kind`) finished after `seconds`."""
        self.durations.observe(kind, seconds)

    def run_ended(self, run: Live, seconds: float, ok: bool, now: float) -> None:
        """A run with a deadline ended after `seconds`; `ok`: it succeeded."""
        if run.deadline is None:
            return
        if ok:
            self.run_times.observe(run.workflow_name, seconds)
        if self.gate is not None:
            # A run cancelled at its deadline took at least that long: leaving it out would
            # teach the gate that runs are quicker than they are.
            self.gate.ended(run, now, ok or (run.late == "cancel" and now >= run.deadline))

    def hopeless_at(self, run: Live) -> float | None:
        """When `run` was found unable to meet its deadline (None: it was not)."""
        record = self._watched.get(run)
        return None if record is None else record.hopeless_at

    def holds(self, run: Live) -> bool:
        """Whether the deadline gate holds `run` (nothing of it may start yet)."""
        return self.gate is not None and self.gate.holds(run)

    def set_limit(self, backend: str, limit: int) -> None:
        """`backend`'s in-flight limit is now `limit` (read from its server at start)."""
        if (knee := self.knees.get(backend)) is not None:
            knee.limit = limit
        if backend in self.reserve_caps and self.headroom is not None:
            self.reserve_caps[backend] = reserve_cap(limit, self.headroom)

    # --- deciding ----------------------------------------------------------------------------

    def submitted_late_cancel(self, run: Live, budget_s: float, now: float) -> Shed | None:
        """A `late="cancel"` run was submitted with `budget_s` to its deadline: shed it at
        once if most recent runs of its workflow took longer than that (until the gate has
        learned enough to judge it while it waits)."""
        if self.gate is not None and self.gate.learned:
            return None  # the gate sheds it while it waits, by what a run takes at this load
        took = self.run_times.typical(run.workflow_name)
        if took is None or took <= budget_s:
            return None
        return Shed(
            run,
            f"shed: its deadline ({budget_s:.1f} s) is shorter than what most recent runs of "
            f"{run.workflow_name!r} took ({took:.1f} s)",
            self._found_hopeless(run, took, now),
        )

    def release(self, now: float) -> Release:
        """What the deadline gate lets in now, earliest deadline first; a waiting run found
        out of reach at the present load is shed if it was submitted `late="cancel"` (it
        has cost nothing yet), else moved behind the rest."""
        decided = Release()
        if self.gate is None:
            return decided
        opened, hopeless = self.gate.release(now)
        for gated, took in hopeless:
            run = cast(Live, gated)
            assert run.deadline is not None
            if run.late == "cancel":
                # Given up: it is hopeless at the present load. (A run that finishes anyway
                # is only moved behind by the gate; hopeless is for what is out of reach
                # even alone, which admission judges once it runs.)
                decided.shed.append(
                    Shed(
                        run,
                        f"shed: waiting to start, its deadline ({run.deadline - now:.1f} s "
                        f"from now) is shorter than what runs take at this load ({took:.1f} s)",
                        self._found_hopeless(run, took, now),
                    )
                )
        decided.opened = [cast(Live, run) for run in opened]
        return decided

    def decide(self, now: float) -> Plan:
        """Classify the runs that may be urgent and answer the caps for this round."""
        plan = Plan()
        if self._watched:
            plan.urgent = self._look_at_deadlines(now, plan.hopeless)
        if self.knees and plan.urgent != self._urgent:  # a reserve cap is the same either way
            self._urgent = plan.urgent
            plan.changed = True
        return plan

    def caps(self, backend: str, urgent: bool) -> tuple[int, int | None] | None:
        """The calls in flight on `backend` under which slack-rich work is admitted, and the
        urgent calls' own cap (None: up to the limit); None: nothing is held back there.
        `urgent`: the plan's answer (urgent work is around)."""
        knee = self.knees.get(backend)
        if knee is None:
            alone = self.reserve_caps.get(backend)
            return None if alone is None else (alone, None)
        capped = knee.headroom.urgent_share is not None
        return knee.cap(urgent), knee.urgent_cap() if capped else None

    @property
    def holds_back(self) -> bool:
        """Whether any backend may hold slack-rich work back (a knee or a reserve)."""
        return bool(self.knees or self.reserve_caps)

    def service_class(
        self, run: Judged, now: float, view: ProgramView | None = None
    ) -> ServiceClass:
        """How `run` is served now (`ServiceClass`); `view`: the run's at `now`, where the
        caller has it already."""
        if run.deadline is None:
            return "urgent" if run.priority_class == "interactive" else "slack_rich"
        if view is None:
            view = run.view(now)
        slack, alone = slack_of(view, now), alone_slack_of(view, now)
        assert slack is not None and alone is not None  # it has a deadline
        if alone < 0:
            return "hopeless"
        # Late only at this load: urgent, not hopeless.
        if slack_rich(run.priority_class, max(0.0, slack), view.remaining, self._margins):
            return "slack_rich"
        # Time to spare needs a path estimated, not guessed.
        roomy = not view.guessed and slack >= SHARE_MARGIN * view.remaining
        return "shareable" if roomy else "tight"

    def slack_rich(self, run: Judged, now: float, view: ProgramView | None = None) -> bool:
        """Whether `run` may wait behind urgent work (slack-rich, or hopeless)."""
        return self.service_class(run, now, view) not in URGENT_CLASSES

    def urgent(self, run: Judged, now: float, view: ProgramView | None = None) -> bool:
        """Whether `run` is urgent work now (its class is one of `URGENT_CLASSES`)."""
        return self.service_class(run, now, view) in URGENT_CLASSES

    def _look_at_deadlines(self, now: float, found: list[Hopeless]) -> bool:
        """Whether urgent work is around; adds each run that has just become hopeless (its
        remaining critical path, even at the least its tasks have taken, is longer than the
        time left) to `found`."""
        urgent = False
        for run, record in self._watched.items():
            if run.complete:
                continue
            if run.deadline is not None and record.hopeless_at is None:
                view = run.view(now)
                alone = alone_slack_of(view, now)
                if alone is not None and alone < 0:
                    notice = self._found_hopeless(run, run.deadline - now - alone, now)
                    if notice is not None:
                        found.append(notice)
            if not urgent and not self.slack_rich(run, now):
                urgent = True
        return urgent

    def _found_hopeless(self, run: Live, needs_s: float, now: float) -> Hopeless | None:
        """Record, once, that `run` cannot meet its deadline; the notice to tell, or None
        if it was told already."""
        record = self._watched.get(run)
        if record is None:
            record = self._watched[run] = _Record()
        if record.hopeless_at is not None:
            return None
        record.hopeless_at = now
        return Hopeless(run, needs_s, now)

    # --- reporting ---------------------------------------------------------------------------

    def knee_stats(self) -> tuple[KneeStats, ...]:
        return tuple(knee.stats() for knee in self.knees.values())

    def gate_stats(self) -> GateStats | None:
        return None if self.gate is None else self.gate.stats()
