"""Routers of engines in different processes, linked through a `Notifier` (PostgreSQL
LISTEN/NOTIFY or Redis pub/sub): what one router publishes (where it placed a prompt, when
a call ended) reaches the others in a few milliseconds.

Messages are small (a few dozen bytes, plus 8 per block a request added): the link packs
those published within one turn of the loop into frames of at most `frame_bytes` (under
PostgreSQL's 8,000-byte NOTIFY payload once base64-encoded) and sends them from its own task,
so `publish` never waits on the network. A message larger than a frame (the first call of
a long document: over ~600 blocks) goes in pieces of a frame each, put together by
the receivers once all have arrived; one over `max_message_bytes` is dropped and counted
(`oversized`), as are pieces whose message never completes (`incomplete`): a peer then
misses one placement, which costs it a recomputed prefix at worst, never a wrong answer.
Delivery is at most once and unordered across publishers, as the router's peer protocol
allows. (A router of a plait release before pieces reads a frame only up to its first piece:
while engines of both kinds run side by side, the older ones miss the rest of such frames.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from orchestrator import StoreError
from orchestrator.ext import Notifier

_log = logging.getLogger("plait.router")
ROUTER_CHANNEL = "plait_router"
_LEN = struct.Struct("<I")
_PIECE = 0x8000_0000
"""Set in an item's length: the item is a piece of a larger message."""
_PIECE_HEAD = struct.Struct("<8sIHH")  # link, message number, index, count
_PARTIAL = 64
"""Messages in pieces a receiver waits to complete at once (the oldest is dropped)."""


class NotifierRouterLink:
    """A router link over `notifier` on `channel` (one per router; routers of one model
    share a channel). `async with` it, then give it to `Router(peers=...)`."""

    def __init__(
        self,
        notifier: Notifier,
        channel: str = ROUTER_CHANNEL,
        *,
        frame_bytes: int = 5_000,
        max_message_bytes: int = 1 << 20,
    ) -> None:
        if frame_bytes <= _LEN.size + _PIECE_HEAD.size:
            raise ValueError(f"frame_bytes={frame_bytes} leaves no room for a message")
        if max_message_bytes > 0xFFFF * (frame_bytes - _LEN.size - _PIECE_HEAD.size):
            raise ValueError(
                f"max_message_bytes={max_message_bytes} needs more than 65,535 pieces of "
                f"frame_bytes={frame_bytes}"
            )
        self.notifier = notifier
        self.channel = channel
        self.frame_bytes = frame_bytes
        self.max_message_bytes = max_message_bytes
        self._id = secrets.token_bytes(8)
        self._numbers = 0
        self._partial: OrderedDict[tuple[bytes, int], list[bytes | None]] = OrderedDict()
        self.partial_bytes = 0
        """Bytes of pieces kept until the rest of their message arrives."""
        self._deliver: Callable[[bytes], None] | None = None
        self._queue: list[tuple[int, bytes]] = []  # (0 or _PIECE, the item)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.frames = 0
        self.received = 0
        self.oversized = 0
        self.pieced = 0
        """Messages sent in pieces."""
        self.incomplete = 0
        """Messages in pieces dropped before all their pieces arrived."""
        self.failed = 0

    async def __aenter__(self) -> NotifierRouterLink:
        await self.notifier.listen(self.channel, self._heard)
        self._task = asyncio.get_running_loop().create_task(self._send(), name="plait-router-link")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.notifier.unlisten(self.channel, self._heard)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- the RouterLink protocol ---------------------------------------------------------------

    def publish(self, message: bytes) -> None:
        if len(message) + _LEN.size <= self.frame_bytes:
            self._queue.append((0, message))
        elif len(message) > self.max_message_bytes:
            self.oversized += 1
            return
        else:
            self._queue.extend((_PIECE, piece) for piece in self._pieces(message))
            self.pieced += 1
        self._wake.set()

    def _pieces(self, message: bytes) -> list[bytes]:
        room = self.frame_bytes - _LEN.size - _PIECE_HEAD.size
        count = -(-len(message) // room)
        if count > 0xFFFF:
            raise ValueError(f"a message of {len(message)} bytes in more than 65,535 pieces")
        self._numbers = number = (self._numbers + 1) & 0xFFFF_FFFF
        return [
            _PIECE_HEAD.pack(self._id, number, i, count) + message[i * room : (i + 1) * room]
            for i in range(count)
        ]

    def subscribe(self, deliver: Callable[[bytes], None]) -> None:
        self._deliver = deliver

    # --- inside ----------------------------------------------------------------------------------

    async def _send(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            queue, self._queue = self._queue, []
            for frame in _frames(queue, self.frame_bytes):
                try:
                    await self.notifier.notify(self.channel, base64.b64encode(frame).decode())
                except StoreError as exc:  # peers miss these placements; routing goes on
                    self.failed += 1
                    _log.warning("router placements not sent to peers: %s", exc)
                    continue
                self.frames += 1
            # Each message is whole, or its last piece ends it.
            self.sent += sum(flag == 0 or _ends(item) for flag, item in queue)

    def _heard(self, payload: str) -> None:
        deliver = self._deliver
        if deliver is None or not payload:
            return
        try:
            frame = base64.b64decode(payload, validate=True)
        except ValueError:
            return  # not ours
        at = 0
        while at + _LEN.size <= len(frame):
            (size,) = _LEN.unpack_from(frame, at)
            at += _LEN.size
            piece = size & _PIECE
            size &= ~_PIECE
            if at + size > len(frame):
                return
            item = frame[at : at + size]
            at += size
            if piece:
                whole = self._piece(item)
                if whole is None:
                    continue
                item = whole
            self.received += 1
            deliver(item)

    def _piece(self, item: bytes) -> bytes | None:
        """Keep a piece; the whole message once its last piece is in. A message announced
        larger than `max_message_bytes` is refused (counted `incomplete`), and the pieces
        kept are bounded: at most `_PARTIAL` messages and 4 x `max_message_bytes`."""
        if len(item) < _PIECE_HEAD.size:
            return None
        link, number, index, count = _PIECE_HEAD.unpack_from(item)
        data = item[_PIECE_HEAD.size :]
        key = (link, number)
        pieces = self._partial.get(key)
        if index >= count or (count - 1) * len(data) > self.max_message_bytes:
            if pieces is not None:
                self._drop(key)
            self.incomplete += 1
            return None
        if pieces is None or len(pieces) != count:
            if pieces is not None:
                self._drop(key)
            pieces = self._partial[key] = [None] * count
        if pieces[index] is None:
            self.partial_bytes += len(data)
        else:
            self.partial_bytes += len(data) - len(pieces[index] or b"")
        pieces[index] = data
        if all(p is not None for p in pieces):
            self._drop(key)
            return b"".join(p for p in pieces if p is not None)
        while self._partial and (
            len(self._partial) > _PARTIAL or self.partial_bytes > 4 * self.max_message_bytes
        ):
            self._drop(next(iter(self._partial)))
            self.incomplete += 1
        return None

    def _drop(self, key: tuple[bytes, int]) -> None:
        pieces = self._partial.pop(key)
        self.partial_bytes -= sum(len(p) for p in pieces if p is not None)


def _ends(piece: bytes) -> bool:
    _, _, index, count = _PIECE_HEAD.unpack_from(piece)
    return bool(index == count - 1)


def _frames(items: list[tuple[int, bytes]], limit: int) -> list[bytes]:
    """Length-prefixed items (the length's top bit set for pieces) packed into frames of at
    most `limit` bytes."""
    frames: list[bytes] = []
    current = bytearray()
    for flag, message in items:
        piece = _LEN.pack(len(message) | flag) + message
        if current and len(current) + len(piece) > limit:
            frames.append(bytes(current))
            current = bytearray()
        current += piece
    if current:
        frames.append(bytes(current))
    return frames
