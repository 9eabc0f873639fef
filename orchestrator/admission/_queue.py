"""Admission: a bounded number of calls in flight per resource, a bounded wait queue.

Ready tasks wait per resource and per program. When a slot frees, the program that the
policy ranks first gets it; within a program, tasks go in the order they became ready.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..model._errors import OverloadedError, UsageError
from ..model._llm import DEFAULT_FUNCTION_RESOURCE, DEFAULT_TOOL_RESOURCE


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of one resource: calls running at once, and ready tasks allowed to wait.

    `kv_tokens` (LLM backends without a keep-alive control, optional): the hold-back budget
    in tokens of KV cache. Then a program's first call waits while the programs already on
    this backend, running or paused within their keep-alive, fill it: admitting it would
    evict a paused program's cache, which its next call would have to recompute. None: the
    engine derives it from the server's KV cache where the backend can say it and the
    server does not keep paused programs' KV itself (`derived_limits`); `hold_back=False`
    turns hold-back off whatever the server says. `max_in_flight`, for a backend given no
    limits at all, is the server's own sequence limit where it says one.

    `batch_in_flight` (LLM backends, optional): an override of the learned throughput knee
    (docs/admission.md): while urgent work is around, slack-rich work (batch, or a deadline
    far away) is admitted only while fewer than this many calls are in flight. None: learned
    from the backend's measured per-token latency (under `Engine(admission="deadlines")`).
    """

    max_in_flight: int = 32
    max_waiting: int = 100_000
    kv_tokens: int | None = None
    batch_in_flight: int | None = None
    hold_back: bool = True

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_waiting < 1:
            raise UsageError(
                f"Limits(max_in_flight={self.max_in_flight}, max_waiting={self.max_waiting}): "
                "both must be at least 1"
            )
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise UsageError(f"Limits(kv_tokens={self.kv_tokens}) must be at least 1 or None")
        if self.kv_tokens is not None and not self.hold_back:
            raise UsageError(
                f"Limits(kv_tokens={self.kv_tokens}, hold_back=False): a hold-back budget with "
                "hold-back off; give one or the other"
            )
        if self.batch_in_flight is not None and not (
            1 <= self.batch_in_flight <= self.max_in_flight
        ):
            raise UsageError(
                f"Limits(batch_in_flight={self.batch_in_flight}) must be between 1 and "
                f"max_in_flight ({self.max_in_flight}), or None to learn it"
            )


DEFAULT_LIMITS: Mapping[str, Limits] = {
    DEFAULT_FUNCTION_RESOURCE: Limits(max_in_flight=256),
    DEFAULT_TOOL_RESOURCE: Limits(max_in_flight=64),
}


class Ticket:
    """A place in a resource's queue for one call made from inside a running task (an LLM
    call from a function running an agent loop). Admitted like a task, by program."""

    __slots__ = ("future", "ready_seq", "resource", "state")

    def __init__(self, resource: str, seq: int, future: asyncio.Future[None]) -> None:
        self.resource = resource
        self.ready_seq = seq
        self.state = "ready"
        self.future = future


class Queued(Protocol):
    """What waits in a queue: a ready task's run state, or a `Ticket`. An entry whose state
    left "ready", or whose `ready_seq` changed since it was queued, is stale and skipped."""

    @property
    def resource(self) -> str: ...

    @property
    def ready_seq(self) -> int: ...

    @property
    def state(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ResourceStats:
    name: str
    max_in_flight: int
    max_waiting: int
    in_flight: int
    waiting: int
    admitted: int
    rejected: int
    peak_waiting: int
    held_for_headroom: int = 0
    """Admission rounds in which slack-rich work waited for headroom (see `Headroom`)."""


class _Resource:
    __slots__ = (
        "admitted",
        "heap",
        "held_rounds",
        "in_flight",
        "limits",
        "moving",
        "name",
        "parked",
        "peak",
        "queues",
        "rejected",
        "share",
        "shared_urgent",
        "urgent",
        "urgent_in_flight",
        "waiting",
    )

    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.queues: dict[Hashable, deque[tuple[int, Queued]]] = {}
        self.heap: list[tuple[Any, Hashable]] = []
        """With a static key: the programs that have a queue here, best first."""
        self.moving: dict[Hashable, None] = {}
        """With a static key: the programs with a queue here whose key changes (the static
        key says None of them), ranked with `admit`'s key every round instead."""
        self.parked: dict[Hashable, deque[tuple[int, Queued]]] = {}
        """Queues of programs the deadline gate holds, out of the way of every admission
        pass until `reopen` (not in `queues`, nor in `heap`)."""
        self.in_flight = 0
        self.waiting = 0
        self.admitted = 0
        self.rejected = 0
        self.peak = 0
        self.held_rounds = 0
        self.urgent: set[int] = set()
        """Ids of the admitted items counted against an urgent cap, until released."""
        self.urgent_in_flight = 0
        self.share: int | None = None
        """With a limit shared by several engines: the slots this engine holds (None: the
        whole `max_in_flight` is this engine's)."""
        self.shared_urgent: set[int] = set()
        """With a shared limit: ids of the admitted items of urgent programs, until released
        (what the engine reports as urgent demand in flight)."""

    @property
    def limit(self) -> int:
        return self.limits.max_in_flight if self.share is None else self.share


class Admission:
    """Per-resource wait queues and in-flight counters; no I/O, no clock."""

    def __init__(
        self,
        limits: Mapping[str, Limits],
        static_key: Callable[[Any], Any] | None = None,
        held: Callable[[Any, str], bool] | None = None,
        gated: Callable[[Any], bool] | None = None,
        *,
        moving: bool = False,
    ) -> None:
        """`static_key`, if given, ranks programs once and for all (lower first); without
        it, `admit` ranks the waiting programs every round with the key it is given.
        `moving`: the static key says None of programs whose key changes (those with a
        deadline, under `slack`); they are ranked every round with `admit`'s key (the two
        keys must compare alike), and admission then looks past a program that waits, as
        without a static key, so the order is the same as ranking all every round. `held`
        says whether a program must wait for a resource with `kv_tokens` (hold-back); `gated`
        whether a program must wait for every resource (the deadline gate holds it)."""
        self._resources = {name: _Resource(name, lim) for name, lim in limits.items()}
        self._static_key = static_key
        self._moving = moving
        self._held = held
        self._gated = gated
        self._pending = False  # some resource may have both free slots and waiting work
        self.urgent: Callable[[Any], bool] | None = None
        """Set with shared limits: whether a program is urgent (its demand is reported
        apart, `demand`)."""

    def knows(self, resource: str) -> bool:
        return resource in self._resources

    @property
    def names(self) -> list[str]:
        return list(self._resources)

    def push(self, program: Any, task: Queued) -> None:
        """Queue a ready task; `OverloadedError` if its resource's wait queue is full."""
        res = self._resources[task.resource]
        if res.waiting >= res.limits.max_waiting:
            res.rejected += 1
            raise OverloadedError(
                f"the wait queue of resource {res.name!r}", res.limits.max_waiting
            )
        queue = res.queues.get(program)
        if queue is None:
            queue = res.parked.get(program)
        if queue is None:
            queue = res.queues[program] = deque()
            if self._static_key is not None:
                self._rank(res, program)
        queue.append((task.ready_seq, task))
        res.waiting += 1
        if res.waiting > res.peak:
            res.peak = res.waiting
        self._pending = True

    def discard(self, task: Queued) -> None:
        """A queued task left the ready state; its queue entry is skipped when reached."""
        self._resources[task.resource].waiting -= 1

    @property
    def pending(self) -> bool:
        """Whether some resource may have both free slots and waiting work."""
        return self._pending

    def in_flight(self, resource: str) -> int:
        return self._resources[resource].in_flight

    def set_limits(self, resource: str, limits: Limits) -> None:
        """`resource`'s limits from now on (the engine derives some from what its server
        says, once it has asked: `derived_limits`)."""
        self._resources[resource].limits = limits
        self._pending = True

    def set_share(self, resource: str, slots: int) -> None:
        """This engine may have `slots` calls in flight on `resource` (a limit shared with
        other engines; `SharedLimits`)."""
        res = self._resources[resource]
        res.share = min(slots, res.limits.max_in_flight)
        self._pending = True

    def share(self, resource: str) -> int | None:
        return self._resources[resource].share

    def demand(self, resource: str) -> tuple[int, int, int]:
        """(in flight, urgent calls wanted, other calls wanted) on `resource`: waiting or in
        flight, urgent as `urgent` says of their program (all "other" without it)."""
        res = self._resources[resource]
        urgent = self.urgent
        waiting_urgent = 0
        parked = sum(  # held by the gate: not wanted yet (live entries only)
            1
            for queue in res.parked.values()
            for seq, task in queue
            if task.state == "ready" and task.ready_seq == seq
        )
        if urgent is not None:
            for program, queue in res.queues.items():
                if urgent(program):
                    waiting_urgent += len(queue)
        urgent_flying = len(res.shared_urgent)
        return (
            res.in_flight,
            waiting_urgent + urgent_flying,
            max(0, res.waiting - parked - waiting_urgent) + res.in_flight - urgent_flying,
        )

    def release(self, resource: str, item: Queued | None = None) -> None:
        """`item` (what was admitted) is needed where admission was given caps."""
        res = self._resources[resource]
        res.in_flight -= 1
        if res.shared_urgent and item is not None:
            res.shared_urgent.discard(id(item))
        if res.urgent and item is not None and id(item) in res.urgent:
            res.urgent.discard(id(item))
            res.urgent_in_flight -= 1
        self._pending = True

    def reopen(self, program: Hashable) -> None:
        """The deadline gate let `program` in: its parked queues wait to be admitted again."""
        for res in self._resources.values():
            queue = res.parked.pop(program, None)
            if queue is None:
                continue
            res.queues[program] = queue
            if self._static_key is not None:
                self._rank(res, program)
            self._pending = True

    def _rank(self, res: _Resource, program: Hashable) -> None:
        """With a static key: file a program that has just got a queue here."""
        assert self._static_key is not None
        rank = self._static_key(program)
        if rank is None:
            res.moving[program] = None
        else:
            heapq.heappush(res.heap, (rank, program))

    def _park(self, res: _Resource, program: Hashable) -> None:
        res.parked[program] = res.queues.pop(program)

    def look_again(self) -> None:
        """Something outside the counters changed (a held-back program may go now)."""
        self._pending = True

    def admit(
        self,
        key: Callable[[Any], Any],
        caps: Callable[[str], tuple[int, int | None] | None] | None = None,
        rich: Callable[[Any], bool] | None = None,
    ) -> list[tuple[Any, Queued]]:
        """Take as much waiting work as free slots allow, best program first.

        `caps` (optional) gives a resource's caps, or None: (for slack-rich, for urgent).
        There, slack-rich programs (`rich` says which) are admitted only while fewer calls
        than the first cap are in flight, so urgent work keeps the headroom; the others
        while fewer than the second of them are in flight (release them with their item),
        or up to the limit where the second is None (and nothing is counted for them)."""
        if not self._pending:
            return []
        self._pending = False
        admitted: list[tuple[Any, Queued]] = []
        for res in self._resources.values():
            free = res.limit - res.in_flight
            if free <= 0 or res.waiting == 0:
                continue
            held = self._held if res.limits.kv_tokens is not None else None
            cap = caps(res.name) if caps is not None and rich is not None else None
            if self._static_key is not None and (
                not self._moving or (not res.moving and (cap is None or cap[1] is None))
            ):
                # With no moving program waiting here, ranking by the heap is ranking by
                # the key; and a program that waits under its cap holds back every one
                # after it (slack-rich: the same cap; urgent: no cap of its own).
                self._admit_static(res, free, admitted, held, cap, rich)
                continue
            queues = res.queues
            gated = self._gated
            if gated is not None:
                for program in [p for p in queues if gated(p)]:
                    self._park(res, program)
            if self._static_key is not None:
                programs = self._merged(res, key)
            else:
                programs = sorted(queues, key=key) if len(queues) > 1 else list(queues)
            waited = False
            for program in programs:
                if held is not None and held(program, res.name):
                    continue
                if cap is not None and rich is not None:
                    free, wait = self._take_capped(res, program, free, admitted, cap, rich)
                    waited = waited or wait
                else:
                    free = self._take(res, program, free, admitted)
                if free == 0:
                    break
            if waited:
                res.held_rounds += 1
            if self._static_key is not None:
                self._tidy(res)
        return admitted

    def _merged(self, res: _Resource, key: Callable[[Any], Any]) -> list[Any]:
        """With a static key, where some program's key moves (or urgent work has a cap of
        its own): every queued program in rank order, the moving ones ranked by `key`.
        What `_admit_static` would stop at is looked past here, as without a static key."""
        ranked = [entry for entry in res.heap if entry[1] in res.queues]
        ranked += [(key(p), p) for p in res.moving if p in res.queues]
        ranked.sort(key=lambda entry: entry[0])
        return [program for _, program in ranked]

    def _tidy(self, res: _Resource) -> None:
        """After `_merged`: only programs that still have a queue stay filed."""
        queues = res.queues
        if len(res.heap) != sum(1 for _, p in res.heap if p in queues):
            res.heap = [entry for entry in res.heap if entry[1] in queues]
            heapq.heapify(res.heap)
        for program in [p for p in res.moving if p not in queues]:
            del res.moving[program]

    def _admit_static(
        self,
        res: _Resource,
        free: int,
        admitted: list[tuple[Any, Queued]],
        held: Callable[[Any, str], bool] | None,
        cap: tuple[int, int | None] | None,
        rich: Callable[[Any], bool] | None,
    ) -> None:
        heap = res.heap
        skipped = []
        gated = self._gated
        while heap and free > 0:
            program = heap[0][1]
            if gated is not None and program in res.queues and gated(program):
                heapq.heappop(heap)
                self._park(res, program)
                continue
            if held is not None and held(program, res.name):
                skipped.append(heapq.heappop(heap))
                continue
            if cap is not None and rich is not None:
                # A fixed order: what ranks after a held-back program waits with it (under
                # `fcfs` interactive programs rank before batch ones anyway).
                free, wait = self._take_capped(res, program, free, admitted, cap, rich)
                if wait:
                    res.held_rounds += 1
                    break
            else:
                free = self._take(res, program, free, admitted)
            if program not in res.queues:
                heapq.heappop(heap)
        for entry in skipped:
            heapq.heappush(heap, entry)

    def _take_capped(
        self,
        res: _Resource,
        program: Any,
        free: int,
        admitted: list[tuple[Any, Queued]],
        cap: tuple[int, int | None],
        rich: Callable[[Any], bool],
    ) -> tuple[int, bool]:
        """`_take` within the cap of `program`'s kind; also says whether work of it waits."""
        is_rich = rich(program)
        for_rich, for_urgent = cap
        if is_rich:
            room = for_rich - res.in_flight
        elif for_urgent is None:  # urgent work without a cap of its own
            return self._take(res, program, free, admitted), program in res.queues
        else:
            room = for_urgent - res.urgent_in_flight
        if room <= 0:
            return free, True
        given = min(room, free)
        start = len(admitted)
        left = self._take(res, program, given, admitted)
        if not is_rich:
            for _, item in admitted[start:]:
                res.urgent.add(id(item))
            res.urgent_in_flight += len(admitted) - start
        return free - given + left, program in res.queues

    def _take(
        self, res: _Resource, program: Any, free: int, admitted: list[tuple[Any, Queued]]
    ) -> int:
        """Admit up to `free` of `program`'s queued tasks; drop its queue once empty."""
        queue = res.queues[program]
        start = len(admitted)
        while queue and free > 0:
            seq, task = queue.popleft()
            if task.state != "ready" or task.ready_seq != seq:
                continue  # removed, replaced or cancelled while it waited
            res.waiting -= 1
            res.in_flight += 1
            res.admitted += 1
            free -= 1
            admitted.append((program, task))
        if not queue:
            del res.queues[program]
        if res.share is not None and self.urgent is not None and self.urgent(program):
            res.shared_urgent.update(id(item) for _, item in admitted[start:])
        return free

    def forget(self, program: Hashable) -> None:
        """Drop a finished program's (already discarded) queue entries."""
        for res in self._resources.values():
            res.parked.pop(program, None)
            if res.queues.pop(program, None) is not None and self._static_key is not None:
                if res.moving.pop(program, 0) is None:
                    continue
                res.heap = [entry for entry in res.heap if entry[1] is not program]
                heapq.heapify(res.heap)

    def stats(self) -> list[ResourceStats]:
        return [
            ResourceStats(
                r.name,
                r.limits.max_in_flight,
                r.limits.max_waiting,
                r.in_flight,
                r.waiting,
                r.admitted,
                r.rejected,
                r.peak,
                r.held_rounds,
            )
            for r in self._resources.values()
        ]
