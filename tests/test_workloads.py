"""Workload generators and the naive-vs-plait harness (small runs, virtual time)."""

from __future__ import annotations

import pytest
from _harness import plait_runner, run_naive, simulate

from executors._simtext import count_tokens, render
from workloads import (
    LLMStep,
    Program,
    ToolStep,
    agent_programs,
    batch_programs,
    many_agent_programs,
    sql_programs,
)


def prompt_tokens(program: Program) -> int:
    replies = {s.id: "x" * 4 * s.max_tokens for s in program.steps if isinstance(s, LLMStep)}
    return sum(
        count_tokens(render(s.build(replies))) for s in program.steps if isinstance(s, LLMStep)
    )


def test_generators_are_seeded() -> None:
    a, b = agent_programs(5, rate=0.1, seed=3), agent_programs(5, rate=0.1, seed=3)
    assert [p.arrival for p in a] == [p.arrival for p in b]
    replies = {s.id: "r" for s in a[0].steps if isinstance(s, LLMStep)}
    first_a = [s.build(replies) for s in a[0].steps if isinstance(s, LLMStep)]
    first_b = [s.build(replies) for s in b[0].steps if isinstance(s, LLMStep)]
    assert first_a == first_b
    assert [p.arrival for p in agent_programs(5, rate=0.1, seed=4)] != [p.arrival for p in a]


def test_agent_programs_have_the_specified_shape() -> None:
    programs = agent_programs(30, rate=0.1, seed=1)
    for p in programs:
        assert 10 <= p.llm_calls <= 40
        pauses = [s.seconds for s in p.steps if isinstance(s, ToolStep)]
        assert len(pauses) == p.llm_calls - 1
        calls = [s for s in p.steps if isinstance(s, LLMStep)]
        assert calls[-1].last and not any(s.last for s in calls[:-1])
        # Context grows every turn: turn t's prompt starts with turn t-1's prompt + reply.
        replies = {s.id: f"reply {s.id}" for s in calls}
        texts = [render(s.build(replies)) for s in calls]
        for t in range(1, len(texts)):
            assert texts[t].startswith(texts[t - 1] + replies[f"turn{t - 1}"])
    pauses = [s.seconds for p in programs for s in p.steps if isinstance(s, ToolStep)]
    assert sorted(pauses)[len(pauses) // 2] < 1.0  # mostly under a second ...
    assert max(pauses) > 5.0  # ... with a heavy tail
    system = programs[0].steps[0]
    assert isinstance(system, LLMStep)
    assert 1000 <= count_tokens(system.build({})[0].content) <= 2100


def test_many_agent_programs_have_the_agents_shape_and_hold_text_only_while_running() -> None:
    programs = many_agent_programs(30, rate=0.1, seed=1)
    assert [p.arrival for p in programs] == [
        p.arrival for p in many_agent_programs(30, rate=0.1, seed=1)
    ]
    for p in programs:
        assert 10 <= p.llm_calls <= 40
        calls = [s for s in p.steps if isinstance(s, LLMStep)]
        assert len([s for s in p.steps if isinstance(s, ToolStep)]) == len(calls) - 1
        assert calls[-1].last and not any(s.last for s in calls[:-1])
        replies = {s.id: f"reply {s.id}" for s in calls}
        texts = [render(s.build(replies)) for s in calls]
        for t in range(1, len(texts)):
            assert texts[t].startswith(texts[t - 1] + replies[f"turn{t - 1}"])
            added = count_tokens(texts[t]) - count_tokens(texts[t - 1])
            assert 200 <= added <= 2600  # a tool result of 200-2,500 tokens, and the reply
        assert texts == [render(s.build(replies)) for s in calls]  # built again: the same
        system, task = calls[0].build(replies)[:2]
        assert 1000 <= count_tokens(system.content) <= 2100
        assert 150 <= count_tokens(task.content) <= 600
    tasks = {p.steps[0].build({})[1].content for p in programs if isinstance(p.steps[0], LLMStep)}
    assert len(tasks) == len(programs)  # no two programs share more than a system prompt


def test_sql_programs_have_the_specified_shape() -> None:
    for p in sql_programs(20, rate=1.0, seed=2):
        assert 16 <= p.llm_calls <= 21
        assert 30_000 <= prompt_tokens(p) <= 70_000
        assert p.deadline is not None and p.deadline > 0


def test_naive_and_plait_run_the_same_programs_to_the_end() -> None:
    programs = agent_programs(4, rate=0.5, seed=5, min_turns=3, max_turns=5)
    naive = simulate(programs, run_naive, mode="naive")
    plait = simulate(programs, plait_runner("fcfs"), mode="fcfs")
    assert naive.programs == plait.programs == 4
    calls = sum(p.llm_calls for p in programs)
    assert naive.server.requests == plait.server.requests == calls
    # Every program takes at least its tool pauses.
    for report in (naive, plait):
        assert all(j > 0 for j in report.jcts)
    again = simulate(programs, run_naive, mode="naive")
    assert again.jcts == naive.jcts  # deterministic


@pytest.mark.parametrize("policy", ["fcfs", "las", "slack"])
def test_plait_runs_sql_programs_under_every_policy(policy: str) -> None:
    programs = sql_programs(3, rate=1.0, seed=1)
    report = simulate(programs, plait_runner(policy), mode=policy)
    assert report.programs == 3 and 0 <= report.deadline_attainment <= 1
    assert report.cache_hit_share > 0.3  # stages share their instructions and schema


def test_batch_programs_share_instructions_and_documents() -> None:
    programs = batch_programs(5, 3, seed=1)
    assert len(programs) == 5 and all(p.llm_calls == 3 for p in programs)
    steps = [s for s in programs[0].steps if isinstance(s, LLMStep)]
    texts = [render(s.build({})) for s in steps]
    # Every question about a document starts with the instructions and that document.
    common = texts[0][: texts[0].index("[question-")]
    assert all(t.startswith(common) for t in texts) and count_tokens(common) > 1500
    # The input is question-major: question q of document d sits at q * 5 + d.
    assert [s.order for s in steps] == [0, 5, 10]


def test_the_naive_client_follows_the_inputs_order() -> None:
    from executors import FunctionLLM
    from orchestrator import Hints, LLMRequest, VirtualClock

    seen: list[str] = []

    def reply(request: LLMRequest, hints: Hints) -> str:
        seen.append(request.messages[-1].content.split("\n\n")[-1][:14])
        return "ok"

    programs = batch_programs(3, 2, seed=2, doc_tokens=(10, 20))
    clock = VirtualClock()
    clock.run(run_naive(programs, [FunctionLLM(reply)], clock))
    questions = [s.split("]")[0] for s in seen]
    assert questions == ["[question-0"] * 3 + ["[question-1"] * 3  # question-major


def test_plait_keeps_a_documents_questions_together_and_its_cache_warm() -> None:
    # 200 documents of ~2,750 tokens do not fit the 400k-token cache at once: question-major
    # order evicts every document before its next question comes.
    programs = batch_programs(200, 4, seed=3)
    naive = simulate(programs, run_naive, mode="naive")
    plait = simulate(programs, plait_runner("fcfs"), mode="fcfs")
    assert plait.cache_hit_share > naive.cache_hit_share
    assert plait.makespan < naive.makespan
    assert plait.cache_hit_share <= plait.ideal_hit_share + 1e-9


def test_the_cache_model_reproduces_the_published_mooncake_lru_figures() -> None:
    """bench/traces/README.md lists these shares with a plain LRU block cache. (Its
    one-replica figure is not comparable: one simulated H100 cannot keep up with the whole
    trace, so running requests pin much of the cache.)"""
    from executors import get_profile
    from workloads import mooncake_programs

    profile = get_profile("h100-llama3-8b").replace(
        name="mooncake-512", block_size=512, num_blocks=940, max_model_len=262_144
    )
    programs = mooncake_programs("synthetic")
    four = simulate(programs, run_naive, profile=profile, replicas=4)
    assert four.cache_hit_share == pytest.approx(0.068, rel=0.1)
    assert four.ideal_hit_share == pytest.approx(0.651, rel=0.02)


def test_plait_over_replicas_keeps_each_agent_on_the_replica_holding_its_context() -> None:
    from workloads import agent_programs

    programs = agent_programs(8, rate=0.5, seed=4, min_turns=4, max_turns=6)
    naive = simulate(programs, run_naive, replicas=2, mode="naive")
    routed = simulate(programs, plait_runner("fcfs"), replicas=2, mode="full")
    spread = simulate(programs, plait_runner("fcfs", route=False), replicas=2, mode="rr")
    assert routed.programs == naive.programs == len(programs)
    # Round-robin sends each turn to the other replica, which lacks the conversation so far.
    assert routed.cache_hit_share > 0.9 * routed.ideal_hit_share
    assert spread.cache_hit_share < routed.cache_hit_share
    assert naive.cache_hit_share < routed.cache_hit_share


def test_document_major_batch_work_computes_prompt_tokens_at_the_bound() -> None:
    # 200 documents do not fit the cache at once (see the test above): only an order that
    # keeps each document's questions together reaches the bound.
    programs = batch_programs(200, 4, seed=3)
    naive = simulate(programs, run_naive, mode="naive")
    plait = simulate(programs, plait_runner("fcfs"), mode="plait")
    bound = 1 - plait.ideal_hit_share  # the least share any cache has to compute
    assert (1 - plait.cache_hit_share) <= 1.05 * bound
    assert (1 - naive.cache_hit_share) > 2 * bound
