"""A prompt's prefix as chained block hashes: what routing and grouping compare.

Block i's hash covers blocks 0..i, so two prompts share their first k hashes exactly when
they share their first k blocks. With a tokenizer the blocks are of real tokens (match the
server's KV block size and the hashes line up with its cache); without one they are of
characters, four to a token, which is close enough to tell prompts apart by prefix.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Sequence

from orchestrator import LLMRequest, Message

from ._simtext import chained_hashes, chat_block_hashes, render, salted

Tokenize = Callable[[str], Sequence[int]]
"""Text to token ids, e.g. `AutoTokenizer.from_pretrained(...).encode`."""

MEMO_SIZE = 256
"""Prompts whose hashes are remembered. A call passes a grouper and then a router that hash
it with the same settings, one right after the other: a short memory is enough for the
second to be free, and it bounds what is kept (the key holds the messages, the value one
int per block)."""


def token_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full `block_size`-token blocks of `tokens` (8 bytes a token)."""
    return chained_hashes(array("q", tokens).tobytes(), block_size * 8)


def prompt_hashes(
    request: LLMRequest,
    block_tokens: int,
    tokenize: Tokenize | None = None,
    salt: str | None = None,
) -> tuple[int, ...]:
    """The chained block hashes of `request`'s rendered prompt, in the namespace of its
    cache `salt` (`Hints.cache_salt`: prompts of different salts share no prefix).

    Computed once per prompt and settings: the hashes depend only on the messages, so the
    latest `MEMO_SIZE` answers are kept and an equal request is answered from them."""
    hashes = _hashes(request.messages, block_tokens, _Identity(tokenize))
    return tuple(salted(hashes, salt)) if salt else hashes


class _Identity:
    """A tokenizer as a memo key: by identity, since a tokenizer object need not be hashable
    (and two equal ones may still tokenize differently). The memo holds it, so its id is
    not reused while its hashes are remembered."""

    __slots__ = ("fn",)

    def __init__(self, fn: Tokenize | None) -> None:
        self.fn = fn

    def __hash__(self) -> int:
        return id(self.fn)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.fn is self.fn


@functools.lru_cache(maxsize=MEMO_SIZE)
def _hashes(
    messages: tuple[Message, ...], block_tokens: int, tokenize: _Identity
) -> tuple[int, ...]:
    text = render(messages)
    if tokenize.fn is None:
        return tuple(chat_block_hashes(messages, text, block_tokens))
    return tuple(token_block_hashes(tokenize.fn(text), block_tokens))
