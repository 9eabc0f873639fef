"""Where the board keeps posts, claims and answers: the `BoardStore` protocol and the
in-process store (the default). `memory.SQLBoardStore` keeps them in the SQL store.

The protocol speaks plain data (kind strings, dicts of JSON values), so an implementation
needs nothing from this package. It decides everything that must hold across processes:
an award takes effect only on an open post and gives it the next attempt number (two
boards never award one post twice), an answer only on a live claim, an expired lease
reopens the post. Each write that takes effect appends its event to the board's log in the
same transaction.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

BoardWrite = tuple[str, str, dict[str, Any]]
"""(kind, post id, fields). Kinds and their fields, and what `write` answers for each:
- "post": the post's fields (id, content, capabilities, poster, posted_at, deadline,
  workflow, max_attempts) -> 1 (a post already there -> 0);
- "award": holder, bid, lease_until, at -> the attempt number awarded; 0 if the post was
  not open (another board won it, or it ended);
- "release": attempt, reason, at -> 1 the post is open again, 2 that was its last attempt
  and it failed, 0 the claim was not live;
- "answer": attempt, result, at -> 1, or 0 if the claim was not live;
- "fail": reason, at -> 1, or 0 if the post was not open;
- "renew": attempt, lease_until -> 1, or 0 if the claim was not live."""

Expiry = tuple[str, int, str, bool]
"""(post id, attempt, holder, reopened) of a claim whose lease ran out."""

BoardRecord = tuple[int, str, str, float, dict[str, Any]]
"""(seq, kind, post id, at, data): one entry of the board's log; seq grows."""

POST_FIELDS = (
    "id", "content", "capabilities", "poster", "posted_at", "deadline", "workflow",
    "max_attempts",
)  # fmt: skip


@runtime_checkable
class BoardStore(Protocol):
    """What the board needs from its storage; see the module docstring."""

    async def write(self, ops: Sequence[BoardWrite]) -> list[int]:
        """Apply `ops` in order, in one transaction, and return only once it committed (as
        durably as the store keeps anything); one answer per op (see `BoardWrite`). If the
        transaction fails, none of `ops` took effect."""
        ...

    async def expire(self, now: float) -> list[Expiry]:
        """End every live claim whose lease ended at or before `now`; reopen its post (or
        fail it, after its last attempt)."""
        ...

    async def posts(self, states: Sequence[str]) -> list[dict[str, Any]]:
        """Posts in one of `states`, oldest first: POST_FIELDS plus state, attempts,
        reason, result, answered_by, and (while claimed) holder and lease_until."""
        ...

    async def events(self, after: int = 0, limit: int = 10_000) -> list[BoardRecord]:
        """The log after seq `after`, in order."""
        ...


def release_outcome(attempt: int, max_attempts: int, reason: str) -> tuple[int, str | None]:
    """(write answer, the failure reason if the post is done for): shared by the stores so
    every implementation gives up after the same attempt with the same words."""
    if attempt >= max_attempts:
        return 2, f"all {max_attempts} claims failed; the last: {reason}"
    return 1, None


class MemoryBoardStore:
    """The in-process `BoardStore`: dicts, gone with the process."""

    def __init__(self) -> None:
        self._posts: dict[str, dict[str, Any]] = {}
        self._claims: dict[tuple[str, int], dict[str, Any]] = {}
        self._log: list[BoardRecord] = []

    def _event(self, kind: str, post_id: str, at: float, data: dict[str, Any]) -> None:
        self._log.append((len(self._log) + 1, kind, post_id, at, data))

    async def write(self, ops: Sequence[BoardWrite]) -> list[int]:
        return [self._apply(kind, post_id, fields) for kind, post_id, fields in ops]

    def _apply(self, kind: str, post_id: str, f: dict[str, Any]) -> int:
        post = self._posts.get(post_id)
        if kind == "post":
            if post is not None:
                return 0
            row = {k: copy.deepcopy(f[k]) for k in POST_FIELDS}
            row.update(state="open", attempts=0, reason=None, result=None, answered_by=None)
            self._posts[post_id] = row
            self._event("posted", post_id, f["posted_at"], {k: f[k] for k in POST_FIELDS})
            return 1
        if post is None:
            return 0
        if kind == "award":
            if post["state"] != "open":
                return 0
            attempt: int = post["attempts"] + 1
            post.update(state="claimed", attempts=attempt)
            claim = {"holder": f["holder"], "bid": f["bid"], "lease_until": f["lease_until"]}
            self._claims[(post_id, attempt)] = {**claim, "state": "live"}
            self._event("awarded", post_id, f["at"], {"attempt": attempt, **claim})
            return attempt
        if kind == "fail":
            if post["state"] != "open":
                return 0
            post.update(state="failed", reason=f["reason"])
            self._event("post_failed", post_id, f["at"], {"reason": f["reason"]})
            return 1
        found = self._claims.get((post_id, f["attempt"]))
        if found is None or found["state"] != "live":
            return 0
        claim = found
        if kind == "renew":
            claim["lease_until"] = f["lease_until"]
            return 1
        if kind == "answer":
            claim["state"] = "answered"
            post.update(state="answered", result=copy.deepcopy(f["result"]))
            post["answered_by"] = claim["holder"]
            data = {"attempt": f["attempt"], "holder": claim["holder"], "result": f["result"]}
            self._event("answered", post_id, f["at"], data)
            return 1
        if kind == "release":
            return self._release(post, post_id, f["attempt"], claim, f["reason"], f["at"])
        raise ValueError(f"unknown board write {kind!r}")

    def _release(
        self,
        post: dict[str, Any],
        post_id: str,
        attempt: int,
        claim: dict[str, Any],
        reason: str,
        at: float,
        state: str = "released",
    ) -> int:
        claim["state"] = state
        outcome, failure = release_outcome(attempt, post["max_attempts"], reason)
        post.update(state="failed" if failure else "open", reason=failure)
        data = {"attempt": attempt, "holder": claim["holder"], "reason": reason}
        self._event("released", post_id, at, {**data, "reopened": failure is None})
        if failure is not None:
            self._event("post_failed", post_id, at, {"reason": failure})
        return outcome

    async def expire(self, now: float) -> list[Expiry]:
        expired: list[Expiry] = []
        for (post_id, attempt), claim in list(self._claims.items()):
            if claim["state"] == "live" and claim["lease_until"] <= now:
                reason = f"the lease of {claim['holder']!r} expired"
                post = self._posts[post_id]
                outcome = self._release(post, post_id, attempt, claim, reason, now, "expired")
                expired.append((post_id, attempt, claim["holder"], outcome == 1))
        return expired

    async def posts(self, states: Sequence[str]) -> list[dict[str, Any]]:
        found = []
        for post_id, post in self._posts.items():
            if post["state"] not in states:
                continue
            row = copy.deepcopy(post)
            claim = self._claims.get((post_id, post["attempts"]))
            live = claim is not None and claim["state"] == "live"
            row["holder"] = claim["holder"] if live and claim else None
            row["lease_until"] = claim["lease_until"] if live and claim else None
            found.append(row)
        return found

    async def events(self, after: int = 0, limit: int = 10_000) -> list[BoardRecord]:
        return copy.deepcopy(self._log[after : after + limit])
