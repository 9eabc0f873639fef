"""The deadline gate: runs with a deadline start in deadline order, as many at once as meets
the most deadlines (docs/admission.md, "Starting runs in deadline order").

Every run with a deadline slows the others: on a server that runs every sequence it holds
in each step, one more run in flight makes every step longer. Past some number of runs at
once, each takes longer than most deadlines allow, and starting more only makes every one
of them late. The gate learns, from the runs that end, how long a run takes with `n` runs
in flight (`seconds = a + b x n`, least squares over the last `memory` runs), and from the
deadlines runs were submitted with, the share of them a run taking that long would meet.
The cap is the `n` that maximises deadlines met per second,

    n / (a + b n) x share of deadlines >= a + b n,

and runs past it wait at the engine, earliest deadline first (nothing of theirs reaches a
backend). A waiting run whose deadline can no longer be met if it started now is hopeless:
with `late="cancel"` it is shed before it costs anything; otherwise it waits behind every
run that can still be met. Until `min_seen` runs have ended, over at least two levels, or
when the fit says more runs at once do not slow any of them, nothing waits.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from ._errors import UsageError


@dataclass(frozen=True, slots=True)
class DeadlineGate:
    """Settings of the deadline gate (`Engine(gate=DeadlineGate(...))`; None: off)."""

    min_seen: int = 10
    """Runs that must have ended (over at least two levels) before any run waits."""
    memory: int = 200
    """Ended runs the fit is made of (the most recent)."""
    deadlines: int = 200
    """Submitted deadlines the share of deadlines met is taken from (the most recent)."""
    sure: float = 0.9
    """A waiting `late="cancel"` run starts only if at least this share of runs at the
    present load finish within the time it has left; otherwise it is shed, having cost
    nothing. (Any other run is moved behind the rest when more than half would be late.)"""

    def __post_init__(self) -> None:
        for name in ("min_seen", "memory", "deadlines"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise UsageError(f"DeadlineGate({name}={value!r}) must be an integer >= 2")
        if not 0.0 < self.sure < 1.0:
            raise UsageError(f"DeadlineGate(sure={self.sure!r}) must be between 0 and 1")
        if self.memory < self.min_seen:
            raise UsageError(
                f"DeadlineGate(memory={self.memory}) must be at least min_seen ({self.min_seen})"
            )


DEFAULT_GATE = DeadlineGate()


@dataclass(frozen=True, slots=True)
class GateStats:
    """What the deadline gate learned (`engine.stats().gate`)."""

    cap: int | None
    """Runs with a deadline allowed in flight at once (None: no cap yet, or none needed)."""
    in_flight: int
    waiting: int
    seen: int
    """Ended runs in the fit."""
    base_s: float | None
    """The fit's seconds of a run alone (`a`)."""
    per_run_s: float | None
    """The seconds one more run in flight adds to each (`b`)."""
    held: int
    """Runs that waited at the gate, in all."""
    shed: int
    """Waiting runs found hopeless (shed if `late="cancel"`, else moved behind the rest)."""


class Gated(Protocol):
    """What the gate needs of a run."""

    deadline: float | None
    started_at: float
    complete: bool
    held: bool

    @property
    def late(self) -> str: ...


_SPREAD = 20
"""Quantiles of the fit's residuals that the share of deadlines met is averaged over."""


class _Entry:
    __slots__ = ("area_at_open", "gone", "opened_at", "run")

    def __init__(self, run: Gated) -> None:
        self.run = run
        self.opened_at = 0.0
        self.area_at_open = 0.0
        self.gone = False
        """Withdrawn while waiting: skipped when it comes up."""


class RunGate:
    """The gate's state: no I/O, no clock (callers pass `now`)."""

    def __init__(self, settings: DeadlineGate) -> None:
        self.settings = settings
        self._waiting: list[tuple[float, int, _Entry]] = []
        self._late: list[tuple[float, int, _Entry]] = []
        self._open: dict[int, _Entry] = {}
        self._queued: dict[int, _Entry] = {}
        self._order = itertools.count()
        self._seen: deque[tuple[float, float]] = deque(maxlen=settings.memory)
        self._budgets: deque[float] = deque(maxlen=settings.deadlines)
        self._area = 0.0
        self._area_at = 0.0
        self._fit: tuple[float, float] | None = None
        self._spread: list[float] = [0.0]
        self._cap: int | None = None
        self._stale = False
        self.held = 0
        self.shed = 0

    # --- runs come and go ------------------------------------------------------------------

    def arrive(self, run: Gated, now: float) -> None:
        """A run with a deadline was submitted: it waits until `release` lets it in."""
        assert run.deadline is not None
        self._budgets.append(run.deadline - run.started_at)
        self._stale = True
        run.held = True
        if self._cap is not None and len(self._open) >= self._cap:
            self.held += 1
        entry = self._queued[id(run)] = _Entry(run)
        heapq.heappush(self._waiting, (run.deadline, next(self._order), entry))

    def release(self, now: float) -> tuple[list[Gated], list[Gated]]:
        """Let waiting runs in while fewer than the cap are in flight, earliest deadline
        first. Returns (runs let in, runs found hopeless on the way). A hopeless run with
        `late="cancel"` stays held for the caller to cancel; any other is moved behind the
        runs that can still be met, and let in only when none of those waits."""
        opened: list[Gated] = []
        hopeless: list[Gated] = []
        cap = self.cap()
        fit = self._fit
        while self._waiting or self._late:
            if cap is not None and len(self._open) >= cap:
                break
            queue = self._waiting if self._waiting else self._late
            deadline, order, entry = heapq.heappop(queue)
            run = entry.run
            if entry.gone or run.complete:
                self._queued.pop(id(run), None)
                continue
            if queue is self._waiting and fit is not None:
                share = self.settings.sure if run.late == "cancel" else 0.5
                if now + self._expect(len(self._open) + 1, share) > deadline:
                    self.shed += 1
                    hopeless.append(run)
                    if run.late != "cancel":  # else the caller cancels it: it never starts
                        heapq.heappush(self._late, (deadline, order, entry))
                    continue
            self._advance(now)
            del self._queued[id(run)]
            entry.opened_at = now
            entry.area_at_open = self._area
            self._open[id(run)] = entry
            run.held = False
            opened.append(run)
        return opened, hopeless

    def ended(self, run: Gated, now: float, ok: bool) -> None:
        """A run let in has ended; one that succeeded teaches the fit."""
        self._advance(now)
        entry = self._open.pop(id(run), None)
        if entry is None:
            return
        took = now - entry.opened_at
        if ok and took > 0:
            level = (self._area - entry.area_at_open) / took
            self._seen.append((max(level, 1.0), took))
            self._stale = True

    def withdraw(self, run: Gated, now: float) -> None:
        """A run leaves without teaching anything (cancelled, failed, waiting or not)."""
        if id(run) in self._open:
            self.ended(run, now, ok=False)
        entry = self._queued.pop(id(run), None)
        if entry is not None:
            entry.gone = True
        run.held = False

    def _advance(self, now: float) -> None:
        if now > self._area_at:
            self._area += len(self._open) * (now - self._area_at)
            self._area_at = now

    # --- learning ----------------------------------------------------------------------------

    def cap(self) -> int | None:
        if self._stale:
            self._stale = False
            fit = self._fitted()
            if fit is not None:
                self._fit = fit
                self._cap = self._best(*fit)
            # Else the last good fit stands: once runs are capped their levels bunch up,
            # and a slope fitted to one level says nothing.
        return self._cap

    def _fitted(self) -> tuple[float, float] | None:
        seen = self._seen
        if len(seen) < self.settings.min_seen:
            return None
        n = len(seen)
        mean_x = sum(x for x, _ in seen) / n
        mean_y = sum(y for _, y in seen) / n
        sxx = sum((x - mean_x) ** 2 for x, _ in seen)
        if sxx <= 1e-9 * n:  # one level only: nothing says what more runs would do
            return None
        b = sum((x - mean_x) * (y - mean_y) for x, y in seen) / sxx
        a = mean_y - b * mean_x
        if b <= 0 or a + b <= 0:
            return None  # more runs at once do not slow them (or the fit is noise)
        residuals = sorted(y - (a + b * x) for x, y in seen)
        step = len(residuals) / _SPREAD
        self._spread = [residuals[int((i + 0.5) * step)] for i in range(_SPREAD)]
        return a, b

    def _best(self, a: float, b: float) -> int | None:
        """The number of runs at once that meets the most deadlines per second; None when
        that is more than the runs ever seen at once (the gate would not bind)."""
        budgets = sorted(self._budgets)
        if not budgets:
            return None
        top = max(2, int(max(x for x, _ in self._seen) * 2) + 1)
        best, best_value = None, 0.0
        total = len(budgets)
        spread = self._spread
        for n in range(1, top + 1):
            took = a + b * n
            if took <= 0:
                continue
            # Runs taking about `took` at this level, spread as the fit's residuals are.
            met = sum(total - bisect.bisect_left(budgets, took + r) for r in spread)
            value = n / took * met / (total * len(spread))
            if value > best_value * (1 + 1e-9):
                best, best_value = n, value
        if best is None or best >= top:
            return None
        return best

    @property
    def learned(self) -> bool:
        """Whether the gate has a fit (it predicts run times, and sheds hopeless runs)."""
        self.cap()
        return self._fit is not None

    def expected(self, now: float) -> float:
        """Seconds a run let in now would take, by the fit (0 before there is one)."""
        self.cap()
        return 0.0 if self._fit is None else self._expect(len(self._open) + 1)

    def _expect(self, level: int, share: float = 0.5) -> float:
        """Seconds a run takes at `level` runs in flight: `share` of them take no longer."""
        assert self._fit is not None
        a, b = self._fit
        spread = self._spread
        return a + b * level + spread[min(len(spread) - 1, int(share * len(spread)))]

    # --- reporting ---------------------------------------------------------------------------

    def stats(self) -> GateStats:
        cap = self.cap()
        fit = self._fit
        waiting = len(self._queued)
        return GateStats(
            cap=cap,
            in_flight=len(self._open),
            waiting=waiting,
            seen=len(self._seen),
            base_s=None if fit is None else fit[0],
            per_run_s=None if fit is None else fit[1],
            held=self.held,
            shed=self.shed,
        )
