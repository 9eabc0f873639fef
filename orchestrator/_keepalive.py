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

from ._errors import UsageError


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
            k = max(0, math.ceil(self.settings.quantile * len(ordered)) - 1)  # nearest rank
            guess = ordered[k]
        return None if guess is None else min(guess, self.settings.cap_s)

    def predict(self, tools: Iterable[str]) -> float | None:
        """The keep-alive for a call followed by `tools`: the longest of their predictions."""
        guesses = [g for g in map(self.predict_one, tools) if g is not None]
        return max(guesses) if guesses else None


DEFAULT_KEEP_ALIVE = KeepAlive()


class CacheBudget:
    """The KV cache one backend's programs hold, for client-side hold-back (`Limits.kv_tokens`).

    A program holds its context's tokens while its call runs and, after it, until its
    keep-alive runs out (its expected pause). A program that holds nothing yet (its first
    call) is held back while the others fill the budget. Pure: the caller says the time.
    """

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._held: dict[str, tuple[int, float]] = {}

    def note(self, program: str, tokens: int, until: float) -> None:
        self._held[program] = (tokens, until)

    def drop(self, program: str) -> None:
        self._held.pop(program, None)

    def used(self, now: float) -> int:
        expired = [p for p, (_, until) in self._held.items() if until < now]
        for program in expired:
            del self._held[program]
        return sum(tokens for tokens, _ in self._held.values())

    def holds_back(self, program: str, now: float) -> bool:
        """Whether `program` must wait; a program let in is counted at once (at the mean
        size of the others) so one admission pass cannot let in more than fits."""
        if program in self._held:
            return False
        used = self.used(now)
        if used >= self.tokens:
            return True
        mean = used // len(self._held) if self._held else 0
        self._held[program] = (mean, math.inf)
        return False
