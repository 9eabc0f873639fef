"""Routers of engines in different processes, linked through a `Notifier` (PostgreSQL
LISTEN/NOTIFY or Redis pub/sub): what one router publishes (where it placed a prompt, when
a call ended) reaches the others in a few milliseconds.

Messages are small (a few dozen bytes, plus 8 per block a request added): the link packs
those published within one turn of the loop into frames of at most `frame_bytes` (under
PostgreSQL's 8,000-byte NOTIFY payload once base64-encoded) and sends them from its own task,
so `publish` never waits on the network. A message larger than a frame is dropped and
counted (`oversized`): a peer then misses one placement, which costs it a recomputed prefix
at worst, never a wrong answer. Delivery is at most once and unordered across publishers,
as the router's peer protocol allows.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
from collections.abc import Callable
from typing import Any

from orchestrator import Notifier, StoreError

_log = logging.getLogger("plait.router")
ROUTER_CHANNEL = "plait_router"
_LEN = struct.Struct("<I")


class NotifierRouterLink:
    """A router link over `notifier` on `channel` (one per router; routers of one model
    share a channel). `async with` it, then give it to `Router(peers=...)`."""

    def __init__(
        self, notifier: Notifier, channel: str = ROUTER_CHANNEL, *, frame_bytes: int = 5_000
    ) -> None:
        self.notifier = notifier
        self.channel = channel
        self.frame_bytes = frame_bytes
        self._deliver: Callable[[bytes], None] | None = None
        self._queue: list[bytes] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.frames = 0
        self.received = 0
        self.oversized = 0
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
        if len(message) + _LEN.size > self.frame_bytes:
            self.oversized += 1
            return
        self._queue.append(message)
        self._wake.set()

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
            self.sent += len(queue)

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
            if at + size > len(frame):
                return
            self.received += 1
            deliver(frame[at : at + size])
            at += size


def _frames(messages: list[bytes], limit: int) -> list[bytes]:
    """Length-prefixed messages packed into frames of at most `limit` bytes."""
    frames: list[bytes] = []
    current = bytearray()
    for message in messages:
        piece = _LEN.pack(len(message)) + message
        if current and len(current) + len(piece) > limit:
            frames.append(bytes(current))
            current = bytearray()
        current += piece
    if current:
        frames.append(bytes(current))
    return frames
