"""Paced prefill: a long uncached prompt computed in pieces before the call that needs it.

A server's step carries every running request's prefill chunk, up to its token budget
(vLLM's `max_num_batched_tokens`, 8,192 by default), so one batch call with a 3,000-token
document in front makes every urgent decode step beside it ~0.1 s long. The router can keep
such steps short without any server support: before the call it sends the prompt's prefix
in pieces of at most `tokens` new tokens, each a request for one token whose only effect is
to leave the piece in the server's prefix cache; the call then finds all but its last piece
cached. A piece is sent once per replica however many calls share it (the calls of one
document wait on the same pieces).

Blocks here are the router's (`block_tokens` tokens, of four characters without a
tokenizer), so a piece ends on a block boundary of the rendered prompt, cut inside the
message that straddles it. With a real tokenizer the cut falls near, not exactly on, a
server block boundary: the last block of each piece may be computed twice.
"""

from __future__ import annotations

import asyncio
import dataclasses

from orchestrator import Hints, LLMRequest, Message

from ._simtext import header


def prefix_request(request: LLMRequest, chars: int) -> LLMRequest | None:
    """A one-token request whose rendered prompt begins with the first `chars` characters of
    `request`'s (None if they end inside the markup before the first message's content)."""
    kept: list[Message] = []
    start = 0
    for message in request.messages:
        head = len(header(message.role))  # as `render` marks it up
        end = start + head + len(message.content) + 1
        if end >= chars:
            cut = chars - start - head
            if cut < 0 and not kept:
                return None
            kept.append(
                dataclasses.replace(message, content=message.content[: max(0, cut)], tool_calls=())
            )
            break
        kept.append(message)
        start = end
    return LLMRequest(
        messages=tuple(kept),
        model=request.model,
        max_tokens=1,
        extra_headers=request.extra_headers,
    )


def piece_ends(held: int, total: int, piece: int) -> list[int]:
    """Block counts at which the pieces end, for a prompt of `total` blocks of which the
    first `held` are cached: multiples of `piece` (so calls that share a prefix name the same
    pieces), while more than `piece` blocks would be left for the call itself."""
    ends: list[int] = []
    done = held
    while total - done > piece:
        done = (done // piece + 1) * piece
        ends.append(done)
    return ends


class Piece:
    """One piece in flight: whoever needs it waits, and learns whether it landed."""

    __slots__ = ("_done", "landed")

    def __init__(self) -> None:
        self._done = asyncio.Event()
        self.landed = False

    async def wait(self) -> bool:
        await self._done.wait()
        return self.landed


class Pieces:
    """The pieces in flight, per replica and last block hash: a second call that needs one
    waits for the first call's request instead of sending it again."""

    def __init__(self) -> None:
        self._flying: dict[tuple[int, int], Piece] = {}
        self.sent = 0
        """Pieces sent."""
        self.shared = 0
        """Pieces a call waited for instead of sending."""

    def waiting(self, replica: int, last: int) -> Piece | None:
        return self._flying.get((replica, last))

    def start(self, replica: int, last: int) -> Piece:
        piece = Piece()
        self._flying[(replica, last)] = piece
        self.sent += 1
        return piece

    def finish(self, replica: int, last: int, piece: Piece, *, landed: bool) -> None:
        if self._flying.get((replica, last)) is piece:
            del self._flying[(replica, last)]
        piece.landed = landed
        piece._done.set()


def priming_hints(hints: Hints) -> Hints:
    """A piece's hints: the call's, except that it is not the program's last call and asks
    for one token."""
    return dataclasses.replace(hints, last_call=False, expected_output_tokens=1)
