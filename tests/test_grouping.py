"""Prefix grouping: siblings of an uncomputed prefix wait for the first, then hit the cache."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from executors import FunctionLLM, PrefixGrouper, Router, SimServer, echo
from executors._prefix import prompt_hashes
from executors._simtext import render
from orchestrator import (
    BackendError,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    Usage,
    VirtualClock,
)

DOCUMENT = "quarterly revenue grew in every region but one; " * 120  # ~1,500 tokens


def question(i: int, document: str = DOCUMENT) -> LLMRequest:
    return LLMRequest(
        (Message("system", "Answer from the document."), Message("user", f"{document}\nQ{i}?")),
        "m",
        max_tokens=8,
    )


async def ask_all(backend: SimServer | PrefixGrouper, n: int) -> list[LLMResponse]:
    return list(
        await asyncio.gather(*(backend.complete(question(i), Hints("p")) for i in range(n)))
    )


def computed_prompt_tokens(grouped: bool, n: int = 10) -> tuple[int, int]:
    clock = VirtualClock()

    async def main() -> tuple[int, int]:
        async with SimServer("h100-llama3-8b", clock=clock) as server:
            backend: SimServer | PrefixGrouper = (
                PrefixGrouper(server, block_tokens=16) if grouped else server
            )
            replies = await ask_all(backend, n)
            stats = server.stats()
            cached = sum(r.usage.cached_prompt_tokens for r in replies)
            return stats.prefix_cache_queries - stats.prefix_cache_hits, cached

    return clock.run(main())


def test_siblings_scheduled_together_share_the_prefix_on_a_vllm_like_server() -> None:
    """vLLM registers a prompt's blocks when the step computing them is scheduled, and so
    does the simulator: siblings in the same step hit them. Grouping adds nothing there."""
    alone, alone_cached = computed_prompt_tokens(grouped=False)
    grouped, grouped_cached = computed_prompt_tokens(grouped=True)
    one_prompt = len(DOCUMENT) // 4
    assert alone < 1.3 * one_prompt  # the document once, then each question's tail
    assert grouped == alone and grouped_cached == alone_cached


class FinishedPrefixServer:
    """A server that can reuse a prompt's blocks only once the call computing them has
    finished (a cache filled after prefill): siblings sent together each compute it."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.cached: set[int] = set()
        self.computed = 0

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        hashes = prompt_hashes(request, 16)
        hit = 0
        while hit < len(hashes) and hashes[hit] in self.cached:
            hit += 1
        self.computed += len(hashes) - hit
        await self.clock.sleep(0.001 * (len(hashes) - hit) + 0.1)
        self.cached.update(hashes)
        return LLMResponse("ok", Usage(prompt_tokens=16 * len(hashes)))


def test_grouping_computes_a_shared_prefix_once_where_only_finished_prefixes_are_cached() -> None:
    def computed_blocks(grouped: bool) -> int:
        clock = VirtualClock()
        server = FinishedPrefixServer(clock)
        backend = PrefixGrouper(server, block_tokens=16) if grouped else server

        async def main() -> None:
            await asyncio.gather(*(backend.complete(question(i), Hints("p")) for i in range(10)))

        clock.run(main())
        return server.computed

    one_prompt_blocks = len(prompt_hashes(question(0), 16))
    assert computed_blocks(grouped=False) >= 9 * one_prompt_blocks
    assert computed_blocks(grouped=True) <= one_prompt_blocks + 10


class Gate:
    """A backend whose calls finish when the test says so; records arrival order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release: dict[str, asyncio.Future[None]] = {}
        self.arrived = asyncio.Event()

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        key = request.messages[-1].content[-3:]
        self.started.append(key)
        self.release[key] = asyncio.get_running_loop().create_future()
        self.arrived.set()
        await self.release[key]
        return LLMResponse("ok", Usage(prompt_tokens=1, completion_tokens=1))


async def until(condition: Callable[[], bool], gate: Gate) -> None:
    while not condition():
        gate.arrived.clear()
        await gate.arrived.wait()


def test_a_failed_leader_releases_its_siblings_and_one_of_them_leads() -> None:
    async def main() -> None:
        gate = Gate()
        grouper = PrefixGrouper(gate, block_tokens=16)
        first = asyncio.create_task(grouper.complete(question(1), Hints("p")))
        await until(lambda: len(gate.started) == 1, gate)
        siblings = [asyncio.create_task(grouper.complete(question(i), Hints("p"))) for i in (2, 3)]
        await asyncio.sleep(0)
        assert gate.started == ["Q1?"]  # held: they share the document with the leader
        gate.release["Q1?"].set_exception(BackendError("boom"))
        with pytest.raises(BackendError):
            await first
        await until(lambda: len(gate.started) == 2, gate)
        assert len(gate.started) == 2  # one sibling leads now, the other still waits
        gate.release[gate.started[1]].set_result(None)
        await until(lambda: len(gate.started) == 3, gate)
        gate.release[gate.started[2]].set_result(None)
        assert [r.text for r in await asyncio.gather(*siblings)] == ["ok", "ok"]
        assert grouper.stats().held == 2

    asyncio.run(main())


def test_a_cancelled_sibling_does_not_cancel_its_leader() -> None:
    async def main() -> None:
        gate = Gate()
        grouper = PrefixGrouper(gate, block_tokens=16)
        leader = asyncio.create_task(grouper.complete(question(1), Hints("p")))
        await until(lambda: len(gate.started) == 1, gate)
        sibling = asyncio.create_task(grouper.complete(question(2), Hints("p")))
        await asyncio.sleep(0)
        sibling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sibling
        gate.release["Q1?"].set_result(None)
        assert (await leader).text == "ok"
        # Once computed, the prefix no longer holds anyone.
        again = asyncio.create_task(grouper.complete(question(3), Hints("p")))
        await until(lambda: len(gate.started) == 2, gate)
        gate.release["Q3?"].set_result(None)
        assert (await again).text == "ok"

    asyncio.run(main())


def test_calls_sharing_too_little_are_not_held() -> None:
    async def main() -> None:
        gate = Gate()
        grouper = PrefixGrouper(gate, block_tokens=16)
        tasks = [
            asyncio.create_task(grouper.complete(question(i, f"document {i} " * 400), Hints("p")))
            for i in range(3)
        ]
        await until(lambda: len(gate.started) == 3, gate)
        for future in gate.release.values():
            future.set_result(None)
        await asyncio.gather(*tasks)
        assert grouper.stats().held == 0

    asyncio.run(main())


def test_a_prompt_is_hashed_once_through_a_grouper_over_a_router(clock: VirtualClock) -> None:
    """Grouper and router both hash each prompt with the same settings: the router's
    hashing is answered from the grouper's."""
    tokenized: list[str] = []

    def tokenize(text: str) -> list[int]:
        tokenized.append(text)
        return [ord(c) for c in text]

    replicas = {f"r{i}": FunctionLLM(echo, latency=1.0) for i in range(2)}
    router = Router(replicas, block_tokens=16, tokenize=tokenize)
    grouper = PrefixGrouper(router, block_tokens=16, tokenize=tokenize)
    documents = [f"document {d}: " + "words " * 200 for d in range(3)]
    requests = [question(i, documents[i % 3]) for i in range(9)]

    async def main() -> None:
        async with grouper:
            await asyncio.gather(*(grouper.complete(r, Hints("p")) for r in requests))

    clock.run(main())
    assert sum(len(llm.calls) for llm in replicas.values()) == 9
    assert grouper.stats().held > 0  # siblings waited between the two hashings
    assert sorted(tokenized) == sorted(render(r.messages) for r in requests)
