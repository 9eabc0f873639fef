"""Urgent lanes: which replicas of a router urgent calls keep, and what batch work may go there.

Pure policy (no clock, no I/O): the router passes the time and what its peers said, tells it
when each call starts and ends, and applies what it decides (routing masks, calls to move).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator import Hints, UsageError
from orchestrator.ext import URGENT_CLASSES


def is_urgent(hints: Hints) -> bool:
    """The call goes to the lanes: its program is urgent work (`Hints.service` one of
    `URGENT_CLASSES`) or `hopeless`. Admission holds a hopeless program back so that it does
    not crowd out those that can still make it; once it runs, its calls want short steps
    as much as any with a deadline, and it is judged at the least its tasks took on loaded
    replicas, which a lane beats: some make it. Slack-rich calls and calls no engine judged
    (`service` None) are batch work."""
    return hints.service in URGENT_CLASSES or hints.service == "hopeless"


def is_tight(hints: Hints) -> bool:
    """The call's program needs short steps (urgent, tight on its deadline, or past it even
    alone): a lane it is on takes no more batch calls than `Lanes.batch_in_flight`. A
    `shareable` program can afford longer steps."""
    return hints.service in ("urgent", "tight", "hopeless")


@dataclass(frozen=True, slots=True)
class Heard:
    """What the routers of other engines said they have in flight (`RouterLink`): urgent
    calls, and batch calls per replica (empty: no peers)."""

    urgent_in_flight: int = 0
    batch_in_flight: Sequence[int] = ()


NO_PEERS = Heard()


@dataclass(frozen=True, slots=True)
class Routed:
    """Where one call may go: `allowed` per replica; `clear`: the lanes to take batch calls
    off, keeping the first `cap` sent to each (an urgent call is routed to them)."""

    allowed: list[bool]
    clear: frozenset[int] = frozenset()
    cap: int = 0
    taken: frozenset[int] = frozenset()
    """Lanes that take this batch call beside urgent work (sharing): sent there, it stays
    when the lane is cleared."""


DEFAULT_MAX_SEQS = 256
"""The sequences a replica is taken to run at once where it does not say (vLLM's default
`max_num_seqs`)."""


@dataclass(frozen=True, slots=True)
class LaneTuning:
    """How a router keeps urgent lanes, spelled out (`Router(lanes=...)`): for benchmarks and
    experiments. The defaults are what a router does unless told otherwise; nothing here
    is read from a config file.

    `lanes`: "auto" (while urgent and batch calls are both around, one lane for every
    `urgent_calls` urgent calls in flight, at most all replicas but one), a number (that
    many whenever urgent calls are around) or 0 (no lanes). `urgent_calls`: None (the
    default) learns it: the median of the throughput knees measured on the replicas
    (`KneeController.measured_knee`, one per replica, fed by the calls the router sends;
    until one is measured, the sequences a replica runs at once as it says, else 256).
    `batch_in_flight`: the batch calls a lane takes while urgent work is around.
    `batch_programs`: instead of counting calls, the batch programs a lane takes at once
    (their calls go there together; no clearing).
    `pauses`: True (the default) keeps urgent work around after an urgent call ends for
    the pause its program is expected to take before its next call (`Hints.keep_alive_s`,
    learned by the engine from the tools' pauses), at most `quiet_s`: a lane held through a
    short pause is freed as the program moves on; False, or a call without one: for
    `quiet_s` after it was routed. `quiet_s`: also how long batch work counts as around
    after its last call was routed, and how long fewer lanes must do before one is given
    back. `prefill_tokens`: a batch call's uncached prompt on a lane is computed in pieces
    of at most this many tokens first (paced prefill). `share_calls`: the batch calls a lane
    takes while every urgent program around is `shareable`."""

    lanes: int | Literal["auto"] = "auto"
    urgent_calls: int | None = None
    batch_in_flight: int = 0
    batch_programs: int | None = None
    quiet_s: float = 5.0
    pauses: bool = True
    prefill_tokens: int | None = None
    share_calls: int = 32

    def __post_init__(self) -> None:
        lanes = self.lanes
        if lanes != "auto" and (isinstance(lanes, bool) or not isinstance(lanes, int)):
            raise UsageError(f"LaneTuning(lanes={lanes!r}) takes a number of replicas or 'auto'")
        if self.urgent_calls is not None and self.urgent_calls < 1:
            raise UsageError(
                f"LaneTuning(urgent_calls={self.urgent_calls}) must be at least 1, or None "
                "to learn it"
            )
        if (
            (lanes != "auto" and lanes < 0)
            or self.batch_in_flight < 0
            or self.quiet_s < 0
            or (self.batch_programs is not None and self.batch_programs < 0)
            or self.share_calls < 0
            or (self.prefill_tokens is not None and self.prefill_tokens < 1)
        ):
            raise UsageError(f"{self}: none may be negative (prefill_tokens at least 1)")


AUTO_LANES = LaneTuning()
NO_LANES = LaneTuning(lanes=0)


class Lanes:
    """The urgent-lane policy of a router over `n` replicas (`LaneTuning` says the options).

    `by_name`: replica indices in name order ("auto" lanes are the first healthy ones in it,
    so every engine's router in front of the same replicas picks the same ones)."""

    def __init__(self, n: int, by_name: Sequence[int], tuning: LaneTuning) -> None:
        self.n = n
        self.by_name = list(by_name)
        self.urgent_lanes = tuning.lanes
        self.urgent_calls = tuning.urgent_calls or DEFAULT_MAX_SEQS
        """Urgent calls one lane serves: `LaneTuning.urgent_calls`, else what the router
        learned of its replicas (`Router` sets it as it learns the knee)."""
        self.learns_calls = tuning.urgent_calls is None
        self.batch_in_flight = tuning.batch_in_flight
        self.batch_programs = tuning.batch_programs
        self.quiet_s = tuning.quiet_s
        self.pauses = tuning.pauses
        self._next_urgent: dict[str, float] = {}
        """Urgent programs between calls: until when each keeps urgent work around (its
        last call's end plus the pause it carried, at most `quiet_s`)."""
        self.share_calls = tuning.share_calls
        self.auto_lanes = 1
        """With "auto": the lanes the urgent load needs (while batch work is around too)."""
        self._auto_lanes_at = 0.0
        self._batch_seen: float | None = None
        self._urgent_seen: float | None = None
        self.urgent_now = 0
        """This router's urgent calls in flight."""
        self._tight_now = 0
        """Urgent calls in flight whose programs need short steps."""
        self._tight_programs: set[str] = set()
        """Urgent programs whose latest call needed short steps: a lane stays unshared while
        any is around, until its next call can afford longer steps or it ends (`cap`)."""
        self.batch_now = [0] * n
        """Per replica: this router's batch calls in flight."""
        self.programs: list[Counter[str]] = [Counter() for _ in range(n)]
        """Per replica: batch calls in flight by program."""

    # --- what happened -------------------------------------------------------------------

    def started(self, replica: int, urgent: bool, tight: bool, program: str) -> None:
        """A call was sent to `replica`."""
        self.batch_now[replica] += not urgent
        self.urgent_now += urgent
        self._tight_now += tight
        if not urgent:
            self.programs[replica][program] += 1

    def ended(
        self,
        replica: int,
        urgent: bool,
        tight: bool,
        program: str,
        now: float,
        pause: float | None = None,
    ) -> None:
        """A call sent to `replica` ended (answered, failed or moved); `pause`: how long its
        program is expected to pause before its next call (`Hints.keep_alive_s`)."""
        self.batch_now[replica] -= not urgent
        self.urgent_now -= urgent
        self._tight_now -= tight
        if urgent and self.pauses and pause is not None:
            self._next_urgent[program] = now + min(pause, self.quiet_s)
        if not urgent:
            on = self.programs[replica]
            on[program] -= 1
            if on[program] <= 0:
                del on[program]

    def program_done(self, program: str) -> None:
        """`program` ended: it keeps no lane unshared any more."""
        self._tight_programs.discard(program)
        self._next_urgent.pop(program, None)

    # --- deciding ------------------------------------------------------------------------

    def route(
        self,
        allowed: list[bool],
        healthy: Sequence[bool],
        *,
        urgent: bool,
        tight: bool,
        program: str,
        now: float,
        heard: Heard = NO_PEERS,
        pause: float | None = None,
    ) -> Routed:
        """The replicas a call may go to. Urgent calls go only to the lanes; batch calls go
        there only up to `batch_in_flight` at once (`share_calls` while every urgent program
        around can afford longer steps: `cap`; with `batch_programs`: only calls of a
        program already there, or of a new one while fewer programs than that are) while an
        urgent call is around (`urgent_around`), so that urgent calls find short steps (a
        batch's prefill shares every step of its server). Routing an urgent call also asks
        for the lanes to be cleared down to the cap. `pause`: the call's program is expected
        to pause that long after it (`Hints.keep_alive_s`; None: not known)."""
        if self.urgent_lanes == "auto":
            self._size(urgent, now, heard)
        if urgent:
            self._next_urgent.pop(program, None)
            if not (self.pauses and pause is not None):
                self._urgent_seen = now
            if tight:
                self._tight_programs.add(program)
            else:
                self._tight_programs.discard(program)
        else:
            self._batch_seen = now
        lanes = self.lane_set(healthy, now, heard)
        if not lanes:
            return Routed(allowed)
        cap = self.cap(tight, now, heard)
        if urgent:
            clear = frozenset(lanes)
            if self.urgent_lanes == "auto" and self.auto_lanes > len(lanes):
                return Routed(allowed, clear, cap)  # more urgent work than lanes: anywhere
            return Routed([a and i in lanes for i, a in enumerate(allowed)], clear, cap)
        if not self.urgent_around(now, heard):
            return Routed(allowed)
        programs = self.batch_programs
        if programs is not None:
            on = self.programs
            return Routed(
                [
                    a and (i not in lanes or program in on[i] or len(on[i]) < programs)
                    for i, a in enumerate(allowed)
                ]
            )
        batch = self.batch_now
        if heard.batch_in_flight:
            batch = [a + b for a, b in zip(batch, heard.batch_in_flight, strict=True)]
        if cap <= self.batch_in_flight:
            return Routed([a and (i not in lanes or batch[i] < cap) for i, a in enumerate(allowed)])
        # Sharing: a lane takes batch calls up to the cap, and more of a program it holds
        # (its prefix is cached there); a call it takes stays when the lane is cleared.
        on = self.programs
        taken = frozenset(i for i in lanes if batch[i] < cap or program in on[i])
        return Routed(
            [a and (i not in lanes or i in taken) for i, a in enumerate(allowed)], taken=taken
        )

    def lane_set(self, healthy: Sequence[bool], now: float, heard: Heard = NO_PEERS) -> set[int]:
        """The lanes: the first `urgent_lanes` healthy replicas, while another is left for
        batch work (else none). With "auto": as many as the urgent load needs, at most all
        but one, and none unless batch work is around as well."""
        if self.urgent_lanes == 0:
            return set()
        if self.urgent_lanes == "auto":
            up = [i for i in self.by_name if healthy[i]]
            if len(up) < 2 or not self.batch_around(now, heard):
                return set()
            return set(up[: min(self.auto_lanes, len(up) - 1)])
        up = [i for i, h in enumerate(healthy) if h]
        return set(up[: self.urgent_lanes]) if len(up) > self.urgent_lanes else set()

    def cap(self, tight: bool, now: float, heard: Heard = NO_PEERS) -> int:
        """The batch calls a lane takes beside its urgent calls: `share_calls` while every
        urgent program around is `shareable` (no call being routed or in flight needs short
        steps, and no program whose latest call did has ended since), else
        `batch_in_flight`. Peers do not say how their urgent programs are served: while any
        of their urgent calls is in flight, the lane takes no more."""
        if tight or heard.urgent_in_flight > 0 or self._tight_now > 0 or self._tight_programs:
            return self.batch_in_flight
        return max(self.batch_in_flight, self.share_calls)

    def urgent_around(self, now: float, heard: Heard = NO_PEERS) -> bool:
        """An urgent call is in flight (this router's, or a peer's as heard), an urgent
        program is within the pause expected after its last call, or an urgent call without
        an expected pause was routed here in the last `quiet_s`."""
        seen = self._urgent_seen
        recent = seen is not None and now - seen <= self.quiet_s
        if recent or heard.urgent_in_flight > 0 or self.urgent_now > 0:
            return True
        waiting = self._next_urgent
        for program in [p for p, until in waiting.items() if until < now]:
            del waiting[program]
        return bool(waiting)

    def batch_around(self, now: float, heard: Heard = NO_PEERS) -> bool:
        """A batch call is in flight (this router's, or a peer's as heard), or one was
        routed here in the last `quiet_s`."""
        seen = self._batch_seen
        recent = seen is not None and now - seen <= self.quiet_s
        return recent or any(heard.batch_in_flight) or any(self.batch_now)

    def _size(self, urgent: bool, now: float, heard: Heard) -> None:
        """With "auto", as a call is routed: one lane for every `urgent_calls` urgent calls
        in flight (this router's, an urgent call being routed, and its peers' as heard; at
        least one). More are taken at once; fewer only once the count has stayed lower for
        `quiet_s`, so a lull between a program's calls does not hand a lane back to batch
        work. Needing more lanes than all replicas but one, urgent calls go to any replica
        (batch calls still keep off the lanes)."""
        calls = self.urgent_now + urgent + heard.urgent_in_flight
        need = max(1, -(-calls // self.urgent_calls))
        if need >= self.auto_lanes or now - self._auto_lanes_at > self.quiet_s:
            self.auto_lanes, self._auto_lanes_at = need, now


def to_move(sends: Sequence[int | None], cap: int, max_moves: int) -> list[int]:
    """Which of a lane's batch calls to take off it, by position: `sends` lists this
    router's batch calls there in the order sent, each the times it was moved before, or
    None where it is done or being moved already. All but the first `cap` still running go
    (the later have done the least), save those moved `max_moves` times already: they are
    left to finish."""
    if len(sends) <= cap:
        return []
    live = [i for i, moved in enumerate(sends) if moved is not None]
    return [i for i in live[cap:] if (sends[i] or 0) < max_moves]
