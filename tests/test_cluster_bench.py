"""The simulated cluster of the scaling benchmark (bench/_cluster.py), at a tiny size."""

from __future__ import annotations

import pytest
from _cluster import Kill, engine_limits, engine_of, simulate_cluster

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


def test_the_static_split_and_the_program_split_are_stable() -> None:
    assert engine_limits(8, 64).max_in_flight == 256 * 64 // 8
    assert engine_limits(1, 4).max_in_flight == 1024
    assert engine_of("agent7", 8) == engine_of("agent7", 8)
    with pytest.raises(ValueError, match="block_tokens=24"):
        simulate_cluster(tiny_agents(1), engines=1, replicas=1, block_tokens=24)
    with pytest.raises(ValueError, match="another engine"):
        simulate_cluster(tiny_agents(1), engines=1, replicas=1, kill=Kill())


def test_engines_sharing_one_budget_never_exceed_it() -> None:
    """Two calls in flight per replica over 3 engines: the servers never see more than 8
    at once, and the engines use all of it (a static split would also hold, with less)."""
    programs = tiny_agents(30)
    run = simulate_cluster(programs, engines=3, replicas=4, profile="cpu-tiny", per_replica=2)
    assert run.limit == 8
    assert run.peak_in_flight == 8
    assert run.report.programs == 30


def test_a_dead_engines_programs_are_finished_by_the_others_exactly_once() -> None:
    """Engine 0 dies mid-run: its programs finish elsewhere from the steps they had done
    (each step done once: `simulate_cluster` checks every program's steps), the calls it
    had in flight are sent again, and with the budget shared the survivors take its slots
    once its row runs out, finishing sooner than with a static split."""
    programs = tiny_agents(30)
    options = {"engines": 3, "replicas": 4, "profile": "cpu-tiny", "per_replica": 2}
    calm = simulate_cluster(programs, **options)  # type: ignore[arg-type]
    kill = Kill(engine=0, at_s=4.0, takeover_s=2.0)
    runs = {
        shared: simulate_cluster(programs, kill=kill, shared_budget=shared, **options)  # type: ignore[arg-type]
        for shared in (True, False)
    }
    shared, static = runs[True], runs[False]
    for run in (shared, static):
        assert run.report.programs == 30
        assert 0 < run.taken_over < 30
        assert run.resent >= 1
        assert run.peak_in_flight <= 8
    assert calm.taken_over == calm.resent == 0
    assert shared.report.makespan < static.report.makespan
