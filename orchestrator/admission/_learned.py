"""What admission learns of tasks and runs: what each kind of task takes, and what recent
runs with a deadline took (no clock, no I/O: callers pass what they measured)."""

from __future__ import annotations

from collections import deque


class Durations:
    """How long each kind of task (`task_kind`: its action's label, in runs of one priority
    class) has taken lately, from admission to its end: an exponential mean over the
    finished ones, so that under load (longer queues and steps at the servers) the estimate
    grows with what the tasks really take. Used for a task without an estimate of its own;
    `default` until one of its kind has finished.

    The class is part of the kind because the same task takes different times in each: an
    interactive run's call goes to a router's urgent lane with short steps while a batch
    run's waits on saturated replicas. Learned together, a batch's many calls would make
    the interactive runs beside it look several times longer than they are.

    Also the least each kind has taken (`least`): what it needs with the least load seen,
    which tells a deadline that cannot be met even alone from one that is only late at the
    present load."""

    __slots__ = ("_least", "_mean", "default", "weight")

    def __init__(self, default: float, weight: float = 0.2) -> None:
        self.default = default
        self.weight = weight
        self._mean: dict[str, float] = {}
        self._least: dict[str, float] = {}

    def observe(self, kind: str, seconds: float) -> None:
        mean = self._mean.get(kind)
        self._mean[kind] = seconds if mean is None else mean + self.weight * (seconds - mean)
        least = self._least.get(kind)
        self._least[kind] = seconds if least is None else min(least, seconds)

    def estimate(self, kind: str) -> float:
        return self._mean.get(kind, self.default)

    def least(self, kind: str) -> float:
        return self._least.get(kind, self.default)

    def knows(self, kind: str) -> bool:
        """A task of this kind has finished: `estimate` is learned, not the default."""
        return kind in self._mean


class RunTimes:
    """What recent runs with a deadline took from submission to their end, per workflow
    name: the last `keep` of each. `typical` answers the `share` quantile of them once
    `min_seen` were seen (None before): what a run submitted now will likely take under the
    present load, since the queues and steps its predecessors met are in their times."""

    __slots__ = ("_seen", "keep", "min_seen", "share")

    def __init__(self, keep: int = 20, min_seen: int = 5, share: float = 0.9) -> None:
        self.keep = keep
        self.min_seen = min_seen
        self.share = share
        self._seen: dict[str, deque[float]] = {}

    def observe(self, name: str, seconds: float) -> None:
        seen = self._seen.get(name)
        if seen is None:
            seen = self._seen[name] = deque(maxlen=self.keep)
        seen.append(seconds)

    def typical(self, name: str) -> float | None:
        seen = self._seen.get(name)
        if seen is None or len(seen) < self.min_seen:
            return None
        ordered = sorted(seen)
        return ordered[min(len(ordered) - 1, int(self.share * len(ordered)))]
