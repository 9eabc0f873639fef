"""Planning a batch before it runs: which rows share a prefix, in what order to run them,
and which rows ask exactly the same LLM call. Pure: no clock, no I/O, no event loop.

Rows are sorted by their prompt text (the rendered messages; a workflow row by its values
in column order). In sorted order a prefix shared by several rows is shared by a run of
adjacent rows, as a trie's depth-first walk would visit them; so sending rows in that order
sends sharers together, while their prefix is in some replica's cache, and the longest
common prefix of each row with the one before it is exactly what that row can reuse. The
sum of those is what a cache of unlimited size would save (in characters, four a token).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..model._llm import LLMRequest
from ._rows import Row

CHARS_PER_TOKEN = 4
MIN_SHARED_TOKENS = 32
"""A row joins the group of the row before it when they share at least this many tokens."""


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The order rows run in and the figures of what they share.

    `order`: row indexes, sharers adjacent. `leaders`: row index -> the row whose identical
    call answers it (a duplicate runs no call of its own). `groups`: runs of adjacent rows
    sharing at least `MIN_SHARED_TOKENS` tokens of prefix beyond what all rows share.
    `prompt_tokens`: of every row's call; `shared_prefix_tokens`: of those, what an
    unlimited prefix cache serves (each distinct prefix computed once);
    `common_prefix_tokens`: the prefix all rows share."""

    order: tuple[int, ...]
    leaders: dict[int, int]
    groups: int
    largest_group: int
    prompt_tokens: int
    shared_prefix_tokens: int
    common_prefix_tokens: int

    @property
    def duplicates(self) -> int:
        return len(self.leaders)

    @property
    def bound_prompt_tokens(self) -> int:
        """The fewest prompt tokens any cache could compute for these calls."""
        return self.prompt_tokens - self.shared_prefix_tokens

    def figures(self) -> dict[str, int]:
        return {
            "rows": len(self.order),
            "groups": self.groups,
            "largest_group": self.largest_group,
            "duplicates": self.duplicates,
            "prompt_tokens": self.prompt_tokens,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "common_prefix_tokens": self.common_prefix_tokens,
            "bound_prompt_tokens": self.bound_prompt_tokens,
        }


def prompt_text(row: Row) -> str:
    """What a row's calls begin with, as text to compare: its rendered messages, else (a
    workflow row) its values in column order, which is where a factory usually takes its
    shared parts from (the document, then the question)."""
    if row.request is not None:
        return "".join(f"<|{m.role}|>\n{m.content}\n" for m in row.request.messages)
    return "\n".join(str(v) for k, v in row.data.items() if k not in ("custom_id", "id"))


def call_key(request: LLMRequest) -> str:
    """Identical calls have equal keys: model, messages, sampling, length, tools, schema."""
    return json.dumps(
        [
            request.model,
            [[m.role, m.content, m.name] for m in request.messages],
            [request.sampling.temperature, request.sampling.top_p, request.sampling.seed],
            list(request.sampling.stop),
            request.max_tokens,
            [t.name for t in request.tools],
            None if request.output is None else request.output.name,
            dict(request.extra_body),
        ],
        sort_keys=True,
        default=str,
    )


def plan(rows: Sequence[Row], *, dedup: bool = True) -> BatchPlan:
    """Order `rows` so that sharers are adjacent, and find duplicates and shared prefixes.
    Rows that could not be read go first (they fail at once and cost nothing). A duplicate
    is an identical call that would give the same answer: sampled calls (temperature above
    0 without a seed) are each asked, as are all with `dedup` False."""
    texts = {row.index: prompt_text(row) for row in rows if row.error is None}
    broken = [row.index for row in rows if row.error is not None]
    ordered = sorted(texts, key=lambda i: (texts[i], i))
    leaders: dict[int, int] = {}
    first_of: dict[str, int] = {}
    by_index = {row.index: row for row in rows}
    for i in ordered:
        request = by_index[i].request
        if request is None or not dedup or not deterministic(request):
            continue
        leader = first_of.setdefault(call_key(request), i)
        if leader != i:
            leaders[i] = leader
    lcps = [_common_prefix(texts[a], texts[b]) for a, b in itertools.pairwise(ordered)]
    common = min(lcps, default=0)
    # A group shares more than what every row shares (one system prompt is not a group).
    groups = 1 if ordered else 0
    largest = size = groups
    for lcp in lcps:
        if lcp - common >= MIN_SHARED_TOKENS * CHARS_PER_TOKEN:
            size += 1
        else:
            groups, size = groups + 1, 1
        largest = max(largest, size)
    shared = sum(lcps)
    total = sum(len(t) for t in texts.values())
    return BatchPlan(
        order=tuple(broken + ordered),
        leaders=leaders,
        groups=groups,
        largest_group=largest,
        prompt_tokens=_tokens(total),
        shared_prefix_tokens=_tokens(shared),
        common_prefix_tokens=_tokens(common) if len(ordered) > 1 else 0,
    )


def deterministic(request: LLMRequest) -> bool:
    """Whether asking again gives the same answer: greedy, or sampled with a seed."""
    return request.sampling.temperature == 0 or request.sampling.seed is not None


def _common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))  # noqa: RUF071 - strings, not paths


def _tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)
