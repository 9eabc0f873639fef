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
backend). A waiting run whose deadline can likely no longer be met if it started now is
late: with `late="cancel"` it is shed before it costs anything; otherwise it waits behind
every run that can still be met and starts into spare room only (or, with
`late_in_flight`, that many are kept going whatever else waits). Until `min_seen` runs
have ended, over at least two levels, or while the fit says more runs at once do not slow
any of them, nothing waits.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from ..model._errors import UsageError
from ._knee import least_squares


def _runs_to_tell(share: float) -> int:
    """The fewest runs that tell what `share` of them take: a quantile from fewer than
    1 / (1 - share) runs is their slowest one at best (0.9: 10 runs; 0.7: 4)."""
    return math.ceil(1.0 / (1.0 - share) - 1e-9)


@dataclass(frozen=True, slots=True)
class DeadlineGate:
    """Settings of the deadline gate (`AdmissionTuning(gate=DeadlineGate(...))`; None: off)."""

    min_seen: int = 5
    """Runs that must have ended (over at least two levels) before any run waits."""
    memory: int = 200
    """Ended runs the fit is made of (the most recent)."""
    deadlines: int = 200
    """Submitted deadlines the share of deadlines met is taken from (the most recent)."""
    sure: float = 0.9
    """A waiting `late="cancel"` run starts only if at least this share of runs at the
    present load finish within the time it has left; otherwise it is shed, having cost
    nothing."""
    likely: float = 0.7
    """Any other waiting run starts ahead of the runs judged late only if at least this
    share of runs at the present load finish within the time it has left; otherwise it is
    judged late and moved behind the rest (it still runs, into spare room: a run with
    a small chance of making it leaves the capacity to runs with a better one)."""
    late_room: float = 0.25
    """Runs judged late (moved behind the rest) start while no run that can still make its
    deadline waits and fewer than this share of the cap are in flight (one, at least, when
    none is): they fill spare room without lengthening the steps of the runs that come
    next."""
    late_in_flight: int = 0
    """Runs judged late kept in flight whenever any wait, whatever else waits, so that they
    go on through an overload, one after another, at the cost of the runs that can still
    make it. 0 (the default): they start only into spare room, and wait while an overload
    lasts."""

    def __post_init__(self) -> None:
        for name, least in (
            ("min_seen", 2),
            ("memory", 2),
            ("deadlines", 2),
            ("late_in_flight", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f"DeadlineGate({name}={value!r}) must be an integer >= {least}")
        for name in ("sure", "likely"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise UsageError(f"DeadlineGate({name}={value!r}) must be between 0 and 1")
        if not 0.0 <= self.late_room <= 1.0:
            raise UsageError(f"DeadlineGate(late_room={self.late_room!r}) must be between 0 and 1")
        if self.memory < self.min_seen:
            raise UsageError(
                f"DeadlineGate(memory={self.memory}) must be at least min_seen ({self.min_seen})"
            )
        for name in ("sure", "likely"):
            share = getattr(self, name)
            if self.memory < _runs_to_tell(share):
                raise UsageError(
                    f"DeadlineGate(memory={self.memory}) keeps too few runs to tell what "
                    f"{name}={share!r} of them take: at least {_runs_to_tell(share)}"
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
    """Runs let in (or gone) after waiting at the gate, in all."""
    shed: int
    """Waiting runs found hopeless (shed if `late="cancel"`, else moved behind the rest)."""
    late_waiting: int = 0
    """Of the waiting runs, those judged late: they start into spare room only (with
    `late_in_flight`, that many also while others wait). Through an overload it grows."""


class Gated(Protocol):
    """What the gate needs of a run."""

    deadline: float | None
    started_at: float
    complete: bool

    @property
    def late(self) -> str: ...


_SPREAD = 20
"""Quantiles of the fit's residuals that the share of deadlines met is averaged over."""
_COMPACT = 64
"""Withdrawn runs' entries tolerated in the heaps beyond the waiting runs' own before they
are swept (then they are over half of the heaps)."""
_BUNCHED = 0.25
"""Levels whose variance is under this (a spread of about half a run) carry no slope."""
_EXACT = 64
"""Levels up to this are searched one by one for the cap; above it, 2% apart."""


class _Entry:
    __slots__ = ("area_at_open", "late", "opened_at", "round", "run")

    def __init__(self, run: Gated, round_: int) -> None:
        self.run = run
        self.round = round_
        """The gate's release round when it arrived: let in later than the next one, it
        waited."""
        self.opened_at = 0.0
        self.area_at_open = 0.0
        self.late = False
        """Judged late while it waited (moved behind the runs that can still be met)."""


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
        self._new_seen = 0
        self._new_budgets = 0
        self._round = 0
        self._late_open = 0
        self.held = 0
        self.shed = 0

    # --- runs come and go ------------------------------------------------------------------

    def arrive(self, run: Gated, now: float) -> None:
        """A run with a deadline was submitted: it waits until `release` lets it in."""
        assert run.deadline is not None
        self._budgets.append(run.deadline - run.started_at)
        self._new_budgets += 1
        entry = self._queued[id(run)] = _Entry(run, self._round)
        heapq.heappush(self._waiting, (run.deadline, next(self._order), entry))

    def release(self, now: float) -> tuple[list[Gated], list[tuple[Gated, float]]]:
        """Let waiting runs in while fewer than the cap are in flight, earliest deadline
        first. Returns (runs let in, runs found hopeless on the way, each with the seconds
        it was judged by). A hopeless run with `late="cancel"` stays held for the caller to
        cancel; any other is moved behind the runs that can still be met and starts, oldest
        deadline first, into spare room (nothing else waits, fewer than `late_room` of the
        cap in flight), or while fewer than `late_in_flight` of its kind are running."""
        self._round += 1
        opened: list[Gated] = []
        hopeless: list[tuple[Gated, float]] = []
        cap = self.cap()
        settings = self.settings
        while self._waiting or self._late:
            if cap is not None and len(self._open) >= cap:
                break
            # spare room: nothing that can still make it waits, and under `late_room` of the
            # cap in flight (always room for one when nothing is in flight)
            spare = not self._waiting and (
                cap is None or len(self._open) < max(1.0, cap * settings.late_room)
            )
            take_late = bool(self._late) and (spare or self._late_open < settings.late_in_flight)
            if not take_late and not self._waiting:
                break  # only runs judged late wait, and there is no spare room for them
            queue = self._late if take_late else self._waiting
            deadline, order, entry = heapq.heappop(queue)
            run = entry.run
            if self._queued.get(id(run)) is not entry:
                continue  # withdrawn while it waited
            if run.complete:
                del self._queued[id(run)]
                continue
            share = settings.sure if run.late == "cancel" else settings.likely
            if not take_late and self._fit is not None and self._judges(share):
                took = self._expect(len(self._open) + 1, share)
                if now + took > deadline:
                    self.shed += 1
                    hopeless.append((run, took))
                    if run.late != "cancel":  # else the caller cancels it: it never starts
                        entry.late = True
                        heapq.heappush(self._late, (deadline, order, entry))
                    continue
            self._advance(now)
            del self._queued[id(run)]
            if self._round > entry.round + 1:
                self.held += 1
            entry.opened_at = now
            entry.area_at_open = self._area
            self._late_open += entry.late
            self._open[id(run)] = entry
            opened.append(run)
        return opened, hopeless

    def ended(self, run: Gated, now: float, ok: bool) -> None:
        """A run let in has ended; `ok`: it teaches the fit (it succeeded, or it was
        cancelled at its deadline: it took at least what it took)."""
        self._advance(now)
        entry = self._open.pop(id(run), None)
        if entry is None:
            return
        self._late_open -= entry.late
        took = now - entry.opened_at
        if ok and took > 0:
            level = (self._area - entry.area_at_open) / took
            self._seen.append((max(level, 1.0), took))
            self._new_seen += 1

    def withdraw(self, run: Gated, now: float) -> None:
        """A run leaves without teaching anything (cancelled, failed, waiting or not)."""
        if id(run) in self._open:
            self.ended(run, now, ok=False)
        entry = self._queued.pop(id(run), None)  # if it waited: skipped when it comes up
        if entry is not None:
            if self._round > entry.round + 1:
                self.held += 1
            # every waiting run has one entry in the heaps; the rest are withdrawn runs'
            if len(self._waiting) + len(self._late) > 2 * len(self._queued) + _COMPACT:
                self._compact()

    def holds(self, run: Gated) -> bool:
        """Whether `run` waits at the gate (nothing of it may start yet)."""
        return id(run) in self._queued

    def _compact(self) -> None:
        """Drop the heap entries of withdrawn runs, so that runs cancelled while they waited
        (late ones through a long overload, say) are not kept until they come up."""
        for heap in (self._waiting, self._late):
            heap[:] = [item for item in heap if self._queued.get(id(item[2].run)) is item[2]]
            heapq.heapify(heap)

    def _advance(self, now: float) -> None:
        if now > self._area_at:
            self._area += len(self._open) * (now - self._area_at)
            self._area_at = now

    # --- learning ----------------------------------------------------------------------------

    def cap(self) -> int | None:
        """Runs with a deadline allowed in flight (None: any number). Refitted once enough
        has changed since the last fit: every run while few were seen, then every 5% of
        `memory` (and as many new deadlines), so a burst of thousands costs a few fits."""
        every = max(1, len(self._seen) // 20)
        if self._new_seen >= every or (self._fit is not None and self._new_budgets >= every):
            refit = self._new_seen > 0
            self._new_seen = self._new_budgets = 0
            fit = self._fitted() if refit else self._fit
            if fit is None:
                self._fit = self._cap = None  # more runs at once do not slow them
            else:
                self._fit = fit
                self._cap = self._best(*fit)
        return self._cap

    def _fitted(self) -> tuple[float, float] | None:
        """The line through what recent runs took; None while too few were seen or when
        more runs at once do not slow them. When their levels bunch up (runs capped at one
        level), the slope says nothing new: the last one is kept, and only the intercept
        follows what runs take now, so a cap can still move."""
        seen = self._seen
        if len(seen) < self.settings.min_seen:
            return self._fit
        mean_x, mean_y, b = least_squares(((1.0, x, y) for x, y in seen), _BUNCHED)
        if b is None:
            if self._fit is None:
                return None  # one level only: nothing says what more runs would do
            b = self._fit[1]
        a = mean_y - b * mean_x
        if b <= 0 or a + b <= 0:
            return None  # more runs at once do not slow them (or the fit is noise)
        residuals = sorted(y - (a + b * x) for x, y in seen)
        step = len(residuals) / _SPREAD
        self._spread = [residuals[int((i + 0.5) * step)] for i in range(_SPREAD)]
        return a, b

    def _best(self, a: float, b: float) -> int | None:
        """The number of runs at once that meets the most deadlines per second, searched up
        to twice the highest level recent runs saw (or the cap in force, if higher: a
        quiet spell does not shrink it). Best at that top: None if no cap was in force
        (the gate would not bind), else the top (the cap grows with what was seen, never
        at once to any number)."""
        budgets = sorted(self._budgets)
        if not budgets:
            return self._cap
        top = max(2, int(max(x for x, _ in self._seen) * 2) + 1, self._cap or 0)
        best, best_value = 1, -1.0
        total = len(budgets) * len(self._spread)
        for n in _levels(top):
            took = a + b * n
            if took <= 0:
                continue
            # Runs taking about `took` at this level, spread as the fit's residuals are.
            met = sum(len(budgets) - bisect.bisect_left(budgets, took + r) for r in self._spread)
            value = n / took * met / total
            if value > best_value * (1 + 1e-9):
                best, best_value = n, value
        if best >= top:
            return None if self._cap is None else top
        return best

    @property
    def learned(self) -> bool:
        """Whether the gate has a fit (it predicts run times, caps runs and judges them late
        once enough runs were seen for the share: `_runs_to_tell`)."""
        self.cap()
        return self._fit is not None

    def _judges(self, share: float) -> bool:
        """Whether enough runs were seen to tell what `share` of them take."""
        return len(self._seen) >= _runs_to_tell(share)

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
        return GateStats(
            cap=cap,
            in_flight=len(self._open),
            waiting=len(self._queued),
            late_waiting=sum(entry.late for entry in self._queued.values()),
            seen=len(self._seen),
            base_s=None if fit is None else fit[0],
            per_run_s=None if fit is None else fit[1],
            held=self.held,
            shed=self.shed,
        )


def _levels(top: int) -> list[int]:
    """1, 2, ... `_EXACT`, then levels 2% apart, up to `top`."""
    levels = list(range(1, min(top, _EXACT) + 1))
    n = float(_EXACT)
    while levels[-1] < top:
        n *= 1.02
        levels.append(min(top, int(n)))
    return levels
