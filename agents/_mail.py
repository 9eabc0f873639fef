"""Peer messages between agents: direct mailboxes and named topics, delivered at least once.

An agent's mailbox is its `Address`: (tenant, workflow id, agent name). A `PostOffice`
sends, publishes, hands out and takes acknowledgements; it keeps nothing itself, its
`MailStore` does (`_mailstore.py`): in this process's memory by default (lost when the
process ends), or `memory.SQLMailStore` (durable: a message is committed before `send`
returns, and survives a crash of the sender or the receiver).

Delivery, as tests/test_mail_contract.py checks it on every store:
- at least once: `receive` leases what it hands out for `visibility_s`; a delivery not
  acknowledged (`ack`) by then, because its receiver failed, was slow or died, is handed
  out again with `attempt` one higher. `Delivery.id` is the same each time: de-duplicate
  on it.
- in order per sender: within one mailbox, a sender's messages come out in the order it
  sent them; while one of them is leased, none of its later ones is handed out, so a
  redelivery never arrives after a later message of the same sender (a receiver that acks
  a later message first has chosen that order itself).
- scoped: a mailbox is read only by its exact address. A message to another workflow must
  say so (`across_workflows=True`) and stays within the tenant; nothing crosses tenants.
  A topic is the workflow's own unless it is `shared=True`, then the tenant's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from orchestrator import Clock, StoreError, TaskContext, UsageError
from orchestrator.ext import Notifier, running_clock

from ._mailstore import Box, InProcessMailStore, MailStore, StoredMessage, TopicKey

_log = logging.getLogger("plait.mail")
MAIL_CHANNEL = "plait_mail"
"""The notification channel of peer messages (a hint: receivers read their mailbox)."""
DEFAULT_TENANT = "default"
MAX_NAME = 200
"""Longest tenant, workflow id, agent or topic name (the SQL store's column width)."""
MAX_KIND = 64
DEFAULT_MAX_BYTES = 256 * 1024


class MessageTooLargeError(UsageError):
    """A message body is larger than the office's `max_bytes`."""

    def __init__(self, sender: Address, size: int, limit: int) -> None:
        super().__init__(
            f"message from {sender} is {size} bytes of JSON, over the post office's limit of "
            f"{limit}; send a reference (a file path, a memory key) instead of the data, or "
            "raise PostOffice(max_bytes=...)"
        )
        self.size = size
        self.limit = limit


class MessageNotJSONError(UsageError):
    """A message body is not JSON data (what `json.loads` gives back, exactly)."""


class MailScopeError(UsageError):
    """A message addressed outside what its sender may reach (another tenant, or another
    workflow without `across_workflows=True`)."""


@dataclass(frozen=True, slots=True, order=True)
class Address:
    """An agent's mailbox: the same agent name in another workflow is another mailbox."""

    tenant: str
    workflow: str
    agent: str

    def __post_init__(self) -> None:
        for field in ("tenant", "workflow", "agent"):
            _check_name(f"Address.{field}", getattr(self, field))

    @classmethod
    def of(cls, ctx: TaskContext, agent: str, *, tenant: str = DEFAULT_TENANT) -> Address:
        """The mailbox of `agent` in the workflow running the task that got `ctx`.

        Workflows carry no tenant; a service that runs several passes its own."""
        return cls(tenant, ctx.workflow.id, agent)

    def peer(self, agent: str) -> Address:
        """Another agent's mailbox in this workflow."""
        return Address(self.tenant, self.workflow, agent)

    @property
    def box(self) -> Box:
        return (self.tenant, self.workflow, self.agent)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.workflow}/{self.agent}"


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """A message: its sender and the sender's sequence number (1, 2, ...). Every copy of a
    published message, and every redelivery, carries the same id."""

    sender: Address
    seq: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message handed to its receiver; `ack` it once handled, or it comes again after
    `leased_until` with `attempt` one higher."""

    id: MessageId
    to: Address
    body: Any
    kind: str
    topic: str | None
    sent_at: float
    attempt: int
    leased_until: float
    receipt: int
    """The store's handle for this copy (what `ack` names)."""


@dataclass(slots=True)
class MailStats:
    """What an office did: sends and publishes kept, copies fanned out, deliveries
    (first and repeated), acknowledgements, and bodies refused (too large, not JSON)."""

    sent: int = 0
    published: int = 0
    copies: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    refused: int = 0


class PostOffice:
    """Sends and hands out peer messages; see the module docstring for the guarantees.

    `store`: where messages are kept; by default an `InProcessMailStore`, which is NOT
    durable (lost when the process ends); pass `memory.SQLMailStore(sql_store)` to keep
    them in the same database as the event log. `clock`: leases and waits run on it (the
    running loop's clock by default). `max_bytes`: the largest body, as UTF-8 JSON.
    `poll_s`: how often a waiting `receive` reads the store again for messages sent by
    other processes; 1 s when a store is given, never for the office's own in-process store
    (nothing else can write to it: a send through this office wakes waiting receivers).
    `notifier` (`memory.PgNotifier`, `memory.RedisNotifier`): a send through any office on
    the same notifier wakes waiting receivers in every process at once (the poll stays as
    a fallback: a notification is a hint, the store the truth). With a notifier, `close()`
    the office (or use it as `async with`) when done with it: it stops listening."""

    def __init__(
        self,
        store: MailStore | None = None,
        *,
        clock: Clock | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        poll_s: float | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        if store is not None and not isinstance(store, MailStore):
            raise UsageError(
                f"PostOffice(store=...) needs a MailStore, got {type(store).__name__}; pass "
                "memory.SQLMailStore(sql_store), or nothing for an in-process store"
            )
        if max_bytes < 1:
            raise UsageError(f"PostOffice(max_bytes={max_bytes}) must be at least 1")
        if poll_s is not None and poll_s <= 0:
            raise UsageError(f"PostOffice(poll_s={poll_s}) must be positive (or None)")
        self.store: MailStore = store if store is not None else InProcessMailStore()
        self.max_bytes = max_bytes
        self.poll_s = poll_s if poll_s is not None or store is None else 1.0
        self.stats = MailStats()
        self._clock = clock
        self._arrival: asyncio.Event | None = None
        self.notifier = notifier
        self._listening = False

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            self._clock = running_clock()
        return self._clock

    # --- sending ---------------------------------------------------------------------------

    async def send(
        self,
        sender: Address,
        to: Address | str,
        body: Any,
        *,
        kind: str = "message",
        across_workflows: bool = False,
    ) -> MessageId:
        """Send `body` (JSON data) to `to`: an agent's name in the sender's workflow, or an
        `Address`. Kept by the store before this returns (committed, for a durable store)."""
        target = sender.peer(to) if isinstance(to, str) else to
        if target.tenant != sender.tenant:
            raise MailScopeError(
                f"{sender} cannot send to {target}: messages never cross tenants; address an "
                f"agent of tenant {sender.tenant!r}"
            )
        if target.workflow != sender.workflow and not across_workflows:
            raise MailScopeError(
                f"{sender} sent to {target}, in another workflow; if that is meant, say so "
                "with send(..., across_workflows=True), else address an agent of workflow "
                f"{sender.workflow!r}"
            )
        text = self._encode(sender, body, kind)
        seq = await self.store.post(
            sender.box, target.box, kind=kind, body=text, at=self.clock.now()
        )
        self.stats.sent += 1
        await self._posted()
        return MessageId(sender, seq)

    async def publish(
        self, sender: Address, topic: str, body: Any, *, kind: str = "message", shared: bool = False
    ) -> MessageId:
        """Send `body` to every current subscriber of `topic` (the sender's workflow's
        topic, or the tenant's with `shared=True`). Subscribers that join later do not get
        it. Kept before this returns, one copy per subscriber, all under one id."""
        key = _topic(sender, topic, shared)
        text = self._encode(sender, body, kind)
        seq, copies = await self.store.publish(
            sender.box, key, kind=kind, body=text, at=self.clock.now()
        )
        self.stats.published += 1
        self.stats.copies += copies
        await self._posted()
        return MessageId(sender, seq)

    async def subscribe(self, agent: Address, topic: str, *, shared: bool = False) -> None:
        """Deliver what is published on `topic` from now on to `agent`'s mailbox. A topic
        is its workflow's own; `shared=True` names the tenant's topic of that name, which
        every workflow of the tenant can publish to and subscribe to."""
        await self.store.subscribe(_topic(agent, topic, shared), agent.box)

    async def unsubscribe(self, agent: Address, topic: str, *, shared: bool = False) -> bool:
        """Stop delivering `topic` to `agent`; whether it was subscribed. Copies already in
        its mailbox stay there."""
        return await self.store.unsubscribe(_topic(agent, topic, shared), agent.box)

    # --- receiving -------------------------------------------------------------------------

    async def receive(
        self,
        agent: Address,
        *,
        limit: int = 16,
        visibility_s: float = 30.0,
        wait_s: float | None = None,
    ) -> list[Delivery]:
        """Up to `limit` messages for `agent`, oldest first, each leased for `visibility_s`
        seconds: `ack` each once handled, or it is handed out again after that.

        Waits until at least one is there, or `wait_s` seconds on the office's clock have
        passed (then returns []); `wait_s=0` does not wait, `None` waits as long as it
        takes."""
        if limit < 1:
            raise UsageError(f"receive(limit={limit}) must be at least 1")
        if not visibility_s > 0:
            raise UsageError(f"receive(visibility_s={visibility_s}) must be positive")
        if wait_s is not None and wait_s < 0:
            raise UsageError(f"receive(wait_s={wait_s}) must be 0 or more (or None)")
        clock = self.clock
        await self._listen()
        deadline = None if wait_s is None else clock.monotonic() + wait_s
        while True:
            # Taken before reading the store, so a send in between still wakes this wait.
            arrival = self._arrival_event()
            now = clock.now()
            leased = await self.store.lease(
                agent.box, now=now, until=now + visibility_s, limit=limit
            )
            if leased:
                return [self._delivery(m) for m in leased]
            waits = [] if self.poll_s is None else [self.poll_s]
            if deadline is not None:
                left = deadline - clock.monotonic()
                if left <= 0:
                    return []
                waits.append(left)
            ends = await self.store.lease_ends(agent.box, now=now)
            if ends is not None:
                waits.append(max(ends - clock.now(), 0.0))
            # Waits run on the loop's time: the office's clock must keep it (as the engine's).
            clock.check_running_loop()
            try:
                async with asyncio.timeout(min(waits, default=None)):
                    await arrival.wait()
            except TimeoutError:
                pass

    async def ack(self, *deliveries: Delivery) -> int:
        """Mark `deliveries` handled, so they never come again; returns how many were still
        pending (one already acknowledged, by this receiver or by another that got it again
        after its lease ran out, counts 0)."""
        by_box: dict[Box, list[int]] = {}
        for delivery in deliveries:
            if not isinstance(delivery, Delivery):
                raise UsageError(
                    f"ack() takes the Delivery objects receive() returned, got "
                    f"{type(delivery).__name__}"
                )
            by_box.setdefault(delivery.to.box, []).append(delivery.receipt)
        acked = 0
        for box, receipts in by_box.items():
            acked += await self.store.ack(box, receipts)
        self.stats.acked += acked
        return acked

    # --- inside ----------------------------------------------------------------------------

    def _encode(self, sender: Address, body: Any, kind: str) -> str:
        try:
            if not isinstance(kind, str) or not 0 < len(kind) <= MAX_KIND:
                raise UsageError(f"message kind {kind!r} must be a string of 1 to {MAX_KIND}")
            problem = _not_json(body, "body")
            if problem is not None:
                raise MessageNotJSONError(
                    f"message from {sender} is not JSON data: {problem}; send dicts with "
                    "string keys, lists, strings, finite numbers, booleans and None"
                )
            text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
            size = len(text.encode())
            if size > self.max_bytes:
                raise MessageTooLargeError(sender, size, self.max_bytes)
        except UsageError:
            self.stats.refused += 1
            raise
        return text

    def _delivery(self, message: StoredMessage) -> Delivery:
        if message.attempt > 1:
            self.stats.redelivered += 1
        else:
            self.stats.delivered += 1
        return Delivery(
            id=MessageId(Address(*message.sender), message.seq),
            to=Address(*message.box),
            body=json.loads(message.body),
            kind=message.kind,
            topic=message.topic,
            sent_at=message.sent_at,
            attempt=message.attempt,
            leased_until=message.leased_until,
            receipt=message.receipt,
        )

    async def _posted(self) -> None:
        """A message was kept: wake this office's receivers, and every process's."""
        self._wake()
        if self.notifier is not None:
            try:
                await self.notifier.notify(MAIL_CHANNEL)
            except StoreError as exc:  # the receivers' poll finds it
                _log.warning("peer message kept but not notified: %s", exc)

    async def _listen(self) -> None:
        if self.notifier is not None and not self._listening:
            self._listening = True
            await self.notifier.listen(MAIL_CHANNEL, self._heard)

    def _heard(self, _payload: str) -> None:
        self._wake()

    def close(self) -> None:
        """Stop listening to the notifier (a later `receive` listens again)."""
        if self.notifier is not None and self._listening:
            self._listening = False
            self.notifier.unlisten(MAIL_CHANNEL, self._heard)

    async def __aenter__(self) -> PostOffice:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _arrival_event(self) -> asyncio.Event:
        if self._arrival is None:
            self._arrival = asyncio.Event()
        return self._arrival

    def _wake(self) -> None:
        """Something was posted: every waiting receive looks at its mailbox again."""
        arrival, self._arrival = self._arrival, None
        if arrival is not None:
            arrival.set()


def _topic(agent: Address, name: str, shared: bool) -> TopicKey:
    _check_name("topic", name)
    return (agent.tenant, "" if shared else agent.workflow, name)


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise UsageError(f"{what} must be a string of 1 to {MAX_NAME} characters, got {value!r}")


def _not_json(value: Any, path: str) -> str | None:
    """Where `value` is not exactly JSON data (a tuple or an int key would come back
    changed), or None."""
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r}, which JSON cannot hold"
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (problem := _not_json(item, f"{path}[{i}]")) is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r}, a {type(key).__name__}, not a string"
            if (problem := _not_json(item, f"{path}[{key!r}]")) is not None:
                return problem
        return None
    return f"{path} is a {type(value).__name__}"
