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
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from orchestrator import Message

CHARS_PER_TOKEN = 4
_GENERATION_PROMPT = "<|assistant|>\n"

_SYLLABLES = tuple(
    f"{w:<4}"[:4]
    for w in (
        "the ", "data", "gpu ", "kv  ", "row ", "cach", "e an", "d so", " on ", "plan",
        "sql ", "tool", "call", "node", "edge", "wait", "fast", "late", "next", "step",
    )
)  # fmt: skip


_rendered: tuple[tuple[object, str], ...] = ()


def header(role: str) -> str:
    """The markup before a message's content in `render` (its content is followed by a
    newline)."""
    return f"<|{role}|>\n"


def render(messages: Iterable[Message]) -> str:
    """The prompt text, ending with the assistant header like `add_generation_prompt`
    (`_GENERATION_PROMPT`; each message is its content and 6 characters of markup).

    A reply appended to this text, then a newline and the next message, renders the next
    turn's prompt: so the next turn's prompt starts with this prompt plus the reply.
    """
    # A call's messages are rendered by the router, then by the simulated server: the same
    # tuple (immutable), so the latest few are answered from memory.
    global _rendered
    if isinstance(messages, tuple):
        for seen, text in _rendered:
            if seen is messages:
                return text
    parts = [f"{header(m.role)}{m.content}\n" for m in messages]
    parts.append(_GENERATION_PROMPT)
    text = "".join(parts)
    if isinstance(messages, tuple):
        _rendered = (*_rendered[-3:], (messages, text))
    return text


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
    if text.isascii():
        return chained_hashes(text.encode(), span, parent)
    # Non-ASCII: blocks are counted in characters, and each is hashed as the ASCII path would
    # hash it where it is ASCII (else as UTF-32), so a block's hash does not depend on the
    # text after it: a prompt's ASCII prefix has the same hashes alone and in the prompt.
    out: list[int] = []
    prev = parent
    for i in range(0, len(text) - span + 1, span):
        chunk = text[i : i + span]
        data = chunk.encode() if chunk.isascii() else chunk.encode("utf-32-le")
        (prev,) = chained_hashes(data, len(data), prev)
        out.append(prev)
    return out


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


# `rng.choice(_SYLLABLES)` draws `getrandbits(5)`, the top 5 bits of the generator's next
# 32-bit word, until one is under 20. Drawn in bulk instead: the top byte of each word
# shifted right by 3, the bytes of 160 and up (values 20-31) dropped.
_TOP5 = bytes(b >> 3 for b in range(256))
_REJECT = bytes(range(len(_SYLLABLES) << 3, 256))


def generate(seed: int, prompt_hash: int, tokens: int) -> str:
    """Deterministic output of exactly `tokens` tokens for a prompt: the same text as
    `"".join(rng.choice(_SYLLABLES) for _ in range(tokens))`, made faster."""
    rng = random.Random(seed * 1_000_003 + prompt_hash)
    codes = b""
    while len(codes) < tokens:
        words = (tokens - len(codes)) * 8 // 5 + 16  # 20 of 32 values are kept
        data = rng.getrandbits(32 * words).to_bytes(4 * words, "little")
        codes += data[3::4].translate(_TOP5, _REJECT)
    return "".join(map(_SYLLABLES.__getitem__, codes[:tokens]))


CHAT_MEMO_BLOCKS = 2_000_000
"""Block hashes `chat_block_hashes` remembers, over all the conversations it has seen."""

_Body = tuple[tuple[str, str], ...]
# (role, content) of a conversation's messages -> its rendered length without the generation
# prompt, and the hashes of that text's full blocks (of one block size); least recent first.
_chat_memo: OrderedDict[tuple[_Body, int], tuple[int, tuple[int, ...]]] = OrderedDict()
_chat_memo_blocks = 0


def chat_block_hashes(messages: Sequence[Message], text: str, block_size: int) -> list[int]:
    """`block_hashes(text, block_size)` for a `text` that starts with `render(messages)`.

    The same list, computed faster for a conversation that grows: the rendered messages
    without the trailing generation prompt are a prefix of every longer conversation's
    (a turn appends a reply and the next message), so only the blocks after the longest
    conversation prefix seen lately are hashed. A 60k-token agent context is 4,000 blocks,
    of which a turn adds a few hundred."""
    if not text.isascii():
        return block_hashes(text, block_size)
    span = block_size * CHARS_PER_TOKEN
    body = tuple((m.role, m.content) for m in messages)
    start = 0
    head: tuple[int, ...] = ()
    # A turn usually appends two messages (a reply, then a tool result or the next question).
    for k in range(len(body), max(0, len(body) - 4), -1):
        found = _chat_memo.get((body[:k], block_size))
        if found is not None:
            _chat_memo.move_to_end((body[:k], block_size))
            length, head = found
            start = length - length % span
            break
    hashes: list[int] = list(head)
    hashes += chained_hashes(text[start:].encode(), span, hashes[-1] if hashes else 0)
    length = sum(len(role) + len(content) for role, content in body) + 6 * len(body)
    _remember((body, block_size), length, tuple(hashes[: length // span]))
    return hashes


def _remember(key: tuple[_Body, int], length: int, hashes: tuple[int, ...]) -> None:
    global _chat_memo_blocks
    old = _chat_memo.pop(key, None)
    if old is not None:
        _chat_memo_blocks -= len(old[1])
    _chat_memo[key] = (length, hashes)
    _chat_memo_blocks += len(hashes)
    while _chat_memo_blocks > CHAT_MEMO_BLOCKS and _chat_memo:
        _, (_, dropped) = _chat_memo.popitem(last=False)
        _chat_memo_blocks -= len(dropped)


def salted(hashes: Sequence[int], salt: str | None) -> list[int]:
    """Block hashes in `salt`'s namespace: each is hashed again with the salt, so prompts
    with different salts share no block while each salt's hashes stay chained (block i's
    still covers blocks 0..i), as vLLM's `cache_salt` enters its first block's hash. No
    salt: the hashes as they are."""
    if not salt:
        return list(hashes)
    key = text_hash(salt)
    return [hash((key, h)) for h in hashes]


def text_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
