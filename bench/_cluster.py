"""Several plait engines over the same simulated replicas, in one process, in virtual time.

Each engine is an `Engine` with its own `Router` over the same `SimServer`s, as engines in
separate processes in front of one pool of GPUs would be; programs are split between the
engines by a hash of their id, as a load balancer in front of the REST service splits
them. With `share_routes`, the routers are joined by a `LocalRouterHub` that delivers each
placement to the others `delay_s` later (a network's propagation), so every router models
every engine's calls; without, each routes on its own calls only (the ablation). With
`spread_calls`, a program's calls leave through a different engine's router turn after
turn, as when its run is taken over by another engine, or when a front end hands each turn
of an agent to any engine: the case where a program's context must be found by a router
that did not place it.

Admission: the engines share one in-flight budget per backend (`LocalSlots`, the broker
`plait serve` gets from the store in a real cluster), or, as the ablation, split it
statically (`engine_limits`). With `kill`, one engine dies partway (its calls are aborted,
its slots stay held until its row runs out) and, a lease later, the others take its
programs over from the steps they had finished, as `Cluster` resumes runs from the log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
import zlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from _harness import Outcome, Report, as_workflow, merge_stats, summarise

from executors import LocalRouterHub, PeerStats, Router, SimServer
from executors._peers import LocalRouterLink
from executors._sim import SimRequest, SimStats
from orchestrator import (
    Cluster,
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    RunHandle,
    VirtualClock,
)
from orchestrator.cluster._slots import LocalSlots
from orchestrator.ext import AdmissionTuning
from workloads import Program

PER_REPLICA_IN_FLIGHT = 256
"""One engine's admission limit per replica, as `_harness.plait_runner` sets it."""


def engine_limits(engines: int, replicas: int, per_replica: int = PER_REPLICA_IN_FLIGHT) -> Limits:
    """A static split (the ablation of the shared budget): each of `engines` engines over
    `replicas` replicas may have an equal share of what one engine alone would be allowed
    (`per_replica` calls in flight per replica) in flight, whatever the others do."""
    return Limits(max_in_flight=max(1, per_replica * replicas // engines))


class InFlight:
    """Calls in flight on all the servers together, and the most there ever were."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0


class CountingServer(SimServer):
    """A `SimServer` that counts the calls in flight on every server of its `InFlight`."""

    def __init__(self, *args: object, in_flight: InFlight, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.in_flight = in_flight

    async def submit(self, req: SimRequest) -> SimRequest:
        count = self.in_flight
        count.now += 1
        count.peak = max(count.peak, count.now)
        try:
            return await super().submit(req)
        finally:
            count.now -= 1


@dataclass(frozen=True, slots=True)
class Kill:
    """Engine `engine` dies `at_s` into the run; `takeover_s` later the others hold its
    programs (`Cluster` claims a dead engine's runs between 1 and 1.25 leases after its
    last renewal: 1.25 x the default lease of 10 s)."""

    engine: int = 0
    at_s: float = 60.0
    takeover_s: float = 12.5


def engine_of(program_id: str, engines: int) -> int:
    """The engine a program is sent to: a stable hash of its id (crc32, not Python's
    salted `hash`), as a load balancer would spread requests."""
    return zlib.crc32(program_id.encode()) % engines


class SpreadCalls:
    """Sends each call of a program through another engine's router, turn after turn."""

    def __init__(self, routers: Sequence[Router]) -> None:
        self.routers = routers

    def isolates_failures(self) -> bool:
        return True  # as a Router: its replicas are ejected one by one, no breaker over all

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        turn = len(request.messages) // 2
        start = zlib.crc32(hints.program_id.encode())
        return await self.routers[(start + turn) % len(self.routers)].complete(request, hints)


class IdealCache:
    """The hit share an unlimited cache would give, computed as requests arrive (the same
    rule as `_harness.ideal_hit_share`, without keeping every request's hashes: for tens
    of thousands of programs those take gigabytes). Stands in for `SimServer.recorded`."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._seen: set[int] = set()
        self.queried = 0
        self.hits = 0

    def append(self, record: tuple[float, int, list[int]]) -> None:
        _, tokens, hashes = record
        usable = hashes[: (tokens - 1) // self.block_size]
        seen = self._seen
        # What was seen is prefix-closed (every request adds all its blocks): bisect.
        lo, hi = 0, len(usable)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if usable[mid - 1] in seen:
                lo = mid
            else:
                hi = mid - 1
        self.queried += tokens
        self.hits += lo * self.block_size
        seen.update(hashes)

    @property
    def share(self) -> float:
        return self.hits / self.queried if self.queried else 0.0


@dataclass(slots=True)
class ClusterRun:
    """One cluster run's figures beyond the `Report`."""

    report: Report
    engines: int
    shared: bool
    peers: list[PeerStats] = field(default_factory=list)
    link_messages: int = 0
    link_bytes: int = 0
    server_requests: list[int] = field(default_factory=list)
    servers: list[SimStats] = field(default_factory=list)
    """Each replica's own figures at the end."""
    busy_imbalance: float = 1.0
    """The busiest replica's busy time (seconds stepping) over the mean."""
    limit: int = 0
    """Calls in flight allowed on all the replicas together (one engine's limit)."""
    peak_in_flight: int = 0
    """The most calls in flight on all the replicas together at any moment."""
    taken_over: int = 0
    """Programs the dead engine was running, finished by the others (with `kill`)."""
    resent: int = 0
    """LLM calls in flight on the dead engine when it died, sent again by the others."""
    wall_s: float = 0.0
    """Wall seconds the run took on this machine."""

    @property
    def unresolved_share(self) -> float:
        received = sum(p.received for p in self.peers)
        return sum(p.unresolved for p in self.peers) / received if received else 0.0


def simulate_cluster(
    programs: Sequence[Program],
    *,
    engines: int,
    replicas: int,
    share_routes: bool = True,
    spread_calls: bool = False,
    delay_s: float = 0.002,
    profile: str = "h100-llama3-8b",
    policy: str = "fcfs",
    block_tokens: int | None = None,
    ceiling: bool = False,
    seed: int = 0,
    mode: str = "",
    shared_budget: bool = True,
    per_replica: int = PER_REPLICA_IN_FLIGHT,
    kill: Kill | None = None,
) -> ClusterRun:
    """Run `programs` on `engines` engines over `replicas` fresh simulated servers.

    `block_tokens`: the routers' prefix block (default: the servers' KV block; a multiple
    of it keeps the routers' model of the caches in step with them at less cost).
    `ceiling`: also compute the unlimited-cache hit share (`Report.ideal_hit_share`).
    `spread_calls`, `kill`: see the module's docstring. `per_replica`: calls in flight
    allowed per replica, over all engines together: one budget the engines share
    (`shared_budget`) or split statically (`engine_limits`)."""
    if kill is not None and (engines < 2 or not 0 <= kill.engine < engines):
        raise ValueError(f"{kill} needs another engine to take over (engines={engines})")
    clock = VirtualClock()
    out: list[ClusterRun] = []
    started = time.perf_counter()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            in_flight = InFlight()
            servers = [
                await stack.enter_async_context(
                    CountingServer(profile, seed=seed, clock=clock, in_flight=in_flight)
                )
                for _ in range(replicas)
            ]
            block = servers[0].profile.block_size
            ideal = IdealCache(block) if ceiling else None
            if ideal is not None:
                for server in servers:  # each request is counted as it arrives, not kept
                    server.record = True
                    server.recorded = ideal  # type: ignore[assignment]
            if block_tokens is not None and block_tokens % block:
                raise ValueError(f"block_tokens={block_tokens} is not a multiple of {block}")
            hub = LocalRouterHub(delay_s) if share_routes and engines > 1 else None
            routers = [
                Router(  # the servers' caches as they say them, in blocks of block_tokens
                    {f"replica{i}": s for i, s in enumerate(servers)},
                    block_tokens=block_tokens,
                    clock=clock,
                    peers=hub.link() if hub is not None else None,
                )
                for _ in range(engines)
            ]
            limit = per_replica * replicas
            broker = LocalSlots(clock) if shared_budget and engines > 1 else None
            each = Limits(limit) if broker else engine_limits(engines, replicas, per_replica)
            limits = {"default": each, "tools": Limits(1_000_000)}
            backends: list[LLMBackend] = (
                [SpreadCalls(routers)] * engines if spread_calls else list(routers)
            )
            running = [
                await stack.enter_async_context(
                    Engine(
                        backends={"default": backend},
                        admission=AdmissionTuning(order=policy),
                        clock=clock,
                        limits=limits,
                        keep_alive=KeepAlive(),
                        # A fixed name per engine: the names break ties in the shares, and
                        # a run must be the same every time.
                        cluster=None
                        if broker is None
                        else Cluster(engine_id=f"engine{i}", share_limits=broker),
                    )
                )
                for i, backend in enumerate(backends)
            ]
            outcomes: list[Outcome] = []
            handles: dict[int, dict[str, RunHandle]] = {i: {} for i in range(engines)}
            dead: set[int] = set()
            taken_over = 0

            def alive_engine(program: Program) -> int:
                alive = [i for i in range(engines) if i not in dead]
                first = engine_of(program.id, engines)
                return first if first not in dead else alive[engine_of(program.id, len(alive))]

            async def one(program: Program) -> None:
                nonlocal taken_over
                await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
                replies: dict[str, str] = {}
                done: set[str] = set()
                at = alive_engine(program)
                handle = running[at].submit(
                    as_workflow(program, replies=replies, done=done), deadline=program.deadline
                )
                handles[at][program.id] = handle
                result = await handle
                del handles[at][program.id]
                if at in dead and not result.ok:  # it died under this program: take over
                    assert kill is not None
                    taken_over += 1
                    await clock.sleep(max(0.0, kill.at_s + kill.takeover_s - clock.monotonic()))
                    workflow = as_workflow(program, replies=replies, done=done)
                    left = (
                        None
                        if program.deadline is None
                        else program.arrival + program.deadline - clock.monotonic()
                    )  # a resumed run keeps its deadline
                    result = await running[alive_engine(program)].run(workflow, deadline=left)
                if not result.ok:
                    raise RuntimeError(f"{program.id} {result.status}: {dict(result.failures)}")
                if len(done) != len(program.steps):
                    raise RuntimeError(f"{program.id}: {len(done)} of {len(program.steps)} steps")
                outcomes.append(
                    Outcome(program.id, program.arrival, clock.monotonic(), program.deadline)
                )

            async def die(k: Kill) -> None:
                await clock.sleep(k.at_s)
                engine = running[k.engine]
                dead.add(k.engine)
                link = routers[k.engine].peering.link if routers[k.engine].peering else None
                if isinstance(link, LocalRouterLink):
                    link.close()  # a dead process tells its peers nothing more
                if engine._shared_task is not None:
                    # Dead, it reports no more: its slots stay held until its row runs out.
                    engine._shared_task.cancel()
                for handle in list(handles[k.engine].values()):
                    handle.cancel("its engine died")

            async with asyncio.TaskGroup() as tg:
                if kill is not None:
                    tg.create_task(die(kill))
                for program in programs:
                    tg.create_task(one(program))
            stats = [s.stats() for s in servers]
            report = summarise(
                mode,
                sorted(outcomes, key=lambda o: o.arrival),
                merge_stats(stats),
                ideal.share if ideal is not None else math.nan,
            )
            computed = [s.prefix_cache_queries - s.prefix_cache_hits for s in stats]
            mean = sum(computed) / len(computed)
            imbalance = max(computed) / mean if mean > 0 else 1.0
            report = dataclasses.replace(report, load_imbalance=imbalance)
            out.append(
                ClusterRun(
                    report,
                    engines,
                    hub is not None,
                    [r.peering.stats() for r in routers if r.peering is not None],
                    hub.messages if hub is not None else 0,
                    hub.bytes if hub is not None else 0,
                    [s.requests for s in stats],
                    stats,
                    max(s.busy_s for s in stats) / (sum(s.busy_s for s in stats) / len(stats)),
                    limit,
                    in_flight.peak,
                    taken_over,
                    # Every call was sent once, and those in flight on the dead engine again.
                    sum(s.requests for s in stats) - sum(p.llm_calls for p in programs),
                )
            )

    clock.run(main())
    return dataclasses.replace(out[0], wall_s=time.perf_counter() - started)
