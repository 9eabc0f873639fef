"""The engine on the virtual clock: results, failures, retries, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from orchestrator import (
    Engine,
    Limits,
    Retry,
    RunResult,
    TaskContext,
    TaskStartedError,
    TaskTimeoutError,
    UnknownResourceError,
    UsageError,
    VirtualClock,
    Workflow,
    WorkflowFailedError,
    run_sync,
)

Run = Callable[[Coroutine[Any, Any, Any]], Any]


async def one(ctx: TaskContext) -> int:
    return 1


def test_results_flow_to_dependents(clock: VirtualClock) -> None:
    wf = Workflow("flow")

    async def double(ctx: TaskContext) -> int:
        return int(ctx.input("a")) * 2

    def total(ctx: TaskContext) -> int:  # sync: runs in a worker thread
        return sum(ctx.inputs.values())

    wf.add("a", one)
    wf.add("b", double, after=["a"])
    wf.add("c", lambda: 10)  # no context at all
    wf.add("d", total, after=["b", "c"])
    result = run_sync(wf, clock=clock)
    assert result.ok
    assert result.results == {"a": 1, "b": 2, "c": 10, "d": 12}
    assert result["d"] == 12


def test_a_failing_task_skips_its_dependents_and_the_rest_goes_on(vrun: Run) -> None:
    wf = Workflow("partial")

    async def boom(ctx: TaskContext) -> None:
        raise ValueError("bad row 17")

    wf.add("ok", one)
    wf.add("bad", boom)
    wf.add("after_bad", one, after=["bad"])
    wf.add("after_after", one, after=["after_bad"])
    wf.add("after_ok", one, after=["ok"])
    wf.add("bad2", boom, after=["ok"])

    async def main() -> RunResult:
        async with Engine() as engine:
            return await engine.run(wf)

    result = vrun(main())
    assert result.status == "failed"
    assert result.failures == {"bad": "ValueError: bad row 17", "bad2": "ValueError: bad row 17"}
    assert isinstance(result.errors["bad"], ValueError)
    assert result.skipped == {
        "after_bad": "dependency 'bad' failed",
        "after_after": "dependency 'after_bad' was skipped",
    }
    assert result.results == {"ok": 1, "after_ok": 1}
    with pytest.raises(WorkflowFailedError, match=r"(?s)2 failure.*bad: ValueError: bad row 17"):
        result.raise_for_status()
    with pytest.raises(KeyError, match="dependency 'bad' failed"):
        result["after_bad"]


def test_failure_at_the_head_of_a_long_chain_skips_all_without_recursion(vrun: Run) -> None:
    wf = Workflow("chain")

    async def boom(ctx: TaskContext) -> None:
        raise RuntimeError("head")

    wf.add("t0", boom)
    for i in range(1, 5000):
        wf.add(f"t{i}", one, after=[f"t{i - 1}"])

    async def main() -> RunResult:
        async with Engine() as engine:
            return await engine.run(wf)

    result = vrun(main())
    assert len(result.skipped) == 4999
    assert result.failures == {"t0": "RuntimeError: head"}


def test_retries_back_off_on_the_injected_clock(clock: VirtualClock) -> None:
    attempts: list[tuple[int, float]] = []

    async def flaky(ctx: TaskContext) -> str:
        attempts.append((ctx.attempt, ctx.clock.monotonic()))
        if ctx.attempt < 3:
            raise ConnectionError("try again")
        return "ok"

    wf = Workflow("retry")
    wf.add("flaky", flaky, retry=Retry(attempts=4, initial_delay=2, jitter=0))

    async def main() -> tuple[RunResult, list[Any]]:
        async with Engine(clock=clock) as engine:
            events = [e async for e in engine.iter(wf)]
        return (await_result(events), events)

    def await_result(events: list[Any]) -> RunResult:
        return RunResult(workflow="retry", status=events[-1].status, results={})

    result, events = clock.run(main())
    assert result.status == "succeeded"
    # Exponential: 2 s, then 4 s, on virtual time.
    assert attempts == [(1, 0.0), (2, 2.0), (3, 6.0)]
    retrying = [e for e in events if e.kind == "task_retrying"]
    assert [(e.attempt, e.delay) for e in retrying] == [(1, 2.0), (2, 4.0)]
    assert "ConnectionError: try again" in retrying[0].error
    started = [e.attempt for e in events if e.kind == "task_started"]
    assert started == [1, 2, 3]


def test_retries_stop_after_the_last_attempt_and_report_the_error(clock: VirtualClock) -> None:
    async def always(ctx: TaskContext) -> None:
        raise ConnectionError(f"down at attempt {ctx.attempt}")

    wf = Workflow("giveup")
    wf.add("t", always, retry=Retry(attempts=3, initial_delay=1, jitter=0))
    result = run_sync(wf, clock=clock)
    assert result.failures == {"t": "ConnectionError: down at attempt 3"}
    assert wf.run_of("t").attempts == 3


def test_usage_errors_are_not_retried(clock: VirtualClock) -> None:
    calls = 0

    async def misuse(ctx: TaskContext) -> None:
        nonlocal calls
        calls += 1
        raise UsageError("wrong argument")

    wf = Workflow("noretry")
    wf.add("t", misuse, retry=5)
    assert run_sync(wf, clock=clock).status == "failed"
    assert calls == 1


def test_a_task_that_never_returns_times_out_by_name_and_others_finish(
    clock: VirtualClock,
) -> None:
    async def hang(ctx: TaskContext) -> None:
        await asyncio.Event().wait()

    stuck = Workflow("stuck")
    stuck.add("hang", hang, timeout=30)
    stuck.add("fine", one)
    others = [Workflow(f"other{i}") for i in range(3)]
    for wf in others:
        wf.add("t", one)

    async def main() -> list[RunResult]:
        async with Engine(clock=clock) as engine:
            return await asyncio.gather(*(engine.run(wf) for wf in [stuck, *others]))

    results = clock.run(main())
    assert results[0].status == "failed"
    error = results[0].errors["hang"]
    assert isinstance(error, TaskTimeoutError) and error.task_id == "hang"
    assert "'hang' did not finish within its timeout of 30 s" in results[0].failures["hang"]
    assert results[0].results == {"fine": 1}
    assert results[0].duration == 30.0
    assert all(r.ok for r in results[1:])


def test_a_stuck_sync_function_times_out_too(clock: VirtualClock) -> None:
    release = threading.Event()

    def blocking(ctx: TaskContext) -> None:
        release.wait(timeout=30)

    wf = Workflow("stuck-thread")
    wf.add("block", blocking, timeout=0.05)

    async def main() -> RunResult:
        async with Engine() as engine:
            try:
                return await engine.run(wf)
            finally:
                release.set()  # let the abandoned thread end so the loop can close

    result = clock.run(main())
    assert isinstance(result.errors["block"], TaskTimeoutError)


def test_unserialisable_result_is_an_error_naming_the_task(clock: VirtualClock) -> None:
    async def handle(ctx: TaskContext) -> object:
        return threading.Lock()

    wf = Workflow("unserialisable")
    wf.add("lock", handle)
    wf.add("user", one, after=["lock"])
    result = run_sync(wf, clock=clock)
    assert result.status == "failed"
    assert "task 'lock' returned a lock" in result.failures["lock"]
    assert result.skipped == {"user": "dependency 'lock' failed"}


def test_many_workflows_run_concurrently_and_one_failure_disturbs_no_other(
    clock: VirtualClock,
) -> None:
    async def slow(ctx: TaskContext) -> int:
        await ctx.clock.sleep(1.0)
        return 1

    async def boom(ctx: TaskContext) -> None:
        raise RuntimeError("nope")

    workflows = []
    for i in range(50):
        wf = Workflow(f"w{i}")
        wf.add("a", slow)
        wf.add("b", boom if i == 7 else slow, after=["a"])
        workflows.append(wf)

    async def main() -> list[RunResult]:
        async with Engine(clock=clock) as engine:
            return await asyncio.gather(*(engine.run(wf) for wf in workflows))

    results = clock.run(main())
    assert [r.status for r in results].count("failed") == 1
    assert results[7].failures == {"b": "RuntimeError: nope"}
    # 100 one-second tasks, at most 256 at once: everything overlaps.
    assert clock.monotonic() == 2.0


def test_cancelling_a_workflow_cancels_its_running_tasks_only(clock: VirtualClock) -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    async def long(ctx: TaskContext) -> None:
        try:
            started.set()
            await ctx.clock.sleep(100)
        except asyncio.CancelledError:
            cancelled.append(ctx.task_id)
            raise

    async def short(ctx: TaskContext) -> str:
        await ctx.clock.sleep(5)
        return "done"

    victim = Workflow("victim")
    victim.add("long", long)
    victim.add("next", one, after=["long"])
    bystander = Workflow("bystander")
    bystander.add("short", short)

    async def main() -> tuple[RunResult, RunResult]:
        async with Engine(clock=clock) as engine:
            handle = engine.submit(victim)
            other = engine.submit(bystander)
            await started.wait()
            handle.cancel("user pressed stop")
            return await handle, await other

    result, other = clock.run(main())
    assert result.status == "cancelled"
    assert result.cancelled == {"long": "user pressed stop", "next": "user pressed stop"}
    assert cancelled == ["long"]
    assert other.ok and other["short"] == "done"
    assert clock.monotonic() == 5.0
    with pytest.raises(WorkflowFailedError, match="cancelled"):
        result.raise_for_status()


def test_cancelling_one_task_skips_its_dependents_and_the_rest_goes_on(
    clock: VirtualClock,
) -> None:
    async def long(ctx: TaskContext) -> None:
        await ctx.clock.sleep(100)

    wf = Workflow("one-task")
    wf.add("long", long)
    wf.add("after_long", one, after=["long"])
    wf.add("other", one)

    async def main() -> RunResult:
        async with Engine(clock=clock) as engine:
            handle = engine.submit(wf)
            await asyncio.sleep(1)
            engine.cancel_task(wf, "long", "not needed")
            return await handle

    result = clock.run(main())
    assert result.status == "succeeded"
    assert result.cancelled == {"long": "not needed"}
    assert result.skipped == {"after_long": "dependency 'long' was cancelled"}
    assert result.results == {"other": 1}


def test_conditional_branch_and_all_done_join(clock: VirtualClock) -> None:
    wf = Workflow("branch")

    async def score(ctx: TaskContext) -> int:
        return 7

    async def high(ctx: TaskContext) -> str:
        return "high"

    async def low(ctx: TaskContext) -> str:
        return "low"

    async def join(ctx: TaskContext) -> list[str]:
        return sorted(v for k, v in ctx.inputs.items())

    wf.add("score", score)
    wf.add("high", high, after=["score"], when=lambda inputs: inputs["score"] > 5)
    wf.add("low", low, after=["score"], when=lambda inputs: inputs["score"] <= 5)
    wf.add("join", join, after=["high", "low"], trigger="all_done")
    wf.add("strict", one, after=["low"])
    result = run_sync(wf, clock=clock)
    assert result.ok
    assert result["join"] == ["high"]
    assert result.skipped == {
        "low": "its condition was false",
        "strict": "dependency 'low' was skipped",
    }


def test_a_condition_that_raises_fails_the_task(clock: VirtualClock) -> None:
    wf = Workflow("badcond")
    wf.add("a", one)
    wf.add("b", one, after=["a"], when=lambda inputs: inputs["missing"])
    result = run_sync(wf, clock=clock)
    assert result.status == "failed"
    assert "missing" in result.failures["b"]


def test_a_planner_adds_tasks_at_run_time_and_the_writer_waits_for_all(
    clock: VirtualClock,
) -> None:
    async def research(ctx: TaskContext) -> str:
        await ctx.clock.sleep(2)
        return f"notes on {ctx.task_id}"

    async def plan(ctx: TaskContext) -> list[str]:
        topics = ["gpu", "kv", "queues"]
        for topic in topics:
            ctx.workflow.add(topic, research, before=["write"])
        return topics

    async def write(ctx: TaskContext) -> str:
        return " | ".join(v for k, v in sorted(ctx.inputs.items()) if k != "plan")

    wf = Workflow("planner")
    wf.add("plan", plan)
    wf.add("write", write, after=["plan"])
    result = run_sync(wf, clock=clock)
    assert result.ok
    assert result["write"] == "notes on gpu | notes on kv | notes on queues"
    assert clock.monotonic() == 2.0


def test_a_loop_adds_rounds_until_done(clock: VirtualClock) -> None:
    wf = Workflow("loop")

    async def step(ctx: TaskContext) -> int:
        n = 1 + max((v for v in ctx.inputs.values()), default=0)
        if n < 5:
            ctx.workflow.add(f"step{n + 1}", step, after=[ctx.task_id])
        return n

    wf.add("step1", step)
    result = run_sync(wf, clock=clock)
    assert result.results == {f"step{i}": i for i in range(1, 6)}


def test_edge_into_a_started_task_is_refused_at_run_time(clock: VirtualClock) -> None:
    errors: list[Exception] = []

    async def first(ctx: TaskContext) -> int:
        await ctx.clock.sleep(1)
        return 1

    async def meddler(ctx: TaskContext) -> None:
        try:
            ctx.workflow.add_edge("meddler", "first")  # "first" is already running
        except TaskStartedError as exc:
            errors.append(exc)

    wf = Workflow("meddle")
    wf.add("first", first)
    wf.add("meddler", meddler)
    result = run_sync(wf, clock=clock)
    assert result.ok
    assert len(errors) == 1
    assert "task 'first' of workflow 'meddle' is already running" in str(errors[0])


def test_cycle_at_run_time_is_refused_and_the_run_goes_on(clock: VirtualClock) -> None:
    seen: list[str] = []

    async def a(ctx: TaskContext) -> int:
        try:
            ctx.workflow.add("x", one, after=["c"], before=["b"])
        except Exception as exc:
            seen.append(type(exc).__name__)
        return 1

    wf = Workflow("cyc")
    wf.add("a", a)
    wf.add("b", one, after=["a"])
    wf.add("c", one, after=["b"])
    result = run_sync(wf, clock=clock)
    assert result.ok and seen == ["CycleError"]
    assert "x" not in wf


def test_removing_a_running_task_cancels_it_and_releases_its_dependents(
    clock: VirtualClock,
) -> None:
    async def long(ctx: TaskContext) -> None:
        await ctx.clock.sleep(100)

    async def remover(ctx: TaskContext) -> None:
        await ctx.clock.sleep(1)
        ctx.workflow.remove("long")

    wf = Workflow("rm")
    wf.add("long", long)
    wf.add("remover", remover)
    wf.add("after", one, after=["long"])
    result = run_sync(wf, clock=clock)
    assert result.ok
    assert result.results == {"remover": None, "after": 1}
    assert clock.monotonic() == 1.0


def test_replacing_a_pending_task_runs_the_new_action(clock: VirtualClock) -> None:
    async def old(ctx: TaskContext) -> str:
        return "old"

    async def new(ctx: TaskContext) -> str:
        return "new"

    async def first(ctx: TaskContext) -> None:
        ctx.workflow.replace("second", new)

    wf = Workflow("swap")
    wf.add("first", first)
    wf.add("second", old, after=["first"])
    assert run_sync(wf, clock=clock)["second"] == "new"


def test_a_clock_given_by_name_is_refused_with_what_to_give() -> None:
    for wrong in ("virtual", "system", 1.0):
        with pytest.raises(UsageError, match=r"takes a Clock: SystemClock\(\), or a VirtualClock"):
            Engine(clock=wrong)  # type: ignore[arg-type]
    assert Engine(clock=VirtualClock()).clock.monotonic() == 0.0


def test_unknown_resource_is_refused_before_anything_runs(vrun: Run) -> None:
    wf = Workflow("gpu")
    wf.add("t", one, resource="gpu-farm")

    async def main() -> None:
        async with Engine() as engine:
            await engine.run(wf)

    with pytest.raises(UnknownResourceError, match="'gpu-farm'.*known: local, tools"):
        vrun(main())


def test_a_workflow_runs_once(vrun: Run) -> None:
    wf = Workflow("once")
    wf.add("t", one)

    async def main() -> None:
        async with Engine() as engine:
            await engine.run(wf)
            with pytest.raises(UsageError, match="already been run"):
                await engine.run(wf)
            with pytest.raises(UsageError, match="has finished"):
                wf.add("u", one)

    vrun(main())


def test_engine_must_be_entered(vrun: Run) -> None:
    wf = Workflow("outside")
    wf.add("t", one)

    async def main() -> None:
        await Engine().run(wf)

    with pytest.raises(UsageError, match="async with Engine"):
        vrun(main())


def test_same_name_workflows_get_distinct_ids(vrun: Run) -> None:
    async def main() -> list[str]:
        async with Engine() as engine:
            handles = []
            for _ in range(3):
                wf = Workflow("same")
                wf.add("t", one)
                handles.append(engine.submit(wf))
            return [(await h).workflow for h in handles]

    assert vrun(main()) == ["same", "same#2", "same#3"]


def test_an_edge_from_a_failed_task_into_a_waiting_task_skips_it(clock: VirtualClock) -> None:
    async def boom(ctx: TaskContext) -> None:
        raise RuntimeError("broken")

    async def hold(ctx: TaskContext) -> None:
        await ctx.clock.sleep(10)

    wf = Workflow("rewire")
    wf.add("bad", boom)
    wf.add("hold", hold)
    wf.add("target", one)  # ready, but the one slot is taken by "hold"

    async def main() -> RunResult:
        async with Engine(limits={"local": Limits(max_in_flight=1)}) as engine:
            handle = engine.submit(wf)
            await asyncio.sleep(5)
            assert wf.state("target") == "ready"
            wf.add_edge("bad", "target")  # from outside the workflow, while it runs
            return await handle

    result = clock.run(main())
    assert result.skipped == {"target": "dependency 'bad' failed"}
    assert result.failures == {"bad": "RuntimeError: broken"}


def test_removing_an_edge_at_run_time_releases_the_waiting_task(clock: VirtualClock) -> None:
    async def slow(ctx: TaskContext) -> str:
        await ctx.clock.sleep(100)
        return "slow"

    async def impatient(ctx: TaskContext) -> None:
        await ctx.clock.sleep(1)
        ctx.workflow.remove_edge("slow", "report")

    async def report(ctx: TaskContext) -> float:
        return ctx.clock.monotonic()

    wf = Workflow("unwire")
    wf.add("slow", slow)
    wf.add("impatient", impatient)
    wf.add("report", report, after=["slow"])
    result = run_sync(wf, clock=clock)
    assert result["report"] == 1.0  # ran as soon as its only input was dropped
    assert result.duration == 100.0


def test_replacing_a_running_task_is_refused(clock: VirtualClock) -> None:
    refused: list[str] = []

    async def long(ctx: TaskContext) -> None:
        await ctx.clock.sleep(5)

    async def swapper(ctx: TaskContext) -> None:
        try:
            ctx.workflow.replace("long", one)
        except TaskStartedError as exc:
            refused.append(str(exc))

    wf = Workflow("noswap")
    wf.add("long", long)
    wf.add("swapper", swapper)
    assert run_sync(wf, clock=clock).ok
    assert refused and "cannot replace task 'long'" in refused[0]


def test_engine_events_sees_every_workflow(clock: VirtualClock) -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        async with Engine() as engine:

            async def watch() -> None:
                async for event in engine.events():
                    if event.kind == "workflow_finished":
                        seen.append(event.workflow)
                        if len(seen) == 2:
                            return

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0)
            for name in ("x", "y"):
                wf = Workflow(name)
                wf.add("t", one)
                await engine.run(wf)
            await watcher
        return seen

    assert clock.run(main()) == ["x", "y"]


def test_cancelling_a_task_before_its_first_step_still_ends_the_run(clock: VirtualClock) -> None:
    async def work(ctx: TaskContext) -> int:
        await ctx.clock.sleep(1)
        return 1

    wf = Workflow("early")
    wf.add("t", work)

    async def main() -> RunResult:
        async with asyncio.timeout(1000), Engine() as engine:
            handle = engine.submit(wf)
            await asyncio.sleep(0)  # the loop has started "t", which has not run a step yet
            engine.cancel(wf, "changed my mind")
            result = await handle
            assert all(r.in_flight == 0 for r in engine.stats().resources)
            return result

    result = clock.run(main())
    assert result.status == "cancelled" and result.cancelled == {"t": "changed my mind"}


def test_leaving_the_engine_right_after_submitting_does_not_hang(clock: VirtualClock) -> None:
    wf = Workflow("leave")
    wf.add("t", one)

    async def main() -> None:
        async with asyncio.timeout(1000), Engine() as engine:
            engine.submit(wf)
            await asyncio.sleep(0)

    clock.run(main())
    assert wf.state("t") in ("done", "cancelled")


def test_a_cancelled_error_from_the_tasks_own_code_is_its_failure(clock: VirtualClock) -> None:
    async def victim(ctx: TaskContext) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # raises CancelledError, though nobody cancelled this task

    wf = Workflow("inner")
    wf.add("victim", victim)
    wf.add("other", one)
    result = run_sync(wf, clock=clock)
    assert result.status == "failed" and result.results == {"other": 1}
    assert "'victim' was cancelled: its code raised CancelledError" in result.failures["victim"]


def test_system_exit_from_a_task_is_a_failure_not_the_end_of_the_engine(
    clock: VirtualClock,
) -> None:
    async def tool(ctx: TaskContext) -> None:
        raise SystemExit(2)  # what argparse does on bad arguments

    bad, good = Workflow("bad"), Workflow("good")
    bad.add("tool", tool)
    good.add("t", one)

    async def main() -> list[RunResult]:
        async with Engine() as engine:
            return list(await asyncio.gather(engine.run(bad), engine.run(good)))

    bad_result, good_result = clock.run(main())
    assert bad_result.status == "failed" and isinstance(bad_result.errors["tool"], SystemExit)
    assert good_result.ok


def test_a_retry_on_base_exception_does_not_swallow_cancellation(clock: VirtualClock) -> None:
    attempts: list[float] = []

    async def stubborn(ctx: TaskContext) -> str:
        attempts.append(ctx.clock.monotonic())
        await ctx.clock.sleep(100)
        return "finished anyway"

    wf = Workflow("stubborn")
    wf.add("t", stubborn, retry=Retry(attempts=5, on=(BaseException,), jitter=0))

    async def main() -> RunResult:
        async with Engine() as engine:
            handle = engine.submit(wf)
            await asyncio.sleep(5)
            handle.cancel("stop")
            return await handle

    result = clock.run(main())
    assert result.status == "cancelled" and attempts == [0.0] and result.duration == 5.0


def test_a_task_added_before_another_and_skipped_at_once_skips_it_honestly(
    clock: VirtualClock,
) -> None:
    async def planner(ctx: TaskContext) -> str:
        ctx.workflow.add("optional", one, before=["report"], when=lambda inputs: False)
        await ctx.clock.sleep(1)
        return "planned"

    wf = Workflow("settled-at-once")
    wf.add("planner", planner)
    wf.add("report", one, after=["planner"])
    result = run_sync(wf, clock=clock)
    assert result.skipped == {
        "optional": "its condition was false",
        "report": "dependency 'optional' was skipped",
    }
    assert result["planner"] == "planned"


def test_a_replacement_that_fails_at_once_releases_its_dependents(clock: VirtualClock) -> None:
    async def hold(ctx: TaskContext) -> None:
        await ctx.clock.sleep(5)

    async def first(ctx: TaskContext) -> None:
        await ctx.clock.sleep(0.1)  # "busy1" is now in flight on "tools"
        ctx.workflow.add("busy2", hold, resource="tools")  # takes the one waiting place
        # "second" is ready (queued behind "first" on "local"); its replacement goes to
        # "tools", whose queue is full, so it fails the moment it is judged.
        ctx.workflow.replace("second", one, resource="tools")

    wf = Workflow("swap-fails")
    wf.add("busy1", hold, resource="tools")
    wf.add("first", first)
    wf.add("second", one)
    wf.add("third", one, after=["second"])

    async def main() -> RunResult:
        limits = {
            "tools": Limits(max_in_flight=1, max_waiting=1),
            "local": Limits(max_in_flight=1),
        }
        async with asyncio.timeout(1000), Engine(limits=limits) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert "wait queue of resource 'tools' is full" in result.failures["second"]
    assert result.skipped == {"third": "dependency 'second' failed"}


def test_a_sync_planner_changes_its_workflow_on_the_loop_thread(clock: VirtualClock) -> None:
    loop_thread: list[int] = []
    mutation_threads: list[int] = []
    started: dict[str, float] = {}
    planner_busy: list[bool] = []

    all_started = asyncio.Event()

    async def child(ctx: TaskContext) -> str:
        started[ctx.task_id] = ctx.clock.monotonic()
        planner_busy.append(not release.is_set())
        if len(started) == 3:
            all_started.set()
        return ctx.task_id

    def plan(ctx: TaskContext) -> int:  # sync: runs in a worker thread
        for i in range(3):
            ctx.workflow.add(f"r{i}", child, before=["write"])
        release.wait(timeout=5)  # keep the planner busy after it planned
        return 3

    release = threading.Event()
    wf = Workflow("sync-planner")
    wf.add("plan", plan)
    wf.add("write", lambda ctx: sorted(ctx.inputs), after=["plan"])

    async def main() -> RunResult:
        loop_thread.append(threading.get_ident())
        async with Engine() as engine:
            handle = engine.submit(wf)
            run = engine._runs[wf.id]
            added = run.added

            def spy(task: Any, after: tuple[str, ...]) -> None:
                mutation_threads.append(threading.get_ident())
                added(task, after)

            run.added = spy  # type: ignore[method-assign]
            await all_started.wait()  # all three ran while the planner still works
            release.set()
            return await handle

    result = clock.run(main())
    assert result["write"] == ["plan", "r0", "r1", "r2"]
    assert set(mutation_threads) == set(loop_thread)
    # The children ran while the planner was still busy, not after it returned.
    assert planner_busy == [True, True, True]


def test_llm_calls_from_function_tasks_wait_for_the_backend_limit(clock: VirtualClock) -> None:
    from agents import Agent
    from executors import FunctionLLM

    in_flight = 0
    peak = 0

    async def reply(request: Any, hints: Any) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(1)
        in_flight -= 1
        return "ok"

    agent = Agent("a", "s")

    async def agent_loop(ctx: TaskContext) -> int:
        for _ in range(2):
            await ctx.complete(agent.request("step"))
        return 2

    wf = Workflow("loops")
    for i in range(10):
        wf.add(f"loop{i}", agent_loop)

    async def main() -> RunResult:
        llm = FunctionLLM(reply)
        limits = {"default": Limits(max_in_flight=2)}
        async with Engine(backends={"default": llm}, limits=limits) as engine:
            result = await engine.run(wf)
            stats = {s.name: s for s in engine.stats().resources}
            assert stats["default"].admitted == 20 and stats["default"].in_flight == 0
            return result

    result = clock.run(main())
    assert result.ok and peak == 2
    assert result.duration == 10.0  # 20 one-second calls, two at a time


def test_cancelling_the_engine_from_outside_resolves_every_waiter(clock: VirtualClock) -> None:
    async def long(ctx: TaskContext) -> None:
        await ctx.clock.sleep(1000)

    wf = Workflow("abandoned")
    wf.add("t", long)
    outcome: list[str] = []

    async def main() -> None:
        handle_box: list[Any] = []
        submitted = asyncio.Event()

        async def host() -> None:
            async with Engine() as engine:
                handle_box.append(engine.submit(wf))
                submitted.set()
                await asyncio.sleep(10_000)

        async def client() -> None:
            await submitted.wait()
            result = await handle_box[0]
            outcome.append(result.status)

        host_task = asyncio.ensure_future(host())
        client_task = asyncio.ensure_future(client())
        await asyncio.sleep(5)
        host_task.cancel()
        async with asyncio.timeout(100):
            await client_task
        with contextlib.suppress(asyncio.CancelledError):
            await host_task

    clock.run(main())
    assert outcome == ["cancelled"]


def test_stuck_sync_functions_do_not_starve_other_workflows(clock: VirtualClock) -> None:
    release = threading.Event()

    def stuck(ctx: TaskContext) -> None:
        release.wait(timeout=30)

    bad = Workflow("bad")
    for i in range(6):
        bad.add(f"s{i}", stuck, timeout=0.05)
    good = Workflow("good")
    good.add("quick", lambda: "fine")

    async def main() -> list[RunResult]:
        async with Engine(threads=16) as engine:
            try:
                first = await engine.run(bad)
                second = await engine.run(good)
            finally:
                release.set()
            return [first, second]

    bad_result, good_result = clock.run(main())
    assert len(bad_result.failures) == 6
    assert good_result.ok and good_result.duration < 1.0


def test_a_refused_workflow_can_be_fixed_and_submitted_again(clock: VirtualClock) -> None:
    wf = Workflow("fixable")
    wf.add("t", one, resource="gpu")

    async def main() -> tuple[RunResult, list[str]]:
        async with Engine(limits={"gpu": Limits(max_in_flight=1)}) as engine:
            wf.replace("t", one, resource="nowhere")
            with pytest.raises(UnknownResourceError, match="Engine\\(limits=...\\)"):
                engine.submit(wf)
            wf.replace("t", one, resource="gpu")
            kinds = [e.kind async for e in engine.iter(wf)]
            return wf.run_of("t").result, kinds

    result, kinds = clock.run(main())
    assert result == 1
    assert kinds.count("workflow_started") == 1 and kinds[-1] == "workflow_finished"


def test_a_callable_object_that_cannot_be_hashed_is_still_a_task(clock: VirtualClock) -> None:
    class Counter:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, ctx: TaskContext) -> int:
            return 7

    wf = Workflow("unhashable")
    wf.add("c", Counter())
    assert run_sync(wf, clock=clock)["c"] == 7


def test_timeout_message_says_how_to_give_more_time(clock: VirtualClock) -> None:
    async def slow(ctx: TaskContext) -> None:
        await ctx.clock.sleep(10)

    wf = Workflow("slow")
    wf.add("s", slow, timeout=1)
    message = run_sync(wf, clock=clock).failures["s"]
    assert "within its timeout of 1 s" in message and "workflow.add(..., timeout=...)" in message


def test_a_task_reads_every_result_upstream_of_it(clock: VirtualClock) -> None:
    seen: dict[str, Any] = {}

    def fails(ctx: TaskContext) -> None:
        raise ValueError("no")

    def last(ctx: TaskContext) -> int:
        seen.update(ctx.upstream)
        return len(ctx.inputs)

    wf = Workflow("upstream")
    wf.add("a", lambda ctx: 1)
    wf.add("aside", lambda ctx: 2)  # succeeds, but "last" does not wait for it
    wf.add("b", lambda ctx: ctx.input("a") + 1, after=["a"])
    wf.add("broken", fails, after=["a"])
    wf.add("last", last, after=["b", "broken"], trigger="all_done")
    result = run_sync(wf, clock=clock)
    assert result["last"] == 1  # its one input that succeeded: b
    assert seen == {"a": 1, "b": 2}  # through b too; not what failed, not what is aside
