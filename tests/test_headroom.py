"""Headroom for urgent work: the learned throughput knee, the caps admission applies with
it, hopeless deadlines, and an urgent program admitted at once while batch work saturates
a simulated GPU (virtual time)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from agents import Agent
from executors import FunctionLLM, LaneTuning, SimServer
from orchestrator import (
    Engine,
    Event,
    Hints,
    Limits,
    LLMRequest,
    Message,
    RunHandle,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.admission._knee import DEFAULT_HEADROOM, KneeController, slack_rich
from orchestrator.admission._learned import Durations, RunTimes
from orchestrator.admission._queue import Admission
from orchestrator.admission._scheduler import Slack, alone_slack_of, order_programs, slack_of
from orchestrator.engine._run import task_kind
from orchestrator.ext import AdmissionTuning, Headroom, ProgramView

A, B = 0.005, 0.0001
"""Seconds per token = A + B x calls in flight: the synthetic server of these tests."""


def _feed(knee: KneeController, levels: list[int], calls: int = 20) -> None:
    for level in levels:
        for _ in range(calls):
            knee.observe(level, (A + B * level) * 100, 100)


def test_the_knee_is_the_fewest_calls_that_give_the_throughput_share() -> None:
    knee = KneeController("gpu", 256)
    _feed(knee, [8, 16, 32, 64, 128, 256])
    # Throughput n / (A + B n) is 8,366 tokens/s at 256; 85% of it needs n >= 123.1: of
    # the levels measured, 128 is the first to reach it.
    assert knee.knee() == 128
    fitted = knee.fit()
    assert fitted is not None
    assert fitted[0] == pytest.approx(A) and fitted[1] == pytest.approx(B)


def test_with_two_levels_the_fitted_line_gives_the_knee() -> None:
    knee = KneeController("gpu", 256)
    _feed(knee, [32, 256])
    # n >= s L A / (A + B L (1 - s)) = 0.85 * 256 * 0.005 / (0.005 + 0.0256 * 0.15) = 123.1
    assert knee.knee() == 124


def test_a_measured_knee_needs_three_levels_seen_often_enough() -> None:
    """`measured_knee` (what a router sizes its lanes by) is the knee only where three load
    levels were each measured, up to near the limit; a line through two is extrapolated,
    and levels far below the limit cannot tell where throughput flattens."""
    knee = KneeController("gpu", 256)
    _feed(knee, [32, 256])
    assert knee.knee() == 124 and knee.measured_knee() is None
    low = KneeController("gpu", 256)
    _feed(low, [4, 8, 16, 32])
    assert low.knee() is not None and low.measured_knee() is None
    _feed(knee, [8, 16, 64, 128])
    assert knee.measured_knee() == knee.knee() == 128


def test_the_cap_applies_while_urgent_work_is_around_and_lifts_without() -> None:
    knee = KneeController("gpu", 256)
    _feed(knee, [8, 16, 32, 64, 128, 256])
    assert knee.cap(urgent=True) == 128
    assert knee.cap(urgent=False) == 256 - 13  # 5% of the slots stay free for urgent work
    assert knee.stats().cap_urgent == 128


def test_before_it_has_learned_it_probes_at_a_share_of_the_limit() -> None:
    knee = KneeController("gpu", 256)
    assert knee.knee() is None and knee.cap(urgent=True) == 64
    _feed(knee, [256])  # one level: nothing to fit yet
    assert knee.cap(urgent=True) == 64
    assert knee.urgent_cap() == 256


def test_a_fixed_override_replaces_the_learned_knee() -> None:
    knee = KneeController("gpu", 256, fixed=40)
    _feed(knee, [8, 16, 32, 64, 128, 256])
    assert knee.cap(urgent=True) == 40
    with pytest.raises(UsageError, match="batch_in_flight"):
        Limits(max_in_flight=8, batch_in_flight=9)


def test_latency_that_does_not_grow_leaves_no_knee_below_the_limit() -> None:
    knee = KneeController("gpu", 64)
    for level in (4, 16, 64):
        for _ in range(20):
            knee.observe(level, 1.0, 100)
    assert knee.knee() == 64


def test_bad_headroom_settings_are_refused() -> None:
    with pytest.raises(UsageError, match="throughput_share"):
        Headroom(throughput_share=0.0)
    with pytest.raises(UsageError, match="reserve"):
        Headroom(reserve=1.0)


def test_which_programs_are_slack_rich() -> None:
    h = DEFAULT_HEADROOM
    assert slack_rich("batch", None, 0.0, h)  # batch without a deadline
    assert not slack_rich("interactive", None, 0.0, h)
    assert not slack_rich("interactive", 10.0, 5.0, h)  # a near deadline: urgent
    assert slack_rich("batch", 3600.0, 5.0, h)  # an hour to spare: may wait
    assert slack_rich("interactive", -1.0, 5.0, h)  # hopeless: must not crowd others out


def test_slack_ranks_hopeless_programs_after_feasible_ones_least_late_first() -> None:
    feasible = ProgramView(1, "interactive", deadline=20.0, remaining=15.0)  # slack 5
    hopeless = ProgramView(2, "interactive", deadline=8.0, remaining=10.0)  # slack -2
    later = ProgramView(3, "interactive", deadline=5.0, remaining=10.0)  # slack -5
    none = ProgramView(4, "interactive")
    ordered = order_programs(Slack(), [none, later, hopeless, feasible], now=0.0)
    assert [v.program for v in ordered] == [1, 2, 3, 4]


def test_late_at_the_present_load_ranks_after_feasible_but_is_hopeless_only_alone() -> None:
    """A program whose tasks take longer lately (under load) than its time left ranks after
    those that can still make it, least late first; it is hopeless (held back, reported)
    only if even the least its tasks have taken is too long."""
    feasible = ProgramView(1, "interactive", deadline=20.0, remaining=15.0)  # slack 5
    loaded = ProgramView(2, "interactive", deadline=8.0, remaining=10.0, least_remaining=6.0)
    hopeless = ProgramView(3, "interactive", deadline=8.0, remaining=12.0, least_remaining=9.0)
    ordered = order_programs(Slack(), [hopeless, feasible, loaded], now=0.0)
    assert [v.program for v in ordered] == [1, 2, 3]
    assert slack_of(loaded, 0.0) == -2.0 and alone_slack_of(loaded, 0.0) == 2.0
    assert alone_slack_of(hopeless, 0.0) == -1.0
    # Without a least (a view built by hand), the path lately stands for it.
    assert alone_slack_of(ProgramView(4, deadline=8.0, remaining=10.0), 0.0) == -2.0


def test_durations_keep_the_least_each_kind_took() -> None:
    durations = Durations(default=1.0)
    assert durations.least("ask") == 1.0 == durations.estimate("ask")
    for seconds in (2.0, 0.5, 4.0, 4.0):
        durations.observe("ask", seconds)
    assert durations.least("ask") == 0.5
    assert durations.estimate("ask") > 2.0  # the mean follows what it takes lately


def _loaded_then_deadline(late: str) -> tuple[float | None, bool]:
    """Steps of one kind take 1 s alone, then 4 s under load (the learned mean climbs); a
    3-step run with 6 s to go is late at that load, but not at the least the steps took.
    Returns when it was found hopeless (None: never) and whether it met its deadline."""
    clock = VirtualClock()
    seconds = {"now": 1.0}

    async def step(ctx: TaskContext) -> None:
        await ctx.clock.sleep(seconds["now"])

    def chain(n: int) -> Workflow:
        wf = Workflow("steps")
        for i in range(n):
            wf.add(f"s{i}", step, after=(f"s{i - 1}",) if i else ())
        return wf

    async def main() -> tuple[float | None, bool]:
        async with Engine(clock=clock) as engine:
            # Learned in interactive runs: durations are learned per priority class.
            await engine.run(chain(1), priority="interactive")  # 1 s alone
            seconds["now"] = 4.0
            await engine.run(chain(3), priority="interactive")  # 4 s a step under load
            seconds["now"] = 1.5  # the load eases
            result = await engine.run(chain(3), deadline=6, priority="interactive", late=late)
            return result.hopeless_at, bool(result.deadline_met)

    return clock.run(main())


def test_a_run_late_only_at_the_present_load_is_not_called_hopeless() -> None:
    hopeless_at, met = _loaded_then_deadline("finish")
    assert hopeless_at is None  # 3 steps at the least 1 s fit in 6 s
    assert met  # and the load eased: it made it


def test_a_run_given_up_when_late_judges_by_the_present_load() -> None:
    """`late="cancel"`: what it needs is what tasks take now, so it makes way at once."""
    hopeless_at, _ = _loaded_then_deadline("cancel")
    assert hopeless_at is not None


@dataclass
class _Item:
    """A queued call, as admission sees it."""

    resource: str
    ready_seq: int
    state: str = "ready"


def test_admission_holds_slack_rich_work_at_its_cap_and_lets_urgent_work_by() -> None:
    admission = Admission({"gpu": Limits(max_in_flight=10)})
    items = [_Item("gpu", i) for i in range(10)]
    for item in items:
        admission.push("batch", item)
    caps = {"gpu": (4, 10)}
    took = admission.admit(lambda p: p, caps.get, lambda p: p == "batch")
    assert len(took) == 4  # batch stops at the cap: 4 in flight
    urgent = [_Item("gpu", 100 + i) for i in range(3)]
    for item in urgent:
        admission.push("query", item)
    took = admission.admit(lambda p: p != "query", caps.get, lambda p: p == "batch")
    assert [p for p, _ in took] == ["query"] * 3
    assert admission.stats()[0].held_for_headroom == 2
    # Urgent calls are capped too, by their own count (the second cap).
    admission.release("gpu", urgent[0])
    admission.push("query", _Item("gpu", 200))
    took = admission.admit(lambda p: p != "query", lambda r: (4, 2), lambda p: p == "batch")
    assert took == []  # two urgent calls still in flight: at the urgent cap of 2


def _chain(n: int, estimate: float, seconds: float) -> Workflow:
    async def step(ctx: TaskContext) -> None:
        await ctx.clock.sleep(seconds)

    wf = Workflow("chain")
    for i in range(n):
        wf.add(f"s{i}", step, after=(f"s{i - 1}",) if i else (), estimate=estimate)
    return wf


def test_a_hopeless_deadline_is_reported_as_soon_as_admission_sees_it() -> None:
    clock = VirtualClock()

    async def main() -> list[Event]:
        async with Engine(clock=clock) as engine:
            flow = _chain(3, 2.0, 2.0)
            return [e async for e in engine.iter(flow, deadline=4, priority="interactive")]

    events = clock.run(main())
    kinds = [e.kind for e in events]
    hopeless = next(e for e in events if e.kind == "deadline_hopeless")
    assert hopeless.at == events[0].at  # 6 s of estimated work, 4 s left: at once
    assert hopeless.remaining == pytest.approx(6.0)
    assert kinds.index("deadline_hopeless") < kinds.index("deadline_missed")


def test_a_feasible_deadline_is_never_called_hopeless() -> None:
    clock = VirtualClock()

    async def main() -> list[str]:
        async with Engine(clock=clock) as engine:
            return [e.kind async for e in engine.iter(_chain(3, 1.0, 1.0), deadline=4)]

    assert "deadline_hopeless" not in clock.run(main())


async def _slow_step(ctx: TaskContext) -> None:
    await ctx.clock.sleep(3.0)


def _slow_chain(n: int) -> Workflow:
    """`n` steps of 3 s each, with no estimate: what they take is learned."""
    wf = Workflow("slow")
    for i in range(n):
        wf.add(f"s{i}", _slow_step, after=(f"s{i - 1}",) if i else ())
    return wf


def test_what_tasks_took_is_learned_and_decides_hopeless() -> None:
    """Without estimates, a run's remaining work is what tasks of the same kind (in runs of
    the same class) took lately: after one 3-step run (3 s a step), a second with 5 s for 3
    steps is hopeless at once; on an engine that has seen none, the default of 1 s a task
    calls it feasible at first, as it does when only batch runs were seen."""
    clock = VirtualClock()

    async def main(learn_from: str | None) -> tuple[float | None, float]:
        async with Engine(clock=clock) as engine:
            if learn_from is not None:
                await engine.run(_slow_chain(3), priority=learn_from)  # type: ignore[arg-type]
            started = clock.monotonic()
            result = await engine.run(_slow_chain(3), deadline=5, priority="interactive")
            return result.hopeless_at, started

    learned_at, learned_start = clock.run(main("interactive"))
    assert learned_at == learned_start  # 9 s learned, 5 s left: at once
    naive_at, naive_start = clock.run(main(None))
    assert naive_at is not None and naive_at > naive_start  # found only later, when late
    # What batch runs took says nothing of the interactive run's steps.
    other_at, other_start = clock.run(main("batch"))
    assert other_at is not None and other_at > other_start


def _submit_batch(engine: Engine, rows: int, tokens: int) -> list[RunHandle]:
    """`rows` batch workflows of one call of `tokens` each, prompts starting "doc"."""
    handles = []
    for i in range(rows):
        wf = Workflow(f"doc{i}")
        wf.add("ask", _ask(tokens, f"doc{i}"), resource="default")
        handles.append(engine.submit(wf))
    return handles


def _ask(tokens: int, tag: str, started: list[float] | None = None) -> object:
    async def call(ctx: TaskContext) -> None:
        if started is not None:
            started.append(ctx.clock.monotonic())
        request = LLMRequest((Message("user", f"{tag} " + "word " * 200),), "m", max_tokens=tokens)
        await ctx.complete(request)

    return call


def _urgent_delay(headroom: Headroom | None) -> tuple[float, float]:
    """Batch work saturates one simulated GPU; an urgent program arrives at t=2. Returns the
    virtual seconds its first call waited for admission and the program's completion time."""
    clock = VirtualClock()
    started: list[float] = []

    async def main() -> tuple[float, float]:
        async with (
            SimServer("h100-llama3-8b", clock=clock) as sim,
            Engine(
                backends={"default": sim},
                admission=AdmissionTuning(headroom=headroom),
                clock=clock,
                limits={"default": Limits(max_in_flight=64)},
            ) as engine,
        ):
            batch = _submit_batch(engine, 300, 400)
            await clock.sleep(2.0)
            arrived = clock.monotonic()
            wf = Workflow("query")
            wf.add("a", _ask(20, "qa", started), resource="default")
            wf.add("b", _ask(20, "qb"), after=("a",), resource="default")
            wf.add("c", _ask(20, "qc"), after=("b",), resource="default")
            result = await engine.run(wf, deadline=10, priority="interactive")
            assert result.ok
            await asyncio.gather(*(h.result() for h in batch))
            return started[0] - arrived, result.duration

    return clock.run(main())


def test_an_urgent_program_is_admitted_at_once_while_batch_saturates_the_gpu() -> None:
    waited, took = _urgent_delay(DEFAULT_HEADROOM)
    # The reserve (5% of 64: 3 slots) is free for it: admitted in the same instant.
    assert waited == 0.0
    waited_without, took_without = _urgent_delay(None)
    # Without headroom every slot is batch's: it waits for a 400-token call to end.
    assert waited_without > 0.1
    # And with batch held to the knee once it is there, its three calls run faster.
    assert took < took_without


def test_a_router_with_urgent_lanes_gets_no_knee_over_all_its_replicas() -> None:
    from executors import FunctionLLM, Router

    def replicas() -> dict[str, FunctionLLM]:
        return {f"r{i}": FunctionLLM(lambda req, hints: "ok") for i in range(2)}

    async def main() -> tuple[list[str], list[str]]:
        lanes = Router(replicas(), lanes=LaneTuning(lanes=1))
        plain = Router(replicas(), lanes=LaneTuning(lanes=0))
        auto = Router(replicas())  # the default: lanes while urgent and batch work meet
        async with Engine(backends={"lanes": lanes, "plain": plain, "auto": auto}) as engine:
            learned = [k.backend for k in engine.stats().knees]
        fixed = {"lanes": Limits(batch_in_flight=8)}
        async with Engine(
            backends={"lanes": Router(replicas(), lanes=LaneTuning(lanes=1))}, limits=fixed
        ) as e:
            overridden = [k.backend for k in e.stats().knees]
        return learned, overridden

    learned, overridden = VirtualClock().run(main())
    assert learned == ["plain"]  # the lanes keep urgent work apart: no knee over them
    assert overridden == ["lanes"]  # a fixed cap is still applied where it is asked for


def test_behind_a_router_with_lanes_an_urgent_call_finds_the_reserve_free() -> None:
    """No knee over a router that keeps urgent lanes, but slack-rich work still leaves the
    reserve of the engine's limit free (5% of 20: one slot), so an interactive call that
    comes while long batch calls fill the limit starts at once, not when one of them ends
    (100 s later)."""
    from executors import Router

    def latency(request: LLMRequest) -> float:
        return 100.0 if request.messages[0].content.startswith("doc") else 1.0

    def run(
        headroom: Headroom | None, policy: str = "slack", priority: str = "interactive"
    ) -> tuple[float, int]:
        clock = VirtualClock()
        llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=latency) for i in range(2)}
        started: list[float] = []

        async def main() -> tuple[float, int]:
            async with Engine(
                backends={"default": Router(llms, clock=clock)},
                admission=AdmissionTuning(order=policy, headroom=headroom),
                clock=clock,
                limits={"default": Limits(max_in_flight=20)},
            ) as engine:
                batch = _submit_batch(engine, 40, 8)
                await clock.sleep(1.0)
                [default] = [r for r in engine.stats().resources if r.name == "default"]
                in_flight = default.in_flight
                wf = Workflow("query")
                wf.add("a", _ask(8, "query", started), resource="default")
                result = await engine.run(wf, deadline=10, priority=priority)
                assert result.ok
                for handle in batch:
                    await handle.result()
                return started[0] - 1.0, in_flight

        return clock.run(main())

    waited, batch_in_flight = run(DEFAULT_HEADROOM)
    assert (waited, batch_in_flight) == (0.0, 19)
    assert run(DEFAULT_HEADROOM, policy="fcfs") == (0.0, 19)  # interactive ranks first
    waited_without, batch_without = run(None)  # every slot is batch's: it waits them out
    assert waited_without >= 99.0 and batch_without == 20


def test_a_run_with_a_near_deadline_gets_the_lane_whatever_its_class() -> None:
    """Behind the default router ("auto" lanes), while batch work runs: a run of
    the default class ("batch") whose deadline is near is urgent work, and its calls go
    to the lane only; one whose deadline is far off is slack-rich, and its calls go where
    batch calls go. The engine tells the router (`Hints.urgent`)."""
    from executors import Router

    clock = VirtualClock()

    def latency(request: LLMRequest) -> float:
        return 100.0 if request.messages[0].content.startswith("doc") else 1.0

    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=latency) for i in range(3)}

    def chain(tag: str, n: int) -> Workflow:
        wf = Workflow(tag)
        for i in range(n):
            after = (f"s{i - 1}",) if i else ()
            wf.add(f"s{i}", _ask(8, f"{tag} {i}"), after=after, resource="default")
        return wf

    def replicas_of(tag: str) -> set[str]:
        return {
            name
            for name, llm in llms.items()
            for c in llm.calls
            if c.request.messages[0].content.startswith(tag)
        }

    async def main() -> None:
        router = Router(llms, clock=clock)
        async with Engine(backends={"default": router}, clock=clock) as engine:
            batch = _submit_batch(engine, 30, 8)
            await clock.sleep(1.0)
            near = await engine.run(chain("near", 6), deadline=20)
            far = await engine.run(chain("far", 6), deadline=3600)
            assert near.ok and far.ok
            for handle in batch:
                await handle.result()

    clock.run(main())
    assert replicas_of("near") == {"r0"}  # the lane
    assert len(replicas_of("far")) > 1  # batch work, spread over the replicas


# --- late="cancel": give up on what will be late ---------------------------------------------


def test_a_late_cancel_run_is_cancelled_when_its_deadline_passes() -> None:
    """3 steps of 3 s, deadline 5 s: with late="cancel" the second step is cancelled at 5 s
    and the third never starts; with the default the run finishes, late, at 9 s."""
    clock = VirtualClock()

    async def main(late: str) -> tuple[str, float, dict[str, str]]:
        async with Engine(clock=clock) as engine:
            started = clock.monotonic()
            result = await engine.run(_slow_chain(3), deadline=5, late=late)  # type: ignore[arg-type]
            return result.status, result.finished_at - started, dict(result.cancelled)

    status, took, cancelled = clock.run(main("cancel"))
    assert status == "cancelled"
    assert took == pytest.approx(5.0)
    assert cancelled["s1"] == "deadline passed"
    assert "s2" in cancelled and "s0" not in cancelled
    status, took, _ = clock.run(main("finish"))
    assert (status, took) == ("succeeded", pytest.approx(9.0))


def test_a_late_cancel_run_is_shed_at_once_when_recent_runs_took_longer_than_its_deadline() -> None:
    """After five 9 s runs of "slow" (each with a deadline, so their times are kept), a
    late="cancel" run given 5 s is refused at once, told hopeless first, and runs nothing;
    one given 20 s runs; a default run given 5 s runs (late)."""
    clock = VirtualClock()

    async def main() -> tuple[list[Event], str, str]:
        async with Engine(clock=clock) as engine:
            for _ in range(5):
                assert (await engine.run(_slow_chain(3), deadline=60)).ok
            shed_at = clock.monotonic()
            events = [
                e async for e in engine.iter(_slow_chain(3), deadline=5, priority="interactive")
            ]
            assert events  # iter has no late=: a default run, which finishes
            handle = engine.submit(_slow_chain(3), deadline=5, late="cancel")
            shed = await handle.result()
            assert shed.finished_at == shed_at + 9.0  # after the iter run, at once
            assert shed.hopeless_at == shed.finished_at
            assert set(shed.cancelled) == {"s0", "s1", "s2"}
            reason = shed.cancelled["s0"]
            roomy = await engine.run(_slow_chain(3), deadline=20, late="cancel")
            return events, shed.status, reason + " | " + roomy.status

    events, status, reasons = clock.run(main())
    assert status == "cancelled"
    assert "shed: its deadline (5.0 s)" in reasons and "'slow' took (9.0 s)" in reasons
    assert reasons.endswith("| succeeded")
    assert events[-1].kind == "workflow_finished"


def test_too_few_recent_runs_shed_nothing() -> None:
    clock = VirtualClock()

    async def main() -> str:
        async with Engine(clock=clock) as engine:
            for _ in range(4):
                await engine.run(_slow_chain(3), deadline=60)
            return (await engine.run(_slow_chain(1), deadline=5, late="cancel")).status

    assert clock.run(main()) == "succeeded"


def test_a_bad_late_value_is_refused() -> None:
    clock = VirtualClock()

    async def main() -> None:
        async with Engine(clock=clock) as engine:
            with pytest.raises(UsageError, match="late must be 'finish' or 'cancel'"):
                engine.submit(_slow_chain(1), deadline=5, late="drop")  # type: ignore[arg-type]

    clock.run(main())


def test_run_times_answer_a_high_quantile_of_the_last_runs() -> None:
    times = RunTimes(keep=10, min_seen=3, share=0.9)
    times.observe("q", 1.0)
    times.observe("q", 2.0)
    assert times.typical("q") is None and times.typical("other") is None
    for seconds in range(3, 30):
        times.observe("q", float(seconds))
    assert times.typical("q") == 29.0  # the last 10 are 20..29; the 0.9 quantile is the top
    times.observe("q", 0.5)
    assert times.typical("q") == 29.0


class _Record:
    """A call memo that answers any program's call it has seen (as a resumed run's are)."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    async def recall(self, program: str, key: str) -> bytes | None:
        return self.kept.get(key)

    def remember(self, program: str, key: str, result: bytes) -> None:
        self.kept[key] = result


def test_a_task_answered_from_a_record_teaches_no_duration() -> None:
    """A resumed task whose call is answered from the record ends at once: that is not
    what its kind takes, so neither the mean nor the least learns it."""
    clock = VirtualClock()
    agent = Agent("asker", "You answer.")

    async def main() -> tuple[float, float, float, float]:
        llm = FunctionLLM(lambda request, hints: "ok", latency=2.0, clock=clock)
        async with Engine(backends={"default": llm}, clock=clock) as engine:
            engine.calls.memo = _Record()
            wf = Workflow("w")
            wf.add("ask", agent.ask("hi"))
            label = task_kind("batch", wf.task("ask").action.label)  # engine.run's class
            await engine.run(wf)
            sent = engine.urgency.durations.least(label), engine.urgency.durations.estimate(label)
            started = clock.monotonic()
            again = Workflow("w")
            again.add("ask", agent.ask("hi"))
            await engine.run(again)
            assert len(llm.calls) == 1  # the second was answered from the record
            assert clock.monotonic() == started  # at once
            return (
                *sent,
                engine.urgency.durations.least(label),
                engine.urgency.durations.estimate(label),
            )

    least, mean, least_after, mean_after = clock.run(main())
    assert least == mean == 2.0
    assert (least_after, mean_after) == (2.0, 2.0)


@pytest.mark.parametrize("policy", ["slack", "fcfs"])
def test_calls_carry_the_slack_their_program_has_to_spare(policy: str) -> None:
    """`Hints.slack_s`: the deadline's seconds left less the remaining critical path at what
    tasks of its kind took lately; None while that is only the default guess (nothing of
    the kind has finished), where the policy estimates no path, or without a deadline.
    `Hints.service` is `shareable` only with that slack known to cover the path."""
    clock = VirtualClock()
    seen: list[Hints] = []

    def answer(request: LLMRequest, hints: Hints) -> str:
        seen.append(hints)
        return "ok"

    async def main() -> None:
        llm = FunctionLLM(answer, latency=0.5, clock=clock)
        async with Engine(
            backends={"default": llm}, clock=clock, admission=AdmissionTuning(order=policy)
        ) as engine:
            for deadline in (10.0, None):
                wf = Workflow("w")
                wf.add("ask", _ask(4, "q"), resource="default")
                wf.add("then", _ask(4, "q"), after=["ask"], resource="default")
                await engine.run(wf, deadline=deadline, priority="interactive")

    clock.run(main())
    first, second, free, _ = seen
    if policy == "fcfs":
        assert [h.slack_s for h in seen] == [None] * 4
        # No path estimated: no time to spare is known, so the lane is not shared.
        assert [h.service for h in seen] == ["tight", "tight", "urgent", "urgent"]
        return
    assert first.slack_s is None and first.service == "tight"  # 1 s a task is a guess
    # The first call took 0.5 s: the next has 9.5 s left and one task (0.5 s lately) to go.
    assert second.slack_s == pytest.approx(9.0) and second.service == "shareable"
    assert free.slack_s is None
