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

Admission across engines is split statically for now (`engine_limits`): see there.
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
from orchestrator import (
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    VirtualClock,
)
from workloads import Program

PER_REPLICA_IN_FLIGHT = 256
"""One engine's admission limit per replica, as `_harness.plait_runner` sets it."""


def engine_limits(engines: int, replicas: int, per_replica: int = PER_REPLICA_IN_FLIGHT) -> Limits:
    """The LLM admission limit of each of `engines` engines over `replicas` replicas.

    PLACEHOLDER for the shared admission budget across engines (issue 13's slot broker):
    until it lands, each engine gets an equal, static share of what one engine alone
    would be allowed (`per_replica` calls in flight per replica). Swap this function for
    the broker's limits when it exists; nothing else here decides admission."""
    return Limits(max_in_flight=max(1, per_replica * replicas // engines))


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
) -> ClusterRun:
    """Run `programs` on `engines` engines over `replicas` fresh simulated servers.

    `block_tokens`: the routers' prefix block (default: the servers' KV block; a multiple
    of it keeps the routers' model of the caches in step with them at less cost).
    `ceiling`: also compute the unlimited-cache hit share (`Report.ideal_hit_share`).
    `spread_calls`: see the module's docstring."""
    clock = VirtualClock()
    out: list[ClusterRun] = []
    started = time.perf_counter()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            servers = [
                await stack.enter_async_context(SimServer(profile, seed=seed, clock=clock))
                for _ in range(replicas)
            ]
            block = servers[0].profile.block_size
            ideal = IdealCache(block) if ceiling else None
            if ideal is not None:
                for server in servers:  # each request is counted as it arrives, not kept
                    server.record = True
                    server.recorded = ideal  # type: ignore[assignment]
            router_block = block_tokens or block
            if router_block % block:
                raise ValueError(f"block_tokens={router_block} is not a multiple of {block}")
            cache_blocks = servers[0].profile.num_blocks * block // router_block
            hub = LocalRouterHub(delay_s) if share_routes and engines > 1 else None
            routers = [
                Router(
                    {f"replica{i}": s for i, s in enumerate(servers)},
                    block_tokens=router_block,
                    cache_blocks=cache_blocks,
                    clock=clock,
                    peers=hub.link() if hub is not None else None,
                )
                for _ in range(engines)
            ]
            limits = {"default": engine_limits(engines, replicas), "tools": Limits(1_000_000)}
            backends: list[LLMBackend] = (
                [SpreadCalls(routers)] * engines if spread_calls else list(routers)
            )
            running = [
                await stack.enter_async_context(
                    Engine(
                        backends={"default": backend},
                        policy=policy,
                        clock=clock,
                        limits=limits,
                        keep_alive=KeepAlive(),
                    )
                )
                for backend in backends
            ]
            outcomes: list[Outcome] = []

            async def one(program: Program) -> None:
                await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
                engine = running[engine_of(program.id, engines)]
                result = await engine.run(as_workflow(program), deadline=program.deadline)
                if not result.ok:
                    raise RuntimeError(f"{program.id} {result.status}: {dict(result.failures)}")
                outcomes.append(
                    Outcome(program.id, program.arrival, clock.monotonic(), program.deadline)
                )

            async with asyncio.TaskGroup() as tg:
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
                )
            )

    clock.run(main())
    return dataclasses.replace(out[0], wall_s=time.perf_counter() - started)
