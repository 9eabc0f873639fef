"""The simulated serving engine against hand-computed cases (pure model, no event loop)."""

from __future__ import annotations

import pytest

from executors._kv import BlockPool
from executors._simengine import SimEngine, SimRequest
from executors._simprofile import H100_LLAMA3_8B, Profile
from orchestrator import UsageError

# A tiny engine: 4-token blocks, 10 blocks, round numbers for costs.
TINY = Profile(
    name="tiny",
    model="tiny",
    step_overhead_s=0.01,
    prefill_s_per_token=0.001,
    decode_s_per_seq=0.002,
    decode_s_per_context_token=0.0,
    num_blocks=10,
    block_size=4,
    max_num_seqs=8,
    max_num_batched_tokens=64,
    max_model_len=64,
)


def request(rid: int, prompt: int, output: int, hashes: list[int], **kw: object) -> SimRequest:
    return SimRequest(
        id=rid, prompt_tokens=prompt, output_tokens=output, hashes=hashes, arrival=0.0, **kw
    )  # type: ignore[arg-type]


def run_to_end(engine: SimEngine, now: float = 0.0) -> tuple[float, list[SimRequest]]:
    done: list[SimRequest] = []
    while (plan := engine.plan(now)) is not None:
        steps = len(plan.durations)
        now += sum(plan.durations)
        done += engine.apply(plan, steps, now)
    return now, done


def test_block_pool_evicts_least_recently_freed_first() -> None:
    pool = BlockPool(3, 4)
    a = pool.allocate(2)
    assert a == [0, 1]
    pool.register(0, 100)
    pool.register(1, 101)
    pool.release(a)  # tail first: block 1 then block 0 join the free queue
    assert pool.match([100, 101]) == [0, 1]
    # Free order is now 2, 1, 0: the next two allocations evict block 1 (the tail) first.
    assert pool.allocate(2) == [2, 1]
    assert pool.match([100, 101]) == [0]


def test_blocks_that_hold_no_prefix_are_reused_before_cached_ones_are_evicted() -> None:
    pool = BlockPool(4, 4)
    blocks = pool.allocate(3)
    assert blocks == [0, 1, 2]
    pool.register(0, 100)
    pool.register(1, 101)  # block 2 was never filled: it holds no reusable prefix
    pool.release(blocks)
    # Block 2 goes to the front (as vLLM 0.32 does); the cached tail (1) goes before (0).
    assert pool.allocate(1) == [2]
    assert pool.allocate(1) == [3]  # the never-used block, before any cached one
    assert pool.allocate(1) == [1]
    assert pool.match([100, 101]) == [0]


def test_a_prefix_hit_skips_exactly_the_cached_blocks() -> None:
    engine = SimEngine(TINY)
    first = request(1, 10, 2, [11, 12, 13])  # 10 prompt tokens: blocks 11, 12 full
    _, done = run_to_end(engine)
    engine.add(first)
    _, done = run_to_end(engine)
    assert done == [first] and first.cached_tokens == 0
    # Same first 8 tokens, different after: blocks 11 and 12 hit, 8 tokens skipped.
    second = request(2, 12, 1, [11, 12, 99])
    engine.add(second)
    plan = engine.plan(0.0)
    assert plan is not None
    assert plan.work == [(second, 4)]  # only the 4 uncached tokens are computed
    assert plan.durations == [pytest.approx(0.01 + 4 * 0.001)]
    assert second.cached_tokens == 8
    stats = engine.pool.stats()
    assert (stats.queries, stats.hits) == (10 + 12, 8)


def test_the_last_prompt_token_is_always_computed() -> None:
    engine = SimEngine(TINY)
    engine.add(request(1, 8, 1, [11, 12, 13]))
    run_to_end(engine)
    again = request(2, 8, 1, [11, 12, 13])  # identical 8-token prompt: 2 full blocks
    engine.add(again)
    plan = engine.plan(0.0)
    assert plan is not None and plan.work == [(again, 4)]  # block 12 recomputed, as vLLM does
    assert again.cached_tokens == 4


def test_prefill_then_decode_costs_and_times() -> None:
    engine = SimEngine(TINY)
    req = request(1, 6, 3, [])
    engine.add(req)
    end, done = run_to_end(engine)
    # Prefill 6 tokens: 0.016 s, first token. Then 2 decode steps of 0.012 s each.
    assert done == [req]
    assert req.first_token_at == pytest.approx(0.016)
    assert end == pytest.approx(0.016 + 2 * 0.012)
    assert engine.steps == 3


def test_higher_urgency_overtakes_in_the_queue() -> None:
    engine = SimEngine(TINY.replace(max_num_seqs=1))
    low = request(1, 4, 1, [], priority=5.0)
    high = request(2, 4, 1, [], priority=-5.0)
    engine.add(low)
    engine.add(high)
    plan = engine.plan(0.0)
    assert plan is not None and [r.id for r, _ in plan.work] == [2]


def test_equal_priority_is_first_come_first_served() -> None:
    engine = SimEngine(TINY.replace(max_num_seqs=1))
    engine.add(request(1, 4, 1, []))
    engine.add(request(2, 4, 1, []))
    plan = engine.plan(0.0)
    assert plan is not None and plan.work[0][0].id == 1


def test_preemption_frees_the_blocks_of_the_lowest_priority_request() -> None:
    engine = SimEngine(TINY.replace(num_blocks=4))
    low = request(1, 8, 8, [], priority=1.0)  # 2 blocks now, more as it decodes
    high = request(2, 7, 8, [], priority=0.0)
    engine.add(low)
    engine.add(high)
    plan = engine.plan(0.0)
    assert plan is not None and {r.id for r, _ in plan.work} == {1, 2}
    assert engine.pool.free == 0
    engine.apply(plan, 1, 0.1)
    # high needs a 3rd block for its 8th token; there is none: low is preempted.
    plan = engine.plan(0.1)
    assert plan is not None
    assert low.state == "waiting" and low.blocks == [] and low.computed == 0
    assert low.preemptions == 1 and engine.preemptions == 1
    assert [r.id for r, _ in plan.work] == [2]
    _, done = run_to_end(engine, 0.2)
    assert {r.id for r in done} == {1, 2}  # low runs again later and finishes


def test_keep_alive_pins_blocks_until_it_expires() -> None:
    engine = SimEngine(TINY.replace(num_blocks=3))
    first = request(1, 8, 1, [11, 12], program="p", keep_alive_s=5.0)
    engine.add(first)
    end, _ = run_to_end(engine)
    assert end == pytest.approx(0.018)
    assert engine.pool.free == 1  # 2 of 3 blocks pinned by program p until 5.018
    # Another program needing 2 blocks cannot get them while the pin holds ...
    other = request(2, 5, 1, [21])
    engine.add(other)
    assert engine.plan(5.0) is None
    assert engine.next_expiry() == pytest.approx(5.018)
    # ... and gets them once it has expired, evicting the pinned prefix.
    plan = engine.plan(5.02)
    assert plan is not None and plan.work[0][0] is other
    assert engine.pool.match([11, 12]) == [0]


def test_an_expired_pin_is_evictable_and_a_live_one_serves_the_next_turn() -> None:
    engine = SimEngine(TINY)
    engine.add(request(1, 8, 1, [11, 12], program="p", keep_alive_s=5.0))
    run_to_end(engine)
    assert "p" in engine.pins
    nxt = request(2, 12, 1, [11, 12, 13], program="p")
    engine.add(nxt)
    engine.plan(1.0)
    assert nxt.cached_tokens == 8
    assert "p" not in engine.pins  # the next call holds the blocks itself now
    engine2 = SimEngine(TINY)
    engine2.add(request(1, 8, 1, [11, 12], program="p", keep_alive_s=5.0))
    run_to_end(engine2)
    engine2.expire_pins(5.1)
    assert engine2.pins == {} and engine2.pool.free == TINY.num_blocks


def test_last_call_releases_at_once() -> None:
    engine = SimEngine(TINY)
    engine.add(request(1, 8, 1, [11, 12], program="p", keep_alive_s=5.0, last_call=True))
    run_to_end(engine)
    assert engine.pins == {} and engine.pool.free == TINY.num_blocks


def test_pure_decode_is_planned_as_one_run_of_steps() -> None:
    engine = SimEngine(TINY)
    engine.add(request(1, 4, 6, []))
    plan = engine.plan(0.0)
    assert plan is not None and len(plan.durations) == 1  # prefill alone
    engine.apply(plan, 1, 0.014)
    plan = engine.plan(0.014)
    assert plan is not None and len(plan.durations) == 5  # five identical decode steps
    done = engine.apply(plan, 5, 0.074)
    assert done and done[0].generated == 6


def test_impossible_profiles_are_refused() -> None:
    with pytest.raises(UsageError, match="prefill_s_per_token=-1"):
        H100_LLAMA3_8B.replace(prefill_s_per_token=-1)
    with pytest.raises(UsageError, match="num_blocks=0"):
        H100_LLAMA3_8B.replace(num_blocks=0)
    with pytest.raises(UsageError, match="no field"):
        H100_LLAMA3_8B.replace(flops=1)


def _drive(engine: SimEngine, whole_runs: bool) -> float:
    """Run to the end, waiting for pins to expire; one step per plan unless `whole_runs`."""
    now = 0.0
    while True:
        plan = engine.plan(now)
        if plan is None:
            expiry = engine.next_expiry()
            if expiry is None:
                return now
            now = expiry
            continue
        steps = len(plan.durations) if whole_runs else 1
        now += sum(plan.durations[:steps])
        engine.apply(plan, steps, now)


@pytest.mark.parametrize("seed", range(6))
def test_a_queue_waiting_for_blocks_does_not_change_what_runs_of_steps_give(seed: int) -> None:
    """While the queue's head waits for blocks, decode steps are planned as one run (up to
    the next pin expiry): the same as planning (and retrying the head) every step."""
    import random

    rng = random.Random(seed)
    profile = TINY.replace(num_blocks=40, max_num_seqs=6)

    def workload() -> list[SimRequest]:
        out = []
        for rid in range(30):
            prompt, output = rng.randint(4, 40), rng.randint(1, 30)
            shared = rng.randrange(3)  # three prefixes of 2 blocks, then the request's own
            hashes = [1000 + shared, 2000 + shared] + [rid * 100 + j for j in range(20)]
            out.append(
                request(
                    rid, prompt, output, hashes[: (prompt + output) // 4],
                    program=f"p{rid % 7}", keep_alive_s=rng.choice([None, 0.05, 0.3]),
                    priority=float(rng.randrange(4)),
                )
            )  # fmt: skip
        return out

    state = rng.getstate()
    results = []
    for whole_runs in (False, True):
        rng.setstate(state)
        engine = SimEngine(profile)
        requests = workload()
        for req in requests:
            engine.add(req)
        end = _drive(engine, whole_runs)
        results.append((engine, requests, end))
    (step_engine, by_step, step_end), (run_engine, by_run, run_end) = results
    assert run_engine.steps == step_engine.steps
    assert run_engine.preemptions == step_engine.preemptions
    assert run_engine.pool.stats() == step_engine.pool.stats()
    assert [r.cached_tokens for r in by_run] == [r.cached_tokens for r in by_step]
    assert [r.finished_at for r in by_run] == pytest.approx([r.finished_at for r in by_step])
    assert run_end == pytest.approx(step_end)


def test_fits_says_what_acquiring_then_allocating_would_and_touches_like_a_failed_try() -> None:
    pool, twin = BlockPool(6, 4), BlockPool(6, 4)
    for p in (pool, twin):
        blocks = p.allocate(4)
        assert blocks is not None
        for i, block in enumerate(blocks):
            p.register(block, 100 + i)
        p.release(blocks)
        held = p.allocate(1)  # one fresh block referenced; 5 free, 4 of them cached
        assert held == [4]
    hits = pool.match([100, 101, 102])
    assert hits == [0, 1, 2]
    assert pool.fits(hits, 2)  # 5 free, 3 of them taken by the hits: 2 left
    assert not pool.fits(hits, 3)
    # What the engine did before fits(): acquire, fail to allocate, release.
    twin.acquire(hits)
    assert twin.allocate(3) is None
    twin.release(hits)
    assert pool.allocate(5) == twin.allocate(5)  # the same eviction order afterwards


def test_a_growing_conversation_hashes_as_its_whole_text_does() -> None:
    import random

    from executors._simtext import block_hashes, chat_block_hashes, render
    from orchestrator import Message

    rng = random.Random(7)
    history = [Message("system", "s" * 3001), Message("user", "task " * 97)]
    for turn in range(12):
        prompt = render(history)
        reply = "reply " * rng.randint(1, 200)
        for size in (16, 128):
            assert chat_block_hashes(history, prompt, size) == block_hashes(prompt, size)
            text = prompt + reply
            assert chat_block_hashes(history, text, size) == block_hashes(text, size)
        # A branch (another reply to the same history) and a non-ASCII turn hash as whole texts.
        other = prompt + "é" * turn
        assert chat_block_hashes(history, other, 16) == block_hashes(other, 16)
        history += [Message("assistant", reply), Message("user", "result " * rng.randint(1, 300))]


def test_generated_output_is_what_one_choice_per_token_gives() -> None:
    import random

    from executors._simtext import _SYLLABLES, generate

    for seed in range(40):
        for tokens in (1, 3, 64, 301):
            rng = random.Random(seed * 1_000_003 + 977 * seed)
            plain = "".join(rng.choice(_SYLLABLES) for _ in range(tokens))
            assert generate(seed, 977 * seed, tokens) == plain


def test_a_pinned_programs_next_call_takes_over_its_blocks_as_acquire_and_release_would() -> None:
    """The hand-over of a pin to the program's next call leaves the pool as acquiring the
    hits and releasing the whole pin did: the same free queue, the same evictions."""
    engine = SimEngine(TINY.replace(num_blocks=12))
    engine.add(request(1, 8, 2, [11, 12], program="p", keep_alive_s=5.0))
    engine.add(request(2, 6, 1, [21], program="q", keep_alive_s=5.0))
    run_to_end(engine)
    pin = engine.pins["p"]
    twin = BlockPool(12, 4)
    twin._ref, twin._hash = list(engine.pool._ref), list(engine.pool._hash)
    twin._cached, twin._free = dict(engine.pool._cached), type(engine.pool._free)(engine.pool._free)
    nxt = request(3, 14, 1, [11, 12, 13, 14], program="p")
    engine.add(nxt)
    engine.plan(1.0)
    assert nxt.cached_tokens == 8 and "p" not in engine.pins
    hits = twin.match([11, 12, 13])
    twin.acquire(hits)
    assert twin.allocate(2) == nxt.blocks[2:]
    twin.release(pin.blocks)
    assert twin._ref == engine.pool._ref
    assert list(twin._free) == list(engine.pool._free)
