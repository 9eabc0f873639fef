"""Prefix-aware routing is pure: these tests need no loop and no servers."""

from __future__ import annotations

import pytest

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


def test_an_overloaded_holder_loses_the_request_to_a_less_loaded_candidate() -> None:
    router = PrefixRouter(4, max_imbalance=1.25)
    router.record([5, 6], 1)
    loads = [1.0, 20.0, 1.0, 1.0]
    choice = router.choose([5, 6, 7], loads, ALL)
    assert choice.replica != 1 and choice.reason == "two-choices"
    first, second = two_candidates(7, [0, 1, 2, 3])
    assert choice.replica == min((first, second), key=lambda r: loads[r])


def test_unhealthy_replicas_are_skipped_and_forgotten() -> None:
    router = PrefixRouter(3)
    router.record([1, 2], 0)
    choice = router.choose([1, 2, 3], [0.0, 0.0, 0.0], [False, True, True])
    assert choice.replica in (1, 2)
    router.forget_replica(0)
    assert router.choose([1, 2], [0.0, 0.0, 0.0], [True, True, True]).matched_blocks == 0
    with pytest.raises(LookupError):
        router.choose([1], [0.0, 0.0, 0.0], [False, False, False])


def test_memory_is_bounded() -> None:
    router = PrefixRouter(2, capacity=3)
    router.record([1, 2, 3, 4, 5], 1)
    assert router.choose([1], [0.0, 0.0], [True, True]).matched_blocks == 0  # forgotten
    assert router.choose([1, 2, 3, 4, 5], [0.0, 0.0], [True, True]).matched_blocks == 5
