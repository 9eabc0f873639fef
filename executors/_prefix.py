"""A prompt's prefix as chained block hashes: what routing and grouping compare.

Block i's hash covers blocks 0..i, so two prompts share their first k hashes exactly when
they share their first k blocks. With a tokenizer the blocks are of real tokens (match the
server's KV block size and the hashes line up with its cache); without one they are of
characters, four to a token, which is close enough to tell prompts apart by prefix.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from orchestrator import LLMRequest

from ._simtext import block_hashes, chained_hashes, render

Tokenize = Callable[[str], Sequence[int]]
"""Text to token ids, e.g. `AutoTokenizer.from_pretrained(...).encode`."""


def token_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full `block_size`-token blocks of `tokens` (8 bytes a token)."""
    return chained_hashes(array("q", tokens).tobytes(), block_size * 8)


def prompt_hashes(
    request: LLMRequest, block_tokens: int, tokenize: Tokenize | None = None
) -> list[int]:
    """The chained block hashes of `request`'s rendered prompt."""
    text = render(request.messages)
    if tokenize is None:
        return block_hashes(text, block_tokens)
    return token_block_hashes(tokenize(text), block_tokens)
