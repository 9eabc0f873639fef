"""The simulated cluster of the scaling benchmark (bench/_cluster.py), at a tiny size."""

from __future__ import annotations

import pytest
from _cluster import engine_limits, engine_of, simulate_cluster

from workloads import Program, many_agent_programs


def tiny_agents(n: int) -> list[Program]:
    return many_agent_programs(
        n,
        rate=100.0,
        seed=3,
        min_turns=4,
        max_turns=8,
        system_tokens=(100, 200),
        task_tokens=(50, 100),
        reply_tokens=(20, 60),
        result_tokens=(50, 300),
        max_pause=2.0,
    )


def test_engines_sharing_their_routes_keep_a_programs_turns_where_its_context_is() -> None:
    """Each turn leaves through another engine's router: shared, they find the context the
    others placed; unshared, they do not."""
    programs = tiny_agents(24)
    runs = {
        shared: simulate_cluster(
            programs, engines=3, replicas=4, profile="cpu-tiny", spread_calls=True,
            share_routes=shared,
        )
        for shared in (True, False)
    }  # fmt: skip
    shared, unshared = runs[True], runs[False]
    assert shared.report.programs == unshared.report.programs == 24
    assert shared.report.cache_hit_share > unshared.report.cache_hit_share + 0.05
    assert shared.link_messages > 0 and unshared.link_messages == 0
    assert all(p.unresolved == 0 for p in shared.peers)


def test_one_engine_reports_the_unlimited_cache_ceiling() -> None:
    run = simulate_cluster(tiny_agents(10), engines=1, replicas=2, profile="cpu-tiny", ceiling=True)
    assert run.report.cache_hit_share <= run.report.ideal_hit_share <= 1.0
    assert run.wall_s > 0 and sum(run.server_requests) == sum(p.llm_calls for p in tiny_agents(10))


def test_admission_is_split_evenly_until_the_shared_budget_lands() -> None:
    assert engine_limits(8, 64).max_in_flight == 256 * 64 // 8
    assert engine_limits(1, 4).max_in_flight == 1024
    assert engine_of("agent7", 8) == engine_of("agent7", 8)
    with pytest.raises(ValueError, match="block_tokens=24"):
        simulate_cluster(tiny_agents(1), engines=1, replicas=1, block_tokens=24)
