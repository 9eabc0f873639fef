"""The deadline gate: runs with a deadline start earliest deadline first, as many at once as
the gate learned meets the most deadlines; a waiting run that cannot make it is shed
(`late="cancel"`) or moved behind the rest (virtual time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from orchestrator import (
    Engine,
    Limits,
    TaskContext,
    UnknownResourceError,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.admission._gate import RunGate
from orchestrator.admission._queue import Admission
from orchestrator.ext import AdmissionTuning, DeadlineGate


@dataclass
class _Run:
    """What the gate reads of a run."""

    deadline: float | None
    started_at: float = 0.0
    late: str = "finish"
    complete: bool = False


def _teach(gate: RunGate, a: float, b: float, levels: range, now: float = 0.0) -> float:
    """Runs that each take `a + b x level` seconds with `level` runs in flight, level by
    level: the gate sees exactly that line."""
    for level in levels:
        runs = [_Run(deadline=now + 1_000.0, started_at=now) for _ in range(level)]
        for run in runs:
            gate.arrive(run, now)
        opened, _ = gate.release(now)
        assert len(opened) == level  # nothing is capped while it learns
        now += a + b * level
        for run in runs:
            gate.ended(run, now, ok=True)
    return now


def _budgets(gate: RunGate, seconds: float, n: int = 50) -> None:
    """Deadlines submitted recently: `n` runs given `seconds` each (withdrawn at once)."""
    for _ in range(n):
        run = _Run(deadline=seconds)
        gate.arrive(run, 0.0)
        run.complete = True
        gate.withdraw(run, 0.0)


def test_nothing_waits_until_enough_runs_have_ended() -> None:
    gate = RunGate(DeadlineGate(min_seen=10))
    _teach(gate, 2.0, 1.0, range(1, 4))  # 6 runs over three levels
    assert gate.cap() is None and not gate.learned
    runs = [_Run(deadline=5.0) for _ in range(30)]
    for run in runs:
        gate.arrive(run, 100.0)
    opened, hopeless = gate.release(100.0)
    assert len(opened) == 30 and hopeless == []
    assert not any(gate.holds(run) for run in runs)


def test_by_default_the_gate_learns_from_five_runs() -> None:
    """The fit needs `min_seen` (5) ended runs over two levels or more: runs of an overload
    wait early, before it has filled the server."""
    gate = RunGate(DeadlineGate())
    now = _teach(gate, 2.0, 1.0, range(1, 2))  # 1 run alone
    now = _teach(gate, 2.0, 1.0, range(3, 4), now)  # 4 runs: three more, together
    assert not gate.learned
    _teach(gate, 2.0, 1.0, range(1, 2), now)  # 5
    assert gate.learned


def test_a_run_is_shed_only_once_enough_runs_tell_what_most_take() -> None:
    """What 90% of runs take (`sure`, for `late="cancel"`) needs ten runs seen; what 70%
    take (`likely`), four. With six seen, a `late="cancel"` run short of time is not shed
    (it starts), while a default one is judged late; with ten seen, it is shed."""
    gate = RunGate(DeadlineGate())
    now = _teach(gate, 2.0, 1.0, range(1, 4))  # 6 runs over three levels
    assert gate.learned
    cancel, finish = (_Run(deadline=now + 1.0, late=late) for late in ("cancel", "finish"))
    for run in (cancel, finish):
        gate.arrive(run, now)
    opened, hopeless = gate.release(now)
    assert [run for run, _ in hopeless] == [finish]  # judged late (it starts as spare)
    assert cancel in opened  # not judged: six runs cannot tell what 90% take
    for run in opened:
        gate.withdraw(run, now)
    now = _teach(gate, 2.0, 1.0, range(4, 5), now)  # 10 runs
    again = _Run(deadline=now + 1.0, late="cancel")
    gate.arrive(again, now)
    opened, hopeless = gate.release(now)
    assert opened == [] and [run for run, _ in hopeless] == [again]


def test_the_cap_is_the_level_that_meets_the_most_deadlines_per_second() -> None:
    """Runs take 2 + n seconds with n in flight and every deadline is 10 s: up to 8 at once
    all are met (8 runs per 10 s); a ninth makes every one late."""
    gate = RunGate(DeadlineGate())
    _teach(gate, 2.0, 1.0, range(1, 7))
    stats = gate.stats()
    assert stats.base_s == pytest.approx(2.0) and stats.per_run_s == pytest.approx(1.0)
    _budgets(gate, 10.0, n=200)  # the recent deadlines are all 10 s
    assert gate.cap() == 8


def test_runs_that_do_not_slow_each_other_are_never_held() -> None:
    gate = RunGate(DeadlineGate())
    _teach(gate, 5.0, 0.0, range(1, 7))
    _budgets(gate, 6.0)
    assert gate.cap() is None
    runs = [_Run(deadline=1_000.0) for _ in range(50)]
    for run in runs:
        gate.arrive(run, 0.0)
    assert len(gate.release(0.0)[0]) == 50


def test_waiting_runs_start_earliest_deadline_first_as_runs_end() -> None:
    gate = RunGate(DeadlineGate())
    now = _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    cap = gate.cap()
    assert cap == 8
    first = [_Run(deadline=now + 900.0, started_at=now) for _ in range(cap)]
    for run in first:
        gate.arrive(run, now)
    assert len(gate.release(now)[0]) == cap
    late, soon, middle = (_Run(deadline=now + d, started_at=now) for d in (800.0, 200.0, 500.0))
    for run in (late, soon, middle):
        gate.arrive(run, now)
    assert gate.release(now) == ([], [])  # full: all three wait
    assert gate.holds(late) and gate.holds(soon) and gate.holds(middle)
    order = []
    for run in first[:3]:
        gate.ended(run, now + 1.0, ok=True)
        opened, _ = gate.release(now + 1.0)
        order.extend(opened)
    assert order == [soon, middle, late]
    assert not gate.holds(soon)


def test_a_waiting_run_that_cannot_make_it_is_shed_or_moved_behind() -> None:
    """Runs take 2 + n s. With none in flight, a `late="cancel"` run with 2.5 s left is
    shed before it starts; a default one with 2.8 s is judged late, and (with
    `late_in_flight=1`) starts as the one run of its kind kept in flight."""
    gate = RunGate(DeadlineGate(late_in_flight=1))
    now = _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    hopeless_cancel = _Run(deadline=now + 2.5, late="cancel")
    hopeless_finish = _Run(deadline=now + 2.8)
    feasible = _Run(deadline=now + 9.0)
    for run in (hopeless_cancel, hopeless_finish, feasible):
        gate.arrive(run, now)
    opened, hopeless = gate.release(now)
    # Judged by what 90% of runs take with one in flight (3 s) for the late="cancel" run,
    # by what 70% take (3 s too: the fit is exact) for the other.
    assert hopeless == [(hopeless_cancel, 3.0), (hopeless_finish, 3.0)]
    # no run judged late is in flight, so this one starts at once (`late_in_flight=1`)
    assert opened == [hopeless_finish, feasible]
    assert gate.holds(hopeless_cancel)  # the engine cancels it; the gate never lets it in
    assert gate.stats().shed == 2


def _teach_spread(gate: RunGate, levels: range) -> float:
    """Runs that take 2 + n s with n in flight, give or take: at each level six in ten
    take 0.5 s less, two 0.5 s more, two 1.5 s more."""
    now = 0.0
    for level in levels:
        for extra in (*[-0.5] * 6, 0.5, 0.5, 1.5, 1.5):
            runs = [_Run(deadline=now + 1_000.0, started_at=now) for _ in range(level)]
            for run in runs:
                gate.arrive(run, now)
            assert len(gate.release(now)[0]) == level
            now += 2.0 + level + extra
            for run in runs:
                gate.ended(run, now, ok=True)
    return now


@pytest.mark.parametrize(
    ("likely", "judged"),
    [
        (0.5, [(2.4, 2.5)]),
        (0.7, [(2.4, 3.5), (3.0, 3.5)]),
        (None, [(2.4, 3.5), (3.0, 3.5)]),  # the default: 0.7
        (0.95, [(2.4, 4.5), (3.0, 4.5), (4.0, 4.5)]),
    ],
)
def test_a_run_is_judged_late_by_the_share_of_runs_likely_to_make_it(
    likely: float | None, judged: list[tuple[float, float]]
) -> None:
    """A waiting run starts ahead of the late ones only if `likely` of runs at the
    present load finish in the time it has left. With one in flight, runs take 2.5 s at
    the median, 3.5 s at 0.6-0.75, 4.5 s from 0.8: a run with 2.4 s left is late by any
    share, one with 3 s from 0.6, one with 4 s from 0.8 (at the median it is judged with
    two in flight, 3.5 s, and starts)."""
    gate = RunGate(DeadlineGate() if likely is None else DeadlineGate(likely=likely))
    now = _teach_spread(gate, range(1, 7))
    _budgets(gate, 30.0, n=200)
    assert gate.cap() is None  # nothing waits for room: only the judging is seen
    runs = [_Run(deadline=now + left, started_at=now) for left in (2.4, 3.0, 4.0, 9.0)]
    for run in runs:
        gate.arrive(run, now)
    _, hopeless = gate.release(now)
    flat = [x for run, took in hopeless for x in (run.deadline - now, took)]
    assert flat == pytest.approx([x for pair in judged for x in pair])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(UsageError, match="min_seen"):
        DeadlineGate(min_seen=1)
    with pytest.raises(UsageError, match="sure"):
        DeadlineGate(sure=1.5)
    with pytest.raises(UsageError, match="likely"):
        DeadlineGate(likely=0.0)
    # a queue of runs too short to tell what the share of them take: no run would be shed
    with pytest.raises(UsageError, match=r"memory=9\) keeps too few runs .* sure=0.9 .* 10"):
        DeadlineGate(memory=9)
    with pytest.raises(UsageError, match="at least 1000"):
        DeadlineGate(sure=0.999)
    with pytest.raises(UsageError, match="likely"):
        DeadlineGate(likely="0.7")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="memory"):
        DeadlineGate(min_seen=50, memory=20)
    with pytest.raises(UsageError, match="late_room"):
        DeadlineGate(late_room=1.5)
    with pytest.raises(UsageError, match="late_in_flight"):
        DeadlineGate(late_in_flight=-1)
    with pytest.raises(UsageError, match="late_in_flight"):
        DeadlineGate(late_in_flight=True)
    with pytest.raises(UsageError, match="DeadlineGate or None"):
        AdmissionTuning(gate=3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="choose one of deadlines, throughput, off"):
        Engine(admission="fast")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="choose one of fcfs, las, slack"):
        AdmissionTuning(order="lifo")


# --- in the engine ---------------------------------------------------------------------------


@dataclass
class _SharedServer:
    """One server whose every call slows the others: a call takes `base + per x n` seconds,
    n the calls running when it starts."""

    clock: VirtualClock
    base: float = 2.0
    per: float = 1.0
    running: int = 0
    calls: int = 0
    cap: Callable[[], int | None] = lambda: None
    """The gate's cap now (set once the engine runs)."""
    seen: list[tuple[int, int | None]] = field(default_factory=list)
    """(calls running, the gate's cap) at each call's start."""

    async def call(self, ctx: TaskContext) -> None:
        self.running += 1
        self.calls += 1
        self.seen.append((self.running, self.cap()))
        try:
            await self.clock.sleep(self.base + self.per * self.running)
        finally:
            self.running -= 1


def _one_call(server: _SharedServer) -> Workflow:
    wf = Workflow("query")
    wf.add("answer", server.call)
    return wf


def _overload(gate: DeadlineGate | None) -> tuple[int, int, int, _SharedServer, object]:
    """80 runs, one a second, each with 10 s: more than the server can answer in time."""
    clock = VirtualClock()
    server = _SharedServer(clock)

    async def main() -> tuple[int, int, int, object]:
        async with Engine(
            clock=clock, admission=AdmissionTuning(gate=gate), limits={"local": Limits(1_000)}
        ) as engine:
            state = engine.urgency.gate
            if state is not None:
                server.cap = state.cap
            handles = []
            for _ in range(80):
                handles.append(
                    engine.submit(
                        _one_call(server), deadline=10.0, priority="interactive", late="cancel"
                    )
                )
                await clock.sleep(1.0)
            results = [await h for h in handles]
            met = sum(r.ok and r.finished_at <= r.deadline for r in results)  # type: ignore[operator]
            never_ran = sum(r.llm_calls == 0 and "answer" in r.cancelled for r in results)
            shed = sum("shed" in r.cancelled.get("answer", "") for r in results)
            return met, never_ran, shed, engine.stats().gate

    met, never_ran, shed, stats = clock.run(main())
    return met, never_ran, shed, server, stats


def test_the_gate_meets_more_deadlines_on_an_overloaded_server() -> None:
    met_none, _, shed_none, server_none, stats_none = _overload(None)
    met, _, shed, server, stats = _overload(DeadlineGate())
    assert stats_none is None and shed_none == 0
    assert stats is not None and stats.cap is not None  # type: ignore[attr-defined]
    # Without the gate every run starts at once, the server slows for all, and most of
    # them are cancelled at their deadline; with it, runs past the cap wait and those that
    # cannot make it are shed before they call the server.
    assert met > met_none
    assert shed > 0 and server.calls == 80 - shed
    capped = [(running, cap) for running, cap in server.seen if cap is not None]
    assert len(capped) > 30  # most calls started under a learned cap, and none above it
    assert all(running <= cap for running, cap in capped)
    assert max(running for running, _ in server_none.seen) > stats.cap  # type: ignore[attr-defined]


def test_a_refused_run_leaves_nothing_waiting_at_the_gate() -> None:
    """A run refused at submission (an unknown resource) was never let in: the gate
    forgets it, and a run submitted after it starts."""
    clock = VirtualClock()
    server = _SharedServer(clock)

    async def main() -> tuple[object, bool]:
        async with Engine(clock=clock, admission=AdmissionTuning(order="fcfs")) as engine:
            wf = Workflow("query")
            wf.add("answer", server.call, resource="nowhere")
            with pytest.raises(UnknownResourceError):
                engine.submit(wf, deadline=10.0)
            waiting = engine.stats().gate
            result = await engine.run(_one_call(server), deadline=10.0)
            return waiting, result.ok

    waiting, ok = clock.run(main())
    assert waiting is not None and waiting.waiting == 0 and waiting.in_flight == 0  # type: ignore[attr-defined]
    assert ok


def _full_gate(settings: DeadlineGate) -> tuple[RunGate, float, list[_Run]]:
    """A gate that learned runs take 2 + n s with n in flight, deadlines of 10 s (cap 8),
    with 8 runs of distant deadlines in flight."""
    gate = RunGate(settings)
    now = _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    assert gate.cap() == 8
    running = [_Run(deadline=now + 500.0, started_at=now) for _ in range(8)]
    for run in running:
        gate.arrive(run, now)
    assert len(gate.release(now)[0]) == 8
    return gate, now, running


def test_one_run_judged_late_is_kept_going_while_others_wait() -> None:
    """With `late_in_flight=1` runs that cannot make their deadline go behind the rest, yet
    one of them is kept in flight whatever else waits: a stream of feasible runs cannot
    starve them. The second waits for the first to end."""
    gate, now, running = _full_gate(DeadlineGate(late_in_flight=1))
    late = [_Run(deadline=now + 2.5, started_at=now), _Run(deadline=now + 2.6, started_at=now)]
    stream = [_Run(deadline=now + 100.0 + i, started_at=now) for i in range(30)]
    for run in (*late, *stream):
        gate.arrive(run, now)
    assert gate.release(now) == ([], [])  # full: nothing is looked at
    order: list[_Run] = []
    for _ in range(6):
        gate.withdraw(running.pop(0), now + 1.0)  # a slot frees; the fit stays
        opened, _ = gate.release(now + 1.0)
        order.extend(opened)  # type: ignore[arg-type]
        running.extend(opened)  # type: ignore[arg-type]
    assert order == [late[0], *stream[:5]]  # the first at once; the second waits for it
    assert gate.holds(late[1]) and gate.stats().shed == 2
    gate.withdraw(late[0], now + 2.0)  # the late run in flight ends
    running.remove(late[0])
    assert gate.release(now + 2.0)[0] == [late[1]]


def test_runs_judged_late_start_only_into_spare_room() -> None:
    """By default a run judged late starts only when no run that can still make its
    deadline waits, and while fewer than `late_room` of the cap (2 of 8) are in flight: it
    does not lengthen the steps of the runs that come next."""
    gate, now, running = _full_gate(DeadlineGate())
    late = [_Run(deadline=now + 2.5 + i / 10, started_at=now) for i in range(3)]
    feasible = [_Run(deadline=now + 100.0, started_at=now) for _ in range(2)]
    for run in (*late, *feasible):
        gate.arrive(run, now)
    started: list[_Run] = []
    for _ in range(8):
        gate.withdraw(running.pop(0), now + 1.0)
        opened, _ = gate.release(now + 1.0)
        started.extend(opened)  # type: ignore[arg-type]
        running.extend(opened)  # type: ignore[arg-type]
        if len(running) >= 2 and not started[2:]:
            # the feasible two started first; the late ones wait for room
            assert all(gate.holds(run) for run in late)
    assert started[:2] == feasible
    # 6 of the first 8 ended and nothing else waits: room under 2 in flight only
    assert len(running) == 2 and started[2:] == []
    assert gate.stats().waiting == gate.stats().late_waiting == 3
    gate.withdraw(running.pop(0), now + 2.0)
    assert gate.release(now + 2.0)[0] == [late[0]]  # 1 in flight: one more fits
    assert gate.stats().late_waiting == 2
    gate.withdraw(running.pop(0), now + 3.0)
    assert gate.release(now + 3.0)[0] == [late[1]]


def test_a_run_judged_late_gives_way_to_one_that_can_still_make_it() -> None:
    """With room for both and `late_in_flight=0`, a run that can still make its deadline
    starts first; the late one then finds no spare room (2 of 8 in flight) and waits."""
    gate, now, running = _full_gate(DeadlineGate(late_in_flight=0, late_room=0.25))
    for run in running[1:]:
        gate.withdraw(run, now)  # one left in flight
    late = _Run(deadline=now + 2.5, started_at=now)
    gate.arrive(late, now)
    feasible = _Run(deadline=now + 100.0, started_at=now)
    gate.arrive(feasible, now)
    opened, hopeless = gate.release(now)
    assert opened == [feasible] and [run for run, _ in hopeless] == [late]
    assert gate.holds(late)


def test_runs_judged_late_start_when_nothing_is_in_flight_however_small_the_room() -> None:
    """`late_room=0` with `late_in_flight=0` still lets a late run start when nothing is in
    flight: late runs never wait on an idle gate."""
    gate, now, running = _full_gate(DeadlineGate(late_in_flight=0, late_room=0.0))
    late = _Run(deadline=now + 2.5, started_at=now)
    gate.arrive(late, now)
    for run in running:
        gate.withdraw(run, now)
    opened, _ = gate.release(now)
    assert opened == [late] and not gate.holds(late)


def test_with_no_cap_a_run_judged_late_still_starts() -> None:
    """Runs slow each other (2 + n s) but every recent deadline is roomy: the gate sets no
    cap. A run with 2.5 s left is judged late, and starts after the run that can make it."""
    gate = RunGate(DeadlineGate(late_in_flight=0))
    now = _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 1_000.0, n=200)
    assert gate.cap() is None and gate.learned
    feasible = _Run(deadline=now + 500.0, started_at=now)
    late = _Run(deadline=now + 2.5, started_at=now)
    for run in (late, feasible):
        gate.arrive(run, now)
    opened, hopeless = gate.release(now)
    assert opened == [feasible, late] and [run for run, _ in hopeless] == [late]


def test_runs_withdrawn_while_they_wait_are_not_kept_until_they_come_up() -> None:
    """Runs judged late wait behind the rest; cancelled while they wait (hundreds, through
    a long overload), they are swept from the gate's queues, not kept until they come up."""
    gate, now, running = _full_gate(DeadlineGate(late_in_flight=0))
    stream = [_Run(deadline=now + 100.0, started_at=now) for _ in range(10)]
    # 10 s deadlines like the rest (the cap stays 8), but 2.5 s of them left
    late = [_Run(deadline=now + 2.5, started_at=now - 7.5) for _ in range(300)]
    for run in (*late, *stream):
        gate.arrive(run, now)
    gate.withdraw(running.pop(0), now)
    opened, hopeless = gate.release(now)  # all 300 judged late, one of the stream let in
    assert opened == [stream[0]] and len(hopeless) == 300
    assert (gate.stats().waiting, gate.stats().late_waiting) == (309, 300)
    for run in late:
        gate.withdraw(run, now + 1.0)
    assert (gate.stats().waiting, gate.stats().late_waiting) == (9, 0)
    assert len(gate._late) + len(gate._waiting) < 100  # swept, not 309
    gate.withdraw(running.pop(0), now + 2.0)
    assert gate.release(now + 2.0)[0] == [stream[1]]  # the order holds after the sweep


def test_a_cap_in_force_grows_with_what_was_seen_never_to_no_cap() -> None:
    """Once the gate caps runs, a fit whose best is beyond everything seen raises the cap
    to twice the highest level seen, not to no cap at all."""
    gate = RunGate(DeadlineGate())
    _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    assert gate.cap() == 8
    _budgets(gate, 1_000.0, n=200)  # now every deadline is roomy: more at once is better
    assert gate.cap() == 13  # twice the highest level seen (6), plus one


def test_a_run_that_waited_is_counted_once_it_starts_or_leaves() -> None:
    gate = RunGate(DeadlineGate(late_in_flight=1))  # the late first of them starts at once
    now = _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    first = [_Run(deadline=now + 10.0, started_at=now) for _ in range(8)]
    for run in first:
        gate.arrive(run, now)
    gate.release(now)
    waiting = [_Run(deadline=now + 10.0, started_at=now) for _ in range(3)]
    for run in waiting:
        gate.arrive(run, now)
    gate.release(now)
    assert gate.stats().waiting == 3 and gate.stats().held == 0  # not let in yet
    gate.ended(first[0], now + 0.5, ok=False)  # a slot frees; the fit stays
    gate.release(now + 0.5)
    waiting[1].complete = True
    gate.withdraw(waiting[1], now + 0.5)
    assert gate.stats().held == 2 and gate.stats().waiting == 1


@dataclass
class _Item:
    resource: str
    ready_seq: int
    state: str = "ready"


@pytest.mark.parametrize("static", [False, True])
def test_a_held_program_is_parked_out_of_every_admission_pass_until_reopened(
    static: bool,
) -> None:
    """Held programs' queued tasks are set aside at the first pass that meets them: later
    passes neither rank them (no key computed) nor pop them, whatever their number."""
    held = {f"held{i}" for i in range(50)}
    keyed: list[str] = []

    def key(program: str) -> str:
        keyed.append(program)
        return program

    admission = Admission(
        {"gpu": Limits(max_in_flight=4)},
        static_key=key if static else None,
        gated=lambda program: program in held,
    )
    for i, program in enumerate(sorted(held)):
        admission.push(program, _Item("gpu", i))
    admission.push("free", _Item("gpu", 100))
    assert [p for p, _ in admission.admit(key)] == ["free"]
    keyed.clear()
    for i in range(5):  # more passes: nothing held is looked at again
        admission.push("other", _Item("gpu", 200 + i))
        admission.release("gpu")
        assert [p for p, _ in admission.admit(key)] == ["other"]
    assert not set(keyed) & held
    heap = admission._resources["gpu"].heap  # the static order: held programs left it
    assert not {program for _, program in heap} & held
    held.discard("held7")
    admission.reopen("held7")
    admission.release("gpu")
    assert [p for p, _ in admission.admit(key)] == ["held7"]
    assert admission.stats()[0].waiting == 49


def test_a_cap_is_lifted_when_runs_stop_slowing_each_other_and_kept_over_a_quiet_spell() -> None:
    gate = RunGate(DeadlineGate())
    _teach(gate, 2.0, 1.0, range(1, 7))
    _budgets(gate, 10.0, n=200)
    assert gate.cap() == 8
    _budgets(gate, 1_000.0, n=200)
    assert gate.cap() == 13  # roomy deadlines, a cap in force: twice the highest level
    for _ in range(70):  # a quiet spell, one or two at once, long enough to fill the memory
        _teach(gate, 2.0, 1.0, range(1, 3), now=1_000.0)
    assert gate.stats().seen == 200
    assert gate.cap() == 13  # few at once lately says nothing against the cap
    for _ in range(20):  # then runs take 3 s however many run at once
        _teach(gate, 3.0, 0.0, range(1, 9), now=3_000.0)
    assert gate.cap() is None and not gate.learned


def test_admission_demand_leaves_out_held_work_but_not_other_programs() -> None:
    """A held program's tasks replaced while parked leave stale entries behind: the demand
    reported for shared limits counts the other program's waiting work in full."""
    held = {"held"}
    admission = Admission({"gpu": Limits(max_in_flight=1)}, gated=lambda p: p in held)
    parked = [_Item("gpu", i) for i in range(5)]
    for item in parked:
        admission.push("held", item)
    admission.push("other", _Item("gpu", 10))
    assert [p for p, _ in admission.admit(lambda p: p)] == ["other"]
    for item in parked:  # replaced while parked: their entries are stale now
        item.state = "replaced"
        admission.discard(item)
    for i in range(5):
        admission.push("other", _Item("gpu", 20 + i))
    assert admission.demand("gpu") == (1, 0, 6)  # 1 in flight + 5 waiting, none held
