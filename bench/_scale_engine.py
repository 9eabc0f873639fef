"""One engine process of bench/scale.py: an `Engine(cluster=...)` on the shared PostgreSQL
store. It says "ready" once its engine is up, waits for "go" on stdin, submits its share of
workflows, awaits them, and says "done <count> <seconds>"; with --count 0 it only takes
runs over (its leases claim what a dead engine left) and says "claimed <n>" each time.
It stops on SIGTERM or when stdin closes."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

from _scale_work import build  # noqa: E402

from memory import SQLStore  # noqa: E402
from orchestrator import Cluster, Engine, Limits, Registry  # noqa: E402


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--engine-id", required=True)
    parser.add_argument("--kind", default="noop")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--lease-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    cluster = Cluster(lease_s=args.lease_s, engine_id=args.engine_id, registry=Registry())
    limits = {"tools": Limits(max_in_flight=64)}
    async with (
        SQLStore(args.store) as store,
        Engine(store=store, cluster=cluster, limits=limits) as engine,
    ):
        assert engine.leases is not None
        print("ready", flush=True)
        if (await reader.readline()).strip() != b"go":
            return 0
        if args.count:
            started = time.perf_counter()
            handles = [
                engine.submit(build(args.kind, f"{args.kind}-{args.engine_id}-{i}"))
                for i in range(args.count)
            ]
            results = [await h.result() for h in handles]
            took = time.perf_counter() - started
            failed = sum(not r.ok for r in results)
            print(f"done {len(results) - failed} {took:.4f} {failed}", flush=True)
        else:
            print(f"claimed {engine.leases.stats.claimed}", flush=True)
            seen = 0
            while not stop.is_set():
                engine.leases.claimed.clear()
                wait = asyncio.ensure_future(engine.leases.claimed.wait())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait((wait, stopping), return_when=asyncio.FIRST_COMPLETED)
                wait.cancel()
                stopping.cancel()
                if engine.leases.stats.claimed != seen:
                    seen = engine.leases.stats.claimed
                    print(f"claimed {seen} {time.time():.4f}", flush=True)
        await stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
