"""Random mutations from inside running tasks and from outside, under random limits,
policies, failures, retries, timeouts and cancellations: every run must end, every task
must be final, and every admission slot must come back."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import (
    Engine,
    Limits,
    PlaitError,
    Retry,
    RunResult,
    TaskContext,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import AdmissionTuning
from orchestrator.model._events import FINAL_STATES

Body = Callable[[TaskContext], Awaitable[float]]


def random_workflow(rng: random.Random, name: str, engine: list[Engine]) -> Workflow:
    wf = Workflow(name)
    made = [0]

    def fresh() -> str:
        made[0] += 1
        return f"n{made[0]}"

    def some(ids: list[str], most: int) -> list[str]:
        return rng.sample(ids, min(len(ids), rng.randint(0, most)))

    async def body(ctx: TaskContext) -> float:
        roll = rng.random()
        await ctx.clock.sleep(rng.choice([0, 0.5, 1, 3]))
        for _ in range(rng.randint(0, 3)):
            ids = [t.id for t in ctx.workflow]
            op = rng.choice(["add", "before", "when", "edge", "unedge", "remove", "swap", "cancel"])
            try:
                if op == "add":
                    ctx.workflow.add(fresh(), body, after=some(ids, 2), timeout=2.0)
                elif op == "before":
                    ctx.workflow.add(fresh(), body, after=some(ids, 1), before=some(ids, 1))
                elif op == "when":
                    ctx.workflow.add(
                        fresh(), body, before=some(ids, 1), when=lambda _: rng.random() < 0.5
                    )
                elif op == "edge" and len(ids) >= 2:
                    ctx.workflow.add_edge(*rng.sample(ids, 2))
                elif op == "unedge" and ctx.workflow.graph.number_of_edges():
                    ctx.workflow.remove_edge(*rng.choice(list(ctx.workflow.graph.edges)))
                elif op == "remove" and ids:
                    ctx.workflow.remove(rng.choice(ids))
                elif op == "swap" and ids:
                    ctx.workflow.replace(rng.choice(ids), body)
                elif op == "cancel" and ids:
                    engine[0].cancel_task(ctx.workflow, rng.choice(ids), "fuzz")
            except PlaitError:
                pass  # refused mutations are part of the game; they must change nothing
        if roll < 0.15:
            raise RuntimeError("random failure")
        if roll < 0.2:
            await ctx.clock.sleep(10)  # beyond any timeout
        return roll

    for _ in range(rng.randint(1, 8)):
        ids = [t.id for t in wf]
        retry = rng.choice([None, Retry(2, initial_delay=0.5, jitter=0)])
        wf.add(fresh(), body, after=some(ids, 2), retry=retry, timeout=rng.choice([None, 2.0]))
    return wf


@settings(max_examples=120, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_random_mutations_always_settle(seed: int) -> None:
    rng = random.Random(seed)
    clock = VirtualClock()
    holder: list[Engine] = []

    async def main() -> tuple[list[Workflow], list[RunResult], list[str]]:
        limits = {"local": Limits(max_in_flight=rng.choice([1, 2, 100]))}
        policy = rng.choice(["fcfs", "las", "slack"])
        # Virtual seconds: a run that never settles (or an engine that cannot close) fails
        # the test instead of hanging it.
        async with (
            asyncio.timeout(100_000),
            Engine(clock=clock, limits=limits, admission=AdmissionTuning(order=policy)) as engine,
        ):
            holder.append(engine)
            flows = [random_workflow(rng, f"w{i}", holder) for i in range(rng.randint(1, 3))]
            handles = [engine.submit(wf, deadline=rng.choice([None, 50.0])) for wf in flows]
            if rng.random() < 0.3:
                await asyncio.sleep(rng.choice([0, 0.5, 2]))
                with contextlib.suppress(PlaitError):  # it may have finished already
                    engine.cancel(flows[0], "from outside")
            results = [await h for h in handles]
            leaks = [
                f"{r.name}: in_flight={r.in_flight} waiting={r.waiting}"
                for r in engine.stats().resources
                if r.in_flight or r.waiting
            ]
        return flows, results, leaks

    flows, results, leaks = clock.run(main())
    assert not leaks
    for wf, result in zip(flows, results, strict=True):
        for task in wf:
            record = wf.run_of(task.id)
            assert record.state in FINAL_STATES, (wf.id, task.id, record.state)
            assert record.waiting_on >= 0, (wf.id, task.id, record.waiting_on)
        assert result.status in ("succeeded", "failed", "cancelled")
