"""The Router over fake backends: affinity, spread, failover, ejection and re-admission."""

from __future__ import annotations

import asyncio

from executors import FunctionLLM
from executors._router import Router
from orchestrator import (
    BackendUnavailableError,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    VirtualClock,
)

SYSTEM = "You are one of many agents sharing this long system prompt. " * 20


def conversation(name: str, turns: int) -> list[LLMRequest]:
    out, history = [], [Message("system", SYSTEM)]
    for t in range(turns):
        history = [*history, Message("user", f"{name} step {t}: " + "details " * 30)]
        out.append(LLMRequest(tuple(history), "m", max_tokens=8))
        history = [*history, Message("assistant", f"{name} answer {t}")]
    return out


def served_by(llms: dict[str, FunctionLLM], request: LLMRequest) -> str:
    for name, llm in llms.items():
        if any(call.request is request for call in llm.calls):
            return name
    raise AssertionError("nobody served it")


def test_a_conversation_stays_on_one_replica_and_conversations_spread(clock: VirtualClock) -> None:
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=1.0) for i in range(4)}

    async def main() -> dict[str, list[str]]:
        where: dict[str, list[str]] = {}
        async with Router(llms) as router:

            async def talk(name: str) -> None:
                for request in conversation(name, 4):
                    await router.complete(request, Hints(program_id=name))
                    where.setdefault(name, []).append(served_by(llms, request))

            # Twelve conversations at once: load, not only prefixes, decides where new
            # ones go; each one then sticks to its replica.
            await asyncio.gather(*(talk(f"c{c}") for c in range(12)))
        return where

    where = clock.run(main())
    assert all(len(set(replicas)) == 1 for replicas in where.values())
    assert len({replicas[0] for replicas in where.values()}) >= 3


def test_a_dead_backend_is_ejected_and_its_calls_fail_over(clock: VirtualClock) -> None:
    def dead(request: LLMRequest, hints: Hints) -> LLMResponse:
        raise BackendUnavailableError("connection refused", backend="r0")

    llms = {"r0": FunctionLLM(dead), "r1": FunctionLLM(lambda r, h: "alive", latency=1.0)}

    async def main() -> tuple[list[str], list[bool], list[bool]]:
        async with Router(llms, readmit_after_s=30) as router:
            calls = [router.complete(conversation(f"c{c}", 1)[0], Hints("p")) for c in range(6)]
            answers = [response.text for response in await asyncio.gather(*calls)]
            ejected = [s.healthy for s in router.stats()]
            await asyncio.sleep(31)
            await router.complete(conversation("late", 1)[0], Hints("p"))
            after = [s.healthy for s in router.stats()]
            return answers, ejected, after

    answers, ejected, after = clock.run(main())
    assert answers == ["alive"] * 6
    assert ejected == [False, True]
    # Re-admitted after 30 s; if it was tried again it failed and was ejected again.
    assert after[1] is True and len(llms["r0"].calls) >= 1


def test_when_every_backend_is_down_the_error_says_so(clock: VirtualClock) -> None:
    def dead(request: LLMRequest, hints: Hints) -> LLMResponse:
        raise BackendUnavailableError("connection refused")

    async def main() -> None:
        async with Router({"a": FunctionLLM(dead), "b": FunctionLLM(dead)}) as router:
            await router.complete(conversation("x", 1)[0], Hints("p"))

    try:
        clock.run(main())
    except BackendUnavailableError as exc:
        assert "no backend of this router could serve the call" in str(exc)
    else:
        raise AssertionError("expected BackendUnavailableError")
