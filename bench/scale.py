"""Beyond one machine (issue 13, docs/scaling.md): engines sharing one PostgreSQL store.

Part 1, real processes on this machine: throughput of no-op and of tool-heavy workflows
with 1, 2 and 3 engine processes (`bench/_scale_engine.py`, each an `Engine(cluster=...)`,
each submitting its share of the same total), in workflows per second from "go" to the
last "done". No-op: a chain of 4 no-op steps, so what is measured is the engine and the
store. Tool-heavy: 4 tool calls of 50 ms each and a join, on each engine's "tools" limit of
64: what one engine can have in flight bounds it, and each engine adds its own.

Part 2, take-over: engine A runs workflows of three 1 s steps, engine B only takes runs
over; A is killed with SIGKILL mid-run. Reported: seconds from the kill until B claimed A's
first and last unfinished run (target: within twice the lease), until every workflow had
finished, and from the store whether any was lost or finished twice.

Part 3, the simulated cluster (bench/scale_sim.py): 64 replicas and 8 engines in virtual
time, and the router's cost per call.

    python bench/scale.py --quick     # ~8 minutes, 6 of them the simulated cluster
    python bench/scale.py --no-sim    # parts 1 and 2 at full size: ~5 minutes
    python bench/scale.py             # and the simulated cluster at full size: hours

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402

PG = os.environ.get("PLAIT_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Child:
    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process

    async def line(self, within_s: float = 300) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(within_s):
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    raise RuntimeError(f"engine {self.name} exited ({self.process.returncode})")
                text = raw.decode().strip()
                if text:
                    return text

    async def send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode() + b"\n")
        await self.process.stdin.drain()

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def spawn(store: str, name: str, kind: str, count: int, lease_s: float) -> Child:
    script = _BENCH / "_scale_engine.py"
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), "--store", store, "--engine-id", name, "--kind", kind,
        "--count", str(count), "--lease-s", str(lease_s),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    child = Child(name, process)
    ready = await child.line()
    if ready != "ready":
        raise RuntimeError(f"engine {name} said {ready!r}")
    return child


class Schema:
    """A PostgreSQL schema of its own per measurement, dropped afterwards."""

    def __init__(self) -> None:
        self.name = f"plait_scale_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    def url(self) -> str:
        return PG.replace("postgresql://", "postgresql+asyncpg://", 1) + f"?schema={self.name}"

    async def fetch(self, sql: str) -> list[Any]:
        conn = await asyncpg.connect(PG)
        try:
            await conn.execute(f"SET search_path TO {self.name}")
            return list(await conn.fetch(sql))
        finally:
            await conn.close()

    async def drop(self) -> None:
        conn = await asyncpg.connect(PG)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        finally:
            await conn.close()


async def throughput(kind: str, engines: int, total: int) -> dict[str, Any]:
    schema = Schema()
    children: list[Child] = []
    try:
        share = [total // engines + (i < total % engines) for i in range(engines)]
        for i in range(engines):
            children.append(await spawn(schema.url(), f"e{i + 1}", kind, share[i], 30.0))
        started = time.perf_counter()
        await asyncio.gather(*(c.send("go") for c in children))
        done = [await c.line() for c in children]
        wall = time.perf_counter() - started
        finished = sum(int(d.split()[1]) for d in done)
        failed = sum(int(d.split()[3]) for d in done)
        rows = await schema.fetch("SELECT status, count(*) AS n FROM plait_workflows GROUP BY 1")
        stored = {r["status"]: r["n"] for r in rows}
        return {
            "kind": kind,
            "engines": engines,
            "workflows": total,
            "wall_s": round(wall, 3),
            "per_s": round(finished / wall, 1),
            "failed": failed,
            "stored": stored,
        }
    finally:
        await asyncio.gather(*(c.stop() for c in children))
        await schema.drop()


async def takeover(count: int, lease_s: float) -> dict[str, Any]:
    schema = Schema()
    victim = survivor = None
    try:
        victim = await spawn(schema.url(), "a", "slow", count, lease_s)
        survivor = await spawn(schema.url(), "b", "slow", 0, lease_s)
        await asyncio.gather(victim.send("go"), survivor.send("go"))
        assert (await survivor.line()).startswith("claimed 0")
        # Kill once every run has started and none has finished (three 1 s steps).
        while True:
            rows = await schema.fetch(
                "SELECT count(*) AS n FROM plait_events WHERE kind = 'task_succeeded'"
            )
            if rows[0]["n"] >= count // 2:
                break
            await asyncio.sleep(0.05)
        victim.process.send_signal(signal.SIGKILL)
        killed = time.time()
        await victim.process.wait()
        left = await schema.fetch("SELECT id FROM plait_workflows WHERE status = 'running'")
        orphans = len(left)
        first = last = None
        while True:
            claimed, at = (await survivor.line(within_s=10 * lease_s + 60)).split()[1:3]
            first = first if first is not None else float(at) - killed
            if int(claimed) >= orphans:
                last = float(at) - killed
                break
        while True:
            rows = await schema.fetch(
                "SELECT count(*) AS n FROM plait_workflows WHERE status = 'running'"
            )
            if rows[0]["n"] == 0:
                break
            await asyncio.sleep(0.05)
        all_done = time.time() - killed
        statuses = await schema.fetch(
            "SELECT status, owner, count(*) AS n FROM plait_workflows GROUP BY 1, 2"
        )
        finishes = await schema.fetch(
            "SELECT workflow_id, count(*) AS n FROM plait_events "
            "WHERE kind = 'workflow_finished' GROUP BY 1"
        )
        succeeded = sum(r["n"] for r in statuses if r["status"] == "succeeded")
        return {
            "workflows": count,
            "lease_s": lease_s,
            "orphans": orphans,
            "first_claim_s": round(first, 3),
            "takeover_s": round(last, 3),
            "all_finished_s": round(all_done, 3),
            "succeeded": succeeded,
            "lost": count - len(finishes),
            "finished_twice": sum(1 for r in finishes if r["n"] > 1),
            "owners": {f"{r['status']}/{r['owner']}": r["n"] for r in statuses},
        }
    finally:
        for child in (victim, survivor):
            if child is not None:
                await child.stop()
        await schema.drop()


def table(rows: Sequence[dict[str, Any]]) -> None:
    print(f"{'workflows':<10} {'engines':>7} {'count':>6} {'wall s':>7} {'per s':>8} {'vs 1':>6}")
    base: dict[str, float] = {}
    for r in rows:
        base.setdefault(r["kind"], r["per_s"])
        ratio = r["per_s"] / base[r["kind"]]
        print(
            f"{r['kind']:<10} {r['engines']:>7} {r['workflows']:>6} {r['wall_s']:>7.2f} "
            f"{r['per_s']:>8.1f} {ratio:>6.2f}"
        )


async def processes(quick: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = []
    for kind, total in (("noop", 600 if quick else 3000), ("tools", 600 if quick else 3000)):
        for engines in (1, 2, 3):
            log(f"part 1: {total} {kind} workflows on {engines} engine(s)")
            rows.append(await throughput(kind, engines, total))
            log(f"  {rows[-1]['per_s']} workflows/s")
    lease = 2.0 if quick else 5.0
    log(f"part 2: take-over, lease {lease} s")
    over = await takeover(100 if quick else 300, lease)
    log(f"  {over}")
    return rows, over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sim", action="store_true", help="skip part 3")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows, over = asyncio.run(processes(args.quick))
    print("\nPart 1: engines on one PostgreSQL store, this machine (2 cores)")
    table(rows)
    print(
        f"\nPart 2: take-over of {over['orphans']} runs after SIGKILL (lease {over['lease_s']} s):"
        f" first claimed after {over['first_claim_s']:.2f} s, all after "
        f"{over['takeover_s']:.2f} s (target <= {2 * over['lease_s']:.1f} s); all finished "
        f"after {over['all_finished_s']:.2f} s; lost {over['lost']}, finished twice "
        f"{over['finished_twice']}"
    )
    figures: dict[str, Any] = {}
    for kind in ("noop", "tools"):
        for r in rows:
            if r["kind"] == kind:
                suffix = "" if kind == "noop" else "_tools"
                figures[f"throughput{suffix}_{r['engines']}"] = r["per_s"]
    figures["takeover_s"] = over["takeover_s"]
    figures["takeover_first_s"] = over["first_claim_s"]
    figures["takeover_lease_s"] = over["lease_s"]
    figures["takeover_lost"] = over["lost"]
    figures["takeover_finished_twice"] = over["finished_twice"]
    if not args.no_sim:
        import scale_sim

        log("part 3: the simulated cluster")
        figures.update(scale_sim.run(args.quick, seed=args.seed))
    figures["quick"] = args.quick
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures, separators=(",", ":")))
    _results.save("scale", figures, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
