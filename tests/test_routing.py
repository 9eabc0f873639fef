"""Prefix-aware routing is pure: these tests need no loop and no servers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from routing_support import decisions

from executors._routing import PrefixRouter, two_candidates

IDLE = [0.0, 0.0, 0.0, 0.0]
ALL = [True, True, True, True]


def test_a_known_prefix_goes_back_to_its_replica() -> None:
    router = PrefixRouter(4)
    first = router.choose([1, 2, 3], IDLE, ALL)
    router.record([1, 2, 3], first.replica)
    again = router.choose([1, 2, 3, 4], IDLE, ALL)
    assert again.replica == first.replica and again.matched_blocks == 3
    assert again.reason == "prefix"


def test_the_longest_known_prefix_wins() -> None:
    router = PrefixRouter(4)
    router.record([10], 0)  # a shared system prompt, everywhere in practice
    router.record([10, 11, 12], 2)  # one conversation went on at replica 2
    choice = router.choose([10, 11, 12, 13], IDLE, ALL)
    assert (choice.replica, choice.matched_blocks) == (2, 3)


def test_new_prefixes_spread_over_replicas_and_stay_put() -> None:
    router = PrefixRouter(4)
    chosen = [router.choose([7, 1000 + i], IDLE, ALL).replica for i in range(200)]
    counts = [chosen.count(r) for r in range(4)]
    assert min(counts) > 25  # rendezvous hashing spreads them
    assert chosen == [router.choose([7, 1000 + i], IDLE, ALL).replica for i in range(200)]


def test_an_overloaded_holder_loses_the_request_to_a_less_loaded_replica() -> None:
    router = PrefixRouter(4, max_imbalance=1.25, load_slack=1.0)
    router.record([5, 6], 1)
    loads = [1.0, 20.0, 1.0, 1.0]
    choice = router.choose([5, 6, 7], loads, ALL)
    assert choice.replica != 1 and choice.reason == "least-loaded"
    assert choice.matched_blocks == 0


def test_a_few_more_requests_in_flight_do_not_break_affinity() -> None:
    router = PrefixRouter(4, max_imbalance=1.5, load_slack=4.0)
    router.record([5, 6], 1)
    # Mean 1.25: the limit is 1.5 x 1.25 + 4 = 5.875 requests in flight (with 7: 6.625).
    assert router.choose([5, 6, 7], [0.0, 5.0, 0.0, 0.0], ALL).replica == 1
    assert router.choose([5, 6, 7], [0.0, 7.0, 0.0, 0.0], ALL).replica != 1
    strict = PrefixRouter(4, max_imbalance=1.5, load_slack=1.0)
    strict.record([5, 6], 1)
    assert strict.choose([5, 6, 7], [0.0, 5.0, 0.0, 0.0], ALL).replica != 1


def test_unhealthy_replicas_are_skipped_and_forgotten() -> None:
    router = PrefixRouter(3)
    router.record([1, 2], 0)
    choice = router.choose([1, 2, 3], [0.0, 0.0, 0.0], [False, True, True])
    assert choice.replica in (1, 2)
    router.forget_replica(0)
    assert router.choose([1, 2], [0.0, 0.0, 0.0], [True, True, True]).matched_blocks == 0
    with pytest.raises(LookupError):
        router.choose([1], [0.0, 0.0, 0.0], [False, False, False])


def test_memory_is_bounded_and_a_prefix_outlives_its_tail() -> None:
    router = PrefixRouter(2, capacity=3)
    router.record([1, 2, 3, 4, 5], 1)
    assert router.held_prefix([1, 2, 3, 4, 5], 1) == 3  # the tail was forgotten first
    assert router.choose([1, 2, 3, 4, 5], [0.0, 0.0], [True, True]).matched_blocks == 3
    router.forget_replica(1)
    router.record([7, 8], 0)
    assert router.held_prefix([7, 8], 0) == 2  # forgetting gave the room back


def test_a_replica_forgets_what_its_cache_could_not_have_kept() -> None:
    # A replica of 4 blocks cannot still hold an old 3-block prompt after a newer one.
    router = PrefixRouter(2, blocks_per_replica=4)
    router.record([1, 2, 3], 0)
    router.record([20, 21, 22], 0)
    assert router.held_prefix([1, 2, 3, 4], 0) == 1
    assert router.held_prefix([20, 21, 22], 0) == 3
    # Without the cache size the router would still believe in the whole old prompt.
    unbounded = PrefixRouter(2)
    unbounded.record([1, 2, 3], 0)
    unbounded.record([20, 21, 22], 0)
    assert unbounded.held_prefix([1, 2, 3, 4], 0) == 3


def test_work_counts_only_the_blocks_a_replica_had_to_compute() -> None:
    router = PrefixRouter(2, half_life=1e9)
    router.record([1, 2, 3], 0)
    router.record([1, 2, 3, 4], 0)  # three blocks were a hit
    router.record([1, 2], 1)
    assert router.work() == pytest.approx([4.0, 2.0])


def test_of_several_holders_the_least_worked_gets_the_request() -> None:
    router = PrefixRouter(4)
    router.record([1, 2], 0)
    router.record([1, 2], 3)
    router.record([50, 51, 52], 0)  # replica 0 has done more since
    choice = router.choose([1, 2, 9], IDLE, ALL)
    assert (choice.replica, choice.matched_blocks, choice.reason) == (3, 2, "prefix")


def test_a_hot_prefix_spills_once_its_holder_has_done_too_much() -> None:
    router = PrefixRouter(4, max_work_imbalance=1.25, half_life=1e9)
    router.record([1, 2], 0)
    for i in range(10):  # replica 0 computes ten 4-block suffixes of the hot prefix
        router.record([1, 2, 100 + 4 * i, 101 + 4 * i, 102 + 4 * i, 103 + 4 * i], 0)
    router.record([200], 1)
    choice = router.choose([1, 2, 999], IDLE, ALL)
    # Replica 0 did 42 blocks against a mean of 10.75: the request goes where nobody
    # did anything, and that replica becomes a second holder of the prefix.
    assert choice.reason == "least-loaded" and choice.replica in (2, 3)
    router.record([1, 2, 999], choice.replica)
    assert router.choose([1, 2, 998], IDLE, ALL).replica == choice.replica


def test_new_prefixes_go_to_the_least_worked_replica() -> None:
    router = PrefixRouter(3, half_life=1e9)
    router.record([1, 2, 3], 0)
    router.record([4, 5], 1)
    choice = router.choose([9, 10], [0.0, 0.0, 0.0], [True, True, True])
    assert (choice.replica, choice.reason) == (2, "least-loaded")


def test_two_candidates_are_distinct_and_stable() -> None:
    first, second = two_candidates(7, [0, 1, 2, 3])
    assert first != second
    assert two_candidates(7, [3, 2, 1, 0]) == (first, second)
    assert two_candidates(7, [first]) == (first, first)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        PrefixRouter(0)
    with pytest.raises(ValueError):
        PrefixRouter(2, blocks_per_replica=0)
    with pytest.raises(ValueError):
        PrefixRouter(2, half_life=0)


def test_a_prefix_key_goes_where_it_was_placed_whatever_the_hashes_say() -> None:
    router = PrefixRouter(4)
    first = router.choose([1, 2], IDLE, ALL, "doc-7")
    assert first.reason != "key"  # unknown yet: placed as usual
    router.record([1, 2], first.replica, "doc-7")
    other = (first.replica + 1) % 4
    router.record([50, 51, 52], other)  # a longer prefix held elsewhere
    choice = router.choose([50, 51, 52, 53], IDLE, ALL, "doc-7")
    assert (choice.replica, choice.reason, choice.matched_blocks) == (first.replica, "key", 0)
    assert router.choose([50, 51, 52, 53], IDLE, ALL).replica == other  # without the key


def test_a_keys_replica_that_is_down_or_overloaded_loses_it() -> None:
    router = PrefixRouter(4, max_imbalance=1.5, load_slack=1.0)
    router.record([1], 2, "k")
    healthy = [True, True, False, True]
    moved = router.choose([1], IDLE, healthy, "k")
    assert moved.replica != 2 and moved.reason != "key"
    router.record([1], moved.replica, "k")  # remembered where it went
    assert router.choose([1], IDLE, ALL, "k").replica == moved.replica
    busy = [0.0] * 4
    busy[moved.replica] = 9.0  # over 1.5 x the mean (2.25) + 1 = 4.375
    assert router.choose([1], busy, ALL, "k").replica != moved.replica
    busy = [2.0] * 4
    busy[moved.replica] = 4.0  # within 1.5 x 2.5 + 1 = 4.75: the key holds
    assert router.choose([1], busy, ALL, "k").replica == moved.replica


def test_keys_are_bounded_and_forgotten_with_their_replica() -> None:
    router = PrefixRouter(2, keys=2)
    for k in ("a", "b", "c"):
        router.record([ord(k)], 1, k)
    assert router.choose([], IDLE[:2], ALL[:2], "a").reason != "key"  # the oldest went
    assert router.choose([], IDLE[:2], ALL[:2], "c").reason == "key"
    router.forget_replica(1)
    assert router.choose([], IDLE[:2], ALL[:2], "c").reason != "key"
    with pytest.raises(ValueError, match="keys"):
        PrefixRouter(2, keys=0)


def test_the_router_decides_as_it_did_on_a_recorded_sequence() -> None:
    """Agent-like calls over 4 to 64 replicas, with keys, loads, outages and restarts: every
    decision and the final work are those recorded before the policy was made faster."""
    golden = json.loads((Path(__file__).parent / "golden" / "routing_decisions.json").read_text())
    assert decisions() == golden


def test_a_peer_that_observes_every_placement_decides_as_the_router_that_made_them() -> None:
    from routing_support import calls

    maker, peer = PrefixRouter(16, blocks_per_replica=300), PrefixRouter(16, blocks_per_replica=300)
    sequence = list(calls(16, 1200, seed=5))
    for call in sequence[:1000]:
        choice = maker.choose(call.hashes, call.loads, call.healthy, call.key)
        assert peer.observe(maker.record(call.hashes, choice.replica, call.key))
    assert peer.work() == maker.work() and peer.unresolved == 0
    for call in sequence[1000:]:
        assert peer.choose(call.hashes, call.loads, call.healthy, call.key) == maker.choose(
            call.hashes, call.loads, call.healthy, call.key
        )


def test_a_conversations_turn_is_placed_as_the_blocks_it_added() -> None:
    router = PrefixRouter(4)
    first = router.record([1, 2, 3], 2, "p")
    assert (first.base_blocks, first.tail, first.computed) == (0, (1, 2, 3), 3)
    turn = router.record([1, 2, 3, 4, 5], 2, "p")
    assert (turn.base, turn.base_blocks, turn.tail, turn.computed) == (3, 3, (4, 5), 2)
    assert turn.blocks == 5 and turn.prefix_key == "p"


def test_a_placement_extending_an_unknown_request_moves_its_key_and_work_only() -> None:
    router = PrefixRouter(4, half_life=1e9)
    late = PrefixRouter(4, half_life=1e9)
    late.observe(router.record([1, 2, 3], 1))
    turn = router.record([1, 2, 3, 4], 1, "p")
    assert PrefixRouter(4).observe(turn) is False  # never saw [1, 2, 3]
    fresh = PrefixRouter(4, half_life=1e9)
    fresh.observe(turn)
    assert fresh.unresolved == 1 and fresh.held_prefix([1, 2, 3, 4], 1) == 0
    assert fresh.work() == [0.0, 1.0, 0.0, 0.0]
    assert fresh.choose([9], IDLE, ALL, "p").reason == "key"
    assert late.observe(turn) and late.held_prefix([1, 2, 3, 4], 1) == 4
    with pytest.raises(ValueError, match="replica 7"):
        late.observe(dataclasses.replace(turn, replica=7))


@pytest.mark.parametrize("seed", range(5))
def test_the_cache_model_evicts_as_one_ordered_dict_of_blocks_would(seed: int) -> None:
    """The plain model (every block of a request moved to the end, tail first) against the
    runs of the prefix tree, on random requests branching off each other."""
    import random
    from collections import OrderedDict

    from executors._cachemodel import CacheModel

    rng = random.Random(seed)
    model, plain = CacheModel(), OrderedDict[int, None]()
    chains: list[tuple[int, ...]] = [()]
    for use in range(1, 3000):
        base = rng.choice(chains)
        base = base[: rng.randint(0, len(base))]  # a prefix of an earlier request ...
        chain = base + tuple(
            hash((base[-1] if base else 0, use, i)) for i in range(rng.randint(0, 6))
        )
        chains.append(chain)  # ... and some blocks of its own
        held = 0
        while held < len(chain) and chain[held] in plain:
            held += 1
        assert held == sum(1 for h in chain if h in model)  # closed under prefixes
        model.touch(held, chain[held - 1] if held else 0, chain[held:], use)
        for h in reversed(chain):
            plain[h] = None
            plain.move_to_end(h)
        over = max(0, len(plain) - rng.randint(20, 60))
        assert model.evict(over) == [plain.popitem(last=False)[0] for _ in range(over)]
        assert set(model.hashes()) == set(plain)


def test_a_request_waiting_at_its_replica_pushes_nothing_out_until_it_is_served() -> None:
    router = PrefixRouter(2, blocks_per_replica=4)
    router.record([1, 2, 3], 0)
    queued = router.record([20, 21, 22], 0, pending=True)
    assert router.held_prefix([1, 2, 3], 0) == 3  # the model holds 6 blocks of 4 for now
    assert router.held_prefix([20, 21, 22], 0) == 3
    router.served(queued)  # computed now: the older prompt's tail and more are gone
    assert router.held_prefix([1, 2, 3], 0) == 1
    assert router.held_prefix([20, 21, 22], 0) == 3
    peer = PrefixRouter(2, blocks_per_replica=4)
    peer.record([1, 2, 3], 0)
    peer.observe(queued, pending=True)
    assert peer.held_prefix([1, 2, 3], 0) == 3
    peer.served(queued)
    assert peer.held_prefix([1, 2, 3], 0) == 1
