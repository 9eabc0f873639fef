"""A Router: many backends serving one model, used as one backend.

Each request goes where its prompt's longest known prefix already sits (`PrefixRouter`),
so replicas reuse their KV caches instead of recomputing what another replica holds. A
backend that cannot be reached is ejected at once, its prefixes forgotten, and the request
fails over to another; a backend that says it is busy (429, 503) keeps its place, and only
this request goes elsewhere. Backends that are `HealthChecked` are probed every
`health_interval_s`: a failed probe ejects, a passing one re-admits. Backends without a
check are tried again after `readmit_after_s`. Calls whose hints carry the same
`prefix_key` go to the replica that key was placed on, while it is healthy and not overloaded.
Routers of several engines in front of the same replicas share what they place over a
`RouterLink` (`peers`), so that each one's model covers every engine's calls (`_peers`).

The router declares every optional capability and answers for its replicas, which it sorts
by capability once, when it is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Literal

from orchestrator import BackendError, Clock, Hints, LLMBackend, LLMRequest, LLMResponse, UsageError
from orchestrator.ext import (
    BackendOverloadedError,
    BackendUnavailableError,
    CapacityReporting,
    FailureIsolating,
    HealthChecked,
    KneeController,
    LoadReport,
    LoadReporting,
    Notifier,
    ProgramAware,
    ServerCapacity,
    UrgentIsolating,
    WallClockBackend,
    running_clock,
)

from ._capacity import DEFAULT_BLOCK_TOKENS, combined, size_router
from ._lanes import (
    AUTO_LANES,
    DEFAULT_MAX_SEQS,
    NO_PEERS,
    Heard,
    Lanes,
    LaneTuning,
    is_tight,
    is_urgent,
    to_move,
)
from ._peerlink import NotifierRouterLink
from ._peers import Peering, PeerStats, RouterLink
from ._prefix import Tokenize, prompt_hashes
from ._priming import Pieces, piece_ends, prefix_request, priming_hints
from ._routing import PrefixRouter
from ._simtext import CHARS_PER_TOKEN, render

_RELEARN_EVERY = 16
"""Calls between two readings of the replicas' knees for the lanes' size."""

_log = logging.getLogger("plait.router")


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    name: str
    healthy: bool
    in_flight: int
    requests: int
    failures: int
    """Calls that found it unreachable (each ejected it)."""
    overloaded: int = 0
    """Calls it turned away as busy (each went to another replica)."""
    ejections: int = 0
    """Times it was taken out of the rotation, by a failed call or a failed health check."""
    checks_failed: int = 0
    server_load: int = 0
    """Requests running and waiting on the server by its own metrics at the latest probe
    (all its clients', not only ours); 0 when it reports none."""
    moved: int = 0
    """Batch calls taken off it as it became an urgent lane (each sent to another replica;
    `Router(lane_clear=True)`)."""


class Router(
    ProgramAware,
    HealthChecked,
    LoadReporting,
    CapacityReporting,
    FailureIsolating,
    UrgentIsolating,
    WallClockBackend,
):
    """Routes each call to one of `backends` by prompt prefix and load.

    `block_tokens`: the prefix granularity (prompts are hashed in blocks of that many
    tokens: of `tokenize`'s when given, else of four characters). None (the default): the
    KV block the replicas say they use, read as the router is entered or first asked its
    `capacity()` (made at least 16 tokens), else 16. `health_interval_s`: how often to
    probe the backends that are `HealthChecked` (None: never); a probe that does not finish
    in `health_timeout_s` fails.
    A probe also reads the server's own load (`load()`, from its metrics) where it is
    `LoadReporting`: a replica busy with other clients' requests then counts as busy here too.
    `cache_blocks`: each server's KV cache in such blocks. None (the default): read from
    the replicas with the block (their servers' KV caches, or their configured
    `kv_cache_tokens`; the smallest, for every replica: `size_router`). Known, the router
    models each server's LRU eviction instead of assuming that what it sent somewhere stays
    there. Given, it counts blocks of `block_tokens` (16 where that is not given). Replicas
    are asked within `health_timeout_s`, all at once; one that fails to answer is logged
    and taken to be like the others. Urgent lanes: while calls of urgent work (and of
    hopeless programs: `is_urgent`) and batch calls are both around, the first replicas by
    name serve the urgent calls, one lane for as many urgent calls in flight as a replica's
    learned throughput knee (`knees`), at most all replicas but one, and take no batch call
    meanwhile (a batch call's prompt would lengthen every step of the lane's urgent calls);
    while every urgent program around is `shareable` a lane takes some batch calls beside
    them (docs/admission.md, "Urgent lanes"). `lane_clear`: as an urgent call is routed
    while lanes are kept, a lane's batch calls (this router's) are cancelled there and
    routed again, so urgent calls find short steps at once, not once those calls end; False
    leaves them to finish (each is billed anyway on a hosted API). `lanes`: the lane policy
    spelled out (`LaneTuning`: no lanes, fixed lanes, counts instead of learned figures), for
    benchmarks and experiments.
    `peers`: a link to the routers of other engines in front of the same replicas
    (by the same names): each publishes where it placed every call and applies the others'
    placements, so a program's calls stay on one replica whichever engine sends them, and
    each router's picture of the caches and of recent work covers every engine's calls.
    """

    def __init__(
        self,
        backends: Mapping[str, LLMBackend],
        *,
        block_tokens: int | None = None,
        max_imbalance: float = 1.5,
        readmit_after_s: float = 30.0,
        health_interval_s: float | None = 10.0,
        health_timeout_s: float = 5.0,
        tokenize: Tokenize | None = None,
        cache_blocks: int | None = None,
        clock: Clock | None = None,
        lanes: LaneTuning = AUTO_LANES,
        lane_clear: bool = True,
        peers: RouterLink | None = None,
    ) -> None:
        if not backends:
            raise UsageError("a Router needs at least one backend")
        if health_interval_s is not None and health_interval_s <= 0:
            raise UsageError(
                f"Router(health_interval_s={health_interval_s}) must be positive, "
                "or None for no health checks"
            )
        self.names = list(backends)
        self.backends = list(backends.values())
        if block_tokens is not None and block_tokens < 1:
            raise UsageError(f"Router(block_tokens={block_tokens}) must be positive or None")
        self._sizes_given = (block_tokens, cache_blocks)
        block_tokens = block_tokens or DEFAULT_BLOCK_TOKENS  # until the replicas say theirs
        self.block_tokens = block_tokens
        self.readmit_after_s = readmit_after_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.tokenize = tokenize
        if cache_blocks is not None and cache_blocks < 1:
            raise UsageError(f"Router(cache_blocks={cache_blocks}) must be positive or None")
        self.policy = PrefixRouter(len(self.backends), max_imbalance=max_imbalance)
        self._size_policy(cache_blocks)
        self._said: dict[str, ServerCapacity | None] | None = None
        """What each replica said of its size as the router was entered (None: failed)."""
        self._clock = clock
        n = len(self.backends)
        # What each replica declared, read once.
        self._checks: list[HealthChecked | None] = [
            b if isinstance(b, HealthChecked) else None for b in self.backends
        ]
        self._loads: list[LoadReporting | None] = [
            b if isinstance(b, LoadReporting) else None for b in self.backends
        ]
        self._program_aware = [b for b in self.backends if isinstance(b, ProgramAware)]
        self._wall_clock = [b for b in self.backends if isinstance(b, WallClockBackend)]
        self._server_load = [0] * n
        self._in_flight = [0] * n
        self._healthy = [True] * n
        self._by_name = sorted(range(n), key=lambda i: self.names[i])
        """Replica indices in name order: "auto" lanes are the first healthy ones in it."""
        self._ejected_at = [0.0] * n
        self._requests = [0] * n
        self._failures = [0] * n
        self._overloaded = [0] * n
        self._ejections = [0] * n
        self._checks_failed = [0] * n
        if lanes.prefill_tokens is not None and lanes.prefill_tokens < block_tokens:
            raise UsageError(
                f"LaneTuning(prefill_tokens={lanes.prefill_tokens}) must be at least "
                f"block_tokens ({block_tokens}), or None to send prompts whole"
            )
        self.lane_policy = Lanes(n, self._by_name, lanes)
        """Which replicas are urgent lanes and what batch work may go there (`Lanes`)."""
        self.knees = [KneeController(name, DEFAULT_MAX_SEQS) for name in self.names]
        """Per replica: its throughput knee, learned from the calls sent to it; with
        "auto" lanes and no `LaneTuning.urgent_calls`, a lane serves as many urgent calls."""
        self._observed = 0
        self.lane_prefill_tokens = lanes.prefill_tokens
        self.lane_clear = lane_clear
        self._batch_sends: list[dict[asyncio.Future[LLMResponse], int]] = [{} for _ in range(n)]
        """Per replica, in the order sent: this router's batch calls there (with
        `lane_clear`), each with the times it was moved before, so that a replica becoming a
        lane can be cleared of them."""
        self._moving: set[asyncio.Future[LLMResponse]] = set()
        self._kept: set[asyncio.Future[LLMResponse]] = set()
        """Batch calls a lane took while shared (`Routed.taken`): clearing leaves them."""
        self._moved = [0] * n
        self.pieces = Pieces()
        """Prefill pieces sent ahead of batch calls on lanes (`lane_prefill_tokens`)."""
        self._stack: contextlib.AsyncExitStack | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._health: asyncio.Task[None] | None = None
        self.peers = peers
        self.peering = Peering(peers, self.policy, self.names) if peers is not None else None
        """This router's side of its link to its peers (None without `peers`)."""

    @property
    def urgent_lanes(self) -> int | Literal["auto"]:
        return self.lane_policy.urgent_lanes

    @property
    def lane_batch_programs(self) -> int | None:
        return self.lane_policy.batch_programs

    @property
    def lane_quiet_s(self) -> float:
        return self.lane_policy.quiet_s

    def join_peers(self, notifier: Notifier, channel: str) -> None:
        """Share placements with the routers of other engines through `notifier` (PostgreSQL
        LISTEN/NOTIFY, Redis pub/sub) on `channel`: `plait serve` in a cluster calls this
        for each router before it starts. Only before the router is entered."""
        if self._stack is not None:
            raise UsageError("join_peers() before the router is entered (async with)")
        if self.peers is not None:
            raise UsageError("this router has peers already")
        link = NotifierRouterLink(notifier, channel)
        self.peers = link
        self.peering = Peering(link, self.policy, self.names)

    @property
    def _probing(self) -> bool:
        return self.health_interval_s is not None and any(c is not None for c in self._checks)

    async def __aenter__(self) -> Router:
        self._clock = self._clock or running_clock()
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            for backend in self.backends:
                if isinstance(backend, contextlib.AbstractAsyncContextManager):
                    await stack.enter_async_context(backend)
            if isinstance(self.peers, contextlib.AbstractAsyncContextManager):
                await stack.enter_async_context(self.peers)
            await self._size()
        except BaseException as exc:
            await stack.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._stack = stack
        if self._probing:
            self._tg = asyncio.TaskGroup()
            await self._tg.__aenter__()
            self._health = self._tg.create_task(self._health_loop(), name="plait-router-health")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._tg is not None:
            assert self._health is not None
            self._health.cancel()
            tg, self._tg, self._health = self._tg, None, None
            # The health loop is the group's only task and it is cancelled: exiting waits
            # for it; the caller's own exception stays the caller's (not an ExceptionGroup).
            await tg.__aexit__(None, None, None)
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.__aexit__(exc_type, exc, tb)

    # --- size --------------------------------------------------------------------------------

    async def _size(self) -> None:
        """Read the block and the per-replica cache from the replicas, where not given."""
        self._said = await self._ask_sizes()
        given_block, given_cache = self._sizes_given
        size = size_router(self._said, block_tokens=given_block, cache_blocks_given=given_cache)
        for warning in size.warnings:
            _log.warning("router over %s: %s", ", ".join(self.names), warning)
        self.block_tokens = size.block_tokens
        self._size_policy(size.cache_blocks)
        for knee, said in zip(self.knees, self._said.values(), strict=True):
            if said is not None and said.max_seqs:
                knee.limit = said.max_seqs
        self._learn_lane_calls()
        prefill = self.lane_prefill_tokens
        if prefill is not None and prefill < size.block_tokens:
            raise UsageError(
                f"LaneTuning(prefill_tokens={prefill}) is less than the replicas' KV block "
                f"({size.block_tokens} tokens): give at least that, or None to send prompts whole"
            )

    def _size_policy(self, cache_blocks: int | None) -> None:
        # With the caches' size known the model holds at most that much; beyond about 40
        # H100s the default bound on remembered prefixes would forget what they still hold.
        self.policy.blocks_per_replica = cache_blocks
        self.policy.capacity = max(1_000_000, len(self.backends) * (cache_blocks or 0))

    async def _ask_sizes(self) -> dict[str, ServerCapacity | None]:
        """What each replica says of its size (`CapacityReporting`), all asked at once, each
        within `health_timeout_s`: None for one that does not report it or failed to."""

        async def ask(name: str, reporting: CapacityReporting) -> ServerCapacity | None:
            try:
                async with asyncio.timeout(self.health_timeout_s):
                    return await reporting.capacity()
            except Exception as exc:  # a replica that cannot say is no reason not to start
                _log.warning("router replica %s did not say its size: %r", name, exc)
                return None

        said: dict[str, ServerCapacity | None] = dict.fromkeys(self.names)
        asking = [
            (name, b)
            for name, b in zip(self.names, self.backends, strict=True)
            if isinstance(b, CapacityReporting)
        ]
        answers = await asyncio.gather(*(ask(name, b) for name, b in asking))
        said.update(zip((name for name, _ in asking), answers, strict=True))
        return said

    async def capacity(self) -> ServerCapacity:
        """The replicas together (`CapacityReporting`): their KV caches added up (unknown
        unless every one says its own), the KV block those that say one agree on, their
        sequence limits added up. As they said it when the router was entered; asked now if
        it was not, and the router sized from their answers then (an engine asks as it
        starts, so a router it was given unentered is sized too)."""
        if self._said is None:
            await self._size()
        said = self._said or {}
        total = combined([c or ServerCapacity() for c in said.values()])
        blocks = {c.block_tokens for c in said.values() if c is not None and c.block_tokens}
        return replace(total, block_tokens=blocks.pop() if len(blocks) == 1 else None)

    def _now(self) -> float:
        if self._clock is None:
            self._clock = running_clock()
        return self._clock.monotonic()

    # --- health ------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        assert self._clock is not None and self.health_interval_s is not None
        while True:
            await self._clock.sleep(self.health_interval_s)
            await self.check_health()

    async def check_health(self) -> list[bool | None]:
        """Probe every backend that has a `check()` once, at the same time: eject those that
        fail, re-admit those that pass. Says per backend whether it passed (None: no probe)."""
        probed = [i for i, check in enumerate(self._checks) if check is not None]
        passed = await asyncio.gather(*(self._probe(i) for i in probed))
        out: list[bool | None] = [None] * len(self.backends)
        for i, ok in zip(probed, passed, strict=True):
            out[i] = ok
            if ok:
                self._healthy[i] = True
            else:
                self._checks_failed[i] += 1
                if self._healthy[i]:
                    self._eject(i)
        return out

    async def _probe(self, replica: int) -> bool:
        checked = self._checks[replica]
        assert checked is not None
        try:
            async with asyncio.timeout(self.health_timeout_s):
                await checked.check()
        except Exception:  # whatever stops a probe (a refused connection, a bug) fails it
            return False
        reporting = self._loads[replica]
        if reporting is not None:
            try:
                async with asyncio.timeout(self.health_timeout_s):
                    report = await reporting.load()
            except Exception:  # no metrics is no failure: the server answered its probe
                return True
            self._server_load[replica] = (report.running or 0) + (report.waiting or 0)
        return True

    def _readmit(self) -> None:
        now = self._now()
        probing = self._probing
        for i, healthy in enumerate(self._healthy):
            if healthy or (probing and self._checks[i] is not None):
                continue  # a backend that can be probed comes back when a probe passes
            if now - self._ejected_at[i] >= self.readmit_after_s:
                self._healthy[i] = True  # on probation: one more failure ejects it again

    def _eject(self, replica: int) -> None:
        self._healthy[replica] = False
        self._ejected_at[replica] = self._now()
        self._ejections[replica] += 1
        self.policy.forget_replica(replica)

    # --- calls -------------------------------------------------------------------------------

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        # Salted as the server salts them: another tenant's prefix is no hit to route for.
        hashes = prompt_hashes(request, self.block_tokens, self.tokenize, hints.cache_salt)
        n = len(self.backends)
        tried = [False] * n
        unavailable: BackendUnavailableError | None = None
        busy: list[BackendOverloadedError] = []
        moves = 0
        urgent, tight = is_urgent(hints), is_tight(hints)
        lanes = self.lane_policy
        tries = n
        while tries > 0:
            tries -= 1
            self._readmit()
            allowed = [h and not t for h, t in zip(self._healthy, tried, strict=True)]
            routed = lanes.route(
                allowed,
                self._healthy,
                urgent=urgent,
                tight=tight,
                program=hints.program_id,
                now=self._now(),
                heard=self._heard(),
                pause=hints.keep_alive_s,
            )
            if routed.clear and self._clears_lanes():
                self._clear(routed.clear, routed.cap)
            if any(routed.allowed):  # else every lane is tried or down: the others serve it
                allowed = routed.allowed
            try:
                # Our calls in flight, or the server's own count if it says it is busier
                # (other clients share it; its figure is as old as the latest probe).
                load = [max(m, r) for m, r in zip(self._calls(), self._server_load, strict=True)]
                choice = self.policy.choose(hashes, load, allowed, hints.prefix_key)
            except LookupError:
                break
            i = choice.replica
            tried[i] = True
            pace = not urgent and self._paced(i)
            held = self.policy.held_prefix(hashes, i) if pace else 0
            placement = self.policy.record(hashes, i, hints.prefix_key, pending=True)
            seq = self.peering.placed(placement, urgent) if self.peering is not None else -1
            self._in_flight[i] += 1
            self._requests[i] += 1
            lanes.started(i, urgent, tight, hints.program_id)
            send = self._send(i, request, hints, hashes, held if pace else None)
            try:
                if urgent or not self._clears_lanes():
                    return await send
                sent = asyncio.ensure_future(send)
                self._batch_sends[i][sent] = moves
                if i in routed.taken:
                    self._kept.add(sent)
                current = asyncio.current_task()
                cancelling = current.cancelling() if current is not None else 0
                try:
                    return await sent
                except asyncio.CancelledError:
                    if sent not in self._moving or (
                        current is not None and current.cancelling() > cancelling
                    ):
                        raise  # the caller's cancellation, not a move
                    # Taken off a new lane: route it again, without counting a try.
                    self._moved[i] += 1
                    moves += 1
                    tried[i] = False
                    tries += 1
                finally:
                    if not sent.done():
                        sent.cancel()
                    del self._batch_sends[i][sent]
                    self._moving.discard(sent)
                    self._kept.discard(sent)
            except BackendUnavailableError as exc:
                self._failures[i] += 1
                if self._healthy[i]:
                    self._eject(i)
                unavailable = exc  # fail over to another replica
            except BackendOverloadedError as exc:
                # Busy, not broken: it keeps its place; this call tries another replica.
                self._overloaded[i] += 1
                busy.append(exc)
            finally:
                self.policy.served(placement)
                if self.peering is not None:
                    self.peering.served(seq)
                self._in_flight[i] -= 1
                lanes.ended(i, urgent, tight, hints.program_id, self._now(), hints.keep_alive_s)
                if hints.last_call:
                    lanes.program_done(hints.program_id)
        if busy:
            waits = [e.retry_after for e in busy if e.retry_after is not None]
            raise BackendOverloadedError(
                f"every replica this router could try is busy ({len(busy)} said so); "
                f"last: {busy[-1]}",
                status=busy[-1].status,
                retry_after=min(waits) if waits else None,
            ) from busy[-1]
        raise BackendUnavailableError(
            f"no backend of this router could serve the call ({n} tried or ejected); "
            f"last error: {unavailable}",
        ) from unavailable

    def _learn_lane_calls(self) -> None:
        """With "auto" lanes sized by learning: a lane serves as many urgent calls as the
        median of the knees measured on the replicas (`KneeController.measured_knee`: three
        or more load levels seen often enough; a line fitted to fewer extrapolates too far,
        and a lane sees only low levels); until one is measured, the fewest sequences a
        replica runs at once (the limits they said, else the default)."""
        policy = self.lane_policy
        if not policy.learns_calls:
            return
        learned = [k for knee in self.knees if (k := knee.measured_knee()) is not None]
        policy.urgent_calls = (
            round(statistics.median(learned)) if learned else min(k.limit for k in self.knees)
        )

    async def _send(
        self,
        replica: int,
        request: LLMRequest,
        hints: Hints,
        hashes: Sequence[int],
        held: int | None,
    ) -> LLMResponse:
        """The call to `replica`; `held`: its prompt paced in pieces first (`_prime`). Its
        time and the replica's load meanwhile teach the replica's knee (`knees`)."""
        if held is not None:
            await self._prime(replica, request, hints, hashes, held)
        at_start, began = self._calls()[replica], self._now()
        response = await self.backends[replica].complete(request, hints)
        level = (at_start + self._calls()[replica]) / 2
        self.knees[replica].observe(level, self._now() - began, response.usage.completion_tokens)
        self._observed += 1
        if self._observed % _RELEARN_EVERY == 0:
            self._learn_lane_calls()
        return response

    # --- clearing a new lane ---------------------------------------------------------------

    MAX_MOVES = 2
    """Times one call may be taken off a new lane; after that it is left to finish."""

    def _clears_lanes(self) -> bool:
        return (
            self.lane_clear
            and self.urgent_lanes != 0
            and self.lane_batch_programs is None
            and len(self.backends) > 1
        )

    def _clear(self, lanes: frozenset[int], cap: int) -> None:
        """Take this router's batch calls off `lanes`, all but the first `cap` sent to each
        (`Lanes.cap`; `to_move` picks them): each is cancelled there (the server drops it)
        and routed again, where the lanes allow (`complete`: a move is not one of the
        call's tries; a call is moved at most `MAX_MOVES` times). Else an urgent call on a
        lane just formed shares its steps with a replica's worth of batch prefill until
        those calls end (in part 1 of bench/deadlines.py, about 5 s of 300 ms steps)."""
        for i in lanes:
            sends = self._batch_sends[i]
            calls = list(sends)
            # A call a lane took while it was shared stays: its program had room for it.
            kept = self._moving | self._kept
            moved = [None if s.done() or s in kept else sends[s] for s in calls]
            for k in to_move(moved, cap, self.MAX_MOVES):
                self._moving.add(calls[k])
                calls[k].cancel()

    # --- paced prefill on lanes --------------------------------------------------------------

    def _heard(self) -> Heard:
        """What the peers said they have in flight."""
        if self.peering is None:
            return NO_PEERS
        return Heard(self.peering.urgent_in_flight, self.peering.batch_in_flight)

    def _lane_set(self) -> set[int]:
        return self.lane_policy.lane_set(self._healthy, self._now(), self._heard())

    def _urgent_around(self) -> bool:
        return self.lane_policy.urgent_around(self._now(), self._heard())

    def _paced(self, replica: int) -> bool:
        """Whether a batch call to `replica` has its prompt computed in pieces first: with
        `lane_prefill_tokens`, on a lane while urgent work is around."""
        if self.lane_prefill_tokens is None or replica not in self._lane_set():
            return False
        return self._urgent_around()

    def lanes(self) -> list[str]:
        """The replicas kept as urgent lanes now: while urgent work is around (with "auto",
        batch work too), else none."""
        if not self._urgent_around():
            return []
        return sorted(self.names[i] for i in self._lane_set())

    async def _prime(
        self, replica: int, request: LLMRequest, hints: Hints, hashes: Sequence[int], held: int
    ) -> None:
        """Leave all but the last `lane_prefill_tokens` of `request`'s uncached prompt in
        `replica`'s prefix cache, a piece of at most that many tokens (rounded down to whole
        blocks) at a time (`_priming`): so no step of that server carries more than a piece
        of this call's prefill. A piece that another call is sending is waited for, not sent
        again; if it does not land (that call was cancelled, or its piece failed), this call
        sends it and the rest itself. A piece the server refuses ends the pacing: the call
        itself then computes the rest; an unreachable server fails the call over at once."""
        assert self.lane_prefill_tokens is not None
        piece = self.lane_prefill_tokens // self.block_tokens
        mine = set(piece_ends(held, len(hashes), piece))
        cut = _Cut(request, self.block_tokens, self.tokenize)
        for end in range(piece, len(hashes), piece):
            last = hashes[end - 1]
            landed = False
            while (flying := self.pieces.waiting(replica, last)) is not None:
                self.pieces.shared += 1
                landed = await flying.wait()
                if landed:
                    break
                mine.update(piece_ends(end - piece, len(hashes), piece))
            if landed or end not in mine:
                continue
            primer = prefix_request(request, cut.chars(end))
            if primer is None:
                continue
            sending = self.pieces.start(replica, last)
            ok = False
            try:
                await self.backends[replica].complete(primer, priming_hints(hints))
                ok = True
            except BackendUnavailableError:
                raise
            except BackendError:
                return  # the call goes as it is; its own errors are handled as ever
            finally:
                self.pieces.finish(replica, last, sending, landed=ok)

    # --- peers -------------------------------------------------------------------------------

    def _calls(self) -> list[int]:
        """Calls in flight at each replica: this router's, and its peers' as heard."""
        if self.peering is None:
            return self._in_flight
        return [a + b for a, b in zip(self._in_flight, self.peering.in_flight, strict=True)]

    def peer_stats(self) -> PeerStats | None:
        """What this router sent and heard on its link (None without one)."""
        return self.peering.stats() if self.peering is not None else None

    # --- capabilities: the router answers for its replicas ---------------------------------

    def isolates_urgent(self) -> bool:
        """With urgent lanes the router keeps urgent calls apart itself (`UrgentIsolating`):
        the engine then does not also hold batch work to a knee over every replica."""
        if self.urgent_lanes == "auto":
            return len(self.backends) > 1
        return self.urgent_lanes > 0

    def isolates_failures(self) -> bool:
        """Failing replicas are ejected here, one by one: the engine puts no circuit breaker
        over the whole router (it would stop every replica for one replica's faults)."""
        return True

    def needs_wall_clock(self) -> bool:
        """A router waits on the network if any of its replicas does."""
        return any(b.needs_wall_clock() for b in self._wall_clock)

    async def program_done(self, program_id: str) -> None:
        """Pass the engine's note that a program finished to every replica that wants it."""
        self.lane_policy.program_done(program_id)
        await asyncio.gather(*(b.program_done(program_id) for b in self._program_aware))

    async def check(self) -> None:
        """Probe the replicas that can be probed (ejecting and re-admitting them as the health
        loop does); raise `BackendUnavailableError` only when no replica is left healthy."""
        passed = await self.check_health()
        self._readmit()
        if not any(self._healthy):
            failed = [self.names[i] for i, ok in enumerate(passed) if ok is False]
            raise BackendUnavailableError(
                f"no replica of this router is healthy ({len(self.backends)} ejected; "
                f"failing their probes now: {', '.join(failed) or 'none'})"
            )

    async def load(self) -> LoadReport:
        """The replicas' reports added up: requests running and waiting and prefix-cache
        counters summed, KV cache usage and the servers' own hit rates averaged. A field is
        None where no replica reports it; a replica whose report fails is left out, and if
        every one fails the last error is raised."""
        reporters = [r for r in self._loads if r is not None]
        answers = await asyncio.gather(*(r.load() for r in reporters), return_exceptions=True)
        reports = [a for a in answers if isinstance(a, LoadReport)]
        errors = [a for a in answers if isinstance(a, BaseException)]
        if errors and not reports:
            last = errors[-1]
            if isinstance(last, BackendError):
                raise last
            raise BackendUnavailableError(f"no replica of this router reported its load: {last}")
        return LoadReport(
            running=_sum([r.running for r in reports]),
            waiting=_sum([r.waiting for r in reports]),
            kv_cache_usage=_mean([r.kv_cache_usage for r in reports]),
            prefix_cache_hits=_sum([r.prefix_cache_hits for r in reports]),
            prefix_cache_queries=_sum([r.prefix_cache_queries for r in reports]),
            cache_hit_rate=_mean([r.cache_hit_rate for r in reports]),
        )

    def stats(self) -> list[ReplicaStats]:
        return [
            ReplicaStats(
                self.names[i],
                self._healthy[i],
                self._in_flight[i],
                self._requests[i],
                self._failures[i],
                self._overloaded[i],
                self._ejections[i],
                self._checks_failed[i],
                self._server_load[i],
                self._moved[i],
            )
            for i in range(len(self.backends))
        ]


class _Cut:
    """Where a prompt's first `blocks` router blocks end, in characters of its text: four to
    a token without a tokenizer. With one, found by the secant method on the tokenized
    length of the piece, from the previous cut (text denser in tokens than the prompt's
    average, such as digits, would otherwise make pieces twice as long)."""

    TRIES = 4

    def __init__(self, request: LLMRequest, block_tokens: int, tokenize: Tokenize | None):
        self.request = request
        self.block_tokens = block_tokens
        self.tokenize = tokenize
        self._last = (0, 0)  # (characters, tokens) of the previous cut
        self._scale: float | None = None

    def _tokens(self, chars: int) -> int:
        assert self.tokenize is not None
        primer = prefix_request(self.request, chars)
        return 0 if primer is None else len(self.tokenize(render(primer.messages)))

    def chars(self, blocks: int) -> int:
        target = blocks * self.block_tokens
        if self.tokenize is None:
            return target * CHARS_PER_TOKEN
        if self._scale is None:  # the first piece: tokenize the prompt once
            text = render(self.request.messages)
            self._scale = len(text) / max(1, len(self.tokenize(text)))
        x0, t0 = self._last
        x1 = x0 + max(1, round((target - t0) * self._scale))
        t1 = self._tokens(x1)
        for _ in range(self.TRIES):
            if abs(t1 - target) <= self.block_tokens // 2 or t1 == t0:
                break
            x2 = x1 + round((target - t1) * (x1 - x0) / (t1 - t0))
            x0, t0, x1 = x1, t1, max(1, x2)
            t1 = self._tokens(x1)
        self._last = (x1, t1)
        return x1


def _sum(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
