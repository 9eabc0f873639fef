"""Retention: which events a finished run can do without (a pure function, checked against
`rebuild` on generated logs and on the golden one), the policy applied to a store (SQLite and
PostgreSQL), the sweeper on a clock the test steps, and the engine that runs it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from conftest import StoreFactory
from hypothesis import example, given, settings
from hypothesis import strategies as st
from stored_runs import golden_events, put_run, same_run, stored_image

from agents import Agent
from executors import FunctionLLM, echo
from orchestrator import (
    EVENT_ADAPTER,
    CallRetrying,
    EdgeAdded,
    EdgeRemoved,
    Engine,
    Event,
    Retention,
    StoreError,
    TaskAdded,
    TaskCancelled,
    TaskContext,
    TaskFailed,
    TaskReady,
    TaskRemoved,
    TaskReplaced,
    TaskRetrying,
    TaskSkipped,
    TaskStarted,
    TaskSucceeded,
    UsageError,
    Workflow,
    WorkflowFinished,
    WorkflowResumed,
    WorkflowStarted,
)
from orchestrator.durability._retention import Sweeper, sweep_once
from orchestrator.ext import ActionSpec, Store, compactable, rebuild

# --- compactable: the pure part -------------------------------------------------------------


def compacted(events: list[Event]) -> list[Event]:
    log = [(i, EVENT_ADAPTER.dump_python(e, mode="json")) for i, e in enumerate(events, 1)]
    gone = set(compactable(log))
    return [e for i, e in enumerate(events, 1) if i not in gone]


def test_the_golden_run_keeps_what_rebuilds_it() -> None:
    events = [EVENT_ADAPTER.validate_python(e) for e in golden_events("replayed")]
    kept = compacted(events)
    assert same_run(rebuild(kept)) == same_run(rebuild(events))
    kinds = [e.kind for e in kept]
    assert "task_ready" not in kinds and "task_retrying" not in kinds
    # Only flaky's second attempt stays: its count (2) is not what a success implies.
    started = [(e.task, e.attempt) for e in kept if isinstance(e, TaskStarted)]
    assert started == [("flaky", 2)]
    assert rebuild(kept).tasks["flaky"].attempts == 2
    assert rebuild(kept).tasks["plan"].attempts == 1
    assert rebuild(kept).tasks["broken"].attempts == 1  # task_failed carries it
    # Everything else stays, in order: mutations, edges, final states, the workflow's events.
    assert len(events) - len(kept) == 7 + 7 + 1  # ready, started, retrying
    assert kinds.count("task_added") == 9 and kinds.count("edge_added") == 3
    assert kinds[0] == "workflow_started" and kinds[-1] == "workflow_finished"


def test_a_task_that_has_not_ended_keeps_its_last_state() -> None:
    """A log cut mid-run (compaction only takes finished runs, but the function must not
    change what an unfinished task's image says either)."""
    events = [EVENT_ADAPTER.validate_python(e) for e in golden_events("replayed")]
    cut = events[:27]  # flaky is waiting to retry, both research tasks ready
    kept = compacted(cut)
    assert same_run(rebuild(kept)) == same_run(rebuild(cut))
    assert rebuild(kept).tasks["flaky"].state == "waiting"
    assert rebuild(kept).tasks["research batching"].state == "ready"


TASKS = ("a", "b")
OPS = (
    "add",
    "remove",
    "replace",
    "ready",
    "started",
    "retrying",
    "call_retrying",
    "succeeded",
    "failed",
    "skipped",
    "cancelled",
    "edge_added",
    "edge_removed",
    "resumed",
)


def generated_log(steps: list[tuple[str, int, int, int]]) -> list[Event]:
    """A log `rebuild` accepts, from (op, task, other task, attempt) steps: state events of
    present tasks (and of removed ones, which rebuild passes over), in any order; a task
    added more than once is its own image each time."""
    spec = ActionSpec("function", "m:f")
    events: list[Event] = [
        WorkflowStarted(workflow="w", program=1, priority="batch", deadline=None, at=0.0)
    ]
    present: set[str] = set()
    removed: set[str] = set()
    for n, (op, i, j, attempt) in enumerate(steps, 1):
        task, other, at = TASKS[i], TASKS[j], float(n)
        # A removed task's late state events are passed over by rebuild; any other step on
        # a task that is not there adds it first (dense logs find more cases).
        late = task in removed and op not in ("add", "remove", "replace", "resumed")
        if op == "add" or (task not in present and not late):
            present.add(task)
            removed.discard(task)
            events.append(TaskAdded(workflow="w", task=task, action=spec, after=(), at=at))
            if op == "add":
                continue
        if op == "resumed":  # a new life: the tasks that were not final are pending again
            events.append(WorkflowResumed(workflow="w", program=n, deadline=None, at=at))
        elif op in ("edge_added", "edge_removed"):
            if task not in present or other not in present or task == other:
                continue
            edge = EdgeAdded if op == "edge_added" else EdgeRemoved
            events.append(edge(workflow="w", source=other, target=task, at=at))
        elif op == "remove":
            present.discard(task)
            removed.add(task)
            events.append(TaskRemoved(workflow="w", task=task, at=at))
        elif op == "replace":
            events.append(TaskReplaced(workflow="w", task=task, action=spec, at=at))
        else:
            events.append(state_event(op, task, attempt, at))
    events.append(WorkflowFinished(workflow="w", status="succeeded", duration=1.0, at=99.0))
    return events


def state_event(op: str, task: str, attempt: int, at: float) -> Event:
    w = "w"
    match op:
        case "ready":
            return TaskReady(workflow=w, task=task, resource="r", at=at)
        case "started":
            return TaskStarted(workflow=w, task=task, attempt=attempt, at=at)
        case "retrying":
            return TaskRetrying(workflow=w, task=task, attempt=attempt, error="e", delay=0.1, at=at)
        case "call_retrying":
            return CallRetrying(
                workflow=w, task=task, backend="b", attempt=1, error="e", delay=0.1, at=at
            )
        case "succeeded":
            return TaskSucceeded(workflow=w, task=task, duration=1.0, result=at, at=at)
        case "failed":
            return TaskFailed(
                workflow=w, task=task, error=f"e{at}", error_type="E", attempts=attempt, at=at
            )
        case "skipped":
            return TaskSkipped(workflow=w, task=task, reason=f"s{at}", at=at)
        case _:
            return TaskCancelled(workflow=w, task=task, reason=f"c{at}", at=at)


# What sets attempt counts comes up more often: the cases that need care are made of it.
WEIGHTED_OPS = OPS + ("started",) * 4 + ("succeeded",) * 3 + ("failed",) * 3
STEPS = st.lists(
    st.tuples(
        st.sampled_from(WEIGHTED_OPS),
        st.integers(0, len(TASKS) - 1),
        st.integers(0, len(TASKS) - 1),
        st.integers(1, 2),
    ),
    min_size=3,
    max_size=40,
)


@settings(max_examples=500, deadline=None)
@given(STEPS)
# A first attempt after a count above 1 (a failure, then the task replaced and run again)
# must stay: a success alone would keep the old count.
@example([("add", 0, 0, 1), ("failed", 0, 0, 2), ("started", 0, 0, 1), ("succeeded", 0, 0, 1)])
# A later attempt's task_started stays: a success alone counts one.
@example([("add", 0, 0, 1), ("started", 0, 0, 2), ("succeeded", 0, 0, 1)])
def test_compaction_never_changes_what_a_log_rebuilds(steps: list[Any]) -> None:
    events = generated_log(steps)
    kept = compacted(events)
    assert same_run(rebuild(kept)) == same_run(rebuild(events))
    assert not any(isinstance(e, CallRetrying) for e in kept)


def test_compaction_drops_what_the_engine_repeats_per_task() -> None:
    """A task that succeeded at its first try keeps two events (added, succeeded) of four;
    call retries go whatever happened after them."""
    steps = [("add", 0, 0, 1), ("ready", 0, 0, 1), ("started", 0, 0, 1)]
    steps += [("call_retrying", 0, 0, 1), ("succeeded", 0, 0, 1)]
    kept = compacted(generated_log(steps))
    assert [e.kind for e in kept] == [
        "workflow_started",
        "task_added",
        "task_succeeded",
        "workflow_finished",
    ]
    assert rebuild(kept).tasks["a"].attempts == 1
    # A first attempt that was cancelled keeps its task_started: nothing else counts it.
    steps[-1] = ("cancelled", 0, 0, 1)
    assert [e.kind for e in compacted(generated_log(steps))][2] == "task_started"


def test_a_resumed_run_compacts_to_the_same_image(make_store: StoreFactory) -> None:
    """A run killed mid-way and resumed (tests/test_resume.py's harness) has two lives in
    its log; compacted, it rebuilds the same, and its recorded LLM calls go."""
    from test_resume import REGISTRY, Gate, crash_during, draft, join, resumed, topic

    async def body(store: Store, llm: FunctionLLM, sent: dict[str, int]) -> None:
        wf = Workflow("report")
        wf.add("topic", topic)
        wf.add("intro", writer.ask("Write an intro"), after=["topic"])
        wf.add("draft", draft, after=["topic"])
        wf.add("join", join, after=["intro", "draft"])
        run_id = await crash_during(store, llm, wf)
        assert Gate.event is not None
        Gate.event.set()
        async with Engine(backends={"default": llm}, store=store) as engine:
            report = await engine.resume(REGISTRY)
            assert (await report.runs[0]).status == "succeeded"
        before = await stored_image(store, run_id)
        assert before.resumes == 1 and (await store.size()).calls == 2
        assert await store.compact([run_id]) == 1
        after = await stored_image(store, run_id)
        assert same_run(after) == same_run(before)
        assert after.tasks["draft"].attempts == 1 and after.tasks["draft"].state == "done"
        assert (await store.size()).calls == 0

    resumed(make_store, body)


# --- the policy -----------------------------------------------------------------------------


def test_retention_settings_are_checked() -> None:
    assert Retention().cutoffs(10_000.0) == (10_000.0 - 3600.0, 10_000.0 - 7 * 86400.0)
    assert Retention(compact_after=None, delete_after=5.0).cutoffs(10.0) == (None, 5.0)
    for bad, says in [
        ({"compact_after": -1.0}, "compact_after=-1.0"),
        ({"delete_after": float("nan")}, "delete_after=nan"),
        ({"keep_last": -1}, "keep_last=-1"),
        ({"every": 0.0}, "every=0.0"),
    ]:
        with pytest.raises(UsageError, match=says):
            Retention(**bad)


def test_a_sweep_deletes_compacts_and_collects(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            await put_run(store, "old", finished=100.0, big=True)
            await put_run(store, "mid", finished=700.0, big=True)
            await put_run(store, "new", finished=950.0, big=True)
            await put_run(store, "live", status="running", big=True)
            before = await stored_image(store, "mid")
            policy = Retention(compact_after=200.0, delete_after=500.0)

            report = await sweep_once(store, policy, now=1000.0)
            assert (report.deleted, report.compacted, report.error) == (1, 1, None)
            assert report.collected == 0  # every big payload is still used by another run
            assert await store.workflow("old") is None
            assert [w.id for w in await store.workflows() if w.compacted] == ["mid"]
            assert same_run(await stored_image(store, "mid")) == same_run(before)
            # Nothing is left to do at the same time; later, "new" is compacted in turn.
            assert await sweep_once(store, policy, now=1000.0) == type(report)()
            assert (await sweep_once(store, policy, now=1200.0)).compacted == 1
            assert (await store.workflow("live")).compacted is False  # type: ignore[union-attr]

            by_count = Retention(compact_after=None, delete_after=None, keep_last=1)
            report = await sweep_once(store, by_count, now=1200.0)
            assert (report.deleted, report.compacted) == (1, 0)  # "mid"; "new" is the last
            assert sorted(w.id for w in await store.workflows()) == ["live", "new"]
            assert report.collected == 0  # "live" still holds every payload
            await store.delete(["live"])
            report = await sweep_once(store, Retention(keep_last=0), now=1200.0)
            assert (report.deleted, report.collected) == (1, 2)  # the big error and result
            size = await store.size()
            assert (size.workflows, size.events, size.payloads) == (0, 0, 0)

    asyncio.run(main())


# --- the sweeper, on a clock the test steps --------------------------------------------------


class SteppedClock:
    """A clock that moves only when the test says: `sleep` waits for `tick()`, then adds its
    seconds. (Satisfies `Clock`; the sweeper reads `now` and sleeps, nothing else.)"""

    def __init__(self, now: float) -> None:
        self._now = now
        self._tick = asyncio.Event()

    def monotonic(self) -> float:
        return self._now

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        await self._tick.wait()
        self._tick.clear()
        self._now += seconds

    def tick(self) -> None:
        self._tick.set()

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    def check_running_loop(self) -> None:
        pass


def failing_once(store: Store, method: str) -> Callable[[], int]:
    """Make the store's `method` raise a StoreError on its first call (a fake of a disk that
    is full once); returns how many calls were made."""
    real = getattr(store, method)
    calls = 0

    async def fake(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise StoreError("could not write to the store: disk full (a test's fake)")
        return await real(*args, **kwargs)

    setattr(store, method, fake)
    return lambda: calls


def test_the_sweeper_sweeps_at_start_and_then_every_period(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            await put_run(store, "a", finished=100.0)
            clock = SteppedClock(now=150.0)
            policy = Retention(compact_after=100.0, delete_after=None, every=60.0)
            sweeper = Sweeper(store, policy, clock)
            async with asyncio.TaskGroup() as tg:
                first = asyncio.ensure_future(sweeper.next_sweep())
                tg.create_task(sweeper.run())
                assert (await first).compacted == 0  # at 150 "a" is 50 s old
                second = asyncio.ensure_future(sweeper.next_sweep())
                clock.tick()  # 210: 110 s old
                assert (await second).compacted == 1
                assert sweeper.stats.sweeps == 2 and sweeper.stats.compacted == 1
                sweeper.stop()  # idle: it ends at once
            assert (await store.workflow("a")).compacted  # type: ignore[union-attr]

    asyncio.run(main())


def test_a_failed_sweep_is_recorded_and_the_next_one_tries_again(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with make_store() as store:
            await put_run(store, "a", finished=100.0)
            calls = failing_once(store, "compact")
            clock = SteppedClock(now=1000.0)
            sweeper = Sweeper(store, Retention(compact_after=0.0, delete_after=None), clock)
            async with asyncio.TaskGroup() as tg:
                first = asyncio.ensure_future(sweeper.next_sweep())
                tg.create_task(sweeper.run())
                report = await first
                assert report.error is not None and "disk full" in report.error
                assert sweeper.stats.failures == 1 and "disk full" in str(sweeper.stats.last_error)
                second = asyncio.ensure_future(sweeper.next_sweep())
                clock.tick()
                assert (await second).compacted == 1
                sweeper.stop()
            assert calls() == 2  # the failed one, then the one that compacted
            assert "retention sweep failed" in caplog.text

    asyncio.run(main())


def test_stop_lets_the_sweep_under_way_end(make_store: StoreFactory) -> None:
    """A sweep is not cancelled half-way: stop() waits for it (it ends at its next chunk)."""

    async def main() -> None:
        async with make_store() as store:
            await put_run(store, "a", finished=100.0)
            entered, release = asyncio.Event(), asyncio.Event()
            real = store.retain

            async def slow_retain(**kwargs: Any) -> int:
                entered.set()
                await release.wait()
                return await real(**kwargs)

            store.retain = slow_retain  # type: ignore[method-assign]
            sweeper = Sweeper(store, Retention(compact_after=0.0), SteppedClock(now=1000.0))
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(sweeper.run())
                report = asyncio.ensure_future(sweeper.next_sweep())
                await entered.wait()
                sweeper.stop()
                release.set()
            assert not task.cancelled()
            assert (await report).compacted == 0  # stopped before its compaction chunk
            assert sweeper.stats.sweeps == 1

    asyncio.run(main())


# --- in the engine ----------------------------------------------------------------------------


writer = Agent("writer", "You write.")


async def plan(ctx: TaskContext) -> int:
    for i in range(3):
        ctx.workflow.add(f"part {i}", writer.ask(f"Part {i}"), before=["join"])
    return 3


async def join(ctx: TaskContext) -> str:
    return " / ".join(str(v) for k, v in sorted(ctx.inputs.items()) if k != "plan")


def build() -> Workflow:
    wf = Workflow("kept")
    wf.add("plan", plan)
    wf.add("join", join, after=["plan"])
    return wf


def test_an_engine_with_retention_compacts_its_finished_runs(make_store: StoreFactory) -> None:
    """On the system clock (a store needs it), with a short period; the test waits for the
    sweeper's reports, never for time."""

    async def main() -> None:
        async with make_store() as store:
            policy = Retention(compact_after=0.0, delete_after=None, every=0.01)
            llm = FunctionLLM(echo)
            async with Engine(backends={"default": llm}, store=store, retention=policy) as engine:
                result = await engine.run(build())
                sweeper = engine.sweeper
                assert sweeper is not None
                async with asyncio.timeout(60):
                    while not (await store.workflow(result.workflow)).compacted:  # type: ignore[union-attr]
                        await sweeper.next_sweep()
                again = await engine.run(build())  # runs go on beside the sweeper
                assert again.status == "succeeded"
            image = await stored_image(store, result.workflow)
            assert image.status == "succeeded"
            assert image.results() == dict(result.results)
            assert {t.state for t in image.tasks.values()} == {"done"}
            assert {t.attempts for t in image.tasks.values()} == {1}
            assert image.edges == {("plan", "join")} | {(f"part {i}", "join") for i in range(3)}
            kinds = [e.kind for e in await store.events(result.workflow)]
            assert "task_ready" not in kinds and "task_started" not in kinds
            assert sweeper.stats.failures == 0

    asyncio.run(main())


def test_a_long_running_engine_keeps_its_store_bounded(make_store: StoreFactory) -> None:
    """Run after run, the store keeps the last few finished runs, compacted; its size stops
    growing with the number of runs."""

    async def main() -> None:
        async with make_store() as store:
            policy = Retention(compact_after=0.0, delete_after=None, keep_last=3, every=0.01)
            llm = FunctionLLM(echo)
            sizes = []
            async with Engine(backends={"default": llm}, store=store, retention=policy) as engine:
                assert engine.sweeper is not None
                for _ in range(4):
                    results = await asyncio.gather(*(engine.run(build()) for _n in range(5)))
                    assert {r.status for r in results} == {"succeeded"}
                    async with asyncio.timeout(60):
                        while True:  # until a sweep has seen every run of this batch
                            report = await engine.sweeper.next_sweep()
                            rows = await store.workflows()
                            if len(rows) == 3 and all(r.compacted for r in rows):
                                break
                    sizes.append(await store.size())
            assert {r.id for r in rows} <= {r.workflow for r in results}
            assert report.error is None and engine.sweeper.stats.deleted == 20 - 3
            # The same three compacted runs' worth of rows and bytes after every batch.
            assert len({(s.workflows, s.events, s.calls) for s in sizes}) == 1
            assert max(s.event_bytes for s in sizes) < 1.1 * min(s.event_bytes for s in sizes)

    asyncio.run(main())


def test_a_failing_sweep_does_not_touch_the_runs(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with make_store() as store:
            failing_once(store, "compact")
            policy = Retention(compact_after=0.0, every=0.01)
            llm = FunctionLLM(echo)
            async with Engine(backends={"default": llm}, store=store, retention=policy) as engine:
                assert engine.sweeper is not None
                async with asyncio.timeout(60):
                    while engine.sweeper.stats.failures == 0:
                        await engine.sweeper.next_sweep()
                result = await engine.run(build())
                assert result.status == "succeeded"
            assert (await store.workflow(result.workflow)).status == "succeeded"  # type: ignore[union-attr]

    asyncio.run(main())


def test_retention_needs_a_store() -> None:
    with pytest.raises(UsageError, match="needs a store"):
        Engine(retention=Retention())


def test_the_compaction_benchmark_measures_both_sides() -> None:
    """bench/compaction.py on a small chain (SQLite): a no-op task keeps 2 events of 4."""
    from _graphs import scenario
    from compaction import measure

    result = asyncio.run(measure(scenario("chain", 50, 0), "sqlite"))
    assert (result.tasks, result.events_before, result.events_after) == (50, 202, 102)
    before, after = result.per_task
    assert 0 < after < 0.8 * before
