"""The router link over a notifier (executors/_peerlink.py): frames, and messages larger
than a frame sent in pieces and put together, over an in-process `LocalNotifier` (the
PostgreSQL and Redis transports are in tests/test_notify.py)."""

from __future__ import annotations

import asyncio
import base64

import pytest

from executors import NotifierRouterLink
from orchestrator.cluster._notify import LocalNotifier


class Lossy(LocalNotifier):
    """A `LocalNotifier` that keeps what it was given to send and, with `lose`, loses
    every second payload."""

    def __init__(self, *, lose: bool) -> None:
        super().__init__()
        self.lose = lose
        self.payloads: list[str] = []

    async def notify(self, channel: str, payload: str = "") -> None:
        self.payloads.append(payload)
        if not self.lose or len(self.payloads) % 2 == 1:
            await super().notify(channel, payload)


class Heard:
    """What a receiving link delivers; `until(n)` waits for the n-th message."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self._grew = asyncio.Event()

    def __call__(self, message: bytes) -> None:
        self.messages.append(message)
        self._grew.set()

    async def until(self, n: int) -> None:
        while len(self.messages) < n:
            self._grew.clear()
            await asyncio.wait_for(self._grew.wait(), 10)


def test_small_and_large_messages_arrive_whole_and_in_order() -> None:
    """A message of 3.5 frames goes in 4 pieces between two small ones; the peer hears the
    three messages, whole, in the order sent; every payload fits the frame."""
    big = bytes(range(256)) * 14  # 3,584 bytes

    async def main() -> tuple[Heard, list[str], NotifierRouterLink]:
        notifier = Lossy(lose=False)
        heard = Heard()
        async with (
            NotifierRouterLink(notifier, "c", frame_bytes=1_000) as sender,
            NotifierRouterLink(notifier, "c", frame_bytes=1_000) as receiver,
        ):
            receiver.subscribe(heard)
            for message in (b"first", big, b"last"):
                sender.publish(message)
            await heard.until(3)
        return heard, notifier.payloads, sender

    heard, payloads, sender = asyncio.run(main())
    assert heard.messages == [b"first", big, b"last"]
    assert sender.pieced == 1 and sender.sent == 3 and sender.oversized == 0
    assert len(payloads) >= 4
    assert all(len(base64.b64decode(p)) <= 1_000 for p in payloads)


def test_a_message_missing_a_piece_is_never_delivered_and_partials_are_bounded() -> None:
    """70 messages of two pieces, a frame each, every second frame lost: nothing is
    delivered, and the receiver keeps at most 64 messages waiting for pieces. A small
    message after them still arrives; garbage is ignored."""

    async def main() -> tuple[Heard, NotifierRouterLink]:
        notifier = Lossy(lose=True)
        heard = Heard()
        async with (
            NotifierRouterLink(notifier, "c", frame_bytes=200) as sender,
            NotifierRouterLink(notifier, "c", frame_bytes=200) as receiver,
        ):
            receiver.subscribe(heard)
            for n in range(70):
                sender.publish(bytes([n]) * 300)
            # Garbage before them (of which the first and third payloads are heard).
            await notifier.notify("c", "not base64 at all!")
            await notifier.notify("c", "not base64 at all!")
            await notifier.notify("c", base64.b64encode(b"\xff\xff\xff\xff").decode())
            sender.publish(b"after")  # sent in the frame of the last piece
            await heard.until(1)
        return heard, receiver

    heard, receiver = asyncio.run(main())
    assert heard.messages == [b"after"]
    assert receiver.incomplete == 70 - 64


def test_a_message_over_the_limit_is_dropped_and_counted() -> None:
    async def main() -> NotifierRouterLink:
        notifier = LocalNotifier()
        heard = Heard()
        async with (
            NotifierRouterLink(notifier, "c", frame_bytes=500, max_message_bytes=2_000) as link,
            NotifierRouterLink(notifier, "c") as receiver,
        ):
            receiver.subscribe(heard)
            link.publish(b"x" * 2_001)
            link.publish(b"y" * 2_000)
            await heard.until(1)
        assert heard.messages == [b"y" * 2_000]
        return link

    link = asyncio.run(main())
    assert (link.oversized, link.pieced, link.sent) == (1, 1, 1)
    with pytest.raises(ValueError, match="no room"):
        NotifierRouterLink(LocalNotifier(), frame_bytes=10)


def test_a_receiver_refuses_messages_over_its_limit_and_sizes_are_checked() -> None:
    """A sender with a larger limit than the receiver's: its 10,000-byte message is refused
    piece by piece (nothing kept, nothing delivered); what follows still arrives."""

    async def main() -> tuple[Heard, NotifierRouterLink]:
        notifier = LocalNotifier()
        heard = Heard()
        async with (
            NotifierRouterLink(notifier, "c", frame_bytes=500, max_message_bytes=100_000) as big,
            NotifierRouterLink(notifier, "c", max_message_bytes=2_000) as receiver,
        ):
            receiver.subscribe(heard)
            big.publish(b"z" * 10_000)
            big.publish(b"small")
            await heard.until(1)
        return heard, receiver

    heard, receiver = asyncio.run(main())
    assert heard.messages == [b"small"]
    assert receiver.incomplete >= 1 and receiver.partial_bytes == 0
    with pytest.raises(ValueError, match="65,535 pieces"):
        NotifierRouterLink(LocalNotifier(), frame_bytes=100, max_message_bytes=10_000_000)
