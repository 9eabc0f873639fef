"""Fault injection end to end: Engine -> Router -> OpenAIBackend -> HTTP -> three simulated
servers that fail 10% of calls with a 500 and hold 5% past the client's timeout, one of
them killed mid-run. Every workflow still completes, retries stay bounded, and they match
what was injected. On the virtual clock, so timeouts and backoffs cost no wall time."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import pytest
from aiohttp import web

from agents import Agent
from executors import Faults, OpenAIBackend, ReplicaStats, Router, SimHTTP, SimServer
from orchestrator import (
    CallRetry,
    CallRetrying,
    Engine,
    Event,
    RunResult,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
)

SERVERS = 3
WORKFLOWS = 20
CALL_RETRY = CallRetry(attempts=5, initial_delay=0.5, max_delay=10.0)
CLIENT_TIMEOUT_S = 2.0
AGENTS = [Agent(f"analyst{i}", f"You are analyst {i}. Be brief. " * 30) for i in range(4)]


def job(i: int) -> Workflow:
    """Five LLM calls: three LLM tasks in a chain, and a task that makes two calls itself."""
    agent = AGENTS[i % len(AGENTS)]
    wf = Workflow(f"job{i}")
    wf.add("plan", agent.ask(f"plan job {i}", max_tokens=8))
    wf.add(
        "draft",
        agent.ask(lambda ctx: f"draft after {ctx.input('plan')}", max_tokens=8),
        after=["plan"],
    )

    async def review(ctx: TaskContext) -> str:
        first = await ctx.complete(agent.request(f"review {i}", max_tokens=8))
        second = await ctx.complete(agent.request(f"again {i}: {first.text}", max_tokens=8))
        return second.text

    wf.add("review", review, after=["draft"])
    wf.add("final", agent.ask(f"finish job {i}", max_tokens=8), after=["review"])
    return wf


CALLS_PER_JOB = 5
TASKS_PER_JOB = 4


@dataclass
class Outcome:
    results: list[RunResult]
    events: list[Event]
    fronts: list[SimHTTP]
    killed: int
    requests_before_kill: int
    replicas: list[ReplicaStats]
    slots_in_use: tuple[int, int]


SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def run_faulty(clock: VirtualClock, error_rate: float, timeout_rate: float, seed: int) -> Outcome:
    async def main() -> Outcome:
        async with contextlib.AsyncExitStack() as stack:
            sims = [
                await stack.enter_async_context(SimServer("h100-llama3-8b", seed=seed + k))
                for k in range(SERVERS)
            ]
            fronts = [
                SimHTTP(sim, faults=Faults(error_rate, timeout_rate, hold_s=30.0, seed=seed + k))
                for k, sim in enumerate(sims)
            ]
            runners: list[web.AppRunner] = []
            for front in fronts:
                # A short shutdown: killing a server cuts its requests off, as a crash would.
                runner = web.AppRunner(front.app(), access_log=None, shutdown_timeout=0.1)
                await runner.setup()
                stack.push_async_callback(runner.cleanup)  # again after a kill is harmless
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                runners.append(runner)
            backends = {
                f"s{k}": OpenAIBackend(
                    f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
                    dialect="sim",
                    name=f"s{k}",
                    timeout_s=CLIENT_TIMEOUT_S,
                    probe_timeout_s=1.0,
                    local=True,  # the servers share this test's (virtual) clock
                    model=SIM_MODEL,
                )
                for k, runner in enumerate(runners)
            }
            router = await stack.enter_async_context(
                Router(backends, health_interval_s=1.0, health_timeout_s=1.0)
            )
            engine = await stack.enter_async_context(
                Engine(backends={"default": router}, call_retry=CALL_RETRY)
            )
            killed, requests_before_kill = -1, 0
            events: list[Event] = []
            tasks_done = finished = 0
            handles = [engine.submit(job(i)) for i in range(WORKFLOWS)]
            async for event in engine.events():
                events.append(event)
                if event.kind == "task_succeeded":
                    tasks_done += 1
                    if tasks_done == WORKFLOWS * TASKS_PER_JOB // 3:
                        # A third of the work is done: kill the busiest server.
                        replicas = router.stats()
                        killed = max(range(SERVERS), key=lambda k: replicas[k].requests)
                        requests_before_kill = replicas[killed].requests
                        await runners[killed].cleanup()
                elif event.kind == "workflow_finished":
                    finished += 1
                    if finished == WORKFLOWS:
                        break
            results = [await handle for handle in handles]
            resources = {r.name: r for r in engine.stats().resources}["default"]
            return Outcome(
                results,
                events,
                fronts,
                killed,
                requests_before_kill,
                router.stats(),
                (resources.in_flight, resources.waiting),
            )
        raise AssertionError("unreachable")

    return clock.run(main())


def test_every_workflow_completes_through_faults_and_a_killed_server(
    clock: VirtualClock,
) -> None:
    out = run_faulty(clock, error_rate=0.10, timeout_rate=0.05, seed=11)
    assert [r.status for r in out.results] == ["succeeded"] * WORKFLOWS
    calls = sum(r.llm_calls for r in out.results)
    assert calls == WORKFLOWS * CALLS_PER_JOB

    retries = [e for e in out.events if isinstance(e, CallRetrying)]
    # Bounded: a call is sent at most `attempts` times, so it waits at most attempts - 1.
    assert len(retries) <= (CALL_RETRY.attempts - 1) * calls
    assert max(r.attempt for r in retries) < CALL_RETRY.attempts
    assert not [e for e in out.events if e.kind in ("task_retrying", "task_failed")]

    errors = sum(f.injected_errors for f in out.fronts)
    timeouts = sum(f.injected_timeouts for f in out.fronts)
    sent = sum(r.requests for r in out.replicas)
    # The dice were rolled for every request that reached a server: about 10% and 5%.
    assert 0.03 * sent <= errors <= 0.2 * sent, (errors, sent)
    assert 1 <= timeouts <= 0.12 * sent, (timeouts, sent)
    # A 500 is not the replica's death: the router passes it up, and the call is retried,
    # once per injected error. A held request times out, ejects its replica and fails over
    # inside the router; the engine retries only when no replica was left to try.
    why = Counter(r.error.split(":")[0] for r in retries)
    assert why["BackendError"] == errors, why
    assert set(why) <= {"BackendError", "BackendUnavailableError", "CircuitOpenError"}, why
    unavailable_calls = sum(r.failures for r in out.replicas)
    assert unavailable_calls >= timeouts

    # The killed server was ejected, and the health checks kept it out.
    dead = out.replicas[out.killed]
    assert out.requests_before_kill > 0
    assert dead.ejections >= 1 and not dead.healthy and dead.checks_failed >= 1
    # No admission slot leaked.
    assert out.slots_in_use == (0, 0)
    print(
        f"calls={calls} sent={sent} injected errors={errors} timeouts={timeouts} "
        f"call retries={len(retries)} {dict(why)} replicas={out.replicas}"
    )


def test_without_faults_nothing_is_retried(clock: VirtualClock) -> None:
    out = run_faulty(clock, error_rate=0.0, timeout_rate=0.0, seed=3)
    assert all(r.ok for r in out.results)
    retries = [e for e in out.events if isinstance(e, CallRetrying)]
    # Only the kill can cost retries: the calls it cut off fail over inside the router.
    assert all(r.error.startswith("BackendUnavailableError") for r in retries)
    assert sum(f.injected_errors + f.injected_timeouts for f in out.fronts) == 0
    assert out.replicas[out.killed].ejections >= 1


def test_fault_rates_are_checked() -> None:
    with pytest.raises(UsageError, match="at most 1"):
        Faults(error_rate=0.7, timeout_rate=0.5)
    with pytest.raises(UsageError, match="negative"):
        Faults(error_rate=-0.1)
