"""Several engines on one store: leases, heartbeats and take-over (docs/scaling.md).

Each engine in a cluster has an id (its *owner* name in the store). A run it starts is leased
to it in the same transaction that first writes the run; a heartbeat extends the leases of
all its runs every `lease_s / 4`. An engine that dies stops renewing; once a run's lease has
run out, another engine claims it (`LeaseStore.claim`: a row lock taken with `SKIP LOCKED`,
so engines claiming at once split the work instead of waiting on each other) and resumes it
from its log: finished tasks keep their results, recorded LLM calls are not paid for again.

Exactly once: every batch an engine writes is fenced (`StoreBatch.owner`): it is written only
if the engine still holds the lease of every workflow it touches. An engine that stalled past
its lease and comes back finds the runs taken over on its next write (`LeaseLostError`); it
lets them go without writing anything more of them. An engine that cannot renew its leases
for most of `lease_s` (the store unreachable) lets every run go on its own, before another
engine may take them, so two engines never run one workflow's tasks for long.

A clean shutdown releases the engine's leases, so others take its runs over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from ..durability._journal import event_json, read_log
from ..durability._registry import Registry
from ..durability._replay import rebuild
from ..durability._store import CancelStore, EventRecord, LeaseStore, StoreBatch, StoreError
from ..model._clock import Clock
from ..model._errors import UsageError
from ..model._events import Event, TaskCancelled, WorkflowFinished
from ._slots import SlotBroker

_log = logging.getLogger("plait.cluster")
REFUSED_LEASES = 10
"""A run claimed and found not resumable here waits this many leases before the next try."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """Run this engine as one of several sharing its store (`Engine(cluster=...)`).

    `lease_s`: how long a run stays with an engine that stopped renewing it; take-over
    happens between `lease_s` and 1.25 x `lease_s` after an engine dies. `engine_id`: this
    engine's name in the store (default: host, process id and a random suffix; it must be
    unique among live engines). `registry`: finds the code of runs taken over (as for
    `Engine.resume`; default: found by import). `take_over`: claim runs whose lease ran out
    (False: this engine only runs what it was given). `claim_batch`: runs claimed at a time.
    Engines in one process without a store (a simulated cluster) share only their limits,
    through `share_limits=LocalSlots(clock)`.
    """

    lease_s: float = 10.0
    engine_id: str | None = None
    registry: Registry | None = None
    take_over: bool = True
    claim_batch: int = 100
    share_limits: bool | SlotBroker = True
    """Each LLM backend's `Limits.max_in_flight` bounds all engines together (the store
    keeps each engine's share; give every engine the same limits). A `SlotBroker`: it keeps
    the shares instead of the store. False: per engine."""
    share_every_s: float = 0.25
    """How often an engine reports its demand and takes its new share."""

    def __post_init__(self) -> None:
        if not isinstance(self.share_limits, bool | SlotBroker):
            raise UsageError(
                f"Cluster(share_limits={self.share_limits!r}) takes True (through the store), "
                "False (per engine) or a SlotBroker (LocalSlots for engines in one process)"
            )
        if not self.lease_s > 0:
            raise UsageError(f"Cluster(lease_s={self.lease_s}) must be positive")
        if self.claim_batch < 1:
            raise UsageError(f"Cluster(claim_batch={self.claim_batch}) must be at least 1")
        if self.engine_id is not None and not (0 < len(self.engine_id) <= 200):
            raise UsageError("Cluster(engine_id=...) must be 1 to 200 characters")
        if not 0 < self.share_every_s < self.lease_s:
            raise UsageError(
                f"Cluster(share_every_s={self.share_every_s}) must be positive and below "
                f"lease_s ({self.lease_s})"
            )

    @property
    def broker(self) -> bool:
        """Whether `share_limits` names a broker of its own (not the store)."""
        return not isinstance(self.share_limits, bool)

    def owner(self) -> str:
        """This engine's name in the store."""
        return self.engine_id if self.engine_id is not None else engine_name()


def engine_name() -> str:
    """A name for this engine unique among live ones: host, process id, a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(slots=True)
class LeaseStats:
    """What an engine's leases did since it started."""

    owner: str
    renewals: int = 0
    renewal_failures: int = 0
    claimed: int = 0
    """Runs this engine took over (or picked up unowned)."""
    resumed: int = 0
    lost: int = 0
    """Runs another engine took from this one (it had stalled past its lease)."""
    given_up: int = 0
    """Runs this engine let go because it could not renew their leases in time."""
    cancelled: int = 0
    """Runs claimed with a cancel asked, ended as cancelled without being resumed."""


class Leases:
    """The engine's side of a cluster: heartbeat, take-over, and letting go. Run `run()` as a
    task of the engine; the engine tells it how many more runs it can take (`room`) and how
    to resume runs (`resume`), and it tells the engine which runs to let go (`let_go`).
    `store` leases the runs; `cancel_store` (the same store, as a `CancelStore`) carries
    the cancels asked of runs held elsewhere."""

    def __init__(
        self,
        cluster: Cluster,
        store: LeaseStore,
        cancel_store: CancelStore,
        clock: Clock,
        *,
        room: Callable[[], int],
        resume: Callable[[Sequence[str]], Awaitable[list[str]]],
        let_go: Callable[[str], None],
        mine: Callable[[], Sequence[str]] = list,
        cancel: Callable[[str, str], object] | None = None,
    ) -> None:
        self.cluster = cluster
        self.owner = cluster.owner()
        self.store = store
        self.cancel_store = cancel_store
        self._clock = clock
        self._room = room
        self._resume = resume
        self._let_go = let_go
        self._mine = mine
        self._cancel = cancel
        self._given_up: set[str] = set()
        """Runs let go while the store could not be reached: released once it can."""
        self.stats = LeaseStats(self.owner)
        self._renewed_at = clock.monotonic()
        self._refused: set[str] = set()
        """Runs claimed that this engine could not resume: told once, released each time."""
        self.claimed = asyncio.Event()
        """Set after each round that claimed something (tests and benchmarks wait on it)."""

    @property
    def interval(self) -> float:
        return self.cluster.lease_s / 4

    async def start(self) -> None:
        """Before the engine writes anything: release the runs a process with this engine's
        id left (it died and this one took its name), so that they are claimed (by this
        engine or another) like any other. (Done later, it would release this engine's own
        first runs too.)"""
        with contextlib.suppress(StoreError):
            await self.store.release(self.owner)

    async def run(self) -> None:
        """Renew, then claim, every `interval` seconds, until cancelled (after `start`)."""
        while True:
            await self.beat()
            await self._clock.sleep(self.interval)

    async def beat(self) -> None:
        """One round: renew the leases of the runs this engine runs, then take over what
        ran out. A renewal that fails or takes longer than `interval` counts as failed; once
        half a lease has passed since the last one that went through, every run is let go:
        the time left before another engine may claim them covers the sleep and one more
        renewal's wait."""
        lease_s = self.cluster.lease_s
        started = self._clock.monotonic()
        try:
            async with asyncio.timeout(self.interval):
                if self._given_up:
                    given_up = sorted(self._given_up)
                    await self.store.release(self.owner, given_up)
                    self._given_up.difference_update(given_up)
                await self.store.renew(self.owner, lease_s, list(self._mine()))
        except (StoreError, TimeoutError) as exc:
            self.stats.renewal_failures += 1
            if started - self._renewed_at > 0.5 * lease_s:
                running = list(self._mine())
                if running:
                    _log.error(
                        "engine %s could not renew its leases for %.1f s (%s): letting its %d "
                        "run(s) go before another engine may take them over",
                        self.owner,
                        started - self._renewed_at,
                        exc or "timed out",
                        len(running),
                    )
                    self._given_up.update(running)
                    self.stats.given_up += len(running)
                    self._let_go("*")
            return
        self._renewed_at = started
        self.stats.renewals += 1
        if self._cancel is not None:
            await self.cancel_asked()
        if self.cluster.take_over:
            # A full batch resumed means more may be waiting: claim again (while there is
            # room) rather than leave them to the next round. (Runs it could not resume are
            # released, and would be claimed again: those end the round.)
            while len(await self.take_over()) >= self.cluster.claim_batch:
                pass

    async def _asked(self) -> dict[str, str]:
        """The runs this engine holds whose cancel was asked (`CancelStore.ask_cancel`), with
        the reason; nothing if the store does not answer within a heartbeat's interval."""
        try:
            async with asyncio.timeout(self.interval):
                return dict(await self.cancel_store.cancels(self.owner))
        except (StoreError, TimeoutError) as exc:
            _log.warning(
                "engine %s could not read the cancels asked of it: %s",
                self.owner,
                exc or "timed out",
            )
            return {}

    async def cancel_asked(self) -> None:
        """Cancel the runs this engine holds whose cancel another engine was asked for
        (`CancelStore.ask_cancel`: the notification that brings it sooner may be lost)."""
        assert self._cancel is not None
        for workflow, reason in (await self._asked()).items():
            try:
                self._cancel(workflow, reason)
            except Exception:  # the heartbeat must go on whatever one run does
                _log.exception("engine %s could not cancel %s as asked", self.owner, workflow)

    async def take_over(self) -> list[str]:
        """Claim runs nobody holds (their lease ran out, or they were released) up to this
        engine's room and `claim_batch`, and resume them; return the ids resumed."""
        room = min(self._room(), self.cluster.claim_batch)
        if room < 1:
            return []
        try:
            claimed = await self.store.claim(self.owner, self.cluster.lease_s, room)
        except StoreError as exc:
            _log.warning("engine %s could not claim runs: %s", self.owner, exc)
            return []
        if not claimed:
            return []
        self.stats.claimed += len(claimed)
        for c in claimed:
            if c.previous is not None:
                _log.info("engine %s takes over %s from %s", self.owner, c.workflow, c.previous)
        ids = [c.workflow for c in claimed]
        asked = await self._asked()
        for workflow in [w for w in ids if w in asked]:
            # Its cancel was asked while nobody held it: end it here without running it (it
            # may not even be resumable here).
            try:
                await self._finish_cancelled(workflow, asked[workflow])
            except Exception as exc:  # the heartbeat goes on; released, it is tried again
                _log.warning("engine %s could not cancel %s: %s", self.owner, workflow, exc)
                with contextlib.suppress(StoreError):
                    await self.store.release(self.owner, [workflow])
        ids = [w for w in ids if w not in asked]
        if not ids:
            self.claimed.set()
            return []
        try:
            resumed = await self._resume(ids)
        except Exception as exc:  # the store failed mid-way, the engine is full: next round
            _log.warning("engine %s could not resume the runs it claimed: %s", self.owner, exc)
            with contextlib.suppress(StoreError):
                await self.store.release(self.owner, ids)
            return []
        self.stats.resumed += len(resumed)
        refused = sorted(set(ids) - set(resumed))
        if refused:
            new = [w for w in refused if w not in self._refused]
            self._refused.update(new)
            if new:
                _log.error(
                    "engine %s claimed %d run(s) it cannot resume (%s); left to others "
                    "after %.0f s",
                    self.owner,
                    len(new),
                    ", ".join(new[:5]),
                    REFUSED_LEASES * self.cluster.lease_s,
                )
            # Held (not renewed) for a while, so that the next claims find the runs behind
            # them instead of these again; then any engine may try them.
            with contextlib.suppress(StoreError):
                await self.store.renew(self.owner, REFUSED_LEASES * self.cluster.lease_s, refused)
        self.claimed.set()
        return resumed

    async def _finish_cancelled(self, workflow: str, reason: str) -> None:
        """Write the end of a claimed run as cancelled, as the engine would have had it run
        here and been cancelled: its unfinished tasks cancelled, then the workflow."""
        row = await self.store.workflow(workflow)
        if row is None:
            return
        try:
            events, last = await read_log(self.store, workflow)
            unfinished = rebuild(events).unfinished()
        except StoreError:
            raise
        except Exception as exc:  # a log it cannot read: the workflow's end is still written
            _log.warning("the log of %s cannot be read (%s): ending it as cancelled", workflow, exc)
            records = await self.store.events(workflow)
            last, unfinished = (records[-1].seq if records else 0), []
        at = self._clock.monotonic()  # as the engine stamps its events
        now = time.time()
        ending: list[Event] = [
            TaskCancelled(workflow=workflow, task=task, reason=reason, at=at) for task in unfinished
        ]
        ending.append(
            WorkflowFinished(
                workflow=workflow, status="cancelled", duration=max(0.0, now - row.created), at=at
            )
        )
        await self.store.append(
            StoreBatch(
                events=[
                    EventRecord(workflow, last + i, e.kind, e.at, event_json(e))
                    for i, e in enumerate(ending, 1)
                ],
                workflows=[dataclasses.replace(row, status="cancelled", updated=now, finished=now)],
                owner=self.owner,
                lease_s=self.cluster.lease_s,
            )
        )
        self.stats.cancelled += 1
        _log.info("engine %s cancelled %s as asked, without resuming it", self.owner, workflow)

    def lost(self, workflows: Sequence[str]) -> None:
        """The journal found these runs taken over by another engine."""
        self.stats.lost += len(workflows)
        for workflow in workflows:
            self._let_go(workflow)

    async def release(self) -> None:
        """A clean shutdown: the runs left go to other engines at once."""
        try:
            await self.store.release(self.owner)
        except StoreError as exc:
            _log.warning(
                "engine %s could not release its leases (%s): they run out", self.owner, exc
            )
