"""Routers of several engines over the same replicas, joined by a link: one view of the caches."""

from __future__ import annotations

import asyncio

import pytest

from executors import (
    FunctionLLM,
    LocalRouterHub,
    Placed,
    Placement,
    PrefixRouter,
    Router,
    RouterLink,
    Served,
)
from executors._prefix import prompt_hashes
from orchestrator import Hints, LLMRequest, Message, VirtualClock

SYSTEM = "You are one of many agents sharing this long system prompt. " * 20


def conversation(name: str, turns: int) -> list[LLMRequest]:
    out, history = [], [Message("system", SYSTEM)]
    for t in range(turns):
        history = [*history, Message("user", f"{name} step {t}: " + "details " * 30)]
        out.append(LLMRequest(tuple(history), "m", max_tokens=8))
        history = [*history, Message("assistant", f"{name} answer {t}")]
    return out


def replicas(n: int) -> dict[str, FunctionLLM]:
    return {f"r{i}": FunctionLLM(lambda req, hints, i=i: f"r{i}", latency=1.0) for i in range(n)}


def two_engines_talk(clock: VirtualClock, hub: LocalRouterHub | None) -> dict[str, list[str]]:
    """Eight conversations at once; turn t of each is sent by engine t % 2's router."""
    llms = replicas(4)

    async def main() -> dict[str, list[str]]:
        links: list[RouterLink | None] = [hub.link(), hub.link()] if hub else [None, None]
        routers = [Router(llms, clock=clock, peers=link) for link in links]
        where: dict[str, list[str]] = {}

        async def talk(name: str) -> None:
            for t, request in enumerate(conversation(name, 6)):
                reply = await routers[t % 2].complete(request, Hints(program_id=name))
                where.setdefault(name, []).append(reply.text)
                await clock.sleep(0.5)  # a tool runs: longer than the link's delay

        await asyncio.gather(*(talk(f"c{c}") for c in range(8)))
        return where

    return clock.run(main())


def test_two_engines_sending_one_programs_calls_keep_them_on_one_replica(
    clock: VirtualClock,
) -> None:
    where = two_engines_talk(clock, LocalRouterHub(delay_s=0.002))
    assert all(len(set(replicas)) == 1 for replicas in where.values()), where
    assert len({replicas[0] for replicas in where.values()}) >= 3  # and they still spread


def test_without_the_link_the_second_engine_sends_a_program_elsewhere() -> None:
    where = two_engines_talk(VirtualClock(), None)
    assert any(len(set(replicas)) > 1 for replicas in where.values())


def test_a_prefix_key_placed_by_one_engine_holds_at_the_other(clock: VirtualClock) -> None:
    """Prompts with nothing in common but their key follow the first one, from either engine."""
    llms = replicas(3)
    unrelated = [LLMRequest((Message("user", f"{i} " * (50 + i)),), "m") for i in range(8)]

    async def main() -> set[str]:
        hub = LocalRouterHub(delay_s=0.01)
        routers = [Router(llms, clock=clock, peers=hub.link()) for _ in range(2)]
        served = set()
        for i, request in enumerate(unrelated):
            reply = await routers[i % 2].complete(request, Hints("p", prefix_key="doc"))
            served.add(reply.text)
            await clock.sleep(0.02)
        return served

    assert len(clock.run(main())) == 1


def test_a_placement_reaches_the_other_engine_after_the_links_delay(clock: VirtualClock) -> None:
    llms = replicas(4)
    first, second = conversation("c", 2)

    async def main() -> tuple[int, int, str, str]:
        hub = LocalRouterHub(delay_s=0.5)
        a, b = (Router(llms, clock=clock, peers=hub.link()) for _ in range(2))
        hashes = prompt_hashes(first, b.block_tokens)

        def known_at_b() -> int:
            return max(b.policy.held_prefix(hashes, r) for r in range(4))

        async with asyncio.TaskGroup() as tg:
            sent = tg.create_task(a.complete(first, Hints("c")))
            await asyncio.sleep(0)  # routed and published; the call itself takes 1 s
            before = known_at_b()
            await clock.sleep(0.6)
            after = known_at_b()
        there = (await b.complete(second, Hints("c"))).text
        return before, after, sent.result().text, there

    before, after, home, there = clock.run(main())
    assert before == 0 and after > 0
    assert there == home


def test_peers_drop_repeats_their_own_messages_unknown_replicas_and_garbage() -> None:
    llms = replicas(2)
    link = LocalRouterHub(delay_s=0).link()
    router = Router(llms, peers=link)
    assert router.peering is not None
    receive = router.peering.receive
    placed = Placed(b"12345678", 1, "r1", Placement(-1, (5, 6, 7), 3, prefix_key="k"))
    data = placed.to_bytes()
    assert len(data) < 80
    decoded = Placed.from_bytes(data)
    assert decoded == placed
    receive(data)
    receive(data)  # delivered twice
    receive(Placed(b"12345678", 2, "r9", placed.placement).to_bytes())
    receive(b"\x00garbage")
    receive(data[:-3])
    own = Placed(router.peering.origin, 1, "r0", placed.placement).to_bytes()
    receive(own)
    stats = router.peer_stats()
    assert stats is not None
    assert (stats.received, stats.applied, stats.repeated, stats.dropped) == (2, 1, 1, 3)
    assert router.policy.held_prefix([5, 6, 7], 1) == 3
    assert router.policy.choose([1], [0, 0], [True, True], "k").replica == 1


def test_a_placement_round_trips_without_key_and_with_a_base() -> None:
    placement = Placement(-1, (-(2**63), 2**63 - 1, 0), 2, base=-42, base_blocks=17)
    placed = Placed(b"\x00" * 8, 2**40, "http://10.0.0.7:8000/v1", placement)
    assert Placed.from_bytes(placed.to_bytes()) == placed
    with pytest.raises(ValueError):
        Placed.from_bytes(placed.to_bytes() + b"x")


def test_placements_reach_every_other_router_and_only_once() -> None:
    hub = LocalRouterHub(delay_s=0)
    routers = [PrefixRouter(2) for _ in range(3)]
    heard: list[list[bytes]] = [[], [], []]
    links = [hub.link() for _ in routers]
    for i, link in enumerate(links):
        link.subscribe(heard[i].append)
    links[0].publish(b"one")
    links[2].publish(b"two")
    assert heard == [[b"two"], [b"one", b"two"], [b"one"]]
    assert (hub.messages, hub.bytes) == (2, 6)
    with pytest.raises(ValueError, match="delay_s=-1"):
        LocalRouterHub(delay_s=-1)


def test_peers_count_each_others_calls_in_flight_until_they_are_served(
    clock: VirtualClock,
) -> None:
    llms = replicas(2)
    first = conversation("a", 1)[0]

    async def main() -> tuple[list[int], list[int], int]:
        hub = LocalRouterHub(delay_s=0.001)
        a, b = (Router(llms, clock=clock, peers=hub.link()) for _ in range(2))
        async with asyncio.TaskGroup() as tg:
            tg.create_task(a.complete(first, Hints("a")))
            tg.create_task(
                a.complete(LLMRequest((Message("user", "other " * 90),), "m"), Hints("o"))
            )
            await clock.sleep(0.5)  # heard by b; the calls take 1 s
            assert b.peering is not None
            during = list(b.peering.in_flight)
        await clock.sleep(0.01)  # the ends are heard after the link's delay
        return during, b.peering.in_flight, b.peering.stats().in_flight

    during, after, left = clock.run(main())
    assert sorted(during) == [1, 1] and after == [0, 0] and left == 0


def test_a_call_whose_end_is_never_heard_is_taken_as_served_in_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import executors._peers as peers_module

    monkeypatch.setattr(peers_module, "HEARD", 3)
    router = Router(replicas(2), peers=LocalRouterHub(delay_s=0).link())
    assert router.peering is not None
    peering = router.peering
    for seq in range(5):
        placement = Placement(-1, (100 + seq,), 1)
        peering.receive(Placed(b"peer0001", seq, "r0", placement).to_bytes())
    assert peering.stats().in_flight == 3 and peering.in_flight == [3, 0]
    assert router._calls() == [3, 0]
    peering.receive(Served(b"peer0001", 4).to_bytes())
    peering.receive(Served(b"peer0001", 4).to_bytes())  # twice: once is enough
    assert peering.in_flight == [2, 0]


def test_routers_keep_one_urgent_lane_between_them_by_each_others_calls(
    clock: VirtualClock,
) -> None:
    """Engine a sends batch calls, engine b urgent ones (the default "auto" lanes): b,
    hearing a's batch calls in flight, sends its urgent calls to one lane only, the replica
    first by name (each lists the replicas in its own order); then neither sends more batch
    calls to the lane than make two there, counting each other's."""

    def slow_batch(request: LLMRequest) -> float:
        return 100.0 if request.messages[0].content.startswith("batch") else 5.0

    names = ["r2", "r0", "r1"]  # engine a's order; b lists them the other way round
    llms = {n: FunctionLLM(lambda req, hints, n=n: n, latency=slow_batch) for n in names}

    def ask(tag: str) -> LLMRequest:
        return LLMRequest((Message("user", f"{tag} " + "words " * 40),), "m", max_tokens=8)

    async def main() -> tuple[set[str], int]:
        hub = LocalRouterHub(delay_s=0.001)
        a = Router(llms, clock=clock, peers=hub.link())
        b = Router(dict(reversed(llms.items())), clock=clock, peers=hub.link())
        batch = Hints(program_id="doc", service="slack_rich")
        async with asyncio.TaskGroup() as tg:
            for i in range(9):
                tg.create_task(a.complete(ask(f"batch {i}"), Hints(f"b{i}")))
            await clock.sleep(0.01)  # heard by b
            urgent = [
                tg.create_task(b.complete(ask(f"urgent {i}"), Hints("q", service="urgent")))
                for i in range(3)
            ]
            await clock.sleep(0.01)  # heard by a
            before = batch_on_lane()
            # Past the three the lane is no busier than the others: only the urgent calls
            # a heard of keep its batch calls off the lane.
            for i in range(12):
                tg.create_task(a.complete(ask(f"batch later {i}"), batch))
            await asyncio.sleep(0)
            by_a = batch_on_lane() - before
            on_lane = {(await task).text for task in urgent}
            # b's urgent calls have ended (urgent work is still around at b for
            # the quiet time): only the count of a's batch calls on the lane keeps b's off it.
            for i in range(12):
                tg.create_task(b.complete(ask(f"batch b {i}"), batch))
            await asyncio.sleep(0)
            by_b = batch_on_lane() - before - by_a
        return on_lane, before, by_a, by_b

    def batch_on_lane() -> int:
        return sum(c.request.messages[0].content.startswith("batch") for c in llms["r0"].calls)

    on_lane, before, by_a, by_b = clock.run(main())
    assert on_lane == {"r0"}
    assert before >= 2 and by_a == by_b == 0, (before, by_a, by_b)
