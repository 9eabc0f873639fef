"""Headroom for urgent work: where a backend's throughput knee is, learned from its calls.

Under continuous batching the running batch *is* the queue: a server admits every request
it has room for, so an urgent call never waits in a queue that priority could reorder; it
waits in longer decode steps instead. Every sequence in the batch adds its KV reads to each
step, so a call's time per output token grows with the calls in flight,

    seconds per token  ~  a + b * in_flight

(a: the weights read once a step; b: what one more sequence adds), while throughput,
in_flight / (a + b * in_flight), flattens towards 1/b. Past some level, more calls in flight
buy little throughput and cost every call latency: that level is the *knee*.

`KneeController` learns a and b per backend from what its calls took (fed by the call path:
the level in flight, the call's seconds and output tokens) and answers how many calls may be
in flight before slack-rich work (batch, or a deadline far away) must wait: the knee while
urgent work is around, the backend's whole limit less a small reserve otherwise. It is pure:
no clock, no I/O; `Admission` applies its answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..model._errors import UsageError


@dataclass(frozen=True, slots=True)
class Headroom:
    """How admission keeps LLM backends responsive for urgent work
    (`AdmissionTuning(headroom=...)`; None turns it off: every call is admitted up to
    `Limits.max_in_flight`).

    `throughput_share`: the knee is the fewest calls in flight that still give this share of
    the throughput at the backend's full limit. `reserve`: the share of `max_in_flight`
    (rounded: none for 10 slots or fewer at the default) that slack-rich work leaves free
    even with no urgent work around, so an urgent call that arrives at a saturated backend
    is admitted at once. `probe_share`: until
    two in-flight levels have been seen, slack-rich work is capped at this share of the limit
    while urgent work is around (which also measures a second level). `min_cap`: never hold
    slack-rich work below this many calls. `rich_slack_s` and `rich_slack_ratio`: a program
    with a deadline is slack-rich (held back like batch) while its slack exceeds both
    `rich_slack_s` and `rich_slack_ratio` times its remaining critical path. `memory`: how
    many observations a level's average mostly reflects (older ones fade). `urgent_share`:
    urgent calls beyond the level giving this share of the full throughput wait at plait (in
    slack order) rather than slow every call in the batch; None (the default): urgent calls
    are admitted up to the limit (on the text-to-SQL workload alone a cap at 0.95 lowered
    deadline attainment at every load below overload: 0.675 against 0.867 at 1.6 queries/s,
    docs/decisions/admission-figures.md)."""

    throughput_share: float = 0.85
    urgent_share: float | None = None
    reserve: float = 0.05
    probe_share: float = 0.25
    min_cap: int = 4
    rich_slack_s: float = 30.0
    rich_slack_ratio: float = 4.0
    memory: int = 200

    def __post_init__(self) -> None:
        for name in ("throughput_share", "urgent_share", "probe_share"):
            value = getattr(self, name)
            if value is None and name == "urgent_share":
                continue
            if not 0.0 < value <= 1.0:
                raise UsageError(f"Headroom({name}={value}) must be in (0, 1]")
        if not 0.0 <= self.reserve < 1.0:
            raise UsageError(f"Headroom(reserve={self.reserve}) must be in [0, 1)")
        if self.min_cap < 1 or self.memory < 1:
            raise UsageError(
                f"Headroom(min_cap={self.min_cap}, memory={self.memory}): both must be >= 1"
            )
        if not (self.rich_slack_s >= 0 and self.rich_slack_ratio >= 0):
            raise UsageError(
                f"Headroom(rich_slack_s={self.rich_slack_s}, rich_slack_ratio="
                f"{self.rich_slack_ratio}): both must be >= 0"
            )


DEFAULT_HEADROOM = Headroom()


@dataclass(frozen=True, slots=True)
class KneeStats:
    """What a controller has learned: the fitted per-token latency `a + b * n`, the knee (None
    until two levels were seen) and the cap it answers now for either case."""

    backend: str
    limit: int
    samples: int
    levels: int
    """In-flight levels (buckets) observed."""
    base_s_per_token: float | None
    per_call_s_per_token: float | None
    knee: int | None
    cap_urgent: int
    cap_alone: int
    urgent_cap: int = 0
    """How many urgent calls may be in flight at once."""


_MIN_WEIGHT = 10
"""Observations a level needs before its measured throughput counts on its own."""


def least_squares(
    points: Iterable[tuple[float, float, float]], min_spread: float = 0.0
) -> tuple[float, float, float | None]:
    """(mean x, mean y, slope) of weighted points `(w, x, y)` by least squares; the slope
    is None when the x's spread no more than `min_spread` (their weighted variance)."""
    points = list(points)
    total = sum(w for w, _, _ in points)
    mx = sum(w * x for w, x, _ in points) / total
    my = sum(w * y for w, _, y in points) / total
    sxx = sum(w * (x - mx) ** 2 for w, x, _ in points)
    if sxx <= min_spread * total:
        return mx, my, None
    return mx, my, sum(w * (x - mx) * (y - my) for w, x, y in points) / sxx


def _bucket(level: float) -> int:
    """Levels grouped geometrically (1, 2, 3, 4, 5, 6, 8, 9, 11, 13, 16, ...: ~20% apart)."""
    return int(math.log(max(level, 1.0)) / math.log(1.2))


def reserve_cap(limit: int, headroom: Headroom) -> int:
    """The calls in flight under which slack-rich work is admitted with no urgent work
    around: `limit` less the reserve (`Headroom.reserve` of it, rounded), at least 1."""
    return max(1, limit - round(headroom.reserve * limit))


class KneeController:
    """Learns one backend's throughput knee and answers the in-flight cap for slack-rich work.

    `limit`: the backend's `max_in_flight`. `fixed`: an override (`Limits.batch_in_flight`):
    the cap while urgent work is around, instead of the learned knee."""

    __slots__ = ("_levels", "_samples", "fixed", "headroom", "limit", "name")

    def __init__(
        self, name: str, limit: int, headroom: Headroom = DEFAULT_HEADROOM, fixed: int | None = None
    ) -> None:
        self.name = name
        self.limit = limit
        self.headroom = headroom
        self.fixed = fixed
        # bucket -> [weight, mean level, mean seconds per token]
        self._levels: dict[int, list[float]] = {}
        self._samples = 0

    def observe(self, in_flight: float, seconds: float, tokens: int) -> None:
        """A call ended: it ran `seconds` with about `in_flight` calls in flight on the
        backend (its own included) and wrote `tokens` output tokens."""
        if tokens < 1 or seconds <= 0 or in_flight < 1:
            return
        self._samples += 1
        entry = self._levels.setdefault(_bucket(in_flight), [0.0, 0.0, 0.0])
        weight = min(entry[0] + 1.0, float(self.headroom.memory))
        alpha = 1.0 / weight  # a running mean that becomes an exponential one past `memory`
        entry[0] = weight
        entry[1] += alpha * (in_flight - entry[1])
        entry[2] += alpha * (seconds / tokens - entry[2])

    def fit(self) -> tuple[float, float] | None:
        """(a, b) of seconds per token = a + b * in_flight, by weighted least squares over
        the observed levels; None until two levels were seen."""
        points = list(self._levels.values())
        if len(points) < 2:
            return None
        mx, my, b = least_squares((w, x, y) for w, x, y in points)
        if b is None:
            return None
        a = my - b * mx
        if a <= 0:  # the line crosses zero: the fixed cost is all in the noise
            a = min(y for _, _, y in points) * 0.5
            b = max(0.0, (my - a) / mx)
        return a, b

    def knee(self) -> int | None:
        """The fewest calls in flight that give `throughput_share` of the throughput at the
        full limit; None until it can be fitted."""
        return self.level(self.headroom.throughput_share)

    def measured_knee(self) -> int | None:
        """The knee as measured: three or more in-flight levels each seen often enough, the
        highest of them near the limit (at least `throughput_share` of it, so the best
        throughput measured is about the limit's); None while it could only be extrapolated,
        from a fitted line or from levels well below the limit."""
        share = self.headroom.throughput_share
        top = max((x for w, x, _ in self._levels.values() if w >= _MIN_WEIGHT), default=0.0)
        if top < share * self.limit:
            return None
        return self.level(share, measured_only=True)

    def level(self, share: float, measured_only: bool = False) -> int | None:
        """The fewest calls in flight that give `share` of the throughput at the full limit;
        None until it can be fitted. Where three or more levels were each seen often
        enough, the measured throughputs (level / seconds per token) decide directly: the
        fewest calls giving `share` of the best measured (a prefill-bound server is flat
        long before the line says); else the fitted line, extrapolated to the limit."""
        seen = sorted((x, x / y) for w, x, y in self._levels.values() if w >= _MIN_WEIGHT and y > 0)
        if len(seen) >= 3:
            best = max(t for _, t in seen)
            first = next(x for x, t in seen if t >= share * best)
            return min(self.limit, max(self.headroom.min_cap, math.ceil(first)))
        if measured_only:
            return None
        fitted = self.fit()
        if fitted is None:
            return None
        a, b = fitted
        if b <= 0:
            return self.limit  # latency does not grow with load: no knee to keep below
        s, top = share, float(self.limit)
        # n / (a + b n) >= s * top / (a + b top)  <=>  n >= s top a / (a + b top (1 - s))
        level = s * top * a / (a + b * top * (1.0 - s))
        return min(self.limit, max(self.headroom.min_cap, math.ceil(level)))

    def cap(self, urgent: bool) -> int:
        """How many calls (of any kind) may be in flight for slack-rich work to be admitted:
        with urgent work around, the knee (or the override, or a probe level while the knee
        is unknown); without, the limit less the reserve."""
        alone = reserve_cap(self.limit, self.headroom)
        if not urgent:
            return alone
        if self.fixed is not None:
            level = self.fixed
        else:
            learned = self.knee()
            level = (
                learned
                if learned is not None
                else max(self.headroom.min_cap, math.ceil(self.headroom.probe_share * self.limit))
            )
        return max(1, min(level, alone))

    def urgent_cap(self) -> int:
        """How many urgent calls may be in flight at once: the level giving `urgent_share`
        of the full throughput (the whole limit until learned). Past it urgent work waits
        at plait in slack order, where hopeless runs fall behind feasible ones, instead of
        every call slowing every other in the server's batch."""
        share = self.headroom.urgent_share
        learned = None if share is None else self.level(share)
        return self.limit if learned is None else learned

    def stats(self) -> KneeStats:
        fitted = self.fit()
        return KneeStats(
            backend=self.name,
            limit=self.limit,
            samples=self._samples,
            levels=len(self._levels),
            base_s_per_token=None if fitted is None else fitted[0],
            per_call_s_per_token=None if fitted is None else fitted[1],
            knee=self.knee(),
            cap_urgent=self.cap(True),
            cap_alone=self.cap(False),
            urgent_cap=self.urgent_cap(),
        )


def slack_rich(
    priority_class: str, slack: float | None, remaining: float, headroom: Headroom
) -> bool:
    """Whether a program may wait for headroom: batch work without a deadline, a deadline
    far away (slack above both `rich_slack_s` and `rich_slack_ratio` x the remaining critical
    path), or one that is hopeless (negative slack: it must not crowd out those that can;
    the engine passes a negative slack only for a run out of reach even alone). Interactive
    work without a deadline is never held back."""
    if slack is None:
        return priority_class != "interactive"
    if slack < 0:
        return True
    return slack > max(headroom.rich_slack_s, headroom.rich_slack_ratio * remaining)
