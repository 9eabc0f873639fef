"""Scheduling policy: pure functions that order ready work, program first.

A *program* is one run of a workflow. Every ready task of a program shares the program's
key; programs are ordered by (priority class, policy key, arrival), and tasks within one
program by the order in which they became ready. No clock, no I/O: `now` is an argument.

- `fcfs`: earlier programs first (Continuum's program-level FCFS).
- `las`: least attained service first, which favours short programs (Autellix's PLAS).
- `slack`: least slack first, slack = deadline - now - remaining critical path
  (HEXGEN-Text2SQL's urgency), the path at what its tasks take lately (under the present
  load); programs without a deadline come after those with one. A program with negative
  slack will likely miss at this load: it ranks after every program that still can, least
  late first, so one lost deadline does not take feasible ones down with it (EDF's domino
  effect under overload). Whether it is *hopeless* (cannot make it even alone: the path at
  the least its tasks have taken is longer than the time left; `alone_slack_of`) is the
  engine's to say, not the order's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import networkx as nx

from ..model._errors import UsageError

PriorityClass = Literal["interactive", "batch"]
CLASS_RANK: Mapping[str, int] = {"interactive": 0, "batch": 1}


@dataclass(frozen=True, slots=True)
class ProgramView:
    """What a policy may know about a running program."""

    program: int
    """Arrival order: lower arrived earlier."""
    priority_class: PriorityClass = "batch"
    attained: float = 0.0
    """Seconds of task execution the program has received so far."""
    deadline: float | None = None
    """Absolute time on the engine clock, or None."""
    remaining: float = 0.0
    """Estimated seconds of the longest remaining path through the program's DAG, at what
    its tasks take lately."""
    least_remaining: float | None = None
    """The same path at the least its tasks have taken (what it needs even alone; None:
    `remaining`)."""
    guessed: bool = False
    """`remaining` is no estimate: some unfinished task's time in it is only the default
    (neither given nor learned from a task of its kind), or the policy estimates no path."""


@dataclass(frozen=True, slots=True)
class ReadyTask:
    program: int
    task: str
    seq: int
    """Order in which the task became ready (engine-wide)."""


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def needs_remaining(self) -> bool:
        """Whether `ProgramView.remaining` must be computed (it costs a walk of the DAG)."""
        ...

    @property
    def static(self) -> bool:
        """Whether a program's key never changes (no dependence on time or service), so
        admission may keep programs in a heap instead of sorting them every round."""
        ...

    def key(self, view: ProgramView, now: float) -> float:
        """Lower runs sooner. Ties are broken by class rank first and arrival last."""
        ...


@dataclass(frozen=True, slots=True)
class Fcfs:
    name: str = "fcfs"
    needs_remaining: bool = False
    static: bool = True

    def key(self, view: ProgramView, now: float) -> float:
        return float(view.program)


@dataclass(frozen=True, slots=True)
class Las:
    name: str = "las"
    needs_remaining: bool = False
    static: bool = False

    def key(self, view: ProgramView, now: float) -> float:
        return view.attained


@dataclass(frozen=True, slots=True)
class Slack:
    name: str = "slack"
    needs_remaining: bool = True
    static: bool = False

    def key(self, view: ProgramView, now: float) -> float:
        if view.deadline is None:
            return math.inf
        slack = view.deadline - now - view.remaining
        if slack < 0:
            return LATE_KEY + min(-slack, 1e7)
        return slack


LATE_KEY = 1e8
"""Where `slack` ranks programs late at the present load: after any feasible slack, before
no deadline."""


def slack_of(view: ProgramView, now: float) -> float | None:
    """Seconds to spare at what the program's tasks take lately; None without a deadline."""
    return None if view.deadline is None else view.deadline - now - view.remaining


def alone_slack_of(view: ProgramView, now: float) -> float | None:
    """Seconds to spare even alone (at the least its tasks have taken); negative: the
    program is hopeless. None without a deadline."""
    if view.deadline is None:
        return None
    least = view.remaining if view.least_remaining is None else view.least_remaining
    return view.deadline - now - least


POLICIES: Mapping[str, Callable[[], Policy]] = {"fcfs": Fcfs, "las": Las, "slack": Slack}


def get_policy(policy: str | Policy) -> Policy:
    if not isinstance(policy, str):
        return policy
    try:
        return POLICIES[policy]()
    except KeyError:
        raise UsageError(
            f"unknown scheduling policy {policy!r}; choose one of {', '.join(POLICIES)}"
        ) from None


def program_key(policy: Policy, view: ProgramView, now: float) -> tuple[int, float, int]:
    return (CLASS_RANK[view.priority_class], policy.key(view, now), view.program)


def order_programs(policy: Policy, views: Iterable[ProgramView], now: float) -> list[ProgramView]:
    """Programs in the order their ready work should be admitted."""
    return sorted(views, key=lambda v: program_key(policy, v, now))


def order(
    policy: Policy,
    ready: Sequence[ReadyTask],
    programs: Mapping[int, ProgramView],
    now: float,
) -> list[ReadyTask]:
    """The order in which to admit `ready` tasks: by program key, then by readiness."""
    keys = {p: program_key(policy, v, now) for p, v in programs.items()}
    return sorted(ready, key=lambda t: (keys[t.program], t.seq))


def urgency(policy: Policy, view: ProgramView, now: float) -> float:
    """A backend-neutral urgency (higher runs sooner) for the hints sent with LLM calls."""
    rank, key, program = program_key(policy, view, now)
    if math.isinf(key):  # no deadline under `slack`: after every deadline, in arrival order
        key = NO_DEADLINE_KEY + program
    return -(rank * 1e12 + key + program * 1e-6)


NO_DEADLINE_KEY = 1e9
"""Where `urgency` puts programs a policy ranks last (`slack`: no deadline): after any late
one (`LATE_KEY`), each by its arrival, which the tie-breaker below would lose to rounding."""


def remaining_critical_path(graph: nx.DiGraph[str], unfinished: Mapping[str, float]) -> float:
    """Longest path, in estimated seconds, through the tasks still to finish.

    `unfinished` maps each task that is not final to its estimate; finished tasks are
    ignored (they cost nothing more).
    """
    return remaining_critical_paths(graph, {t: (e, e) for t, e in unfinished.items()})[0]


def remaining_critical_paths(
    graph: nx.DiGraph[str], unfinished: Mapping[str, tuple[float, float]]
) -> tuple[float, float]:
    """`remaining_critical_path` at two estimates of each task at once (what tasks take
    lately, and the least they took), in one walk of the graph: the longest path at each."""
    longest: dict[str, tuple[float, float]] = {}
    best_a = best_b = 0.0
    for node in nx.topological_sort(graph.subgraph(unfinished)):
        before = [longest[p] for p in graph.predecessors(node) if p in longest]
        a, b = unfinished[node]
        path = (
            a + max((x for x, _ in before), default=0.0),
            b + max((y for _, y in before), default=0.0),
        )
        longest[node] = path
        best_a, best_b = max(best_a, path[0]), max(best_b, path[1])
    return best_a, best_b
