"""KV keep-alive: how long to ask a server to keep a program's cache after a call.

An agent's call that ends in a tool call is followed by a pause (the tool runs) and then the
program's next call, whose prompt is this call's prompt plus the reply and the tool's
result. If the server evicts the program's KV cache during the pause, the next call
recomputes all of it. So the call carries a time-to-live: the pause its next step is
expected to take, learned per tool from the pauses observed so far (Continuum, arXiv
2511.02230, sets the TTL from the tool's duration distribution the same way). A quantile,
not the mean: a TTL a little too long holds memory a little longer, one too short loses the
whole cache. Capped, because a pinned cache is memory other programs cannot use.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..model._errors import UsageError


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Settings of the keep-alive hint (pass to `Engine(keep_alive=...)`; None turns it off).

    `quantile` of the observed pauses of a tool is its predicted pause; `cap_s` bounds it;
    `initial_s` is the prediction for a tool not seen yet (None: no hint until observed);
    `window` is how many recent pauses per tool are kept.
    """

    quantile: float = 0.8
    cap_s: float = 10.0
    initial_s: float | None = 1.0
    window: int = 128

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise UsageError(f"KeepAlive(quantile={self.quantile}) must be in (0, 1]")
        if self.cap_s <= 0 or (self.initial_s is not None and self.initial_s < 0):
            raise UsageError("KeepAlive cap_s must be positive and initial_s not negative")
        if self.window < 1:
            raise UsageError(f"KeepAlive(window={self.window}) must be at least 1")


class PausePredictor:
    """Observed pauses per tool (by task label) in, a keep-alive time out. Pure: no clock."""

    def __init__(self, settings: KeepAlive) -> None:
        self.settings = settings
        self._recent: dict[str, deque[float]] = {}
        self._sorted: dict[str, list[float]] = {}

    def observe(self, tool: str, seconds: float) -> None:
        recent = self._recent.setdefault(tool, deque())
        ordered = self._sorted.setdefault(tool, [])
        if len(recent) == self.settings.window:
            del ordered[bisect.bisect_left(ordered, recent.popleft())]
        recent.append(seconds)
        bisect.insort(ordered, seconds)

    def predict_one(self, tool: str) -> float | None:
        ordered = self._sorted.get(tool)
        if not ordered:
            guess = self.settings.initial_s
        else:
            # nearest rank; the epsilon keeps 0.07 * 100 from rounding up to 8
            k = max(0, math.ceil(self.settings.quantile * len(ordered) - 1e-9) - 1)
            guess = ordered[k]
        return None if guess is None else min(guess, self.settings.cap_s)

    def predict(self, tools: Iterable[str]) -> float | None:
        """The keep-alive for a call followed by `tools`: the longest of their predictions."""
        guesses = [g for g in map(self.predict_one, tools) if g is not None]
        return max(guesses) if guesses else None


DEFAULT_KEEP_ALIVE = KeepAlive()


class _Holding:
    __slots__ = ("calls", "kept", "reserved", "running", "until")

    def __init__(self) -> None:
        self.calls = 0  # calls of the program running now
        self.running = 0  # their contexts, in tokens
        self.kept = 0  # the context left after its latest call, kept until `until`
        self.until = -math.inf
        self.reserved = 0  # admitted, no call started yet: a guess of its size

    def tokens(self, now: float) -> int:
        kept = self.kept if self.calls or self.until > now else 0
        return self.running + kept + self.reserved


class CacheBudget:
    """The KV cache one backend's programs hold, for client-side hold-back (`Limits.kv_tokens`).

    A program holds the contexts of its running calls and, after its latest call, that
    call's context until its keep-alive runs out (its expected pause). A program that holds
    nothing (a new one, or one back after its keep-alive ran out) waits while the others
    fill the budget; the budget frees as calls end and keep-alives run out, so the wait is
    bounded, and the scheduler's order says who goes first then. A program let in is
    counted at once at the typical size of a program's context, so one admission pass cannot
    let in a crowd; the guess is dropped when its first call starts or its task ends without
    one. Pure: the caller says the time.
    """

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._held: dict[str, _Holding] = {}
        self._typical = max(1, tokens // 16)  # until programs have been seen
        self._used: tuple[float, int] | None = None  # (now, used) memo for one pass

    def _changed(self) -> None:
        self._used = None

    def start(self, program: str, context: int) -> None:
        """A call of `program` with a prompt of `context` tokens starts."""
        h = self._held.setdefault(program, _Holding())
        h.calls += 1
        h.running += context
        h.kept = 0  # what it kept is part of this call's context now
        h.reserved = 0
        self._changed()

    def end(self, program: str, context: int, held: int, keep_s: float, now: float) -> None:
        """That call ended; `held` tokens stay cached for `keep_s` (0: they may go)."""
        h = self._held.get(program)
        if h is None:
            return
        h.calls -= 1
        h.running -= context
        h.kept = max(h.kept, held)
        h.until = max(h.until, now + keep_s) if h.calls else now + keep_s
        self._typical = (7 * self._typical + held) // 8
        self._changed()

    def unreserve(self, program: str) -> None:
        """A task of `program` ended without a call: drop the guess made when it was let in."""
        h = self._held.get(program)
        if h is not None and h.reserved:
            h.reserved = 0
            self._changed()

    def drop(self, program: str) -> None:
        if self._held.pop(program, None) is not None:
            self._changed()

    def used(self, now: float) -> int:
        if self._used is not None and self._used[0] == now:
            return self._used[1]
        total = sum(h.tokens(now) for h in self._held.values())
        self._used = (now, total)
        return total

    def holds_back(self, program: str, now: float) -> bool:
        """Whether `program` must wait: it holds nothing (it is new, or back after its
        keep-alive ran out, so its cache is likely gone) and the others fill the budget."""
        h = self._held.get(program)
        if h is not None and h.tokens(now) > 0:
            return False
        used = self.used(now)
        if used >= self.tokens:
            return True
        self._held.setdefault(program, _Holding()).reserved = self._typical
        self._used = (now, used + self._typical)
        return False
