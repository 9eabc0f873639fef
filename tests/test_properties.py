"""Property tests: on random DAGs with random failures, the engine keeps its invariants."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import Limits, TaskContext, VirtualClock, Workflow, run_sync


@st.composite
def dags(draw: st.DrawFn) -> tuple[list[list[int]], set[int], int]:
    n = draw(st.integers(min_value=1, max_value=40))
    seed = draw(st.integers(min_value=0, max_value=2**32))
    rng = random.Random(seed)
    preds = [sorted(rng.sample(range(i), k=min(i, rng.randint(0, 3)))) for i in range(n)]
    failing = {i for i in range(n) if rng.random() < 0.15}
    slots = draw(st.integers(min_value=1, max_value=8))
    return preds, failing, slots


@settings(max_examples=150, deadline=None)
@given(dags())
def test_every_task_ends_and_dependencies_are_respected(
    case: tuple[list[list[int]], set[int], int],
) -> None:
    preds, failing, slots = case
    finished_at: dict[str, float] = {}
    started_at: dict[str, float] = {}
    clock = VirtualClock()

    def make(i: int) -> Callable[[TaskContext], Awaitable[int]]:
        async def body(ctx: TaskContext) -> int:
            started_at[ctx.task_id] = ctx.clock.monotonic()
            await ctx.clock.sleep(1 + i % 3)
            finished_at[ctx.task_id] = ctx.clock.monotonic()
            if i in failing:
                raise RuntimeError(f"t{i} fails")
            return sum(ctx.inputs.values()) + 1

        return body

    wf = Workflow("random")
    for i, ps in enumerate(preds):
        wf.add(f"t{i}", make(i), after=[f"t{p}" for p in ps])
    result = run_sync(wf, clock=clock, limits={"local": Limits(max_in_flight=slots)})

    every = {f"t{i}" for i in range(len(preds))}
    # Every task ends in exactly one of the outcomes.
    outcomes = [set(result.results), set(result.failures), set(result.skipped)]
    assert set().union(*outcomes) == every
    assert sum(len(o) for o in outcomes) == len(every)
    assert not result.cancelled
    for i, ps in enumerate(preds):
        name = f"t{i}"
        deps_ok = all(f"t{p}" in result.results for p in ps)
        # A task ran if and only if all its dependencies succeeded ...
        assert (name in started_at) == deps_ok
        # ... after every one of them had finished.
        for p in ps:
            if name in started_at:
                assert started_at[name] >= finished_at[f"t{p}"]
        if name in result.skipped:
            assert result.skipped[name].startswith("dependency 't")
    assert (result.status == "failed") == bool(result.failures)
    assert set(result.failures) == {f"t{i}" for i in failing if f"t{i}" in started_at}
    # Never more than `slots` tasks at once.
    events = sorted([(t, 1) for t in started_at.values()] + [(t, -1) for t in finished_at.values()])
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        peak = max(peak, running)
    assert peak <= slots
