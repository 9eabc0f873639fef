"""One in-flight limit per LLM backend for several engines together (docs/scaling.md).

With one engine, `Limits(max_in_flight=N)` bounds the calls it sends a backend. Several
engines sending to the same servers each with their own N would send up to N per engine:
the shared budget splits N between them instead. Each engine *holds* some of the N slots
and admits calls only up to what it holds; every `every_s` it tells a broker what it has in
flight and what it wants (urgent calls apart from the rest, waiting or in flight) and gets
its new share back:

- targets: the N slots are shared max-min fairly over the urgent wants of all engines
  first, then what is left over the other wants, then what nobody wants evenly (so an
  engine whose demand grows finds room at once); program-first across engines, at the
  level of classes: one engine's batch never holds slots another engine's urgent work is
  waiting for, past one round;
- safety: an engine grows only into slots no other engine holds; one above its target
  admits nothing more at once, and holds what it has in flight until those calls end
  (calls cannot be called back): its next rounds give the slots back as they free. So the
  engines together never hold more than N, and each has in flight at most what it holds:
  never more than N calls in flight on the backend.

An engine that stops reporting (it died) keeps its slots until its row runs out
(`lease_s`), then they go to the others. The broker is the store (`SQLStore` keeps the rows in
`plait_slots`, one transaction per report), or `LocalSlots` for engines in one process (the
simulated cluster, tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..durability._store import StoreError
from ..model._clock import Clock
from ..model._errors import UsageError

_log = logging.getLogger("plait.slots")


@dataclass(frozen=True, slots=True)
class SlotRow:
    """One engine's row for one backend."""

    held: int
    want_urgent: int
    want_batch: int


def fill(budget: int, wants: Mapping[str, int]) -> dict[str, int]:
    """Max-min fair shares of `budget` over `wants` (no one gets more than it wants; what
    the smaller wants leave goes to the larger ones), in whole slots."""
    shares = dict.fromkeys(wants, 0)
    left = budget
    open_ = sorted((k for k, w in wants.items() if w > 0), key=lambda k: (wants[k], k))
    while open_ and left > 0:
        each = left // len(open_)
        if each == 0:  # fewer slots than engines: one each, in name order
            for k in sorted(open_)[:left]:
                shares[k] += 1
            return shares
        smallest = open_[0]
        step = min(each, wants[smallest] - shares[smallest])
        for k in open_:
            shares[k] += step
        left -= step * len(open_)
        open_ = [k for k in open_ if shares[k] < wants[k]]
    return shares


def targets(limit: int, rows: Mapping[str, SlotRow]) -> dict[str, int]:
    """What each engine should hold: urgent wants first, then the rest, then what is left
    evenly (the first engines by name take the remainder)."""
    urgent = fill(limit, {k: r.want_urgent for k, r in rows.items()})
    left = limit - sum(urgent.values())
    other = fill(left, {k: r.want_batch for k, r in rows.items()})
    shares = {k: urgent[k] + other[k] for k in rows}
    spare = limit - sum(shares.values())
    names = sorted(rows)
    for i, k in enumerate(names):
        shares[k] += spare // len(names) + (1 if i < spare % len(names) else 0)
    return shares


def allot(limit: int, me: str, in_flight: int, rows: Mapping[str, SlotRow]) -> tuple[int, int]:
    """`me`'s new (held, admit): it may admit calls up to `admit`, its target within what
    the others do not hold; it holds that, or what it has in flight if more (calls cannot
    be called back: it admits nothing until they are down to `admit`). `rows` are the live
    engines' rows, `me`'s with its new wants."""
    others = sum(r.held for k, r in rows.items() if k != me)
    admit = max(0, min(targets(limit, rows)[me], limit - others))
    return max(in_flight, admit), admit


@runtime_checkable
class SlotBroker(Protocol):
    """Where engines share their backends' in-flight limits: one call per engine, backend
    and round; the answer is what the engine may hold until its next round."""

    async def share(
        self,
        backend: str,
        engine: str,
        *,
        limit: int,
        in_flight: int,
        want_urgent: int,
        want_batch: int,
        lease_s: float,
    ) -> int: ...

    async def leave(self, engine: str) -> None:
        """The engine stops: its slots go to the others at once."""


class LocalSlots:
    """A `SlotBroker` for engines in one process (the simulated cluster, tests): rows in a
    dict, times on `clock`."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._rows: dict[str, dict[str, tuple[SlotRow, float]]] = {}

    async def share(
        self,
        backend: str,
        engine: str,
        *,
        limit: int,
        in_flight: int,
        want_urgent: int,
        want_batch: int,
        lease_s: float,
    ) -> int:
        now = self._clock.monotonic()
        table = self._rows.setdefault(backend, {})
        for gone in [k for k, (_, until) in table.items() if until < now]:
            del table[gone]
        held = table[engine][0].held if engine in table else 0
        live = {k: row for k, (row, _) in table.items()}
        live[engine] = SlotRow(held, want_urgent, want_batch)
        held, admit = allot(limit, engine, in_flight, live)
        table[engine] = (SlotRow(held, want_urgent, want_batch), now + lease_s)
        return admit

    async def leave(self, engine: str) -> None:
        for table in self._rows.values():
            table.pop(engine, None)

    def held(self, backend: str) -> dict[str, int]:
        """What each engine holds of `backend` now (tests, the simulated cluster's report)."""
        return {k: row.held for k, (row, _) in self._rows.get(backend, {}).items()}


Demand = Callable[[str], tuple[int, int, int]]
"""(in flight, urgent wanted, other wanted) of a backend in this engine."""


class SharedLimits:
    """The engine's side of shared limits: every `every_s`, for each backend, report the
    demand and apply the share (`set_share`)."""

    def __init__(
        self,
        broker: SlotBroker,
        engine: str,
        limits: Mapping[str, int],
        clock: Clock,
        *,
        demand: Demand,
        set_share: Callable[[str, int], None],
        every_s: float = 0.25,
        lease_s: float = 10.0,
    ) -> None:
        if not every_s > 0 or not lease_s > every_s:
            raise UsageError(
                f"shared limits: every_s={every_s} must be positive and below lease_s={lease_s}"
            )
        self.broker = broker
        self.engine = engine
        self.limits = dict(limits)
        self.every_s = every_s
        self.lease_s = lease_s
        self._clock = clock
        self._demand = demand
        self._set_share = set_share
        self.shares: dict[str, int] = dict.fromkeys(limits, 0)
        started = clock.monotonic()
        self._answered: dict[str, float] = dict.fromkeys(limits, started)
        """When each backend's report last went through (the engine's clock)."""
        self.rounds = 0
        self.failures = 0

    async def round(self) -> None:
        """Report every backend's demand and apply its share. While a report is on its way
        the engine admits nothing more on that backend (its share is held at what it has in
        flight), so what the broker is told stays true until its answer is applied. A
        broker that fails, or does not answer within `every_s`, leaves the share as it was
        while the row still holds (half its lease since the last answer); past that the
        engine admits nothing more until a round goes through."""
        now = self._clock.monotonic()
        for backend, limit in self.limits.items():
            in_flight, urgent, other = self._demand(backend)
            held = self.shares[backend]
            self._set_share(backend, min(held, in_flight))  # nothing more until answered
            try:
                async with asyncio.timeout(self.every_s):
                    share = await self.broker.share(
                        backend,
                        self.engine,
                        limit=limit,
                        in_flight=in_flight,
                        want_urgent=urgent,
                        want_batch=other,
                        lease_s=self.lease_s,
                    )
            except (StoreError, TimeoutError) as exc:
                self.failures += 1
                _log.warning(
                    "engine %s: shared limit of %r not renewed: %s", self.engine, backend, exc
                )
                if now - self._answered[backend] < self.lease_s / 2:
                    self._set_share(backend, held)  # the row still holds: keep the share
                    continue
                # Its row may run out soon and others take the slots: admit nothing more
                # (the calls in flight drain before the row's lease ends, unless they take
                # longer than half of it).
                share = 0
            else:
                self._answered[backend] = now
            self.shares[backend] = share
            self._set_share(backend, share)
        self.rounds += 1

    async def run(self) -> None:
        while True:
            await self._clock.sleep(self.every_s)
            await self.round()

    async def leave(self) -> None:
        try:
            await self.broker.leave(self.engine)
        except StoreError as exc:
            _log.warning("engine %s: shared limits not left (%s): they run out", self.engine, exc)
        except asyncio.CancelledError:
            raise
