"""The blackboard's data: posts, claims, answers, its events, volunteers, and the award
policy (pure: bids and loads in, a winner out; no clock, no I/O)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from orchestrator import RunError, TaskContext, UsageError

PostState = Literal["open", "claimed", "answered", "failed"]
ClaimState = Literal["live", "answered", "released", "expired"]

Bid = float | None
"""A volunteer's bid: higher wins; None declines the post."""
BidFunction = Callable[["Post"], Bid | Awaitable[Bid]]
"""Rule-based (a plain function) or asked of the agent's LLM (a coroutine function)."""


@dataclass(frozen=True, slots=True)
class Post:
    """A request on the board. Times are the board clock's `now()` (epoch seconds), so
    every process sharing a store reads them alike."""

    id: str
    content: Any
    capabilities: frozenset[str]
    poster: str
    posted_at: float
    deadline: float | None = None
    """No capable volunteer by then: the post fails. None: it waits for good."""
    workflow: str | None = None
    """The id of the poster's workflow, when posted from inside a task."""
    max_attempts: int = 3
    """Claims it may have (one per award); the last one failing fails the post."""


@dataclass(frozen=True, slots=True)
class Claim:
    """An award: `holder` serves `post` until `lease_until` (its answer is refused after)."""

    post: Post
    attempt: int
    holder: str
    bid: float
    lease_until: float

    @property
    def task_id(self) -> str:
        """The task this claim runs as in the poster's workflow."""
        return f"board/{self.post.id}/{self.attempt}"


@dataclass(frozen=True, slots=True)
class Answer:
    """What the holder of `attempt` answered to post `post_id`."""

    post_id: str
    attempt: int
    holder: str
    result: Any
    at: float


# --- events: what every subscriber sees (and what the store's log keeps) --------------------


@dataclass(frozen=True, slots=True)
class Posted:
    post: Post
    kind: Literal["posted"] = "posted"


@dataclass(frozen=True, slots=True)
class Awarded:
    claim: Claim
    kind: Literal["awarded"] = "awarded"


@dataclass(frozen=True, slots=True)
class Released:
    """A claim ended without an answer (its task failed, or its lease expired)."""

    post_id: str
    attempt: int
    holder: str
    reason: str
    reopened: bool
    """True: the post is open again; False: that was its last attempt and it failed."""
    kind: Literal["released"] = "released"


@dataclass(frozen=True, slots=True)
class Answered:
    answer: Answer
    kind: Literal["answered"] = "answered"


@dataclass(frozen=True, slots=True)
class PostFailed:
    post_id: str
    reason: str
    kind: Literal["post_failed"] = "post_failed"


BoardEvent = Posted | Awarded | Released | Answered | PostFailed


# --- errors ---------------------------------------------------------------------------------


class PostFailedError(RunError):
    """A post ended without an answer: its deadline passed with no capable volunteer, or
    every claim on it failed. `reason` says which."""

    def __init__(self, post_id: str, reason: str) -> None:
        super().__init__(f"post {post_id!r} failed: {reason}")
        self.post_id = post_id
        self.reason = reason


class ClaimLostError(RunError):
    """The claim's lease expired (or it was released) before its answer: the post went back
    on the board, and the answer was not recorded."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(
            f"claim {claim.task_id!r} of {claim.holder!r} is no longer live (its lease ended "
            f"at {claim.lease_until:.3f}); its answer was dropped: renew long claims with "
            "board.renew(claim), or give the board a longer lease"
        )
        self.claim = claim


# --- volunteers ---------------------------------------------------------------------------


@runtime_checkable
class Volunteer(Protocol):
    """What the board needs of an agent: a name, capability tags, an optional bid, and a way
    to serve a post it was awarded. `ctx` is the task's context when the claim runs as a task
    in the poster's workflow (so its LLM calls share that program's priority), else None."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> frozenset[str]: ...

    @property
    def bid(self) -> BidFunction | None: ...

    def serve(self, post: Post, ctx: TaskContext | None) -> Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class Helper:
    """A `Volunteer` made of functions: `work(post, ctx)` (sync or async) gives the answer."""

    name: str
    capabilities: frozenset[str]
    work: Callable[[Post, TaskContext | None], Any]
    bid: BidFunction | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("a Helper needs a name")
        object.__setattr__(self, "capabilities", tags(self.capabilities, f"Helper {self.name!r}"))

    async def serve(self, post: Post, ctx: TaskContext | None) -> Any:
        result = self.work(post, ctx)
        if isinstance(result, Awaitable):
            result = await result
        return result


def tags(capabilities: Iterable[str], owner: str) -> frozenset[str]:
    """Capability tags as a frozenset, refusing a bare string (which would be its letters)."""
    if isinstance(capabilities, str):
        raise UsageError(
            f"{owner}: capabilities must be a collection of tags, got the string "
            f"{capabilities!r}; write {{{capabilities!r}}}"
        )
    found = frozenset(capabilities)
    bad = sorted(repr(t) for t in found if not isinstance(t, str) or not t)
    if bad:
        raise UsageError(
            f"{owner}: capability tags must be non-empty strings, got {', '.join(bad)}"
        )
    return found


# --- the award policy (pure) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Offer:
    """One volunteer's bid on one post. Ordered so that the best offer is the smallest."""

    key: tuple[float, int, str] = field(init=False, repr=False)
    volunteer: str = field(compare=False)
    bid: float = field(compare=False)
    load: int = field(compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (-self.bid, self.load, self.volunteer))


def award(bids: Mapping[str, float], loads: Mapping[str, int]) -> Offer | None:
    """The winning offer: the highest bid; ties go to the volunteer holding the fewest
    claims, then to the first name in order (so the result never depends on dict order)."""
    best: tuple[float, int, str] | None = None
    for name, amount in bids.items():
        key = (-amount, loads.get(name, 0), name)  # Offer's order, without an Offer per bid
        if best is None or key < best:
            best = key
    return None if best is None else Offer(best[2], -best[0], best[1])


def capable(
    required: frozenset[str], index: Mapping[str, set[str]], everyone: set[str]
) -> set[str]:
    """Volunteers having every tag in `required` (`index`: tag -> volunteers having it)."""
    if not required:
        return set(everyone)
    sets: Sequence[set[str]] = sorted((index.get(tag, set()) for tag in required), key=len)
    found = set(sets[0])
    for other in sets[1:]:
        found &= other
    return found
