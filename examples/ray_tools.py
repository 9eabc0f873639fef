"""Count primes on a Ray cluster: CPU-heavy tool tasks that declare what they hold.

    python examples/ray_tools.py                  # starts a private one-machine Ray
    python examples/ray_tools.py 127.0.0.1:6379   # a running cluster (`ray start --head`)

A `primes` tool counts the primes in one slice of a range by trial division, as a Ray task
holding one CPU; the workflow has one tool task per slice and a local function that adds
their counts up. The engine stays in this process; only `count_primes` and each slice's
bounds go to the cluster (pickled by value from `__main__`, so the workers need nothing of
this file), and each count comes back as the tool task's result. A slice whose worker dies
is run again by Ray (twice), then by the task's `retry=`. See docs/ray.md.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

from agents import Tool
from executors import RayCluster, RayRunner
from orchestrator import Engine, RunResult, TaskContext, Workflow


def count_primes(start: int, stop: int) -> int:
    """Count the primes in [start, stop), by trial division (CPU-heavy on purpose)."""
    return sum(
        1 for n in range(max(start, 2), stop) if all(n % d for d in range(2, math.isqrt(n) + 1))
    )


primes = Tool("primes", count_primes, runner=RayRunner(num_cpus=1, max_retries=2))


def add_up(ctx: TaskContext) -> int:
    return sum(ctx.inputs.values())


def count(limit: int, slices: int) -> Workflow:
    """Count the primes below `limit` in `slices` tool tasks on the cluster."""
    wf = Workflow("primes")
    step = math.ceil(limit / slices)
    bounds = [(i * step, min(limit, (i + 1) * step)) for i in range(slices)]
    for i, (start, stop) in enumerate(bounds):
        wf.add(f"slice{i}", primes.call({"start": start, "stop": stop}), retry=2)
    wf.add("total", add_up, after=[f"slice{i}" for i in range(slices)])
    return wf


LIMIT = 300_000


async def main(address: str = "local", limit: int = LIMIT, slices: int = 8) -> RunResult:
    # "local" starts a Ray of this process's own, without its dashboard.
    options = {"include_dashboard": False} if address == "local" else {}
    async with RayCluster(address, options=options) as cluster:
        cpus = (await cluster.resources()).get("CPU", 0)
        print(f"Ray cluster at {address}: {cpus:g} CPUs")
        async with Engine() as engine:
            return await engine.run(count(limit, slices))


if __name__ == "__main__":
    began = time.perf_counter()
    result = asyncio.run(main(*sys.argv[1:2])).raise_for_status()
    print(f"{result['total']} primes below {LIMIT:,} in {time.perf_counter() - began:.1f} s")
