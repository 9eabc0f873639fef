"""The urgent-lane policy (`executors._lanes`): pure decisions, no event loop, time passed in."""

from __future__ import annotations

from typing import Literal

import pytest

from executors._lanes import Heard, Lanes, LaneTuning, is_tight, is_urgent, to_move
from orchestrator import Hints
from orchestrator.ext import ServiceClass

ALL = [True] * 4


def lanes(
    urgent_lanes: int | Literal["auto"] = "auto",
    *,
    n: int = 4,
    urgent_calls: int = 2,
    batch_in_flight: int = 0,
    batch_programs: int | None = None,
    share_calls: int = 3,
) -> Lanes:
    return Lanes(
        n,
        range(n),
        LaneTuning(
            lanes=urgent_lanes,
            urgent_calls=urgent_calls,
            batch_in_flight=batch_in_flight,
            batch_programs=batch_programs,
            quiet_s=5.0,
            share_calls=share_calls,
        ),
    )


@pytest.mark.parametrize(
    ("service", "urgent", "tight"),
    [
        ("urgent", True, True),
        ("tight", True, True),
        ("shareable", True, False),
        ("slack_rich", False, False),
        ("hopeless", True, True),
        (None, False, False),
    ],
)
def test_a_call_is_urgent_and_tight_by_its_service_class_alone(
    service: ServiceClass | None, urgent: bool, tight: bool
) -> None:
    hints = Hints("p", service=service, slack_s=100.0)
    assert (is_urgent(hints), is_tight(hints)) == (urgent, tight)


def test_auto_keeps_no_lane_without_batch_work_around() -> None:
    policy = lanes()
    routed = policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0)
    assert routed.allowed == ALL and not routed.clear
    assert policy.lane_set(ALL, 0.0) == set()


def test_auto_takes_a_lane_per_urgent_calls_at_once_and_gives_them_back_after_quiet() -> None:
    policy = lanes(urgent_calls=2)
    policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.0)
    policy.started(3, urgent=False, tight=False, program="b")
    for _ in range(3):  # the third urgent call needs a second lane
        routed = policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=1.0)
        policy.started(0, urgent=True, tight=True, program="q")
    assert policy.auto_lanes == 2 and policy.lane_set(ALL, 1.0) == {0, 1}
    assert routed.allowed == [True, True, False, False]
    for _ in range(3):
        policy.ended(0, urgent=True, tight=True, program="q", now=2.0)
    # One urgent call in flight needs one lane, but fewer only after quiet_s (5 s).
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=4.0)
    assert policy.auto_lanes == 2
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=6.5)
    assert policy.auto_lanes == 1 and policy.lane_set(ALL, 6.5) == {0}


def test_auto_lanes_leave_one_replica_and_skip_the_ejected() -> None:
    policy = lanes(urgent_calls=1)
    policy.started(3, urgent=False, tight=False, program="b")
    for _ in range(5):
        policy.started(0, urgent=True, tight=True, program="q")
    routed = policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0)
    # Six lanes wanted, three possible: urgent calls may go anywhere, but still clear.
    assert policy.lane_set(ALL, 0.0) == {0, 1, 2}
    assert routed.allowed == ALL and routed.clear == {0, 1, 2}
    healthy = [False, True, True, True]
    assert policy.lane_set(healthy, 0.0) == {1, 2}


def test_batch_calls_keep_off_a_lane_beyond_its_cap_while_urgent_work_is_around() -> None:
    policy = lanes(1, batch_in_flight=1, share_calls=0)
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0)
    policy.started(0, urgent=True, tight=True, program="q")
    first = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.1)
    assert first.allowed == ALL  # the lane has room for one
    policy.started(0, urgent=False, tight=False, program="b")
    second = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.2)
    assert second.allowed == [False, True, True, True]
    # Peers' batch calls count on a lane too; off the lanes they do not matter.
    policy.ended(0, urgent=False, tight=False, program="b", now=0.3)
    heard = Heard(0, [1, 5, 0, 0])
    peers = policy.route(ALL, ALL, urgent=False, tight=False, program="c", now=0.3, heard=heard)
    assert peers.allowed == [False, True, True, True]
    policy.ended(0, urgent=True, tight=True, program="q", now=1.0)
    # Quiet for quiet_s (5 s) after the urgent call was last routed: the lane is open again.
    later = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=5.5)
    assert later.allowed == ALL


def test_a_lane_outlasts_an_urgent_call_by_the_pause_its_program_is_expected_to_take() -> None:
    """With the learned pause (`Hints.keep_alive_s`) the lane is kept for it after the call
    ends, at most `quiet_s`, and freed when the program calls again or ends; without one,
    for `quiet_s` after the call was routed."""

    def batch_allowed(policy: Lanes, now: float) -> bool:
        routed = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=now)
        return routed.allowed == ALL

    policy = lanes(1, share_calls=0)
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0, pause=1.0)
    policy.started(0, urgent=True, tight=True, program="q")
    policy.ended(0, urgent=True, tight=True, program="q", now=2.0, pause=1.0)
    assert not batch_allowed(policy, 2.9)  # within the pause after the call
    assert batch_allowed(policy, 3.1)  # the pause has passed: 5 s had not

    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=10.0, pause=60.0)
    policy.started(0, urgent=True, tight=True, program="q")
    policy.ended(0, urgent=True, tight=True, program="q", now=11.0, pause=60.0)
    assert not batch_allowed(policy, 15.9)
    assert batch_allowed(policy, 16.1)  # a long pause holds the lane quiet_s at most
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=20.0, pause=3.0)
    policy.started(0, urgent=True, tight=True, program="q")
    policy.ended(0, urgent=True, tight=True, program="q", now=21.0, pause=3.0)
    policy.program_done("q")
    assert batch_allowed(policy, 21.1)  # its program ended: nothing to wait for

    fixed = Lanes(4, range(4), LaneTuning(lanes=1, share_calls=0, pauses=False))
    fixed.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0, pause=1.0)
    fixed.started(0, urgent=True, tight=True, program="q")
    fixed.ended(0, urgent=True, tight=True, program="q", now=2.0, pause=1.0)
    assert not batch_allowed(fixed, 4.9)  # quiet_s after it was routed, whatever the pause
    assert batch_allowed(fixed, 5.1)


def test_a_lane_shares_only_while_every_urgent_program_around_is_shareable() -> None:
    policy = lanes(1, batch_in_flight=0, share_calls=3)
    assert policy.cap(tight=False, now=0.0) == 3
    assert policy.cap(tight=True, now=0.0) == 0
    policy.route(ALL, ALL, urgent=True, tight=True, program="t", now=0.5)
    policy.started(0, urgent=True, tight=True, program="t")
    assert policy.cap(tight=False, now=1.0) == 0  # a tight call in flight
    policy.ended(0, urgent=True, tight=True, program="t", now=2.0)
    # Its program is still around (between calls): the lane stays unshared, however long.
    assert policy.cap(tight=False, now=60.0) == 0
    assert policy.cap(tight=False, now=60.0, heard=Heard(1, [0] * 4)) == 0  # a peer's
    # Its next call can afford longer steps: sharing again at once.
    policy.route(ALL, ALL, urgent=True, tight=False, program="t", now=61.0)
    assert policy.cap(tight=False, now=61.0) == 3
    policy.route(ALL, ALL, urgent=True, tight=True, program="u", now=62.0)
    assert policy.cap(tight=False, now=62.0) == 0
    policy.program_done("u")  # or it ended
    assert policy.cap(tight=False, now=62.0) == 3


def test_a_shared_lane_keeps_what_it_took_and_takes_more_of_a_program_it_holds() -> None:
    policy = lanes(1, batch_in_flight=0, share_calls=1)
    policy.route(ALL, ALL, urgent=True, tight=False, program="s", now=0.0)
    policy.started(0, urgent=True, tight=False, program="s")
    first = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.1)
    assert first.allowed == ALL and first.taken == {0}
    policy.started(0, urgent=False, tight=False, program="b")
    # The lane is at its cap: another program's call keeps off it, b's next one may go.
    other = policy.route(ALL, ALL, urgent=False, tight=False, program="c", now=0.2)
    assert other.allowed == [False, True, True, True] and not other.taken
    again = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.3)
    assert again.allowed == ALL and again.taken == {0}
    # Unshared (a tight program came), nothing more is taken.
    policy.route(ALL, ALL, urgent=True, tight=True, program="t", now=0.4)
    unshared = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.5)
    assert unshared.allowed == [False, True, True, True] and not unshared.taken


def test_an_urgent_call_asks_the_lanes_cleared_to_the_cap_it_finds() -> None:
    policy = lanes(1, batch_in_flight=0, share_calls=3)
    shareable = policy.route(ALL, ALL, urgent=True, tight=False, program="s", now=0.0)
    assert shareable.clear == {0} and shareable.cap == 3
    tight = policy.route(ALL, ALL, urgent=True, tight=True, program="t", now=0.1)
    assert tight.clear == {0} and tight.cap == 0
    assert tight.allowed == [True, False, False, False]


def test_a_lane_by_programs_takes_calls_of_programs_already_there() -> None:
    policy = lanes(1, batch_programs=1)
    policy.route(ALL, ALL, urgent=True, tight=True, program="q", now=0.0)
    policy.started(0, urgent=True, tight=True, program="q")
    assert policy.route(ALL, ALL, urgent=False, tight=False, program="a", now=0.1).allowed == ALL
    policy.started(0, urgent=False, tight=False, program="a")
    again = policy.route(ALL, ALL, urgent=False, tight=False, program="a", now=0.2)
    other = policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.2)
    assert again.allowed == ALL and other.allowed == [False, True, True, True]
    policy.ended(0, urgent=False, tight=False, program="a", now=0.3)
    assert policy.programs[0] == {}
    assert policy.route(ALL, ALL, urgent=False, tight=False, program="b", now=0.4).allowed == ALL


def test_a_fixed_number_of_lanes_needs_another_replica_for_batch_work() -> None:
    assert lanes(2).lane_set(ALL, 0.0) == {0, 1}
    assert lanes(2).lane_set([True, False, True, False], 0.0) == set()
    assert lanes(0).lane_set(ALL, 0.0) == set()


def test_to_move_keeps_the_first_sent_and_leaves_calls_moved_too_often() -> None:
    # Positions 1 and 3 are done or moving already; 4 was moved twice before.
    sends = [0, None, 1, None, 2, 0]
    assert to_move(sends, cap=1, max_moves=2) == [2, 5]
    assert to_move(sends, cap=0, max_moves=2) == [0, 2, 5]
    assert to_move([0, 0], cap=2, max_moves=2) == []
