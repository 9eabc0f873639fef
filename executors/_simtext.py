"""Text as the simulated server sees it: a chat template, tokens, block hashes, and output.

A token is four characters (the usual rule of thumb for English with BPE), so prompts that
begin with the same text begin with the same tokens and the same blocks, which is all that
prefix caching needs. Hashes are blake2b, so runs are identical across processes.
"""

from __future__ import annotations

import hashlib
import math
import random
import zlib
from collections.abc import Iterable

from orchestrator import Message

CHARS_PER_TOKEN = 4

_SYLLABLES = tuple(
    f"{w:<4}"[:4]
    for w in (
        "the ", "data", "gpu ", "kv  ", "row ", "cach", "e an", "d so", " on ", "plan",
        "sql ", "tool", "call", "node", "edge", "wait", "fast", "late", "next", "step",
    )
)  # fmt: skip


def render(messages: Iterable[Message]) -> str:
    """The prompt text, ending with the assistant header like `add_generation_prompt`.

    A reply appended to this text, then a newline and the next message, renders the next
    turn's prompt: so the next turn's prompt starts with this prompt plus the reply.
    """
    parts = [f"<|{m.role}|>\n{m.content}\n" for m in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def count_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def block_hashes(text: str, block_size: int, *, parent: int = 0) -> list[int]:
    """Chained hashes of the full blocks of `text` (block i's hash covers blocks 0..i).

    Each block's content is summarised by two C checksums (crc32 and adler32: 64 bits),
    chained through the hash of an int tuple, which Python does not salt: so the same text
    gives the same hashes in every process. Cryptographic strength is not needed here, and
    this is the simulator's hottest loop (a 60k-token agent context is 4,000 blocks).
    """
    span = block_size * CHARS_PER_TOKEN
    data = text.encode()
    if len(data) != len(text):  # non-ASCII: blocks are counted in characters
        data = text.encode("utf-32-le")
        span *= 4
    return chained_hashes(data, span, parent)


def chained_hashes(data: bytes, span: int, parent: int = 0) -> list[int]:
    """Chained hashes of the full `span`-byte chunks of `data`."""
    out: list[int] = []
    prev = parent
    crc, adler = zlib.crc32, zlib.adler32
    for i in range(0, len(data) - span + 1, span):
        chunk = data[i : i + span]
        prev = hash((prev, crc(chunk), adler(chunk)))
        out.append(prev)
    return out


def generate(seed: int, prompt_hash: int, tokens: int) -> str:
    """Deterministic output of exactly `tokens` tokens for a prompt."""
    rng = random.Random(seed * 1_000_003 + prompt_hash)
    return "".join(rng.choice(_SYLLABLES) for _ in range(tokens))


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
