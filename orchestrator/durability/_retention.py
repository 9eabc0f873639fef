"""Retention: what a store keeps of finished workflows, and the sweeper that applies it.

A long-running service appends every event of every run, so its store grows without end
unless finished runs are shrunk and, later, dropped. `Retention` says when: compact a run
`compact_after` seconds after it finished (its log keeps what rebuilds it, see
`compactable`), delete it `delete_after` seconds after, and keep at most `keep_last`
finished runs. Unfinished runs are never touched: they are what a resume needs whole.

`sweep_once(store, retention, now)` applies the policy once; `Sweeper` runs it every
`retention.every` seconds on the engine's clock, as a task of the engine's TaskGroup
(`Engine(store=..., retention=Retention(...))`). A sweep that fails is logged and told to
`next_sweep()` waiters, and the next one tries again: the store's writes are transactions,
so a failed sweep leaves each workflow as it was or as it should be, never half-compacted.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..model._clock import Clock
from ..model._errors import UsageError, error_text
from ._store import RetainingStore

log = logging.getLogger("plait.retention")

_COMPACT_CHUNK = 100
"""Workflows per `RetainingStore.compact` call of a sweep: the sweeper checks for `stop()`
between calls, so closing the engine waits for one chunk at most, not a whole backlog."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    """When finished workflows are compacted and deleted; all times in seconds.

    `compact_after`: compact a run this long after it finished (None: never compact). An
    hour by default, so a run's whole history is there while someone may look into it.
    `delete_after`: delete it this long after it finished (None: never by age). A week.
    `keep_last`: keep at most this many finished runs, the most recently finished (None: no
    bound by count). A run past either bound is deleted.
    `every`: seconds between two sweeps (the first one runs when the engine starts)."""

    compact_after: float | None = 3600.0
    delete_after: float | None = 7 * 86400.0
    keep_last: int | None = None
    every: float = 300.0

    def __post_init__(self) -> None:
        for name in ("compact_after", "delete_after"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UsageError(
                    f"Retention({name}={value!r}) must be seconds, 0 or more, or None for never"
                )
        if self.keep_last is not None and self.keep_last < 0:
            raise UsageError(f"Retention(keep_last={self.keep_last}) must be 0 or more, or None")
        if not (math.isfinite(self.every) and self.every > 0):
            raise UsageError(f"Retention(every={self.every!r}) must be seconds above zero")

    def cutoffs(self, now: float) -> tuple[float | None, float | None]:
        """(compact runs finished before, delete runs finished before) at epoch time `now`."""
        compact = None if self.compact_after is None else now - self.compact_after
        delete = None if self.delete_after is None else now - self.delete_after
        return compact, delete


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep did: workflows deleted and compacted, payloads collected. `error` is
    the failure that cut it short (what was done before it stays done)."""

    deleted: int = 0
    compacted: int = 0
    collected: int = 0
    error: str | None = None


async def sweep_once(
    store: RetainingStore,
    retention: Retention,
    now: float,
    *,
    stopping: Callable[[], bool] = lambda: False,
) -> SweepReport:
    """Apply `retention` once at epoch time `now`: delete, then compact what is left, then
    collect the payloads nothing references any more (only if something went). Stops between
    two compaction chunks once `stopping()` is true. Raises what the store raises."""
    compact_before, delete_before = retention.cutoffs(now)
    deleted = 0
    if delete_before is not None or retention.keep_last is not None:
        deleted = await store.retain(finished_before=delete_before, keep_last=retention.keep_last)
    compacted = 0
    if compact_before is not None:
        while not stopping():
            done = await store.compact(finished_before=compact_before, limit=_COMPACT_CHUNK)
            compacted += done
            if done < _COMPACT_CHUNK:
                break
    collected = await store.collect_garbage() if deleted or compacted else 0
    return SweepReport(deleted, compacted, collected)


@dataclass(frozen=True, slots=True)
class SweeperStats:
    sweeps: int
    failures: int
    deleted: int
    compacted: int
    collected: int
    last_error: str | None


class Sweeper:
    """Runs `sweep_once` now and then every `retention.every` seconds on `clock`, until
    `stop()`. Run `run()` as a task of the owner's TaskGroup; it never raises a sweep's
    failure (it logs it and tries again at the next period)."""

    def __init__(self, store: RetainingStore, retention: Retention, clock: Clock) -> None:
        self.store = store
        self.retention = retention
        self.clock = clock
        self._stopping = False
        self._sweeping = False
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[asyncio.Future[SweepReport]] = []
        self._sweeps = self._failures = 0
        self._deleted = self._compacted = self._collected = 0
        self._last_error: str | None = None

    @property
    def stats(self) -> SweeperStats:
        return SweeperStats(
            self._sweeps,
            self._failures,
            self._deleted,
            self._compacted,
            self._collected,
            self._last_error,
        )

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            while not self._stopping:
                self._sweeping = True
                try:
                    report = await self._sweep()
                finally:
                    self._sweeping = False
                self._tell(report)
                if self._stopping:
                    return
                await self.clock.sleep(self.retention.every)
        except asyncio.CancelledError:
            if self._stopping and not self._sweeping:
                return  # stop() between two sweeps: nothing was under way
            raise
        finally:
            self._tell(SweepReport(error="the sweeper stopped"))

    def stop(self) -> None:
        """Stop after the sweep under way, if any (it ends at its next chunk), else now."""
        self._stopping = True
        if self._task is not None and not self._sweeping:
            self._task.cancel()

    async def next_sweep(self) -> SweepReport:
        """The report of the next sweep to end (an error report if the sweeper stops)."""
        future: asyncio.Future[SweepReport] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        return await future

    async def _sweep(self) -> SweepReport:
        try:
            report = await sweep_once(
                self.store, self.retention, self.clock.now(), stopping=lambda: self._stopping
            )
        except Exception as exc:
            # Retention is housekeeping: a failure must not stop the runs. The store keeps
            # each workflow whole (its writes are transactions); the next sweep tries again.
            self._failures += 1
            self._last_error = error_text(exc)
            log.warning("retention sweep failed (the next one tries again): %s", error_text(exc))
            return SweepReport(error=self._last_error)
        self._sweeps += 1
        self._deleted += report.deleted
        self._compacted += report.compacted
        self._collected += report.collected
        return report

    def _tell(self, report: SweepReport) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(report)


# --- what a finished run's log can do without ----------------------------------------------

_TASK_KINDS = frozenset(
    {
        "task_added",
        "task_replaced",
        "task_removed",
        "task_ready",
        "task_started",
        "task_retrying",
        "call_retrying",
        "task_succeeded",
        "task_failed",
        "task_skipped",
        "task_cancelled",
    }
)


def compactable(events: Iterable[tuple[int, Mapping[str, Any]]]) -> list[int]:
    """The seqs of the events a finished run's log can do without, in order: folding the
    rest with `rebuild()` gives the same `RunImage` but for its event count. `events` are
    one run's (seq, event data) in seq order; only `kind`, `task`, `attempt` and `attempts`
    are read.

    This mirrors `_replay._apply`: call_retrying changes nothing; task_ready, task_retrying
    and task_started set a state a later event of the task sets again (task_started also sets
    the attempt count, so it goes only if a later event sets that too, or if it is the first
    attempt of a task that then succeeded: `rebuild` counts a success as one attempt at
    least). task_added and task_removed start a task's image over. Nothing else goes:
    mutations, edges, final states (which carry results and errors), workflow events."""
    log = [
        (seq, data["kind"], data.get("task", ""), data)
        for seq, data in events
        if data["kind"] in _TASK_KINDS
    ]
    drop: set[int] = set()
    first_attempts: set[int] = set()
    """task_started(1) events kept for their attempt count alone."""
    state_set: set[str] = set()  # tasks whose state a later event sets
    attempts_set: set[str] = set()  # ... and whose attempt count
    for seq, kind, task, data in reversed(log):
        if kind == "call_retrying":
            drop.add(seq)
        elif kind in ("task_added", "task_removed"):
            state_set.add(task)
            attempts_set.add(task)
        elif kind in ("task_ready", "task_retrying"):
            if task in state_set:
                drop.add(seq)
            state_set.add(task)
        elif kind == "task_started":
            if task in state_set and task in attempts_set:
                drop.add(seq)
            elif task in state_set and data.get("attempt") == 1:
                first_attempts.add(seq)
            state_set.add(task)
            attempts_set.add(task)
        else:  # task_replaced and the final states set the state
            state_set.add(task)
            if kind == "task_failed":
                attempts_set.add(task)
    # A first attempt's task_started goes if the task's next event that touches its attempt
    # count is its success, and the count before it is at most 1 (in the log as compacted):
    # the success then counts 1, as the task_started did.
    attempts: dict[str, int] = {}
    candidate: dict[str, int] = {}
    for seq, kind, task, data in log:
        if seq in drop or kind not in _COUNTING:
            continue
        held = candidate.pop(task, None)
        if held is not None:
            if kind == "task_succeeded":
                drop.add(held)
            else:
                attempts[task] = 1  # kept after all: the count is the one it set
        if kind == "task_started":
            if seq in first_attempts and attempts.get(task, 0) <= 1:
                candidate[task] = seq  # the count stays as it was unless it is kept
            else:
                attempts[task] = int(data["attempt"])
        elif kind == "task_succeeded":
            attempts[task] = max(attempts.get(task, 0), 1)
        elif kind == "task_failed":
            attempts[task] = int(data["attempts"])
        elif kind in ("task_added", "task_removed"):
            attempts[task] = 0
    return sorted(drop)


_COUNTING = frozenset(
    {
        "task_added",
        "task_removed",
        "task_started",
        "task_succeeded",
        "task_failed",
        "task_skipped",
        "task_cancelled",
    }
)
"""The events after which a held first attempt's task_started is decided on."""
