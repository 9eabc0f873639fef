"""Run a workload two ways on identical simulated hardware and arrivals, and measure it.

- naive: what a user of another framework gets: every call sent as soon as it is ready,
  no hints, the server's queue first-come-first-served, round-robin over replicas.
- plait: the same programs as plait workflows in one Engine, program-first.

Both run in virtual time on fresh `SimServer`s, so the comparison is exact and repeatable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import statistics
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from executors import PrefixGrouper, Profile, Router, SimServer, SimStats
from executors._routing import PrefixRouter
from executors._simengine import SimRequest
from orchestrator import (
    Clock,
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    TaskContext,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import AdmissionTuning, FailureIsolating
from workloads import LLMStep, Program, Step, ToolStep, TraceStep


@dataclass(frozen=True, slots=True)
class Outcome:
    program: str
    arrival: float
    finished: float
    deadline: float | None
    dropped: bool = False
    """Given up before it finished (shed or cancelled at its deadline): a miss, left out of
    the JCT figures."""

    @property
    def jct(self) -> float:
        return self.finished - self.arrival

    @property
    def met_deadline(self) -> bool:
        return not self.dropped and (self.deadline is None or self.jct <= self.deadline)


@dataclass(frozen=True, slots=True)
class Report:
    """One mode's figures on one workload."""

    mode: str
    programs: int
    mean_jct: float
    p95_jct: float
    throughput: float
    """Programs finished per second in the steady middle of the run (the middle half of
    completions), so neither the ramp-up nor the drain at the end dilutes it."""
    deadline_attainment: float
    cache_hit_share: float
    makespan: float
    server: SimStats
    jcts: tuple[float, ...] = ()
    load_imbalance: float = 1.0
    """Busiest replica's computed prompt tokens over the mean (1.0 with one replica)."""
    ideal_hit_share: float = math.nan
    """The share of prompt tokens an unlimited cache would have served (the same requests,
    in the order they arrived): the ceiling for `cache_hit_share`."""

    def row(self) -> dict[str, float | str]:
        return {
            "mode": self.mode,
            "mean_jct_s": round(self.mean_jct, 3),
            "p95_jct_s": round(self.p95_jct, 3),
            "throughput_per_s": round(self.throughput, 4),
            "deadline_attainment": round(self.deadline_attainment, 4),
            "cache_hit_share": round(self.cache_hit_share, 4),
            "ideal_hit_share": round(self.ideal_hit_share, 4),
            "makespan_s": round(self.makespan, 2),
            "preemptions": self.server.preemptions,
        }


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def steady_throughput(finish_times: Sequence[float]) -> float:
    ends = sorted(finish_times)
    lo, hi = len(ends) // 4, (3 * len(ends)) // 4
    if hi <= lo or ends[hi] <= ends[lo]:
        return math.inf
    return (hi - lo) / (ends[hi] - ends[lo])


def ideal_hit_share(records: Sequence[tuple[float, int, list[int]]], block_size: int) -> float:
    """Hits an unlimited block cache would give: every full block seen before is reused
    (never a request's last token, as in vLLM)."""
    seen: set[int] = set()
    queried = hits = 0
    for _, tokens, hashes in sorted(records, key=lambda r: r[0]):
        usable = hashes[: (tokens - 1) // block_size]
        n = 0
        for h in usable:
            if h not in seen:
                break
            n += 1
        queried += tokens
        hits += n * block_size
        seen.update(hashes)  # prompt and output blocks: a later turn may repeat both
    return hits / queried if queried else 0.0


def summarise(
    mode: str, outcomes: list[Outcome], stats: SimStats, ideal: float = math.nan
) -> Report:
    jcts = [o.jct for o in outcomes if not o.dropped] or [math.nan]
    start = min(o.arrival for o in outcomes)
    end = max(o.finished for o in outcomes)
    return Report(
        mode=mode,
        programs=len(outcomes),
        mean_jct=statistics.fmean(jcts),
        p95_jct=percentile(jcts, 0.95),
        throughput=steady_throughput([o.finished for o in outcomes]),
        deadline_attainment=sum(o.met_deadline for o in outcomes) / len(outcomes),
        cache_hit_share=stats.hit_rate,
        makespan=end - start,
        server=stats,
        jcts=tuple(jcts),
        ideal_hit_share=ideal,
    )


def merge_stats(stats: list[SimStats]) -> SimStats:
    return SimStats(
        running=sum(s.running for s in stats),
        waiting=sum(s.waiting for s in stats),
        kv_cache_usage=statistics.fmean(s.kv_cache_usage for s in stats),
        prefix_cache_queries=sum(s.prefix_cache_queries for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats),
        steps=sum(s.steps for s in stats),
        busy_s=sum(s.busy_s for s in stats),
        preemptions=sum(s.preemptions for s in stats),
        requests=sum(s.requests for s in stats),
    )


Runner = Callable[[Sequence[Program], Sequence[SimServer], Clock], Awaitable[list[Outcome]]]


def simulate(
    programs: Sequence[Program],
    runner: Runner,
    *,
    profile: str | Profile = "h100-llama3-8b",
    replicas: int = 1,
    seed: int = 0,
    mode: str = "",
) -> Report:
    """Run `programs` with `runner` on fresh simulated servers in virtual time."""
    clock = VirtualClock()
    busy: list[float] = []

    async def main() -> tuple[list[Outcome], SimStats, float]:
        async with AsyncExitStack() as stack:
            servers = [
                await stack.enter_async_context(
                    SimServer(profile, seed=seed, clock=clock, record=True)
                )
                for _ in range(replicas)
            ]
            outcomes = await runner(programs, servers, clock)
            # Load = prompt tokens each replica had to compute (prefill dominates traces).
            busy.extend(
                s.stats().prefix_cache_queries - s.stats().prefix_cache_hits for s in servers
            )
            records = [r for s in servers for r in s.recorded]
            ideal = ideal_hit_share(records, servers[0].profile.block_size)
            return outcomes, merge_stats([s.stats() for s in servers]), ideal

    outcomes, stats, ideal = clock.run(main())
    report = summarise(mode, outcomes, stats, ideal)
    mean_busy = sum(busy) / len(busy) if busy else 0.0
    imbalance = max(busy) / mean_busy if mean_busy > 0 else 1.0
    return dataclasses.replace(report, load_imbalance=imbalance)


# --- naive ------------------------------------------------------------------------------------


async def run_naive(
    programs: Sequence[Program], servers: Sequence[LLMBackend], clock: Clock
) -> list[Outcome]:
    """Every call goes out as soon as it is ready, with no hints, round-robin over servers.

    Calls are started in the input's order (arrival, then each call's position in the job),
    so a batch laid out question-major is sent question-major, as a naive client would:
    the baseline must not get document affinity by accident.
    """
    turn = itertools.cycle(servers)
    outcomes: list[Outcome] = []
    replies: dict[str, dict[str, str]] = {p.id: {} for p in programs}
    done = {p.id: {s.id: asyncio.Event() for s in p.steps} for p in programs}
    left = {p.id: len(p.steps) for p in programs}

    async def step_of(program: Program, step: Step) -> None:
        await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
        for dep in step.after:
            await done[program.id][dep].wait()
        if isinstance(step, ToolStep):
            await clock.sleep(step.seconds)
        elif isinstance(step, TraceStep):
            server = next(turn)
            assert isinstance(server, SimServer), "traces replay on simulated servers only"
            await server.submit(trace_request(server, step, None))
        else:
            messages = tuple(step.build(replies[program.id]))
            request = LLMRequest(messages, "m", max_tokens=step.max_tokens)
            reply = await next(turn).complete(request, Hints(program_id=""))
            replies[program.id][step.id] = reply.text
        done[program.id][step.id].set()
        left[program.id] -= 1
        if left[program.id] == 0:
            outcomes.append(
                Outcome(program.id, program.arrival, clock.monotonic(), program.deadline)
            )

    calls = sorted(
        (
            (p.arrival, s.order if isinstance(s, LLMStep) else 0, pi, si)
            for pi, p in enumerate(programs)
            for si, s in enumerate(p.steps)
        )
    )
    async with asyncio.TaskGroup() as tg:
        for _, _, pi, si in calls:
            tg.create_task(step_of(programs[pi], programs[pi].steps[si]))
    return sorted(outcomes, key=lambda o: o.arrival)


TRACE_SALT = 0x7472616365  # "trace"


def trace_request(server: SimServer, step: TraceStep, hints: Hints | None) -> SimRequest:
    """A simulator request for a trace line: block ids become the simulator's own blocks."""
    size = server.profile.block_size
    if step.block_tokens % size:
        raise ValueError(
            f"trace blocks of {step.block_tokens} tokens do not split into blocks of {size}"
        )
    per = step.block_tokens // size
    # Trace ids already stand for whole prefixes, so a sub-block's hash needs no chain.
    # Ints only: a str in the tuple would make the hash differ between processes.
    hashes = [hash((TRACE_SALT, block, j)) for block in step.block_ids for j in range(per)]
    return server.make_request(
        prompt_tokens=step.prompt_tokens,
        output_tokens=step.output_tokens,
        hashes=hashes,
        hints=hints,
    )


def routed_runner(max_imbalance: float = 1.5, *, cache_size_known: bool = True) -> Runner:
    """Trace replay with plait's prefix-aware router instead of round-robin.
    `cache_size_known`: the router is told the replicas' KV cache size in blocks (their
    configuration, as an operator would give it; never their cache contents)."""

    async def run(
        programs: Sequence[Program], servers: Sequence[LLMBackend], clock: Clock
    ) -> list[Outcome]:
        sims = [s for s in servers if isinstance(s, SimServer)]
        blocks = sims[0].profile.num_blocks if cache_size_known and sims else None
        return await _replay(programs, sims, clock, max_imbalance, blocks)

    return run


async def _replay(
    programs: Sequence[Program],
    servers: Sequence[SimServer],
    clock: Clock,
    max_imbalance: float,
    blocks_per_replica: int | None = None,
) -> list[Outcome]:
    # A slack of 4 in-flight requests: at a few requests per replica, Poisson jitter alone
    # would otherwise break affinity (see PrefixRouter).
    router = PrefixRouter(
        len(servers),
        max_imbalance=max_imbalance,
        blocks_per_replica=blocks_per_replica,
        load_slack=4.0,
    )
    in_flight = [0] * len(servers)
    healthy = [True] * len(servers)
    outcomes: list[Outcome] = []

    async def one(program: Program) -> None:
        await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
        for step in program.steps:
            assert isinstance(step, TraceStep), "routed replay takes trace programs"
            request = trace_request(servers[0], step, None)
            choice = router.choose(request.hashes, in_flight, healthy)
            router.record(request.hashes, choice.replica)
            in_flight[choice.replica] += 1
            try:
                await servers[choice.replica].submit(request)
            finally:
                in_flight[choice.replica] -= 1
        outcomes.append(Outcome(program.id, program.arrival, clock.monotonic(), program.deadline))

    async with asyncio.TaskGroup() as tg:
        for program in sorted(programs, key=lambda p: p.arrival):
            tg.create_task(one(program))
    return sorted(outcomes, key=lambda o: o.arrival)


# --- plait ------------------------------------------------------------------------------------


def as_workflow(
    program: Program,
    name: str | None = None,
    *,
    replies: dict[str, str] | None = None,
    done: set[str] | None = None,
) -> Workflow:
    """A plait workflow doing what `program` describes; LLM calls carry the program's hints.
    Named `name` (the program's id if None; the engine makes run ids unique).

    `done`: the ids of the steps finished so far (each step adds its own as it finishes),
    and `replies` the LLM steps' replies: a workflow built again from both runs only the
    steps not yet done, with the same prompts, as a run resumed from its log would (the
    simulated cluster's take-over)."""
    wf = Workflow(program.id if name is None else name)
    replies = {} if replies is None else replies
    finished: set[str] = set() if done is None else done
    for step in program.steps:
        if step.id in finished:
            continue
        after = [a for a in step.after if a not in finished]
        if isinstance(step, TraceStep):
            raise NotImplementedError("trace replay through plait arrives with the router")
        if isinstance(step, ToolStep):
            wf.add(step.id, _pause(step, finished), after=after, resource="tools")
        else:
            wf.add(step.id, _call(step, replies, finished), after=after, resource="default")
    return wf


def _pause(step: ToolStep, done: set[str]) -> Callable[[TaskContext], Awaitable[None]]:
    async def pause(ctx: TaskContext) -> None:
        await ctx.clock.sleep(step.seconds)
        _finished(step.id, done)

    return pause


def _call(
    step: LLMStep, replies: dict[str, str], done: set[str]
) -> Callable[[TaskContext], Awaitable[None]]:
    async def call(ctx: TaskContext) -> None:
        request = LLMRequest(tuple(step.build(replies)), "m", max_tokens=step.max_tokens)
        reply = await ctx.complete(request, last_call=step.last)
        replies[step.id] = reply.text
        _finished(step.id, done)

    return call


def _finished(step: str, done: set[str]) -> None:
    if step in done:
        raise RuntimeError(f"step {step!r} finished twice")
    done.add(step)


class RoundRobin:
    """Calls spread over backends in turn: replicas without prefix routing (an ablation)."""

    def __init__(self, backends: Sequence[LLMBackend]) -> None:
        self._turn = itertools.cycle(backends)

    def isolates_failures(self) -> bool:
        return True  # as a Router: one failing replica must not stop the others

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        return await next(self._turn).complete(request, hints)


HOLD_BACK_SHARE = 0.8
"""Share of the servers' KV cache the hold-back budget counts on (running contexts grow)."""


class NoKeepAlive:
    """A backend that never hears the keep-alive hint (a server without one: upstream vLLM)."""

    def __init__(self, backend: LLMBackend) -> None:
        self.backend = backend

    def isolates_failures(self) -> bool:
        # A Router under it ejects failing replicas itself: keep the engine's breaker off.
        inner = self.backend
        return isinstance(inner, FailureIsolating) and inner.isolates_failures()

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        return await self.backend.complete(request, dataclasses.replace(hints, keep_alive_s=None))


def plait_backend(
    servers: Sequence[LLMBackend], *, route: bool, group: bool, block_tokens: int
) -> LLMBackend:
    """The one backend plait's engine sees: replicas behind a prefix router (or round-robin),
    wrapped in prefix grouping. Nothing is entered: the servers are the caller's."""
    backend: LLMBackend
    if len(servers) == 1:
        backend = servers[0]
    elif route:  # the servers' caches as they say them, in blocks of `block_tokens`
        replicas = {f"replica{i}": s for i, s in enumerate(servers)}
        backend = Router(replicas, block_tokens=block_tokens)
    else:
        backend = RoundRobin(servers)
    if group:
        backend = PrefixGrouper(backend, block_tokens=block_tokens)
    return backend


def plait_runner(
    policy: str = "fcfs",
    max_in_flight: int = 256,
    *,
    route: bool = True,
    group: bool = False,
    keep_alive: bool = True,
    hold_back: bool = False,
    kv_tokens: int | None = None,
    block_tokens: int | None = None,
) -> Runner:
    """plait: program-first scheduling, plus (each can be switched for an ablation) prefix
    routing over replicas and learned keep-alive hints; prefix grouping is off by default:
    the simulator, like vLLM, shares a prefix between siblings scheduled in one step.
    `hold_back`: the servers do not hear the keep-alive hint; plait holds new programs back
    instead while paused ones fill the KV cache (`Limits.kv_tokens`: `kv_tokens`, the
    servers' KV cache in tokens all together, or a simulated server's size).
    `block_tokens` is the prefix-hashing block (default: a simulated server's block size)."""

    async def run_plait(
        programs: Sequence[Program], servers: Sequence[LLMBackend], clock: Clock
    ) -> list[Outcome]:
        block = block_tokens or (
            servers[0].profile.block_size if isinstance(servers[0], SimServer) else 16
        )
        backend = plait_backend(servers, route=route, group=group, block_tokens=block)
        budget = None
        if hold_back:
            backend = NoKeepAlive(backend)
            if kv_tokens is None and not all(isinstance(s, SimServer) for s in servers):
                raise ValueError("hold_back on real servers needs kv_tokens= (their KV cache)")
            total = kv_tokens or sum(
                s.profile.num_blocks * s.profile.block_size
                for s in servers
                if isinstance(s, SimServer)
            )
            budget = int(HOLD_BACK_SHARE * total)
        outcomes: list[Outcome] = []
        limits = {
            # Without `hold_back`, none: not even the one the engine would derive from a
            # server that says its cache size (an ablation must not have it by the back door).
            "default": Limits(
                max_in_flight=max_in_flight * len(servers), kv_tokens=budget, hold_back=hold_back
            ),
            "tools": Limits(100_000),
        }
        async with Engine(
            backends={"default": backend},
            admission=AdmissionTuning(order=policy),
            clock=clock,
            limits=limits,
            keep_alive=KeepAlive() if keep_alive or hold_back else None,
        ) as engine:

            async def one(program: Program) -> None:
                await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
                result = await engine.run(as_workflow(program), deadline=program.deadline)
                if not result.ok:
                    raise RuntimeError(f"{program.id} {result.status}: {dict(result.failures)}")
                outcomes.append(
                    Outcome(program.id, program.arrival, clock.monotonic(), program.deadline)
                )

            async with asyncio.TaskGroup() as tg:
                for program in programs:
                    tg.create_task(one(program))
        return sorted(outcomes, key=lambda o: o.arrival)

    return run_plait
