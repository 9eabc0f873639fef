"""Store bytes per finished task before and after compaction, and what compacting costs: the
overhead graphs of bench/durability.py run durably (SQLite, PostgreSQL), then
`store.compact()` and `store.collect_garbage()`.

    python bench/compaction.py --quick
    python bench/compaction.py --only sqlite

Bytes are the store's own count (`Store.size()`: event data plus payloads), not the file or
table size: SQLite reuses freed pages without shrinking its file (VACUUM does), PostgreSQL
reclaims space at its next VACUUM. A table goes to stdout, progress to stderr, and the last
line of stdout is one JSON object with `store_bytes_per_task_sqlite`,
`store_bytes_per_task_after_compaction_sqlite` (and `_postgres`) averaged over the graphs,
and `compact_us_per_task_*`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _graphs import Graph, scenario  # noqa: E402
from durability import PG_URL, SIZES, _drop_schema, _workflows  # noqa: E402


@dataclass
class Compaction:
    tasks: int
    bytes_before: int
    bytes_after: int
    events_before: int
    events_after: int
    compact_s: float

    @property
    def per_task(self) -> tuple[float, float]:
        return self.bytes_before / self.tasks, self.bytes_after / self.tasks


async def measure(graphs: list[Graph], store_kind: str) -> Compaction:
    """Run `graphs` durably into a fresh store, then compact every run and collect."""
    from memory import SQLStore
    from orchestrator import Engine

    tmp = tempfile.TemporaryDirectory() if store_kind == "sqlite" else None
    schema = None if tmp else f"plait_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    store = SQLStore(Path(tmp.name) / "plait.db") if tmp else SQLStore(PG_URL, schema=schema)
    try:
        async with store:
            async with Engine(store=store) as engine:
                results = await asyncio.gather(*(engine.run(wf) for wf in _workflows(graphs)))
            if any(r.status != "succeeded" for r in results):
                raise RuntimeError("a workflow did not succeed")
            before = await store.size()
            start = perf_counter()
            compacted = await store.compact()
            await store.collect_garbage()
            seconds = perf_counter() - start
            after = await store.size()
            assert compacted == len(graphs)
            return Compaction(
                tasks=sum(len(g) for g in graphs),
                bytes_before=before.event_bytes + before.payload_bytes,
                bytes_after=after.event_bytes + after.payload_bytes,
                events_before=before.events,
                events_after=after.events,
                compact_s=seconds,
            )
    finally:
        if schema is not None:
            await _drop_schema(schema)
        if tmp is not None:
            tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs")
    parser.add_argument("--only", default="sqlite,postgres", help="stores to measure")
    parser.add_argument("--seed", type=int, default=0)
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    stores = [s for s in ("sqlite", "postgres") if s in args.only.split(",")]
    rows: dict[str, dict[str, Compaction]] = {}
    for kind, size in SIZES["quick" if args.quick else "full"].items():
        graphs = scenario(kind, size, args.seed)
        for store in stores:
            print(f"compaction {kind} {size} {store}", file=sys.stderr)
            rows.setdefault(kind, {})[store] = asyncio.run(measure(graphs, store))

    print(f"{'graph':<11}{'store':<10}{'B/task':>8}{'after':>8}{'events/task':>13}{'us/task':>9}")
    for kind, by_store in rows.items():
        for store, c in by_store.items():
            before, after = c.per_task
            events = f"{c.events_before / c.tasks:.1f}->{c.events_after / c.tasks:.1f}"
            us = c.compact_s / c.tasks * 1e6
            print(f"{kind:<11}{store:<10}{before:>8.0f}{after:>8.0f}{events:>13}{us:>9.1f}")

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 1) if values else None

    summary: dict[str, object] = {"quick": args.quick}
    for store in stores:
        done = [r[store] for r in rows.values()]
        summary[f"store_bytes_per_task_{store}"] = mean([c.per_task[0] for c in done])
        summary[f"store_bytes_per_task_after_compaction_{store}"] = mean(
            [c.per_task[1] for c in done]
        )
        summary[f"compact_us_per_task_{store}"] = mean([c.compact_s / c.tasks * 1e6 for c in done])
    print(json.dumps(summary))
    _results.save("compaction", summary, parser, args, argv)


if __name__ == "__main__":
    main()
