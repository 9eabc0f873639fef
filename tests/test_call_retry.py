"""Call-level retries and the circuit breaker: the pure parts without a loop, then through
the engine on the virtual clock, where waits are exact."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from agents import Agent
from executors import FunctionLLM
from orchestrator import (
    EVENT_ADAPTER,
    BackendError,
    Breaker,
    CallRetry,
    CallRetrying,
    CircuitOpenError,
    Engine,
    Event,
    Hints,
    Limits,
    LLMRequest,
    Retry,
    RunResult,
    TaskContext,
    UsageError,
    VirtualClock,
    Workflow,
    WorkflowFinished,
)
from orchestrator.engine._resilience import CircuitBreaker
from orchestrator.ext import BackendOverloadedError, BackendRequestError, BackendUnavailableError

AGENT = Agent("a", "You answer.")
NO_JITTER = CallRetry(attempts=4, initial_delay=1.0, max_delay=20.0, jitter=0.0)


# --- the circuit breaker as a pure state machine ------------------------------------------------


def test_the_circuit_opens_after_consecutive_failures_only() -> None:
    cb = CircuitBreaker(failures=3, cooldown_s=10.0)
    for t in (1.0, 2.0):
        assert cb.acquire(t) is None
        cb.failed(t)
    cb.succeeded()  # a success in between resets the count
    for t in (3.0, 4.0):
        cb.failed(t)
    assert cb.state == "closed" and cb.consecutive_failures == 2
    cb.failed(5.0)
    assert cb.state == "open"
    assert cb.acquire(5.0) == 10.0
    assert cb.acquire(11.5) == pytest.approx(3.5)  # what is left of the cooldown


def test_half_open_lets_one_probe_through_and_its_verdict_decides() -> None:
    cb = CircuitBreaker(failures=1, cooldown_s=10.0)
    cb.failed(0.0)
    assert cb.acquire(10.0) is None  # the probe
    assert cb.state == "half_open"
    assert cb.acquire(10.5) == 10.0  # others wait while the probe is out
    cb.failed(12.0)  # the probe failed: open for a whole cooldown from now
    assert cb.state == "open" and cb.acquire(12.0) == 10.0
    assert cb.acquire(22.0) is None  # the next probe
    cb.succeeded()
    assert cb.state == "closed" and cb.consecutive_failures == 0
    assert cb.acquire(22.0) is None and cb.acquire(22.0) is None


def test_an_abandoned_probe_lets_the_next_call_probe() -> None:
    cb = CircuitBreaker(failures=1, cooldown_s=5.0)
    cb.failed(0.0)
    assert cb.acquire(5.0) is None
    cb.abandoned()  # cancelled: it said nothing about the backend
    assert cb.state == "half_open"
    assert cb.acquire(5.0) is None
    assert cb.acquire(5.0) == 5.0


@pytest.mark.parametrize("bad", [dict(failures=0), dict(cooldown_s=-1.0)])
def test_breaker_settings_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(UsageError):
        Breaker(**bad)


# --- the retry policy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (BackendUnavailableError("refused"), True),
        (BackendOverloadedError("busy", status=429, retry_after=3.0), True),
        (BackendError("boom", status=500), True),
        (CircuitOpenError("b", 5, 2.0), True),
        (BackendRequestError("bad", status=400), False),
        (BackendOverloadedError("busy for an hour", status=503, retry_after=3600.0), False),
        (ValueError("a bug"), False),
    ],
)
def test_which_errors_a_call_retries(error: BaseException, retried: bool) -> None:
    assert NO_JITTER.should_retry(error) is retried


def test_the_delay_doubles_is_capped_and_honours_retry_after() -> None:
    spec = CallRetry(attempts=8, initial_delay=0.5, max_delay=4.0, jitter=1.0)
    assert [spec.delay(n, None, 0.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert spec.delay(1, None, 0.5) == 1.0  # half the jitter
    busy = BackendOverloadedError("busy", retry_after=3.0)
    assert spec.delay(1, busy, 0.0) == 3.0  # never sooner than the server asked
    assert spec.delay(4, busy, 0.0) == 4.0
    with pytest.raises(UsageError):
        CallRetry(attempts=0)


# --- through the engine -----------------------------------------------------------------------


def flaky(errors: Sequence[BaseException], reply: str = "ok") -> FunctionLLM:
    """Raises `errors` in turn, then answers; one second per call."""
    pending = list(errors)

    def answer(request: LLMRequest, hints: Hints) -> str:
        if pending:
            raise pending.pop(0)
        return reply

    return FunctionLLM(answer, latency=1.0)


def run_one(
    clock: VirtualClock, llm: FunctionLLM, workflow: Workflow, **engine: Any
) -> tuple[WorkflowFinished, list[Event]]:
    """Run `workflow` alone; how it finished and every event it produced."""

    async def main() -> list[Event]:
        async with Engine(backends={"default": llm}, **engine) as e:
            return [event async for event in e.iter(workflow)]

    events = clock.run(main())
    finished = [e for e in events if isinstance(e, WorkflowFinished)]
    assert len(finished) == 1
    return finished[0], events


def retries(events: list[Event]) -> list[CallRetrying]:
    return [e for e in events if isinstance(e, CallRetrying)]


def test_a_failed_call_is_sent_again_after_exact_backoff(clock: VirtualClock) -> None:
    llm = flaky([BackendUnavailableError("refused"), BackendError("boom", status=500)])
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"))
    finished, events = run_one(clock, llm, wf, call_retry=NO_JITTER)
    assert finished.status == "succeeded"
    assert [c.at for c in llm.calls] == [0.0, 2.0, 5.0]  # 1 s call, 1 s wait, 1 s, 2 s wait
    seen = retries(events)
    assert [(r.attempt, r.delay, r.backend, r.task) for r in seen] == [
        (1, 1.0, "default", "ask"),
        (2, 2.0, "default", "ask"),
    ]
    assert seen[0].error.startswith("BackendUnavailableError: refused")
    assert [e.kind for e in events].count("task_started") == 1  # the task ran once
    assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(seen[0])) == seen[0]


def test_retry_after_is_the_shortest_wait(clock: VirtualClock) -> None:
    llm = flaky([BackendOverloadedError("busy", status=429, retry_after=7.0)])
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"))
    finished, events = run_one(clock, llm, wf, call_retry=NO_JITTER)
    assert finished.status == "succeeded"
    assert [c.at for c in llm.calls] == [0.0, 8.0]
    assert [r.delay for r in retries(events)] == [7.0]


def test_retries_are_bounded_and_the_last_error_fails_the_task(clock: VirtualClock) -> None:
    llm = flaky([BackendError(f"boom {i}", status=502) for i in range(10)])
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"))
    finished, events = run_one(clock, llm, wf, call_retry=NO_JITTER, breaker=None)
    assert finished.status == "failed" and "boom 3" in finished.failures["ask"]
    assert len(llm.calls) == 4 and len(retries(events)) == 3


def test_a_refused_request_is_not_retried(clock: VirtualClock) -> None:
    llm = flaky([BackendRequestError("bad field", status=400)] * 3)
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"))
    finished, events = run_one(clock, llm, wf, call_retry=NO_JITTER)
    assert finished.status == "failed" and len(llm.calls) == 1 and not retries(events)


def test_task_retries_multiply_call_retries(clock: VirtualClock) -> None:
    llm = flaky([BackendUnavailableError("refused")] * 5)
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"), retry=Retry(attempts=2, initial_delay=1.0, jitter=0))
    retry = CallRetry(attempts=3, initial_delay=1.0, jitter=0.0)
    finished, events = run_one(clock, llm, wf, call_retry=retry, breaker=None)
    assert finished.status == "succeeded"  # 3 failed calls, task retry, 2 more failed, 1 ok
    assert len(llm.calls) == 6
    assert [e.kind for e in events].count("task_retrying") == 1 and len(retries(events)) == 4


def two_in_task_calls(name: str) -> Workflow:
    async def loop(ctx: TaskContext) -> int:
        await ctx.complete(AGENT.request(f"{name} 1"))
        await ctx.complete(AGENT.request(f"{name} 2"))
        return 2

    wf = Workflow(name)
    wf.add("loop", loop)
    return wf


def test_a_waiting_in_task_call_gives_its_slot_to_others(clock: VirtualClock) -> None:
    """One slot on the backend; A's first call fails and waits 10 s. B's calls take the slot
    meanwhile, instead of idling behind A's backoff."""
    failed = [False]

    def answer(request: LLMRequest, hints: Hints) -> str:
        if "A 1" in request.messages[-1].content and not failed[0]:
            failed[0] = True
            raise BackendUnavailableError("refused")
        return "ok"

    llm = FunctionLLM(answer, latency=1.0)
    retry = CallRetry(attempts=2, initial_delay=10.0, jitter=0.0)

    async def main() -> tuple[list[RunResult], Any]:
        limits = {"default": Limits(max_in_flight=1)}
        async with Engine(backends={"default": llm}, limits=limits, call_retry=retry) as e:
            a = e.submit(two_in_task_calls("A"))
            b = e.submit(two_in_task_calls("B"))
            results = [await a, await b]
            return results, {s.name: s for s in e.stats().resources}["default"]

    results, stats = clock.run(main())
    assert all(r.ok for r in results)
    order = [(c.request.messages[-1].content, c.at) for c in llm.calls]
    assert order == [("A 1", 0.0), ("B 1", 1.0), ("B 2", 2.0), ("A 1", 11.0), ("A 2", 12.0)]
    assert stats.in_flight == 0 and stats.waiting == 0


def test_an_llm_task_keeps_its_own_slot_while_its_call_waits(clock: VirtualClock) -> None:
    """An LLM task's slot is its admission: it keeps it through the backoff, so the backend's
    limit holds, and B starts only when A is done."""
    llm = flaky([BackendUnavailableError("refused")])
    retry = CallRetry(attempts=2, initial_delay=10.0, jitter=0.0)

    def one(name: str) -> Workflow:
        wf = Workflow(name)
        wf.add("ask", AGENT.ask(name))
        return wf

    async def main() -> list[RunResult]:
        limits = {"default": Limits(max_in_flight=1)}
        async with Engine(backends={"default": llm}, limits=limits, call_retry=retry) as e:
            a, b = e.submit(one("A")), e.submit(one("B"))
            return [await a, await b]

    results = clock.run(main())
    assert all(r.ok for r in results)
    assert [(c.request.messages[-1].content, c.at) for c in llm.calls] == [
        ("A", 0.0),
        ("A", 11.0),
        ("B", 12.0),
    ]


def sequential(n: int, gap: float) -> Callable[[TaskContext], Any]:
    async def calls(ctx: TaskContext) -> list[str]:
        out = []
        for i in range(n):
            try:
                out.append((await ctx.complete(AGENT.request(f"q{i}"))).text)
            except BackendError as exc:
                out.append(type(exc).__name__)
            await ctx.clock.sleep(gap)
        return out

    return calls


def test_an_open_circuit_fails_fast_then_a_probe_closes_it(clock: VirtualClock) -> None:
    down_until = 12.0

    def answer(request: LLMRequest, hints: Hints) -> str:
        if clock.monotonic() < down_until:
            raise BackendUnavailableError("refused")
        return "ok"

    llm = FunctionLLM(answer)  # answers at once: only the breaker decides what is sent
    wf = Workflow("w")
    wf.add("calls", sequential(8, gap=2.0))
    breaker = Breaker(failures=3, cooldown_s=7.0)
    no_retry = CallRetry(attempts=1)

    async def main() -> tuple[list[str], str]:
        async with Engine(backends={"default": llm}, call_retry=no_retry, breaker=breaker) as e:
            result = (await e.run(wf)).raise_for_status()
            circuit = e.circuit("default")
            assert circuit is not None
            return result["calls"], circuit.state

    answers, state = clock.run(main())
    # t=0,2,4 fail (opens at 4); 6, 8 fail fast; 10 is not yet 4+7: fast; 12 probes, succeeds.
    assert answers == ["BackendUnavailableError"] * 3 + ["CircuitOpenError"] * 3 + ["ok"] * 2
    assert [c.at for c in llm.calls] == [0.0, 2.0, 4.0, 12.0, 14.0]
    assert state == "closed"


def test_call_retries_wait_out_an_open_circuit_instead_of_hammering(clock: VirtualClock) -> None:
    down_until = 3.0

    def answer(request: LLMRequest, hints: Hints) -> str:
        if clock.monotonic() < down_until:
            raise BackendUnavailableError("refused")
        return "ok"

    llm = FunctionLLM(answer)
    wf = Workflow("w")
    wf.add("ask", AGENT.ask("hi"))
    retry = CallRetry(attempts=4, initial_delay=1.0, jitter=0.0)
    finished, events = run_one(
        clock, llm, wf, call_retry=retry, breaker=Breaker(failures=2, cooldown_s=10.0)
    )
    assert finished.status == "succeeded"
    # Fails at 0 and 1 (the circuit opens at 1 for 10 s). At 3 the circuit answers "8 s
    # more" without calling the backend, and the retry waits that instead of its own 4 s;
    # the probe at 11 succeeds.
    assert [c.at for c in llm.calls] == [0.0, 1.0, 11.0]
    seen = retries(events)
    assert [r.delay for r in seen] == [1.0, 2.0, 8.0]
    assert seen[2].error.startswith("CircuitOpenError: circuit open for backend 'default'")
