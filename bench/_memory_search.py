"""Memory search latency over many facts: p50 and p99 of `Memory.search`, one query at a time.

The facts are generated (a deterministic seed): a vocabulary of made-up words, each fact a
dict of eight words drawn with Zipf-like frequencies (a few words are common, most rare), as
text in memory tends to be; queries are two words from the same distribution, so some hit
thousands of facts. All facts are in one tenant's scope, the search's own, which is the
worst case: scope filtering removes nothing.

Usage: python bench/_memory_search.py [--quick] [--facts N] [--queries N] [--url URL]
(--quick: 20,000 facts; no --url: a SQLite file in a temporary directory). Prints a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _results
from sqlalchemy.ext.asyncio import create_async_engine

from memory import Memory, Scope, SQLStore

SEED = 20261110
VOCABULARY = 5000
WORDS_PER_FACT = 8
BATCH = 5000
SCOPE = Scope(tenant="bench", agent="analyst")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    """Distinct made-up words and cumulative Zipf weights (1/rank) for drawing them."""
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        words["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4)))] = None
    return list(words), list(itertools.accumulate(1 / rank for rank in range(1, VOCABULARY + 1)))


def facts(count: int, rng: random.Random) -> list[tuple[str, str, Any]]:
    words, weights = vocabulary(rng)
    return [
        (
            f"topic{i % 20}",
            f"fact{i}",
            {"text": " ".join(rng.choices(words, cum_weights=weights, k=WORDS_PER_FACT)), "n": i},
        )
        for i in range(count)
    ]


def queries(count: int, rng: random.Random) -> list[str]:
    words, weights = vocabulary(rng)
    return [" ".join(rng.choices(words, cum_weights=weights, k=2)) for _ in range(count)]


def _percentile(sorted_ms: list[float], p: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(p * len(sorted_ms)))]


async def measure(url: str, facts: int = 100_000, queries: int = 500) -> dict[str, Any]:
    """Fill a fresh store at `url` (a SQLite path or URL; on PostgreSQL a schema of its own,
    dropped afterwards) with `facts` facts, then time `queries` searches."""
    schema = None if "postgresql" not in url else f"plait_bench_memory_{uuid.uuid4().hex[:8]}"
    store = SQLStore(url, schema=schema)
    try:
        async with store:
            return await _measure(Memory(store), facts, queries)
    finally:
        if schema is not None:
            await _drop_schema(store, schema)


async def _measure(memory: Memory, count: int, searches: int) -> dict[str, Any]:
    rows = facts(count, random.Random(SEED))
    started = time.perf_counter()
    for start in range(0, len(rows), BATCH):
        await memory.remember_many(rows[start : start + BATCH], scope=SCOPE)
    fill_s = time.perf_counter() - started
    asked = queries(searches, random.Random(SEED))  # the same vocabulary: words that occur
    timings, hits = await _search_all(memory, asked)
    out: dict[str, Any] = {
        "facts": count,
        "queries": searches,
        "queries_with_hits": hits,
        "p50_ms": round(_percentile(timings, 0.50), 3),
        "p99_ms": round(_percentile(timings, 0.99), 3),
        "max_ms": round(timings[-1], 3),
        "fill_s": round(fill_s, 2),
        "store": memory.store.url.get_backend_name(),
    }
    if out["store"] == "postgresql":
        # The figures above are right after the bulk fill, before PostgreSQL has statistics
        # of the table (its planner then scans every match). A running service has them:
        # autovacuum analyzes a table once a tenth of it changed. Measured again after the
        # ANALYZE autovacuum would run, as a separate figure.
        async with memory.store.engines[0].begin() as conn:
            await conn.exec_driver_sql("ANALYZE plait_memory")
        again, _ = await _search_all(memory, asked)
        out["p50_ms_analyzed"] = round(_percentile(again, 0.50), 3)
        out["p99_ms_analyzed"] = round(_percentile(again, 0.99), 3)
    return out


async def _search_all(memory: Memory, asked: list[str]) -> tuple[list[float], int]:
    timings: list[float] = []
    hits = 0
    for query in asked:
        started = time.perf_counter()
        found = await memory.search(query, scope=SCOPE)
        timings.append((time.perf_counter() - started) * 1000)
        hits += bool(found)
    timings.sort()
    return timings, hits


async def _drop_schema(store: SQLStore, schema: str) -> None:
    engine = create_async_engine(store.url)  # not a store: opening one would migrate
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 facts")
    parser.add_argument("--facts", type=int, default=None)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--url", default=None, help="a store URL (default: a temporary SQLite)")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    count = args.facts or (20_000 if args.quick else 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or str(Path(tmp) / "memory.db")
        figures = asyncio.run(measure(url, count, args.queries))
    print(json.dumps(figures))
    # The result file is named for the store's kind, not its URL.
    store = "sqlite" if args.url is None else args.url.split(":", 1)[0].split("+")[0]
    _results.save("_memory_search", figures, parser, args, argv, ignore=("url",), label=store)


if __name__ == "__main__":
    main()
