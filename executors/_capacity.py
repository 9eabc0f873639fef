"""What a serving engine says about its own size: its KV cache in tokens, its KV block and
how many sequences it runs at once, read into one backend-neutral `ServerCapacity`.

Pure functions of each server's answer, so each is pinned by a test on a sample of it, and
one probe that asks a server. Where each server says it, as checked in its source:

- vLLM: `GET /metrics`, the info gauge `vllm:cache_config_info` (value 1), emitted once the
  engine has profiled its memory (`vllm/v1/metrics/loggers.py`,
  `PrometheusStatLogger.log_metrics_info("cache_config", ...)`), one sample per engine
  (label `engine`: one per data-parallel rank). Its labels are every field of `CacheConfig`
  as text, "None" when unset (`vllm/config/cache.py`, `CacheConfig.metrics_info`):
  `block_size` (tokens per KV block), `num_gpu_blocks`, and in newer versions
  `kv_cache_size_tokens` (the engine's KV capacity in tokens, counted per KV group, which
  `num_gpu_blocks * block_size` is not for hybrid models) and `kv_cache_max_concurrency`
  (requests of `max_model_len` that fit: not a sequence limit). `max_num_seqs` is a
  `SchedulerConfig` field, which has no info gauge: vLLM does not publish it.
- SGLang: `GET /server_info` (`/get_server_info` before it was renamed; kept as a
  deprecated alias) in `python/sglang/srt/entrypoints/http_server.py`: the server's
  arguments (`page_size`, `max_running_requests`, `dp_size`), the scheduler's start-up
  answer (`max_total_num_tokens`: the KV pool of one data-parallel rank in tokens;
  `Scheduler.get_init_info`) and `internal_states`, one per data-parallel rank, each with
  `effective_max_running_requests_per_dp` (the running-batch cap the scheduler settled on).
- llama.cpp `llama-server`: `GET /props` (`tools/server/server-context.cpp`, `get_props`):
  `total_slots` (`--parallel`: sequences at once) and `default_generation_settings.n_ctx`
  (one slot's context; the whole KV cache with the unified cache `-np auto` uses, a slot's
  share of it otherwise), `n_ctx` at the top level in older versions. llama.cpp has no KV
  blocks.
- Dynamo's frontend and the OpenAI API say none of this.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator import (
    BackendError,
)
from orchestrator.ext import ServerCapacity

from ._load import parse_prometheus

MAX_KV_TOKENS = 10**10
"""More KV than any server holds (about 1.3 PB at Llama-8B's 128 KiB a token): a larger
figure is a broken or hostile answer, read as not said."""
MAX_BLOCK_TOKENS = 1 << 20
MAX_SEQS = 1 << 20

_CACHE_CONFIG = "vllm:cache_config_info"

Get = Callable[[str], Awaitable[str | None]]
"""Fetches a URL's body as text: None when the server answered with an error status (it
does not serve that path); raises `BackendError` when it did not answer at all."""
Reader = Callable[[str, str], ServerCapacity]


def capacity_from_metrics(text: str, source: str = "") -> ServerCapacity:
    """Read vLLM's `vllm:cache_config_info` from its Prometheus `/metrics` text.

    One sample per engine: KV tokens add up over engines (each data-parallel rank has its
    own cache), the block is theirs if they agree. An engine's tokens are its
    `kv_cache_size_tokens` where it says it, else `num_gpu_blocks` x `block_size`.
    """
    lines = [line for line in text.splitlines() if line.lstrip().startswith(_CACHE_CONFIG)]
    engines: dict[str, dict[str, str]] = {}
    for labels, _ in parse_prometheus("\n".join(lines)).get(_CACHE_CONFIG, []):
        engines.setdefault(labels.get("engine", ""), labels)  # a repeated engine counts once
    if not engines:
        return ServerCapacity()
    blocks = {_count(e.get("block_size"), MAX_BLOCK_TOKENS) for e in engines.values()}
    tokens = [_engine_tokens(e) for e in engines.values()]
    kv = _bounded(sum(t or 0 for t in tokens), MAX_KV_TOKENS) if all(tokens) else None
    block = blocks.pop() if len(blocks) == 1 else None
    return _said(ServerCapacity(kv_tokens=kv, block_tokens=block), source)


def _engine_tokens(labels: Mapping[str, str]) -> int | None:
    said = _count(labels.get("kv_cache_size_tokens"), MAX_KV_TOKENS)
    if said is not None:
        return said
    block = _count(labels.get("block_size"), MAX_BLOCK_TOKENS)
    count = _count(labels.get("num_gpu_blocks"), MAX_KV_TOKENS)
    return _bounded(block * count, MAX_KV_TOKENS) if block and count else None


def capacity_from_sglang(text: str, source: str = "") -> ServerCapacity:
    """Read SGLang's `/server_info` (or `/get_server_info`) JSON.

    `max_total_num_tokens` is one data-parallel rank's pool: the cache is `dp_size` of them.
    Sequences: the ranks' `effective_max_running_requests_per_dp` added up, else the
    `max_running_requests` argument (a total over the ranks)."""
    info = _json_object(text)
    if info is None:
        return ServerCapacity()
    ranks = _count(info.get("dp_size"), MAX_SEQS) or 1
    per_rank = _count(info.get("max_total_num_tokens"), MAX_KV_TOKENS)
    kv = _bounded(per_rank * ranks if per_rank else None, MAX_KV_TOKENS)
    block = _count(info.get("page_size"), MAX_BLOCK_TOKENS)
    states = info.get("internal_states")
    caps = (
        [_count(s.get("effective_max_running_requests_per_dp"), MAX_SEQS) for s in states]
        if isinstance(states, list) and states and all(isinstance(s, dict) for s in states)
        else []
    )
    seqs: int | None
    if caps and all(caps):
        seqs = _bounded(sum(c for c in caps if c is not None), MAX_SEQS)
    else:
        seqs = _count(info.get("max_running_requests"), MAX_SEQS)
    return _said(ServerCapacity(kv_tokens=kv, block_tokens=block, max_seqs=seqs), source)


def capacity_from_llamacpp(text: str, source: str = "") -> ServerCapacity:
    """Read llama.cpp's `/props` JSON: `total_slots` sequences at once, and a slot's
    context (`default_generation_settings.n_ctx`) as the KV cache: all of it with the
    unified cache (`-np auto`, the default), one slot's share otherwise, so never more
    than the server holds."""
    props = _json_object(text)
    if props is None:
        return ServerCapacity()
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    kv = _count(n_ctx if n_ctx is not None else props.get("n_ctx"), MAX_KV_TOKENS)
    seqs = _count(props.get("total_slots"), MAX_SEQS)
    return _said(ServerCapacity(kv_tokens=kv, max_seqs=seqs), source)


PROBES: Mapping[str, tuple[tuple[str, Reader], ...]] = {
    "vllm": (("/metrics", capacity_from_metrics),),
    "vllm-continuum": (("/metrics", capacity_from_metrics),),
    "sim": (("/metrics", capacity_from_metrics),),
    "sglang": (
        ("/server_info", capacity_from_sglang),
        ("/get_server_info", capacity_from_sglang),
    ),
    "llamacpp": (("/props", capacity_from_llamacpp),),
}
"""Where to ask a server of each dialect, in order: the first answer that says anything
is it. Dynamo's frontend and the OpenAI API say nothing, so they are not asked."""

KEEPS_KV = frozenset({"sglang", "sim", "vllm-continuum"})
"""Dialects whose servers keep a paused program's KV when plait asks (SGLang sessions, the
simulator's pins, vllm-continuum's pin after a tool call)."""


def combined(capacities: Sequence[ServerCapacity]) -> ServerCapacity:
    """Several servers used as one backend (a router's replicas): their KV caches and
    sequence limits add up (unknown if any one is), the block is theirs if they agree, and
    they keep paused programs' KV only if all of them do."""
    if not capacities:
        return ServerCapacity()
    kv = [c.kv_tokens for c in capacities]
    seqs = [c.max_seqs for c in capacities]
    blocks = {c.block_tokens for c in capacities}
    return ServerCapacity(
        kv_tokens=_bounded(sum(k or 0 for k in kv), MAX_KV_TOKENS) if all(kv) else None,
        block_tokens=blocks.pop() if len(blocks) == 1 else None,
        max_seqs=_bounded(sum(n or 0 for n in seqs), MAX_SEQS) if all(seqs) else None,
        source="; ".join(dict.fromkeys(c.source for c in capacities if c.source)),
        kv_from_config=any(c.kv_from_config for c in capacities),
        keeps_kv=all(c.keeps_kv for c in capacities),
    )


def cache_blocks(capacities: Sequence[ServerCapacity], block_tokens: int) -> int | None:
    """Each replica's KV cache in a router's blocks of `block_tokens` (the smallest
    replica's, so the router's model of eviction errs towards evicting early); None unless
    every replica's cache is known."""
    kv = [c.kv_tokens for c in capacities]
    if not kv or not all(kv):
        return None
    return max(1, min(k or 0 for k in kv) // block_tokens)


def router_block(capacities: Sequence[ServerCapacity], at_least: int = 16) -> int | None:
    """A router's prefix block for these replicas: their common KV block, times the least
    whole number that makes it `at_least` tokens (SGLang's page of one token would hash
    every token); None unless every replica says the same block."""
    blocks = {c.block_tokens for c in capacities}
    if len(blocks) != 1:
        return None
    block = blocks.pop()
    return None if block is None else block * -(-at_least // block)


_SAYS = {
    "vllm": "KV cache and block",
    "vllm-continuum": "KV cache and block",
    "sim": "KV cache and block",
    "sglang": "KV cache, page and running-request cap (max_in_flight where no limits are set)",
    "llamacpp": "context and slots (max_in_flight where no limits are set)",
}


def explain_capacity(dialect: str, root: str, kv_cache_tokens: int | None) -> str:
    """Where a backend of this dialect will learn its server's size, said without asking
    (`plait config check`): read from the server when the run starts, the configured
    `kv_cache_tokens`, or unknown."""
    fallback = f"kv_cache_tokens {kv_cache_tokens:,}" if kv_cache_tokens else None
    probes = PROBES.get(dialect, ())
    if probes:
        where = " or ".join(f"GET {root}{path}" for path, _ in probes)
        text = f"{_SAYS[dialect]} read from {where} as the run starts"
        text += f", else {fallback}" if fallback else ", else unknown (no kv_cache_tokens)"
    elif fallback:
        text = f"{fallback} ({dialect} servers do not say their own)"
    else:
        return f"unknown ({dialect} servers do not say it; set kv_cache_tokens)"
    if dialect in KEEPS_KV:
        return text + "; no hold-back: the server keeps paused programs' KV itself"
    known = "" if fallback else "where it is known, "
    return text + f"; {known}new programs are held back as paused ones fill it"


async def probe_capacity(get: Get, root: str, dialect: str) -> ServerCapacity | None:
    """Ask the server at `root` (no `/v1`) what it says of its size, where its dialect
    says it. None when it did not answer at all (down or unreachable: ask again later); a
    capacity of unknowns when it answered but said nothing, or its dialect says nothing.
    `keeps_kv` follows the dialect."""
    said = ServerCapacity()
    for path, read in PROBES.get(dialect, ()):
        url = root + path
        try:
            text = await get(url)
        except BackendError:
            return None
        if text is None:
            continue  # not served here (an older or newer server): the next place
        said = read(text, f"GET {url}")
        if said.source:
            break
    return replace(said, keeps_kv=dialect in KEEPS_KV)


def _said(capacity: ServerCapacity, source: str) -> ServerCapacity:
    """`capacity` with where it was read, if it says anything."""
    known = (capacity.kv_tokens, capacity.block_tokens, capacity.max_seqs)
    return replace(capacity, source=source) if any(v is not None for v in known) else capacity


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON (an HTML error page), or absurdly deep
        return None
    return data if isinstance(data, dict) else None


def _count(value: object, most: int) -> int | None:
    """A whole number from 1 to `most` as a server writes it (a JSON number, or label
    text such as "16"), else None: "None", NaN, fractions, negatives, bools, absurd sizes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _bounded(value, most)
    if isinstance(value, float):
        return _bounded(int(value), most) if value.is_integer() else None  # NaN, inf: not
    if isinstance(value, str):
        digits = value.strip()
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            return _bounded(int(digits), most)
    return None


def _bounded(value: int | None, most: int) -> int | None:
    return value if value is not None and 1 <= value <= most else None


DEFAULT_BLOCK_TOKENS = 16
"""A router's prefix block where its members do not say theirs (vLLM's default on GPUs)."""


@dataclass(frozen=True, slots=True)
class RouterSize:
    """How a router sizes its model of its replicas' caches: prompts are hashed in blocks
    of `block_tokens`, and each replica holds `cache_blocks` of them (None: unknown, so the
    model remembers what it sent and evicts nothing). `warnings`: what went wrong in
    deriving them, one line each, for the log."""

    block_tokens: int
    cache_blocks: int | None
    warnings: tuple[str, ...] = ()


def size_router(
    said: Mapping[str, ServerCapacity | None],
    *,
    block_tokens: int | None = None,
    cache_blocks_given: int | None = None,
) -> RouterSize:
    """A router's block and per-replica cache from what its members said (`said`, by
    member: None for one that did not answer in time or failed to), unless given.

    - The block: `block_tokens` where given; else `DEFAULT_BLOCK_TOKENS` where
      `cache_blocks_given` is (that count is in the router's blocks, so their size cannot
      move under it); else the block the members that say one agree on, made at least 16
      tokens (`router_block`); `DEFAULT_BLOCK_TOKENS` where none says one, and with a
      warning where they differ.
    - The cache: `cache_blocks_given` where given; else the smallest KV cache a member says
      (its server's, or its configured `kv_cache_tokens`) in those blocks, for every
      replica: one model's replicas are alike, and one that says nothing (down as the
      router starts) is taken to be like the others. None where no member says one.
    """
    warnings: list[str] = []
    known = {name: c for name, c in said.items() if c is not None}
    silent = [name for name, c in said.items() if c is None or c.kv_tokens is None]
    if block_tokens is not None:
        block = block_tokens
    elif cache_blocks_given is not None:
        block = DEFAULT_BLOCK_TOKENS
    else:
        blocks = {name: c.block_tokens for name, c in known.items() if c.block_tokens}
        common = router_block([ServerCapacity(block_tokens=b) for b in set(blocks.values())])
        if len(set(blocks.values())) > 1:
            sizes = ", ".join(f"{name} {b}" for name, b in blocks.items())
            warnings.append(
                f"the members' KV blocks differ ({sizes} tokens): prompts are hashed in "
                f"blocks of {DEFAULT_BLOCK_TOKENS}; give block_tokens to choose"
            )
        block = common or DEFAULT_BLOCK_TOKENS
    if cache_blocks_given is not None:
        return RouterSize(block, cache_blocks_given, tuple(warnings))
    sized = [c for c in known.values() if c.kv_tokens is not None]
    blocks_each = cache_blocks(sized, block) if sized else None
    if silent and blocks_each is not None:
        warnings.append(
            f"{', '.join(silent)} did not say its KV cache (down, or a server that does "
            f"not say it, with no kv_cache_tokens): taken as {blocks_each:,} blocks like "
            "the smallest of the others"
        )
    return RouterSize(block, blocks_each, tuple(warnings))
