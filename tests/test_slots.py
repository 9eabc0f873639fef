"""One in-flight limit per backend for several engines: the sharing rule (never more than
the limit held in all, urgent wants first, convergence), and engines that share a limit of 8
on one backend never having more than 8 calls in flight on it: in one process on the virtual
clock (`LocalSlots`), and through the store (SQLite, PostgreSQL) on wall time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

import pytest
from conftest import StoreFactory
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import (
    Cluster,
    Engine,
    Hints,
    Limits,
    LLMRequest,
    LLMResponse,
    Message,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.cluster._slots import LocalSlots, fill, targets
from orchestrator.ext import URGENT_CLASSES, SlotRow, allot


def test_fill_is_max_min_fair_and_never_gives_more_than_wanted() -> None:
    assert fill(10, {"a": 2, "b": 20, "c": 20}) == {"a": 2, "b": 4, "c": 4}
    assert fill(10, {"a": 1, "b": 1}) == {"a": 1, "b": 1}
    assert fill(2, {"a": 5, "b": 5, "c": 5}) == {"a": 1, "b": 1, "c": 0}
    assert fill(0, {"a": 5}) == {"a": 0}


def test_urgent_wants_come_first_and_what_nobody_wants_is_spread() -> None:
    rows = {"a": SlotRow(0, 10, 0), "b": SlotRow(0, 0, 30)}
    assert targets(8, rows) == {"a": 8, "b": 0}
    rows = {"a": SlotRow(0, 2, 0), "b": SlotRow(0, 0, 3), "c": SlotRow(0, 0, 0)}
    assert targets(8, rows) == {"a": 3, "b": 4, "c": 1}  # 3 spare: one each, a and b first


def test_an_engine_grows_only_into_free_slots_and_never_below_its_calls_in_flight() -> None:
    # b holds 8 of 8 and a now wants urgent work: a gets nothing until b shrinks ...
    rows = {"a": SlotRow(0, 5, 0), "b": SlotRow(8, 0, 8)}
    assert allot(8, "a", 0, rows) == (0, 0)
    # ... b's next round admits no more than its target (3), and holds its 6 in flight ...
    assert allot(8, "b", 6, rows) == (6, 3)
    rows = {"a": SlotRow(0, 5, 0), "b": SlotRow(6, 0, 8)}
    assert allot(8, "a", 0, rows) == (2, 2)
    # ... and once they are down, 3 (a's 5 urgent first).
    assert allot(8, "b", 1, {"a": SlotRow(2, 5, 0), "b": SlotRow(6, 0, 8)}) == (3, 3)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 40),
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(0, 30), st.floats(0, 1)),
        min_size=1,
        max_size=60,
    ),
)
def test_engines_reporting_in_any_order_never_hold_more_than_the_limit(
    limit: int, steps: list[tuple[int, int, int, float]]
) -> None:
    """Four engines report in a random order with random wants; each has some of what it
    holds in flight. After every report the held slots sum to at most the limit."""
    rows = {k: SlotRow(0, 0, 0) for k in "abcd"}
    in_flight = dict.fromkeys(rows, 0)
    for who, urgent, other, busy in steps:
        me = "abcd"[who]
        in_flight[me] = int(busy * rows[me].held)  # at most what it held
        wants = {**rows, me: SlotRow(rows[me].held, urgent, other)}
        held, admit = allot(limit, me, in_flight[me], wants)
        assert admit <= held
        rows[me] = SlotRow(held, urgent, other)
        assert sum(r.held for r in rows.values()) <= limit


def test_steady_wants_converge_to_the_fair_shares() -> None:
    rows = {"a": SlotRow(0, 0, 100), "b": SlotRow(0, 0, 100), "c": SlotRow(0, 4, 0)}
    for _ in range(3):
        for me in "abc":
            held, _ = allot(24, me, 0, rows)
            rows[me] = SlotRow(held, rows[me].want_urgent, rows[me].want_batch)
    assert {k: r.held for k, r in rows.items()} == {"a": 10, "b": 10, "c": 4}


# --- engines sharing a limit -------------------------------------------------------------------


class Counting:
    """A backend that answers after `seconds` on its clock (x 0.5 to 1.5 with `jitter`, so
    calls do not end in lockstep) and counts the calls in flight."""

    def __init__(self, sleep: object, seconds: float, jitter: bool = False) -> None:
        self.sleep = sleep
        self.seconds = seconds
        self.rng = random.Random(0) if jitter else None
        self.in_flight = 0
        self.most = 0
        self.calls = 0
        self.now: object = None
        self.starts: list[tuple[float, str | None, int, int]] = []
        """(time, class, batch calls in flight with it, urgent calls finished before it)."""
        self.batch_in_flight = 0
        self.urgent_done = 0

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        if self.now is not None:
            batch = hints.service not in URGENT_CLASSES
            self.batch_in_flight += batch
            when = self.now()  # type: ignore[operator]
            self.starts.append((when, hints.service, self.batch_in_flight, self.urgent_done))
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            scale = 1.0 if self.rng is None else 0.5 + self.rng.random()
            await self.sleep(self.seconds * scale)  # type: ignore[operator]
        finally:
            self.in_flight -= 1
        self.calls += 1
        if self.now is not None:
            if hints.service in URGENT_CLASSES:
                self.urgent_done += 1
            else:
                self.batch_in_flight -= 1
        return LLMResponse(text="ok")


async def ask(ctx: TaskContext) -> str:
    reply = await ctx.complete(LLMRequest((Message("user", "hi"),), "m"))
    return reply.text


def asks(name: str, n: int) -> Workflow:
    wf = Workflow(name)
    for i in range(n):
        wf.add(f"q{i}", ask)
    return wf


def totals(results: Mapping[str, int]) -> int:
    return sum(results.values())


def sharing(
    backend: Counting, broker: LocalSlots, clock: VirtualClock, limits: dict[str, Limits]
) -> Engine:
    """An engine whose limits are shared through `broker`."""
    return Engine(
        backends={"default": backend},
        clock=clock,
        limits=limits,
        cluster=Cluster(share_limits=broker),
    )


def test_two_engines_with_a_shared_limit_of_8_never_have_more_than_8_in_flight() -> None:
    clock = VirtualClock()

    async def main() -> tuple[int, int, dict[str, int]]:
        backend = Counting(clock.sleep, 0.5)
        broker = LocalSlots(clock)
        limits = {"default": Limits(max_in_flight=8)}
        a, b = sharing(backend, broker, clock, limits), sharing(backend, broker, clock, limits)
        async with a, b:
            runs = [a.run(asks(f"a{i}", 10)) for i in range(6)]
            runs += [b.run(asks(f"b{i}", 10)) for i in range(6)]
            results = await asyncio.gather(*runs)
            assert all(r.ok for r in results)
            held = broker.held("default")
        return backend.most, backend.calls, held

    most, calls, held = clock.run(main())
    assert calls == 120
    assert most == 8  # the limit is reached, and never passed
    assert sum(held.values()) <= 8


def test_without_a_shared_limit_two_engines_send_twice_as_many() -> None:
    """The baseline the shared limit is for: each engine's own limit of 8 adds up."""
    clock = VirtualClock()

    async def main() -> int:
        backend = Counting(clock.sleep, 0.5)
        limits = {"default": Limits(max_in_flight=8)}
        a = Engine(backends={"default": backend}, clock=clock, limits=limits)
        b = Engine(backends={"default": backend}, clock=clock, limits=limits)
        async with a, b:
            await asyncio.gather(a.run(asks("a", 20)), b.run(asks("b", 20)))
        return backend.most

    assert clock.run(main()) == 16


def test_urgent_work_on_one_engine_takes_the_slots_of_batch_work_on_another() -> None:
    """Engine b saturates the backend with batch work; an interactive run of 8 calls
    arrives at a: within two rounds (a reports its urgent want, b's next round shrinks b to
    what is left) b never starts a call that would leave a's unfinished urgent calls fewer
    slots than they need, and a takes the slots as b's calls end."""
    clock = VirtualClock()

    async def main() -> tuple[float, float, list[float]]:
        backend = Counting(clock.sleep, 0.5, jitter=True)
        backend.now = clock.monotonic
        broker = LocalSlots(clock)
        limits = {"default": Limits(max_in_flight=8)}
        a, b = sharing(backend, broker, clock, limits), sharing(backend, broker, clock, limits)
        async with a, b:
            batch = asyncio.ensure_future(b.run(asks("batch", 200)))
            await clock.sleep(2.0)
            started = clock.monotonic()
            urgent = await a.run(asks("urgent", 8), priority="interactive")
            assert urgent.ok
            ended = clock.monotonic()
            await batch
            # Batch calls started after two rounds that took a slot urgent work needed:
            # with them in flight, fewer than the 8 - done unfinished urgent calls fit.
            crowding = [
                t - started
                for t, cls, batch_flying, done in backend.starts
                if cls not in URGENT_CLASSES
                and started + 0.5 < t < ended
                and batch_flying + (8 - done) > 8
            ]
            return ended - started, backend.most, crowding

    took, most, batch_starts = clock.run(main())
    assert most == 8
    assert batch_starts == []
    # Two rounds of 0.25 s, b's calls in flight draining, one call (up to 0.75 s each).
    assert took <= 2.0


def test_engines_share_a_limit_through_the_store(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as sa_, make_store() as sb:
            backend = Counting(asyncio.sleep, 0.01)
            limits = {"default": Limits(max_in_flight=8)}
            common = {"backends": {"default": backend}, "limits": limits}
            a = Engine(store=sa_, cluster=Cluster(lease_s=5, engine_id="a"), **common)  # type: ignore[arg-type]
            b = Engine(store=sb, cluster=Cluster(lease_s=5, engine_id="b"), **common)  # type: ignore[arg-type]
            async with a, b:
                runs = [a.run(asks(f"a{i}", 10)) for i in range(4)]
                runs += [b.run(asks(f"b{i}", 10)) for i in range(4)]
                results = await asyncio.gather(*runs)
            assert all(r.ok for r in results)
            assert backend.calls == 80 and 1 <= backend.most <= 8

    asyncio.run(main())


def test_a_cluster_on_a_store_that_cannot_lease_runs_says_so() -> None:
    from conftest import MemoryStore

    with pytest.raises(UsageError, match="leases its runs to engines"):
        Engine(store=MemoryStore(), cluster=Cluster())
    with pytest.raises(UsageError, match="leases its runs to engines"):
        Engine(store=MemoryStore(), cluster=Cluster(share_limits=False))
