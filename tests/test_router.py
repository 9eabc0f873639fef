"""The Router over fake backends: affinity, spread, failover, ejection and re-admission."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import zlib
from typing import Any

import pytest

from executors import FunctionLLM, LaneTuning, SimServer
from executors._prefix import prompt_hashes
from executors._router import Router
from executors._simtext import render
from orchestrator import Hints, LLMRequest, LLMResponse, Message, UsageError, VirtualClock
from orchestrator.ext import BackendOverloadedError, BackendUnavailableError

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


class Replica:
    """A small backend that can be taken down or made busy, with a health probe."""

    def __init__(self, name: str, *, retry_after: float | None = None) -> None:
        self.name = name
        self.up = True
        self.busy = False
        self.retry_after = retry_after
        self.served: list[str] = []
        self.probed: list[float] = []

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        if not self.up:
            raise BackendUnavailableError("connection refused", backend=self.name)
        if self.busy:
            raise BackendOverloadedError(
                "busy", backend=self.name, status=429, retry_after=self.retry_after
            )
        await asyncio.sleep(1)
        self.served.append(request.messages[-1].content)
        return LLMResponse(text=self.name)

    async def check(self) -> None:
        self.probed.append(asyncio.get_running_loop().time())
        if not self.up:
            raise BackendUnavailableError("connection refused", backend=self.name)


def test_health_checks_eject_a_failing_backend_and_readmit_it_when_it_passes(
    clock: VirtualClock,
) -> None:
    replicas = {name: Replica(name) for name in ("a", "b")}

    async def main() -> list[tuple[float, list[bool]]]:
        seen = []
        async with Router(replicas, health_interval_s=5.0, readmit_after_s=1.0) as router:
            replicas["a"].up = False
            for t in (4.0, 6.0, 41.0):  # checks run at 5, 10, 15, ...
                await asyncio.sleep(t - clock.monotonic())
                seen.append((t, [s.healthy for s in router.stats()]))
            replicas["a"].up = True
            await asyncio.sleep(46.0 - clock.monotonic())
            seen.append((46.0, [s.healthy for s in router.stats()]))
            stats = router.stats()
            assert stats[0].ejections == 1 and stats[0].checks_failed == 8
        return seen

    seen = clock.run(main())
    # Ejected by the probe at 5 without a single failed call; kept out by the probes (not
    # let back after readmit_after_s, as a backend without probes would be), back at 45.
    assert seen == [
        (4.0, [True, True]),
        (6.0, [False, True]),
        (41.0, [False, True]),
        (46.0, [True, True]),
    ]
    assert replicas["a"].probed == [5.0 * k for k in range(1, 10)]
    assert replicas["a"].served == [] and replicas["b"].served == []


def test_an_ejected_backend_gets_no_calls_until_a_probe_passes(clock: VirtualClock) -> None:
    replicas = {name: Replica(name) for name in ("a", "b", "c")}

    async def main() -> None:
        async with Router(replicas, health_interval_s=10.0) as router:
            replicas["b"].up = False
            await asyncio.sleep(10.5)  # the probe at 10 ejects b
            await asyncio.gather(
                *(router.complete(conversation(f"c{c}", 1)[0], Hints("p")) for c in range(12))
            )
            assert replicas["b"].served == []
            replicas["b"].up = True
            await asyncio.sleep(20.5 - clock.monotonic())  # the probe at 20 passes
            await asyncio.gather(
                *(router.complete(conversation(f"d{c}", 1)[0], Hints("p")) for c in range(12))
            )
            assert replicas["b"].served  # back in the rotation

    clock.run(main())


def test_the_health_loop_ends_with_the_router(clock: VirtualClock) -> None:
    replica = Replica("a")

    async def main() -> None:
        async with Router({"a": replica}, health_interval_s=1.0):
            await asyncio.sleep(3.5)
        await asyncio.sleep(10)
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current] == []

    clock.run(main())
    assert replica.probed == [1.0, 2.0, 3.0]


def test_a_busy_replica_keeps_its_place_and_the_call_goes_elsewhere(clock: VirtualClock) -> None:
    replicas = {name: Replica(name) for name in ("a", "b")}
    request = conversation("x", 1)[0]

    async def main() -> tuple[str, str, list[bool], list[int]]:
        async with Router(replicas, health_interval_s=None) as router:
            first = (await router.complete(request, Hints("p"))).text
            replicas[first].busy = True
            second = (await router.complete(request, Hints("p"))).text
            stats = router.stats()
            return first, second, [s.healthy for s in stats], [s.overloaded for s in stats]

    first, second, healthy, overloaded = clock.run(main())
    assert second != first
    assert healthy == [True, True]
    assert overloaded == [1 if name == first else 0 for name in ("a", "b")]


def test_when_every_replica_is_busy_the_call_gets_the_shortest_retry_after(
    clock: VirtualClock,
) -> None:
    replicas = {"a": Replica("a", retry_after=9.0), "b": Replica("b", retry_after=4.0)}
    for replica in replicas.values():
        replica.busy = True

    async def main() -> None:
        async with Router(replicas, health_interval_s=None) as router:
            await router.complete(conversation("x", 1)[0], Hints("p"))

    with pytest.raises(BackendOverloadedError, match="every replica this router") as info:
        clock.run(main())
    assert info.value.retry_after == 4.0


def test_prefixes_are_hashed_on_the_given_tokenizer(clock: VirtualClock) -> None:
    """Prompts with nothing in common spread over the replicas; a tokenizer that sees them
    all as the same tokens makes them one prefix, held by one replica."""
    prompts = [
        LLMRequest((Message("user", f"{i} " + "unrelated words " * 20),), "m") for i in range(8)
    ]
    tokenized: list[str] = []

    def same_tokens(text: str) -> list[int]:
        tokenized.append(text)
        return [7] * 64

    def spread(tokenize: Any) -> int:
        llms = {f"r{i}": FunctionLLM(lambda r, h: "ok") for i in range(4)}

        async def main() -> None:
            async with Router(llms, tokenize=tokenize) as router:
                for request in prompts:  # one after another: load never decides
                    await router.complete(request, Hints("p"))

        clock.run(main())
        return sum(1 for llm in llms.values() if llm.calls)

    assert spread(None) >= 2
    assert spread(same_tokens) == 1
    assert len(tokenized) == len(prompts)


def test_a_router_that_knows_the_cache_size_stops_trusting_evicted_prefixes(
    clock: VirtualClock,
) -> None:
    """With `cache_blocks`, a prefix pushed out of a replica's modelled cache no longer pins
    calls to that replica; without it, the router believes the replica holds it forever."""
    first = LLMRequest((Message("system", SYSTEM), Message("user", "first")), "m")
    flood = [LLMRequest((Message("system", f"other prompt {i} " * 60),), "m") for i in range(16)]

    def holder_of_first(cache_blocks: int | None) -> int:
        llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok") for i in range(2)}

        async def main() -> int:
            async with Router(llms, health_interval_s=None, cache_blocks=cache_blocks) as router:
                await router.complete(first, Hints(program_id="a"))
                for request in flood:
                    await router.complete(request, Hints(program_id="b"))
                hashes = prompt_hashes(first, router.block_tokens)
                return max(router.policy.held_prefix(hashes, r) for r in range(2))

        return clock.run(main())

    assert holder_of_first(None) > 0
    assert holder_of_first(32) == 0
    with pytest.raises(UsageError, match="cache_blocks"):
        Router({"r": FunctionLLM(lambda req, hints: "ok")}, cache_blocks=0)


def test_the_engine_puts_no_circuit_breaker_over_a_router(clock: VirtualClock) -> None:
    """The router ejects a failing replica itself; one engine breaker over all replicas
    would stop the healthy ones too. A plain backend keeps its breaker."""
    from executors import PrefixGrouper
    from orchestrator import Engine

    plain = FunctionLLM(lambda req, hints: "ok")
    router = Router({"r": FunctionLLM(lambda req, hints: "ok")}, health_interval_s=None)
    engine = Engine(
        backends={"plain": plain, "routed": router, "grouped": PrefixGrouper(router)},
        clock=clock,
    )
    assert engine.circuit("plain") is not None
    assert engine.circuit("routed") is None
    assert engine.circuit("grouped") is None


class Metered(FunctionLLM):
    """A replica whose probe also reports how busy the server is with everyone's requests."""

    def __init__(self) -> None:
        super().__init__(lambda req, hints: "ok")
        self.running = 0

    async def check(self) -> None:
        return None

    async def load(self) -> Any:
        from executors import LoadReport

        return LoadReport(running=self.running, waiting=0)


def test_a_replica_busy_with_other_clients_is_avoided_after_a_probe(clock: VirtualClock) -> None:
    llms = {"r0": Metered(), "r1": Metered()}
    turns = conversation("c", 3)

    async def main() -> list[str]:
        where = []
        async with Router(llms, health_interval_s=None) as router:
            await router.complete(turns[0], Hints(program_id="c"))
            home = served_by(llms, turns[0])
            where.append(home)
            await router.complete(turns[1], Hints(program_id="c"))
            where.append(served_by(llms, turns[1]))  # sticks while nobody is busy
            llms[home].running = 40  # others' requests fill that server
            await router.check_health()
            assert {s.name: s.server_load for s in router.stats()}[home] == 40
            await router.complete(turns[2], Hints(program_id="c"))
            where.append(served_by(llms, turns[2]))
        return where

    first, second, third = clock.run(main())
    assert first == second and third != first


def test_calls_with_one_prefix_key_go_to_one_replica_while_it_serves(clock: VirtualClock) -> None:
    """The key says what the prompts do not: these share a prefix a tokenizer would not see
    (here, none at all), so they follow the first one; the key moves off a dead replica."""
    up = {"r0": True, "r1": True, "r2": True}

    def reply(name: str) -> Any:
        def answer(request: LLMRequest, hints: Hints) -> str:
            if not up[name]:
                raise BackendUnavailableError("connection refused", backend=name)
            return name

        return answer

    llms = {name: FunctionLLM(reply(name), latency=1.0) for name in up}
    unrelated = [LLMRequest((Message("user", f"{i} " * (50 + i)),), "m") for i in range(12)]

    async def main() -> tuple[set[str], set[str], set[str]]:
        async with Router(llms, readmit_after_s=1000) as router:

            async def ask(key: str | None, requests: list[LLMRequest]) -> set[str]:
                hints = Hints("p", prefix_key=key)
                return {(await router.complete(r, hints)).text for r in requests}

            keyed = await ask("doc", unrelated[:6])
            unkeyed = await ask(None, unrelated[6:])
            (home,) = keyed
            up[home] = False
            moved = await ask("doc", unrelated[:6])
            return keyed, unkeyed, moved

    keyed, unkeyed, moved = clock.run(main())
    assert len(keyed) == 1 and len(unkeyed) > 1
    assert len(moved) == 1 and moved != keyed


def _ask(tag: str) -> LLMRequest:
    return LLMRequest((Message("user", f"{tag} " + "words " * 40),), "m", max_tokens=8)


def test_urgent_lanes_keep_urgent_calls_apart_from_batch_calls(clock: VirtualClock) -> None:
    """One lane of three replicas: urgent calls go only to it; while they are around, batch
    calls use it for at most two at once; once urgent calls stop for `LaneTuning.quiet_s`, batch
    calls use it again."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=10.0) for i in range(3)}
    urgent = Hints(program_id="q", service="urgent")

    def batch(n: int) -> Hints:
        return Hints(program_id=f"b{n}", service="slack_rich")

    async def main() -> tuple[list[str], list[str], list[str], int, bool]:
        async with Router(llms, clock=clock, lanes=LaneTuning(lanes=1, quiet_s=5.0)) as router:
            lane = router.names[0]
            calls = [_ask(f"urgent {i}") for i in range(6)]
            bulk = [_ask(f"batch {i}") for i in range(30)]
            async with asyncio.TaskGroup() as tg:
                for request in calls:
                    tg.create_task(router.complete(request, urgent))
                await asyncio.sleep(0)  # the urgent calls are routed first
                for i, request in enumerate(bulk):
                    tg.create_task(router.complete(request, batch(i)))
            urgent_at = [served_by(llms, r) for r in calls]
            bulk_on_lane = sum(served_by(llms, r) == lane for r in bulk)
            later = [_ask(f"later {i}") for i in range(30)]
            await clock.sleep(6.0)  # no urgent call for longer than the quiet time
            await asyncio.gather(*(router.complete(r, batch(100 + i)) for i, r in enumerate(later)))
            later_on_lane = [served_by(llms, r) for r in later if served_by(llms, r) == lane]
            return urgent_at, [lane], later_on_lane, bulk_on_lane, router.isolates_urgent()

    urgent_at, (lane,), later_on_lane, bulk_on_lane, isolates = clock.run(main())
    assert set(urgent_at) == {lane}
    assert bulk_on_lane <= 2  # 30 batch calls beside the urgent ones: 2 at most on the lane
    assert isolates
    assert later_on_lane  # quiet again: the lane takes batch work


def _slow_batch(request: LLMRequest) -> float:
    """Batch calls take 100 s, the rest 1 s."""
    return 100.0 if request.messages[0].content.startswith("batch") else 1.0


def test_auto_lanes_only_while_batch_work_is_around(clock: VirtualClock) -> None:
    """The default ("auto" lanes): urgent calls alone use every replica; once batch
    calls are around, urgent calls go only to the first replica, and batch calls use it for
    at most two at once."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=_slow_batch) for i in range(3)}
    urgent = Hints(program_id="q", service="urgent")

    async def main() -> tuple[set[str], set[str], int, bool]:
        async with Router(llms, clock=clock) as router:
            alone = [_ask(f"urgent {i}") for i in range(12)]
            await asyncio.gather(*(router.complete(r, urgent) for r in alone))
            bulk = [_ask(f"batch {i}") for i in range(30)]
            beside = [_ask(f"urgent later {i}") for i in range(12)]
            async with asyncio.TaskGroup() as tg:
                for i, request in enumerate(bulk):
                    tg.create_task(router.complete(request, Hints(program_id=f"b{i}")))
                await asyncio.sleep(0)  # the batch calls are in flight
                await asyncio.gather(*(router.complete(r, urgent) for r in beside))
                bulk_on_lane = sum(served_by(llms, r) == "r0" for r in bulk)
            return (
                {served_by(llms, r) for r in alone},
                {served_by(llms, r) for r in beside},
                bulk_on_lane,
                router.isolates_urgent(),
            )

    alone_at, beside_at, bulk_on_lane, isolates = clock.run(main())
    assert len(alone_at) > 1  # no batch work: no lane, urgent calls spread
    assert beside_at == {"r0"}
    assert bulk_on_lane <= 2
    assert isolates


def test_auto_lanes_count_batch_work_routed_lately_as_around(clock: VirtualClock) -> None:
    """Batch calls that ended less than `LaneTuning.quiet_s` ago still count as batch work around
    (a batch job's next rows are coming): urgent calls then keep to the lane; once the
    batch has been quiet for longer, they use every replica."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=1.0) for i in range(3)}
    urgent = Hints(program_id="q", service="urgent")

    async def main() -> tuple[set[str], set[str]]:
        async with Router(llms, clock=clock, lanes=LaneTuning(quiet_s=5.0)) as router:
            await asyncio.gather(
                *(router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}")) for i in range(6))
            )
            await clock.sleep(2.0)  # the batch calls ended 2 s ago
            soon = [_ask(f"urgent {i}") for i in range(9)]
            await asyncio.gather(*(router.complete(r, urgent) for r in soon))
            await clock.sleep(6.0)  # no batch call for longer than the quiet time
            late = [_ask(f"urgent late {i}") for i in range(9)]
            await asyncio.gather(*(router.complete(r, urgent) for r in late))
        return {served_by(llms, r) for r in soon}, {served_by(llms, r) for r in late}

    soon_at, late_at = clock.run(main())
    assert soon_at == {"r0"}
    assert len(late_at) > 1


def test_auto_lanes_grow_with_the_urgent_load_and_shrink_when_it_falls(
    clock: VirtualClock,
) -> None:
    """One lane for every `LaneTuning.urgent_calls` urgent calls in flight, never the last replica;
    back to one once fewer have been in flight for `LaneTuning.quiet_s`."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=_slow_batch) for i in range(4)}
    urgent = Hints(program_id="q", service="urgent")

    async def main() -> tuple[set[str], set[str], set[str]]:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(urgent_calls=4, quiet_s=5.0)
        ) as router:
            async with asyncio.TaskGroup() as tg:
                for i in range(40):  # batch work around throughout
                    tg.create_task(router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}")))
                await asyncio.sleep(0)
                burst = [_ask(f"urgent {i}") for i in range(16)]
                await asyncio.gather(*(router.complete(r, urgent) for r in burst))
                soon = [_ask(f"urgent soon {i}") for i in range(3)]
                for request in soon:  # one at a time, within the quiet time: lanes kept
                    await router.complete(request, urgent)
                await clock.sleep(6.0)
                calm = [_ask(f"urgent calm {i}") for i in range(6)]
                for request in calm:
                    await router.complete(request, urgent)
            return (
                {served_by(llms, r) for r in burst},
                {served_by(llms, r) for r in soon},
                {served_by(llms, r) for r in calm},
            )

    burst_at, soon_at, calm_at = clock.run(main())
    assert burst_at == {"r0", "r1", "r2", "r3"}  # 16 calls need 4 lanes: more than 3, so
    # the last go anywhere (batch calls still keep off the 3 lanes)
    assert len(soon_at) > 1  # the lanes are kept through a short lull
    assert calm_at == {"r0"}


def test_auto_lanes_shrink_as_batch_calls_are_routed(clock: VirtualClock) -> None:
    """Lanes taken for a burst of urgent calls are given back once it has passed, as batch
    calls are routed, while one long urgent call keeps urgent work around."""

    def latency(request: LLMRequest) -> float:
        long = request.messages[0].content.startswith(("batch", "long"))
        return 100.0 if long else 1.0

    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=latency) for i in range(4)}
    urgent = Hints(program_id="q", service="urgent")

    async def main() -> int:
        async with (
            Router(llms, clock=clock, lanes=LaneTuning(urgent_calls=4, quiet_s=5.0)) as router,
            asyncio.TaskGroup() as tg,
        ):
            for i in range(4):
                tg.create_task(router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}")))
            tg.create_task(router.complete(_ask("long urgent"), urgent))
            await asyncio.sleep(0)
            burst = [_ask(f"urgent {i}") for i in range(11)]  # 12 in flight: 3 lanes
            await asyncio.gather(*(router.complete(r, urgent) for r in burst))
            await clock.sleep(6.0)  # the burst has passed; the long call goes on
            later = [_ask(f"batch later {i}") for i in range(24)]
            for i, request in enumerate(later):
                tg.create_task(router.complete(request, Hints(program_id=f"l{i}")))
            await clock.sleep(1.0)  # sent (a batch call is sent from a task of its own)
            return sum(served_by(llms, r) in ("r1", "r2") for r in later)

    # One lane again: r1 and r2 take batch calls as r3 does (none while they are lanes).
    assert clock.run(main()) > 4


def test_batch_calls_on_a_lane_are_capped_while_urgent_work_is_around(clock: VirtualClock) -> None:
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=10.0) for i in range(2)}
    seen: list[int] = []

    async def main() -> None:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(lanes=1, batch_in_flight=2)
        ) as router:
            lane, urgent = 0, Hints(program_id="q", service="urgent")

            async def one(i: int) -> None:
                await router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}"))

            async with asyncio.TaskGroup() as tg:
                tg.create_task(router.complete(_ask("urgent"), urgent))
                await asyncio.sleep(0)  # in flight on the lane
                for i in range(20):
                    tg.create_task(one(i))
                await asyncio.sleep(0)
                seen.append(router.stats()[lane].in_flight)

    clock.run(main())
    assert seen == [3]  # the urgent call and 2 of the 20 batch calls; 18 on the other replica


def test_by_default_a_lane_takes_no_batch_call_while_urgent_work_is_around(
    clock: VirtualClock,
) -> None:
    """The default cap is 0: a batch call's prompt would lengthen every step of the lane's
    urgent calls (bench/deadlines.py part 1: 0.712 of the deadlines met on seed 1 with 2
    batch calls on the lane, 0.932 with none, at the same batch throughput)."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=10.0) for i in range(2)}
    urgent = Hints(program_id="q", service="urgent")
    batch = [_ask(f"batch {i}") for i in range(20)]
    later = [_ask(f"batch later {i}") for i in range(20)]

    async def main() -> None:
        async with (
            Router(llms, clock=clock, lanes=LaneTuning(lanes=1)) as router,
            asyncio.TaskGroup() as tg,
        ):
            tg.create_task(router.complete(_ask("urgent"), urgent))
            await asyncio.sleep(0)  # in flight on the lane
            for i, request in enumerate(batch):
                tg.create_task(router.complete(request, Hints(program_id=f"b{i}")))
            await clock.sleep(20.0 + router.lane_quiet_s)  # all done, and quiet since
            for i, request in enumerate(later):
                tg.create_task(router.complete(request, Hints(program_id=f"l{i}")))

    clock.run(main())
    assert [served_by(llms, r) for r in batch] == ["r1"] * 20
    assert {served_by(llms, r) for r in later} == {"r0", "r1"}  # no urgent work: both


def _named(n: int) -> dict[str, FunctionLLM]:
    """Replicas r0..r{n-1} that answer with their own name, after `_slow_batch`."""
    return {
        f"r{i}": FunctionLLM(lambda req, hints, name=f"r{i}": name, latency=_slow_batch)
        for i in range(n)
    }


def _send_batch(router: Router, n: int) -> list[asyncio.Future[LLMResponse]]:
    """Batch calls "batch 0".."batch {n-1}", one program each, sent at once."""
    return [
        asyncio.ensure_future(router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}")))
        for i in range(n)
    ]


@pytest.mark.parametrize("clear", [True, False])
def test_a_replica_becoming_a_lane_is_cleared_of_batch_calls_which_finish_elsewhere(
    clock: VirtualClock, clear: bool
) -> None:
    """Batch calls fill both replicas; an urgent call comes: the first replica becomes its
    lane, and (`lane_clear`, the default) the batch calls there are cancelled and sent to
    the other replica, where each finishes once; the urgent call has the lane to itself at
    once. Without clearing they stay, and the urgent call shares every step with them."""
    llms = _named(2)
    urgent = Hints(program_id="q", service="urgent")

    async def main() -> tuple[list[str], int, int, str, float]:
        async with Router(llms, clock=clock, lane_clear=clear) as router:
            sent = _send_batch(router, 20)
            await clock.sleep(10.0)
            on_lane_before = router.stats()[0].in_flight
            asked = asyncio.ensure_future(router.complete(_ask("urgent"), urgent))
            await clock.sleep(0.5)  # before the urgent call's 1 s is up
            on_lane = router.stats()[0].in_flight
            answer = await asked
            answers = [r.text for r in await asyncio.gather(*sent)]
            assert on_lane_before >= 5  # the batch was spread over both
            return answers, on_lane, router.stats()[0].moved, answer.text, clock.monotonic()

    answers, on_lane, moved, answer, ended = clock.run(main())
    assert answer == "r0"
    if clear:
        assert on_lane == 1  # the urgent call alone
        assert moved >= 5
        # Each moved call was answered by r1 (started again there: 10 s + 100 s).
        assert answers.count("r1") == 20
        assert sum(len(llm.calls) for llm in llms.values()) == 20 + moved + 1
        assert ended >= 110.0
    else:
        assert on_lane > 5 and moved == 0
        assert answers.count("r0") > 5


def test_a_moved_call_keeps_its_tries_and_returns_to_the_lane_if_nowhere_else_serves(
    clock: VirtualClock,
) -> None:
    """Two replicas: the batch calls on the first are moved to the second as it becomes a
    lane, and the second then goes down. The moved calls are answered by the first (no
    lane is left with one healthy replica), not failed for want of tries."""
    down = False

    def second(request: LLMRequest, hints: Hints) -> str:
        if down:
            raise BackendUnavailableError("connection refused", backend="r1")
        return "r1"

    llms = {
        "r0": FunctionLLM(lambda req, hints: "r0", latency=_slow_batch),
        "r1": FunctionLLM(second, latency=_slow_batch),
    }

    async def main() -> tuple[list[str], int]:
        nonlocal down
        async with Router(llms, clock=clock, readmit_after_s=1_000) as router:
            sent = _send_batch(router, 6)
            await clock.sleep(10.0)
            down = True
            await router.complete(_ask("urgent"), Hints("q", service="urgent"))
            answers = [r.text for r in await asyncio.gather(*sent)]
            return answers, router.stats()[0].moved

    answers, moved = clock.run(main())
    assert moved >= 1
    assert answers == ["r0"] * 6


def test_a_lane_keeps_its_first_batch_calls_up_to_the_cap(clock: VirtualClock) -> None:
    """With `LaneTuning(batch_in_flight=2)` a new lane keeps the first 2 of its batch calls and
    moves the rest."""
    llms = _named(2)

    async def main() -> tuple[int, int]:
        async with Router(llms, clock=clock, lanes=LaneTuning(batch_in_flight=2)) as router:
            sent = _send_batch(router, 20)
            await clock.sleep(10.0)
            before = router.stats()[0].in_flight
            asked = asyncio.ensure_future(
                router.complete(_ask("urgent"), Hints("q", service="urgent"))
            )
            await clock.sleep(0.5)
            on_lane = router.stats()[0].in_flight
            await asked
            await asyncio.gather(*sent)
            assert before > 3
            return on_lane, router.stats()[0].moved

    on_lane, moved = clock.run(main())
    assert on_lane == 3  # the urgent call and 2 batch calls
    assert moved >= 2


def test_a_call_from_a_task_that_once_swallowed_a_cancellation_is_still_moved(
    clock: VirtualClock,
) -> None:
    """A task whose cancellation was once caught (and not `uncancel`led) still counts as
    cancelling; its batch call, moved off a new lane, is routed again all the same."""
    llms = _named(2)

    async def main() -> list[str]:
        async with Router(llms, clock=clock) as router:

            async def stubborn(i: int) -> str:
                me = asyncio.current_task()
                assert me is not None
                me.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)  # caught without uncancel(): cancelling() stays 1
                answer = await router.complete(_ask(f"batch {i}"), Hints(program_id=f"b{i}"))
                return answer.text

            sent = [asyncio.ensure_future(stubborn(i)) for i in range(10)]
            await clock.sleep(10.0)
            await router.complete(_ask("urgent"), Hints("q", service="urgent"))
            answers = await asyncio.gather(*sent)
            assert router.stats()[0].moved >= 1
            return answers

    assert clock.run(main()) == ["r1"] * 10


def test_a_batch_call_cancelled_by_its_caller_is_not_sent_again(clock: VirtualClock) -> None:
    """Clearing moves only calls it cancelled itself: a caller's cancellation goes through."""
    llms = _named(2)

    async def main() -> tuple[bool, list[int]]:
        async with Router(llms, clock=clock) as router:
            call = asyncio.ensure_future(router.complete(_ask("batch 0"), Hints(program_id="b")))
            await clock.sleep(1.0)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await clock.sleep(200.0)
            return call.cancelled(), [s.in_flight for s in router.stats()]

    cancelled, in_flight = clock.run(main())
    assert cancelled and in_flight == [0, 0]
    assert sum(len(llm.calls) for llm in llms.values()) == 1


def test_a_cleared_lane_on_simulated_servers_runs_the_urgent_call_alone(
    clock: VirtualClock,
) -> None:
    """On simulated servers the cleared batch requests are dropped by the lane's server
    (aborted, their blocks freed), so the urgent call's steps carry no batch prefill, and it
    ends sooner than beside them."""

    async def urgent_latency(clear: bool) -> tuple[float, int]:
        servers = {f"r{i}": SimServer("h100-llama3-8b", clock=clock, seed=i) for i in range(2)}
        async with Router(servers, clock=clock, lane_clear=clear) as router:
            batch = [
                asyncio.ensure_future(
                    router.complete(
                        LLMRequest((Message("user", f"batch {i} " + "text " * 3000),), "m",
                                   max_tokens=200),
                        Hints(program_id=f"b{i}", service="slack_rich"),
                    )
                )
                for i in range(200)
            ]  # fmt: skip
            await clock.sleep(0.5)
            started = clock.monotonic()
            await router.complete(_ask("urgent"), Hints("q", service="urgent"))
            took = clock.monotonic() - started
            batch_on_lane = len(servers["r0"].engine.running) + len(servers["r0"].engine.waiting)
            for call in batch:
                call.cancel()
            await asyncio.gather(*batch, return_exceptions=True)
            return took, batch_on_lane

    async def main() -> tuple[tuple[float, int], tuple[float, int]]:
        return await urgent_latency(True), await urgent_latency(False)

    (cleared, left), (kept, stayed) = clock.run(main())
    assert left == 0 and stayed > 0
    assert cleared < kept / 2


def test_a_lane_by_programs_takes_a_program_s_calls_together(clock: VirtualClock) -> None:
    """With `LaneTuning(batch_programs=1)` the lane takes the calls of one batch program while
    urgent work is around, and none of another's; the count of calls no longer applies
    (here 0, which alone would keep every batch call off the lane)."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=10.0) for i in range(2)}
    document = {p: f"{p}: " + " ".join(f"{p}-word{k}" for k in range(200)) for p in ("a", "b")}
    asked = {p: [_ask(f"{document[p]} question {i}") for i in range(5)] for p in ("a", "b")}

    async def main() -> None:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(lanes=1, batch_in_flight=0, batch_programs=1)
        ) as router:
            urgent = Hints(program_id="q", service="urgent")
            async with asyncio.TaskGroup() as tg:
                tg.create_task(router.complete(_ask("urgent"), urgent))
                await asyncio.sleep(0)  # in flight on the lane
                for program, requests in asked.items():
                    for request in requests:
                        tg.create_task(router.complete(request, Hints(program_id=program)))

    clock.run(main())
    lane = "r0"
    on_lane = {
        p for p, requests in asked.items() if any(served_by(llms, r) == lane for r in requests)
    }
    assert len(on_lane) == 1  # one program's calls on the lane, the other's kept off


def _document_calls(program: str, questions: int, words: int = 1200) -> list[LLMRequest]:
    document = f"{program}: " + " ".join(f"{program}-w{k:05d}" for k in range(words))
    return [
        LLMRequest(
            (Message("system", SYSTEM), Message("user", f"{document}\n\nquestion {q}?")),
            "m",
            max_tokens=8,
        )
        for q in range(questions)
    ]


def _rendered(request: LLMRequest) -> str:
    return render(request.messages)


async def _lane_in_use(router: Router, tg: asyncio.TaskGroup) -> None:
    """An urgent call in flight on the lane, and three batch calls of another program on the
    other replica (slower), so that the next batch program's calls go to the lane."""
    tg.create_task(router.complete(_ask("urgent"), Hints("q", service="urgent")))
    await asyncio.sleep(0)
    for i in range(3):  # one prefix of their own: they stay together
        request = LLMRequest((Message("user", "other work " * 50 + str(i)),), "m", max_tokens=8)
        tg.create_task(router.complete(request, Hints(program_id="x")))
        await asyncio.sleep(0)


def test_paced_prefill_sends_a_lane_s_batch_prompt_in_aligned_pieces_once(
    clock: VirtualClock,
) -> None:
    """With `LaneTuning(prefill_tokens=256)` a batch call on the lane while urgent work is around is
    preceded by one-token requests for its prompt's prefix, each 256 tokens (1,024
    characters) longer than the last, until at most 256 uncached tokens are left. The five
    calls of one document share the pieces: each is sent once, in order, before any call."""
    llms = {
        "r0": FunctionLLM(lambda req, hints: "ok", latency=1.0),
        "r1": FunctionLLM(lambda req, hints: "ok", latency=100.0),
    }
    calls = _document_calls("a", 5)

    async def main() -> tuple[int, int]:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(lanes=1, batch_programs=1, prefill_tokens=256)
        ) as router:
            async with asyncio.TaskGroup() as tg:
                await _lane_in_use(router, tg)
                for request in calls:
                    tg.create_task(router.complete(request, Hints(program_id="a")))
            return router.pieces.sent, router.pieces.shared

    sent, shared = clock.run(main())
    lane = llms["r0"].calls
    pieces = [c for c in lane if c.request.max_tokens == 1]
    full = _rendered(calls[0])
    ends = [len(_rendered(c.request)) - len("\n<|assistant|>\n") for c in pieces]
    assert ends == [1024 * k for k in range(1, len(pieces) + 1)]  # aligned, one after another
    prefixes = [_rendered(c.request)[:end] for c, end in zip(pieces, ends, strict=True)]
    assert all(full.startswith(prefix) for prefix in prefixes)
    assert len(full) - ends[-1] <= 1024 + 64  # at most a piece (and a part block) left
    assert sent == len(pieces) and shared > 0  # the other four calls waited for them
    times = [c.at for c in pieces]
    assert times == sorted(times) and len(set(times)) == len(times)  # one piece at a time
    on_lane = [c.at for c in lane if c.request in calls]
    assert len(on_lane) >= 4 and min(on_lane) > times[-1]  # the calls go once it is in


@pytest.mark.parametrize("ending", ["", " café?"])
def test_paced_prefill_leaves_the_prompt_cached_on_the_simulated_server(
    clock: VirtualClock, ending: str
) -> None:
    """On the simulated server the pieces really land in its prefix cache: the call finds all
    but its last piece cached (and its step computes no more than that), also when text
    after the pieces is not ASCII."""
    [call] = _document_calls("a", 1, words=3000)
    last = call.messages[-1]
    calls = [LLMRequest((*call.messages[:-1], Message("user", last.content + ending)), "m")]

    async def main() -> tuple[int, int, int]:
        other = FunctionLLM(lambda req, hints: "ok", latency=100.0)
        async with SimServer("h100-llama3-8b", clock=clock) as lane:
            router = Router(
                {"lane": lane, "other": other},
                clock=clock,
                lanes=LaneTuning(lanes=1, batch_programs=1, prefill_tokens=512),
            )
            async with router:
                async with asyncio.TaskGroup() as tg:
                    await _lane_in_use(router, tg)
                    answer = tg.create_task(router.complete(calls[0], Hints(program_id="a")))
                usage = answer.result().usage
                assert usage.cached_prompt_tokens is not None
                return usage.prompt_tokens, usage.cached_prompt_tokens, router.pieces.sent

    prompt, cached, sent = clock.run(main())
    assert sent >= 10  # a ~9,000-token prompt in pieces of 512
    assert prompt - cached <= 512 + 16


def test_paced_prefill_only_on_lanes_while_urgent_work_is_around(clock: VirtualClock) -> None:
    """No pieces without urgent work around, none for urgent calls, none off the lane; a piece
    that fails ends the pacing and the call itself still goes."""
    [call_b] = _document_calls("b", 1)
    quiet_call = LLMRequest((Message("user", "quiet " * 2000),), "m", max_tokens=8)

    def flaky(request: LLMRequest, hints: Hints) -> str:
        if request.max_tokens == 1:
            raise BackendOverloadedError("piece refused", status=429)
        return "ok"

    slow = FunctionLLM(lambda req, hints: "ok", latency=100.0)
    llms = {"r0": FunctionLLM(flaky, latency=1.0), "r1": slow}

    async def main() -> tuple[int, str]:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(lanes=1, batch_programs=1, prefill_tokens=256)
        ) as router:
            await router.complete(quiet_call, Hints(program_id="a"))  # nothing urgent yet
            quiet = router.pieces.sent
            urgent = Hints(program_id="q", service="urgent")
            await router.complete(_document_calls("u", 1)[0], urgent)  # urgent: not paced
            async with asyncio.TaskGroup() as tg:
                await _lane_in_use(router, tg)
                answer = tg.create_task(router.complete(call_b, Hints(program_id="b")))
            return quiet, answer.result().text

    quiet, text = clock.run(main())
    assert quiet == 0
    pieces = [c for llm in llms.values() for c in llm.calls if c.request.max_tokens == 1]
    assert len(pieces) == 1 and pieces[0] in llms["r0"].calls  # the one refused, on the lane
    assert text == "ok"  # the call went although its piece was refused
    assert served_by(llms, call_b) == "r0"  # as it is, to the lane, which stays in service


def test_a_piece_that_does_not_land_is_sent_by_the_call_waiting_for_it(
    clock: VirtualClock,
) -> None:
    """Two calls share a document; the first is cancelled while its second piece is in
    flight. The second call, which waited for that piece, sends it and the rest itself:
    no request to the lane carries more than a piece of uncached prompt."""
    llms = {
        "r0": FunctionLLM(lambda req, hints: "ok", latency=1.0),
        "r1": FunctionLLM(lambda req, hints: "ok", latency=100.0),
    }
    first, second = _document_calls("a", 2)

    async def main() -> None:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(lanes=1, batch_programs=1, prefill_tokens=256)
        ) as router:
            async with asyncio.TaskGroup() as tg:
                await _lane_in_use(router, tg)
                doomed = tg.create_task(router.complete(first, Hints(program_id="a")))
                await asyncio.sleep(0)
                answer = tg.create_task(router.complete(second, Hints(program_id="a")))
                await clock.sleep(1.5)  # the first call's second piece is in flight
                doomed.cancel()
            assert answer.result().text == "ok"

    clock.run(main())
    lane = [c.request for c in llms["r0"].calls if c.hints.program_id == "a"]
    ends = [len(_rendered(r)) for r in lane]
    grown = [b - a for a, b in itertools.pairwise([0, *ends])]
    assert lane[-1] is second and len(lane) > 3
    assert max(grown) <= 1024 + 64 + 20  # a piece (or the call's tail) at a time


def test_with_a_tokenizer_pieces_are_cut_by_its_tokens(clock: VirtualClock) -> None:
    """Text denser in tokens than the prompt's average (digits, one token each) still gets
    pieces of about `LaneTuning.prefill_tokens` tokens, not twice that."""

    def tokenize(text: str) -> list[int]:
        out: list[int] = []
        for word in text.split(" "):
            pieces = word if word.isdigit() else [word[i : i + 4] for i in range(0, len(word), 4)]
            out.extend(zlib.crc32(p.encode()) for p in [*pieces, " "])
        return out

    prose = " ".join(f"w{k:03d}" for k in range(1500))
    digits = " ".join("1234567890" for _ in range(300))
    request = LLMRequest((Message("user", f"{prose} {digits} ?"),), "m", max_tokens=8)
    llms = {
        "r0": FunctionLLM(lambda req, hints: "ok", latency=1.0),
        "r1": FunctionLLM(lambda req, hints: "ok", latency=100.0),
    }

    async def main() -> None:
        async with (
            Router(
                llms,
                clock=clock,
                lanes=LaneTuning(lanes=1, batch_programs=1, prefill_tokens=256),
                tokenize=tokenize,
            ) as router,
            asyncio.TaskGroup() as tg,
        ):
            await _lane_in_use(router, tg)
            tg.create_task(router.complete(request, Hints(program_id="a")))

    clock.run(main())
    pieces = [c.request for c in llms["r0"].calls if c.request.max_tokens == 1]
    sizes = [len(tokenize(render(p.messages))) for p in pieces]
    grown = [b - a for a, b in itertools.pairwise([0, *sizes])]
    assert len(pieces) > 5 and max(grown) <= 256 * 1.3


def test_lanes_need_a_replica_left_for_batch_and_no_negative_settings() -> None:
    llms = {"a": FunctionLLM(lambda req, hints: "ok"), "b": FunctionLLM(lambda req, hints: "ok")}
    with pytest.raises(UsageError, match="lanes=-1"):
        Router(llms, lanes=LaneTuning(lanes=-1))
    with pytest.raises(UsageError, match="batch_programs=-1"):
        Router(llms, lanes=LaneTuning(lanes=1, batch_programs=-1))
    with pytest.raises(UsageError, match="prefill_tokens=8"):
        Router(llms, lanes=LaneTuning(lanes=1, prefill_tokens=8))  # less than a block
    with pytest.raises(UsageError, match="lanes='many'"):
        Router(llms, lanes=LaneTuning(lanes="many"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="urgent_calls=0"):
        Router(llms, lanes=LaneTuning(urgent_calls=0))
    assert Router(llms).isolates_urgent()  # "auto" by default
    assert not Router(llms, lanes=LaneTuning(lanes=0)).isolates_urgent()
    assert not Router({"a": llms["a"]}).isolates_urgent()  # one replica: never a lane


@pytest.mark.parametrize("share", [4, 0])
def test_a_lane_shares_with_urgent_work_that_has_slack_to_spare_and_not_with_the_rest(
    clock: VirtualClock, share: int
) -> None:
    """While the urgent calls' programs have slack to spare (`Hints.service` "shareable"),
    a lane takes up to `LaneTuning.share_calls` batch calls beside them. A "tight" urgent call
    clears the lane down to `LaneTuning.batch_in_flight` (0) of the calls it had before it was
    shared, keeps those it took beside the roomy call (their programs had room for them),
    and takes no more while that call is in flight; the moved calls finish elsewhere, each
    once."""
    llms = _named(2)
    roomy = Hints("q", service="shareable", slack_s=15.0)  # 5 s of path left
    tight = Hints("t", service="tight", slack_s=5.0)  # 15 s of path left

    def batch(tag: str, n: int) -> list[asyncio.Future[LLMResponse]]:
        return [
            asyncio.ensure_future(router.complete(_ask(f"batch {tag} {i}"), Hints(f"{tag}{i}")))
            for i in range(n)
        ]

    async def main() -> tuple[list[int], int, list[str], int]:
        nonlocal router
        async with Router(llms, clock=clock, lanes=LaneTuning(share_calls=share)) as router:
            sent = batch("a", 2)  # one on each replica
            await clock.sleep(1.0)
            asked = asyncio.ensure_future(router.complete(_ask("urgent roomy"), roomy))
            await clock.sleep(0.1)
            sent += batch("b", 10)
            await clock.sleep(0.1)
            beside_roomy = router.stats()[0].in_flight - 1  # less the urgent call
            await asked
            strict = asyncio.ensure_future(router.complete(_ask("urgent tight"), tight))
            await clock.sleep(0.1)
            beside_tight = router.stats()[0].in_flight - 1
            sent += batch("c", 5)
            await clock.sleep(0.1)
            still = router.stats()[0].in_flight - 1
            assert (await strict).text == "r0"
            answers = [r.text for r in await asyncio.gather(*sent)]
            calls = sum(len(llm.calls) for llm in llms.values())
            return [beside_roomy, beside_tight, still], router.stats()[0].moved, answers, calls

    router: Router
    beside, moved, answers, calls = clock.run(main())
    kept = share - 1 if share else 0  # taken beside the roomy call (the first was there)
    assert beside == [share, kept, kept]
    # Moved off: the batch call the lane had before it was a lane (for the tight call with
    # sharing; for the roomy one without).
    assert moved == 1
    # Each batch call once: the kept ones on the lane, the rest on the other replica.
    assert answers[:2] == ["r1", "r1"] and answers[12:] == ["r1"] * 5  # a moved; c off it
    assert sorted(answers) == ["r0"] * kept + ["r1"] * (17 - kept)
    assert calls == 17 + moved + 2


def test_a_tight_program_keeps_the_lane_unshared_until_it_has_room_or_ends(
    clock: VirtualClock,
) -> None:
    """A tight urgent call keeps the lane from sharing while it runs, and its program keeps
    it so between its calls, however long (past `LaneTuning.quiet_s`): batch calls sent beside a
    roomy urgent call 6 s after the tight call ended keep off the lane. Once the tight
    program's next call has room (or it ends), the lane takes `LaneTuning.share_calls` again."""
    llms = _named(2)
    roomy = Hints("q", service="shareable", slack_s=15.0)
    tight = Hints("t", service="tight", slack_s=5.0)

    sent: list[asyncio.Future[LLMResponse]] = []

    async def main() -> list[int]:
        async with Router(
            llms, clock=clock, lanes=LaneTuning(share_calls=4, quiet_s=5.0)
        ) as router:

            async def beside_roomy(tag: str) -> int:
                asked = asyncio.ensure_future(router.complete(_ask(f"urgent {tag}"), roomy))
                await clock.sleep(0.1)
                sent.extend(
                    asyncio.ensure_future(
                        router.complete(_ask(f"batch {tag} {i}"), Hints(f"{tag}{i}"))
                    )
                    for i in range(10)
                )
                await clock.sleep(0.1)
                on_lane = router.stats()[0].in_flight - 1  # less the urgent call
                await asked
                return on_lane

            sent.extend(_send_batch(router, 2))
            await clock.sleep(1.0)
            await router.complete(_ask("urgent tight"), tight)  # ends 1 s after it was routed
            await clock.sleep(6.0)
            between = await beside_roomy("between")
            await asyncio.gather(*sent)
            roomy_now = Hints("t", service="shareable", slack_s=15.0)
            await router.complete(_ask("urgent t again"), roomy_now)  # its next call has room
            after = await beside_roomy("after")
            await asyncio.gather(*sent)
            await router.complete(_ask("urgent t tight"), tight)
            await router.program_done("t")  # or it ends
            done = await beside_roomy("done")
            await asyncio.gather(*sent)  # every batch call answered
            return [between, after, done]

    assert clock.run(main()) == [0, 4, 4]


def test_prefixes_are_known_per_cache_salt(clock: VirtualClock) -> None:
    """A server keeps each salt's prefixes apart, so the router's model does too: a prompt
    routed under one tenant's salt is no known prefix for another salt, or for none."""
    llms = {f"r{i}": FunctionLLM(lambda req, hints: "ok", latency=1.0) for i in range(2)}
    request = conversation("shared", 1)[0]

    async def main() -> tuple[list[int], list[int], list[int]]:
        async with Router(llms) as router:
            await router.complete(request, Hints(program_id="a", cache_salt="salt-a"))
            held = [
                [router.policy.held_prefix(prompt_hashes(request, 16, None, s), i) for i in (0, 1)]
                for s in ("salt-a", "salt-b", None)
            ]
        return held[0], held[1], held[2]

    mine, other, unsalted = clock.run(main())
    assert max(mine) == len(prompt_hashes(request, 16))  # where it went, all of it
    assert other == [0, 0] and unsalted == [0, 0]


def test_auto_lanes_are_sized_by_the_replicas_learned_knee(clock: VirtualClock) -> None:
    """Until a knee is learned a lane serves as many urgent calls as a replica runs at once
    (as the servers say it); each call the router sends teaches its replica's knee, and the
    lanes' size becomes the median of those learned. A count given in `LaneTuning` stays."""

    def wave(level: int) -> list[LLMRequest]:
        return [
            LLMRequest((Message("user", f"w{level}-{i} " + "words " * 200),), "m", max_tokens=64)
            for i in range(level)
        ]

    async def main(tuning: LaneTuning) -> tuple[int, int, list[int | None]]:
        servers = {f"r{i}": SimServer("h100-llama3-8b", clock=clock, seed=i) for i in range(2)}
        async with Router(servers, clock=clock, health_interval_s=None, lanes=tuning) as router:
            before = router.lane_policy.urgent_calls
            for level in (2, 8, 32, 128, 512):  # waves at growing load, up to full replicas
                requests = wave(level)
                await asyncio.gather(
                    *(router.complete(r, Hints(program_id=f"b{i}")) for i, r in enumerate(requests))
                )
            return (
                before,
                router.lane_policy.urgent_calls,
                [k.measured_knee() for k in router.knees],
            )

    before, after, knees = clock.run(main(LaneTuning()))
    assert before == SimServer("h100-llama3-8b").profile.max_num_seqs
    learned = [k for k in knees if k is not None]
    assert len(learned) == 2
    assert after == round(statistics.median(learned)) and after < before
    fixed = clock.run(main(LaneTuning(urgent_calls=7)))
    assert fixed[:2] == (7, 7)
