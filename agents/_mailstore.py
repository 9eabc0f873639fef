"""Where peer messages are kept: the `MailStore` protocol, and an in-process store.

A store keeps three things: each sender's last sequence number, the messages not yet
acknowledged (one row per recipient mailbox), and topic subscriptions. It speaks in plain
tuples and strings, so a store in another package (`memory.SQLMailStore`) satisfies the
protocol structurally without importing it; `PostOffice` (`_mail.py`) owns the user-facing
types and every check.

Times are epoch seconds (the office's `clock.now()`), so leases compare across processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

Box = tuple[str, str, str]
"""A mailbox: (tenant, workflow id, agent name)."""

TopicKey = tuple[str, str, str]
"""A topic: (tenant, scope, name); the scope is a workflow id, or "" for a topic shared by
every workflow of the tenant."""


class StoredMessage(Protocol):
    """One message as a store hands it out on lease."""

    @property
    def receipt(self) -> int:
        """The store's id of this copy: what `ack` names. Never reused."""
        ...

    @property
    def box(self) -> Box: ...

    @property
    def sender(self) -> Box: ...

    @property
    def seq(self) -> int:
        """The sender's sequence number: 1, 2, ... per sender, in the order it sent."""
        ...

    @property
    def topic(self) -> str | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def body(self) -> str:
        """The body as JSON text."""
        ...

    @property
    def sent_at(self) -> float: ...

    @property
    def attempt(self) -> int:
        """1 on the first delivery, one more on each redelivery."""
        ...

    @property
    def leased_until(self) -> float: ...


@runtime_checkable
class MailStore(Protocol):
    """What a `PostOffice` needs from where messages are kept.

    Contract (tests/test_mail_contract.py runs it against every store):
    - `post` and `publish` keep the message before they return, under the sender's next
      sequence number, which they return; a durable store has committed it by then.
    - `lease` hands out, oldest first, up to `limit` messages of `box` that nobody holds,
      marks each held until `until` and counts the attempt. A sender's messages form one
      stream per mailbox: while any of them is held (its lease has not ended), none of that
      sender's later messages is handed out, so a message handed out again (its lease ran
      out without an ack) never comes after a later message of the same sender. Messages
      of one stream come out in their sender's order.
    - `ack` forgets the named messages of `box`; it returns how many were still kept.
    """

    async def post(self, sender: Box, to: Box, *, kind: str, body: str, at: float) -> int:
        """Keep one message for `to`; return its sequence number."""
        ...

    async def publish(
        self, sender: Box, topic: TopicKey, *, kind: str, body: str, at: float
    ) -> tuple[int, int]:
        """Keep a copy for each subscriber of `topic`, all under one sequence number;
        return (that number, how many copies)."""
        ...

    async def subscribe(self, topic: TopicKey, box: Box) -> None: ...

    async def unsubscribe(self, topic: TopicKey, box: Box) -> bool:
        """Whether `box` was subscribed."""
        ...

    async def lease(
        self, box: Box, *, now: float, until: float, limit: int
    ) -> Sequence[StoredMessage]: ...

    async def lease_ends(self, box: Box, *, now: float) -> float | None:
        """When the first lease held on a message of `box` runs out (None: none held)."""
        ...

    async def ack(self, box: Box, receipts: Sequence[int]) -> int: ...


@dataclass(frozen=True, slots=True)
class Kept:
    """A message as the in-process store keeps it (and hands it out)."""

    receipt: int
    box: Box
    sender: Box
    seq: int
    topic: str | None
    kind: str
    body: str
    sent_at: float
    attempt: int = 0
    leased_until: float = 0.0


class InProcessMailStore:
    """A `MailStore` in this process's memory: what a `PostOffice` uses when given no store.

    NOT DURABLE: every message, lease and subscription is lost when the process ends.
    Pass `memory.SQLMailStore` for messages that survive a crash. Offices in one process
    may share one instance."""

    def __init__(self) -> None:
        self._seqs: dict[Box, int] = {}
        self._boxes: dict[Box, dict[int, Kept]] = {}
        self._topics: dict[TopicKey, set[Box]] = {}
        self._receipts = 0

    async def post(self, sender: Box, to: Box, *, kind: str, body: str, at: float) -> int:
        seq = self._next_seq(sender)
        self._keep(sender, seq, to, None, kind, body, at)
        return seq

    async def publish(
        self, sender: Box, topic: TopicKey, *, kind: str, body: str, at: float
    ) -> tuple[int, int]:
        seq = self._next_seq(sender)
        boxes = sorted(self._topics.get(topic, ()))
        for box in boxes:
            self._keep(sender, seq, box, topic[2], kind, body, at)
        return seq, len(boxes)

    async def subscribe(self, topic: TopicKey, box: Box) -> None:
        self._topics.setdefault(topic, set()).add(box)

    async def unsubscribe(self, topic: TopicKey, box: Box) -> bool:
        boxes = self._topics.get(topic, set())
        found = box in boxes
        boxes.discard(box)
        return found

    async def lease(self, box: Box, *, now: float, until: float, limit: int) -> list[Kept]:
        kept = self._boxes.get(box, {})
        busy = {m.sender for m in kept.values() if m.leased_until > now}
        # Receipts grow with every message kept, and a sender's seq with every message it
        # sends, so receipt order is also each sender's own order.
        chosen = [kept[r] for r in sorted(kept) if kept[r].sender not in busy][:limit]
        leased = []
        for message in chosen:
            held = replace(message, attempt=message.attempt + 1, leased_until=until)
            kept[message.receipt] = held
            leased.append(held)
        return leased

    async def lease_ends(self, box: Box, *, now: float) -> float | None:
        ends = [m.leased_until for m in self._boxes.get(box, {}).values() if m.leased_until > now]
        return min(ends, default=None)

    async def ack(self, box: Box, receipts: Sequence[int]) -> int:
        kept = self._boxes.get(box, {})
        return sum(kept.pop(r, None) is not None for r in set(receipts))

    def _next_seq(self, sender: Box) -> int:
        seq = self._seqs.get(sender, 0) + 1
        self._seqs[sender] = seq
        return seq

    def _keep(
        self, sender: Box, seq: int, box: Box, topic: str | None, kind: str, body: str, at: float
    ) -> None:
        self._receipts += 1
        message = Kept(self._receipts, box, sender, seq, topic, kind, body, at)
        self._boxes.setdefault(box, {})[message.receipt] = message
