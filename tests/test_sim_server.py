"""The simulated server behind the LLMBackend protocol, on the virtual clock."""

from __future__ import annotations

import asyncio

import pytest

from agents import Agent
from executors import RequestTooLongError, SimServer, SimStats
from orchestrator import (
    Engine,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    RunResult,
    TaskContext,
    VirtualClock,
    Workflow,
)

SYSTEM = "You are a coding agent working in a large repository. " * 40  # ~550 tokens


def conversation(name: str, turns: int, keep_alive: float | None = None) -> Workflow:
    """One agent program: each turn's prompt is the whole conversation so far."""
    wf = Workflow(name)

    async def turn(ctx: TaskContext) -> list[str]:
        history: list[str] = list(next(iter(ctx.inputs.values()), []))
        messages = [Message("system", SYSTEM)]
        for i, text in enumerate(history):
            messages.append(Message("user" if i % 2 == 0 else "assistant", text))
        question = f"{name}: step {len(history) // 2}"
        messages.append(Message("user", question))
        n = len(history) // 2
        reply = await ctx.complete(
            LLMRequest(tuple(messages), model="m", max_tokens=64),
            keep_alive_s=keep_alive,
            last_call=n == turns - 1,
        )
        return [*history, question, reply.text]

    prev: list[str] = []
    for t in range(turns):
        wf.add(f"turn{t}", turn, after=prev)
        prev = [f"turn{t}"]
    return wf


def run_agents(
    seed: int, programs: int = 6, turns: int = 4, keep_alive: float | None = None
) -> tuple[list[RunResult], SimStats, float]:
    clock = VirtualClock()

    async def main() -> tuple[list[RunResult], SimStats]:
        async with SimServer("h100-llama3-8b", seed=seed) as sim:
            async with Engine(backends={"default": sim}) as engine:
                flows = [conversation(f"p{i}", turns, keep_alive) for i in range(programs)]
                results = await asyncio.gather(*(engine.run(wf) for wf in flows))
            return results, sim.stats()

    results, stats = clock.run(main())
    return results, stats, clock.monotonic()


def test_same_seed_same_result_bit_for_bit() -> None:
    a, stats_a, end_a = run_agents(seed=7)
    b, stats_b, end_b = run_agents(seed=7)
    assert [r.results for r in a] == [r.results for r in b]
    assert [r.duration for r in a] == [r.duration for r in b]
    assert stats_a == stats_b and end_a == end_b
    c, _, _ = run_agents(seed=8)
    assert [r.results for r in c] != [r.results for r in a]  # the seed drives the text


def test_later_turns_reuse_the_conversation_prefix() -> None:
    results, stats, _ = run_agents(seed=1)
    assert all(r.ok for r in results)
    assert stats.requests == 24
    # Every turn after the first finds the system prompt and the previous turns cached.
    assert stats.prefix_cache_hits > 0.7 * stats.prefix_cache_queries
    last = results[0].usage
    assert last.cached_prompt_tokens is not None and last.cached_prompt_tokens > 0


def test_usage_reports_prompt_completion_and_cached_tokens() -> None:
    clock = VirtualClock()

    async def main() -> tuple[LLMResponse, LLMResponse]:
        async with SimServer("h100-llama3-8b") as sim:
            req = LLMRequest((Message("system", SYSTEM), Message("user", "hi")), "m", max_tokens=5)
            first = await sim.complete(req, Hints(program_id="x"))
            second = await sim.complete(req, Hints(program_id="x"))
            return first, second

    first, second = clock.run(main())
    assert first.usage.completion_tokens == 5 and len(first.text) == 20
    assert first.usage.cached_prompt_tokens == 0
    prompt = first.usage.prompt_tokens
    assert second.usage.cached_prompt_tokens == (prompt - 1) // 16 * 16
    assert first.text == second.text


def test_a_request_longer_than_the_context_is_a_clear_error() -> None:
    clock = VirtualClock()

    async def main() -> None:
        async with SimServer("h100-llama3-8b") as sim:
            huge = LLMRequest((Message("user", "x" * 600_000),), "m", max_tokens=10)
            await sim.complete(huge, Hints(program_id="x"))

    with pytest.raises(RequestTooLongError, match="more than the model's context of 131072"):
        clock.run(main())


def test_a_cancelled_call_frees_its_place() -> None:
    clock = VirtualClock()

    async def main() -> SimStats:
        async with SimServer("h100-llama3-8b") as sim:
            req = LLMRequest((Message("user", "write a lot"),), "m", max_tokens=5000)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(1.0):
                    await sim.complete(req, Hints(program_id="x"))
            return sim.stats()

    stats = clock.run(main())
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_cache_usage == 0.0


def test_forty_agent_programs_share_the_server_and_all_finish() -> None:
    results, stats, end = run_agents(seed=3, programs=40, turns=10)
    assert all(r.ok for r in results)
    assert stats.requests == 400 and stats.running == 0 and stats.waiting == 0
    assert stats.busy_s <= end  # the server never works longer than the time that passed


def test_agent_tasks_run_on_the_simulator(clock: VirtualClock) -> None:
    agent = Agent("a", SYSTEM, max_tokens=32)

    async def main() -> RunResult:
        wf = Workflow("one")
        wf.add("ask", agent.ask("hello"))
        async with SimServer("h100-llama3-8b") as sim, Engine(backends={"default": sim}) as engine:
            return await engine.run(wf)

    result = clock.run(main())
    assert result.ok and result.usage.completion_tokens == 32
    assert 0.1 < result.duration < 1.0  # ~600 prompt tokens and 32 decode steps on an H100


TENANTS = [("alice-1", "alice"), ("bob", "bob"), ("alice-2", "alice"), ("anon-1", None)]
TENANTS += [("anon-2", None)]


def test_a_tenant_gets_no_cache_hits_from_another_tenants_prompt(clock: VirtualClock) -> None:
    """Runs of one tenant share their prompts' cached blocks; another tenant sending the
    same prompt finds nothing cached (so cannot learn it was sent), and runs without a
    tenant share among themselves as before."""
    agent = Agent("a", SYSTEM, max_tokens=8)

    async def main() -> dict[str, int | None]:
        cached: dict[str, int | None] = {}
        async with SimServer("h100-llama3-8b") as sim, Engine(backends={"default": sim}) as engine:
            for name, tenant in TENANTS:
                wf = Workflow(name)
                wf.add("ask", agent.ask("What is the secret launch date?"))
                result = await engine.submit(wf, tenant=tenant)
                assert result.ok
                cached[name] = result.usage.cached_prompt_tokens
        return cached

    cached = clock.run(main())
    assert cached["alice-1"] == 0 and cached["bob"] == 0 and cached["anon-1"] == 0
    hits = cached["alice-2"]
    assert hits is not None and hits > 500  # the ~550-token system prompt and more
    assert cached["anon-2"] == hits
