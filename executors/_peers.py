"""Routers of several engines in front of the same replicas, telling each other what they placed.

Each engine has its own `Router`. Alone, each would model every replica's prefix cache (and
balance recent work) from its own calls only: a program whose calls come from two engines
(after a take-over, or behind a load balancer that spreads requests) would find its context
unknown to the second, and every model would miss what the others' calls put in and pushed
out of the caches. So each router publishes every placement on a `RouterLink` and applies
its peers' (`PrefixRouter.observe`): all of them then hold about one model.

A placement is a few dozen bytes plus 8 per block the request added past the longest
prefix some replica holds (a conversation's turn carries only its own blocks); when the call
returns, its router says so in 18 bytes (`Served`). Until then the call's blocks push
nothing out of the models (it may wait behind many others at its replica), and it counts
as in flight there in every router's loads. A transport may be anything that moves bytes:
`LocalRouterHub` for routers in one process (tests, the simulated cluster), PostgreSQL
LISTEN/NOTIFY or Redis pub/sub between processes. Delivery may be late, lost, repeated or
out of order between peers: a repeat is dropped, a placement whose prefix no replica holds
here moves only its key and work (`PrefixRouter.unresolved`), a call whose end is never
heard is taken as served once `HEARD` later calls were, and the models drift apart by what
was lost until the replicas' caches turn over.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ._routing import Placement, PrefixRouter

HEARD = 65_536
"""Peers' placements remembered (by origin and number), to drop one delivered twice; and
peers' calls remembered in flight (the oldest is taken as served when there are more)."""


@runtime_checkable
class RouterLink(Protocol):
    """A channel between the routers of several engines. One link per router; a router
    subscribes when it is built and enters the link (if it is an async context manager,
    e.g. to hold a connection) when it is entered."""

    def publish(self, message: bytes) -> None:
        """Send `message` to the other routers on the link. Must not block: a transport
        that waits on a network queues the message and sends it from its own task."""
        ...

    def subscribe(self, deliver: Callable[[bytes], None]) -> None:
        """Call `deliver` with every message another router publishes, on the event loop
        (this router's own may come back too: it drops them)."""
        ...


_HEAD = struct.Struct("<cB8sQIqIHHI")
_VERSION = 1
_NO_KEY = 0xFFFF
_SWAP = sys.byteorder != "little"


@dataclass(frozen=True, slots=True)
class Placed:
    """One placement as it travels: `replica` by name (each engine lists its replicas in
    its own order), `origin` and `seq` to drop repeats and this router's own messages."""

    origin: bytes
    seq: int
    replica: str
    placement: Placement
    urgent: bool = False
    """An urgent (interactive) call's: peers keep urgent lanes by every engine's calls."""
    kind: Literal["placed"] = "placed"

    def to_bytes(self) -> bytes:
        p = self.placement
        name = self.replica.encode()
        key = p.prefix_key.encode() if p.prefix_key is not None else b""
        if len(name) >= _NO_KEY or len(key) >= _NO_KEY:
            raise ValueError("a replica name or prefix key of 64 KiB or more cannot be sent")
        tail = array("q", p.tail)
        if _SWAP:
            tail.byteswap()
        head = _HEAD.pack(
            b"U" if self.urgent else b"P",
            _VERSION,
            self.origin,
            self.seq,
            p.computed,
            p.base,
            p.base_blocks,
            len(name),
            len(key) if p.prefix_key is not None else _NO_KEY,
            len(tail),
        )
        return b"".join((head, name, key, tail.tobytes()))

    @classmethod
    def from_bytes(cls, data: bytes, replica: int = -1) -> Placed:
        """Decode a message; its placement names `replica` (the receiver's index for
        `Placed.replica`). Raises ValueError for anything that is not a placement."""
        try:
            kind, version, origin, seq, computed, base, base_blocks, n_name, n_key, n_tail = (
                _HEAD.unpack_from(data)
            )
        except struct.error as exc:
            raise ValueError(f"not a router message ({len(data)} bytes)") from exc
        if kind not in (b"P", b"U") or version != _VERSION:
            raise ValueError(f"not a placement of version {_VERSION}: {kind!r} {version}")
        at = _HEAD.size
        key_len = 0 if n_key == _NO_KEY else n_key
        end = at + n_name + key_len + 8 * n_tail
        if len(data) != end:
            raise ValueError(f"a placement of {len(data)} bytes where {end} were announced")
        name = data[at : at + n_name].decode()
        at += n_name
        key = None if n_key == _NO_KEY else data[at : at + key_len].decode()
        at += key_len
        tail = array("q")
        tail.frombytes(data[at:end])
        if _SWAP:
            tail.byteswap()
        placement = Placement(replica, tuple(tail), computed, base, base_blocks, key)
        return cls(origin, seq, name, placement, urgent=kind == b"U")


_SERVED = struct.Struct("<cB8sQ")


@dataclass(frozen=True, slots=True)
class Served:
    """The call placed as `seq` by `origin` has returned: its blocks now count against the
    replica's cache, and it is no longer in flight there."""

    origin: bytes
    seq: int
    kind: Literal["served"] = "served"

    def to_bytes(self) -> bytes:
        return _SERVED.pack(b"S", _VERSION, self.origin, self.seq)

    @classmethod
    def from_bytes(cls, data: bytes) -> Served:
        try:
            kind, version, origin, seq = _SERVED.unpack(data)
        except struct.error as exc:
            raise ValueError(f"not a router message ({len(data)} bytes)") from exc
        if kind != b"S" or version != _VERSION:
            raise ValueError(f"not a served message of version {_VERSION}: {kind!r} {version}")
        return cls(origin, seq)


RouterMessage = Placed | Served
"""Everything routers send each other."""


def decode(data: bytes) -> RouterMessage:
    """A message from its bytes (ValueError if it is none)."""
    if data[:1] == b"S":
        return Served.from_bytes(data)
    return Placed.from_bytes(data)


@dataclass(frozen=True, slots=True)
class PeerStats:
    """What a router sent and heard on its link."""

    published: int
    received: int
    applied: int
    unresolved: int
    """Placements that extended a request not known here: key and work applied, blocks not."""
    repeated: int
    dropped: int
    """Malformed, or on a replica this router does not have."""
    in_flight: int = 0
    """Peers' calls placed and not yet served, by what was heard."""


class Peering:
    """A router's side of its link: publishes its placements and their ends, applies its
    peers' to its policy, and counts their calls in flight at each replica."""

    def __init__(self, link: RouterLink, policy: PrefixRouter, names: Sequence[str]) -> None:
        self.link = link
        self.policy = policy
        self.names = list(names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self.origin = os.urandom(8)
        self._seq = itertools.count()
        self._heard: OrderedDict[tuple[bytes, int], None] = OrderedDict()
        # Peers' calls placed and not yet served: their replica, and the placement as
        # applied here (None if it could not be).
        self._calls: OrderedDict[tuple[bytes, int], tuple[int, Placement | None, bool]] = (
            OrderedDict()
        )
        self.in_flight = [0] * len(self.names)
        """Peers' calls in flight at each replica, as heard."""
        self.batch_in_flight = [0] * len(self.names)
        """Of those, the calls that are not urgent."""
        self.urgent_in_flight = 0
        """Peers' urgent (interactive) calls in flight, all replicas together."""
        self._published = self._received = self._applied = 0
        self._unresolved = self._repeated = self._dropped = 0
        link.subscribe(self.receive)

    def placed(self, placement: Placement, urgent: bool = False) -> int:
        """Tell the peers; returns the number to say it was `served` by."""
        seq = next(self._seq)
        name = self.names[placement.replica]
        self.link.publish(Placed(self.origin, seq, name, placement, urgent).to_bytes())
        self._published += 1
        return seq

    def served(self, seq: int) -> None:
        self.link.publish(Served(self.origin, seq).to_bytes())

    def receive(self, data: bytes) -> None:
        """A peer's message: apply its placement to the policy, or its end."""
        try:
            message = decode(data)
        except ValueError:
            self._dropped += 1
            return
        if message.origin == self.origin:
            return
        call = (message.origin, message.seq)
        if isinstance(message, Served):
            self._end(call)  # a repeat finds nothing left to do
            return
        if call in self._heard:
            self._repeated += 1
            return
        self._heard[call] = None
        if len(self._heard) > HEARD:
            self._heard.popitem(last=False)
        self._received += 1
        replica = self._index.get(message.replica)
        if replica is None:
            self._dropped += 1
            return
        p = message.placement
        applied: Placement | None = Placement(
            replica, p.tail, p.computed, p.base, p.base_blocks, p.prefix_key
        )
        assert applied is not None
        try:
            observed = self.policy.observe(applied, pending=True)
        except ValueError:  # inconsistent with this router's model: not applied
            self._dropped += 1
            return
        if observed:
            self._applied += 1
        else:
            self._unresolved += 1
            applied = None
        self._calls[call] = (replica, applied, message.urgent)
        self.in_flight[replica] += 1
        if message.urgent:
            self.urgent_in_flight += 1
        else:
            self.batch_in_flight[replica] += 1
        if len(self._calls) > HEARD:  # its end was lost, or it runs very long
            self._end(next(iter(self._calls)))

    def _end(self, call: tuple[bytes, int]) -> None:
        known = self._calls.pop(call, None)
        if known is None:
            return
        replica, applied, urgent = known
        self.in_flight[replica] -= 1
        if urgent:
            self.urgent_in_flight -= 1
        else:
            self.batch_in_flight[replica] -= 1
        if applied is not None:
            self.policy.served(applied)

    def stats(self) -> PeerStats:
        return PeerStats(
            self._published,
            self._received,
            self._applied,
            self._unresolved,
            self._repeated,
            self._dropped,
            len(self._calls),
        )


class LocalRouterHub:
    """Links routers in one process: what one publishes reaches every other `link()`,
    `delay_s` later on the running loop's clock (a network's propagation; on a virtual
    clock, virtual seconds), each message once and in the order it was published.
    Without a running loop, or with no delay, a message is delivered at once."""

    def __init__(self, delay_s: float = 0.002) -> None:
        if delay_s < 0:
            raise ValueError(f"LocalRouterHub(delay_s={delay_s}) must not be negative")
        self.delay_s = delay_s
        self._links: list[LocalRouterLink] = []
        self.messages = 0
        self.bytes = 0

    def link(self) -> LocalRouterLink:
        link = LocalRouterLink(self)
        self._links.append(link)
        return link

    def _send(self, sender: LocalRouterLink, message: bytes) -> None:
        self.messages += 1
        self.bytes += len(message)
        receivers = [link for link in self._links if link is not sender and link.deliver]
        if not receivers:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.delay_s == 0:
            _deliver(receivers, message)
        else:
            loop.call_later(self.delay_s, _deliver, receivers, message)


def _deliver(receivers: list[LocalRouterLink], message: bytes) -> None:
    for link in receivers:
        for deliver in link.deliver:
            deliver(message)


class LocalRouterLink:
    """One router's end of a `LocalRouterHub`."""

    def __init__(self, hub: LocalRouterHub) -> None:
        self.hub = hub
        self.deliver: list[Callable[[bytes], None]] = []
        self.closed = False

    def publish(self, message: bytes) -> None:
        if not self.closed:
            self.hub._send(self, message)

    def close(self) -> None:
        """Leave the hub: publish nothing more, hear nothing more (as a process that died)."""
        self.closed = True
        self.deliver = []
        if self in self.hub._links:
            self.hub._links.remove(self)

    def subscribe(self, deliver: Callable[[bytes], None]) -> None:
        self.deliver.append(deliver)
