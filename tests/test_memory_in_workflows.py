"""Memory used from workflows: an agent's conversation carried across runs through
`memory.Memory`, and a malformed query recorded as its task's failure while the workflow
carries on. On SQLite and PostgreSQL (memory is real I/O: the system clock)."""

from __future__ import annotations

import asyncio

from conftest import StoreFactory

from agents import Agent, ConversationLog
from executors import FunctionLLM
from memory import Memory, Scope
from orchestrator import Engine, LLMRequest, RunResult, SystemClock, TaskContext, Workflow


def test_memory_is_a_conversation_log_and_a_conversation_goes_on_across_runs(
    make_store: StoreFactory,
) -> None:
    seen: list[list[tuple[str, str]]] = []

    def reply(request: LLMRequest, hints: object) -> str:
        seen.append([(m.role, m.content) for m in request.messages[1:]])
        return f"reply {len(seen)}"

    async def main() -> list[RunResult]:
        async with make_store() as store:
            memory = Memory(store)
            assert isinstance(memory, ConversationLog)
            agent = Agent("tutor", "You teach.", memory=memory)
            results = []
            async with Engine(backends={"default": FunctionLLM(reply)}, clock=SystemClock()) as e:
                for question in ("What is a KV cache?", "And why evict it?"):
                    wf = Workflow("lesson")  # the same name: the same conversation
                    agent.solve(wf, "answer", question)
                    results.append(await e.run(wf))
            turns = await memory.conversation("tutor", "lesson")
            assert [(t.role, t.content) for t in turns] == [
                ("user", "What is a KV cache?"),
                ("assistant", "reply 1"),
                ("user", "And why evict it?"),
                ("assistant", "reply 2"),
            ]
            return results

    first, second = asyncio.run(main())
    assert first["answer"] == "reply 1" and second["answer"] == "reply 2"
    # The second run's first turn opened with the first run's exchange.
    assert seen[1] == [
        ("user", "What is a KV cache?"),
        ("assistant", "reply 1"),
        ("user", "And why evict it?"),
    ]


def test_a_malformed_memory_query_fails_its_task_with_the_reason_and_the_rest_goes_on(
    make_store: StoreFactory,
) -> None:
    async def main() -> RunResult:
        async with make_store() as store:
            memory = Memory(store)
            await memory.remember("docs", "kv", "KV caches hold attention keys and values")

            async def bad(ctx: TaskContext) -> object:
                return await memory.search("  !!! ()  ")

            async def good(ctx: TaskContext) -> list[str]:
                hits = await memory.search("attention keys", scope=Scope())
                return [h.item.key for h in hits]  # type: ignore[union-attr]

            wf = Workflow("searches")
            wf.add("bad", bad)
            wf.add("good", good)
            async with Engine(clock=SystemClock()) as engine:
                return await engine.run(wf)

    result = asyncio.run(main())
    assert result.status == "failed"
    assert result.failures["bad"].startswith("MemoryQueryError:")
    assert "no words" in result.failures["bad"] or "word" in result.failures["bad"]
    assert result["good"] == ["kv"]
