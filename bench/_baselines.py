"""Reference runners for the overhead benchmark: plain asyncio, LangGraph and Ray.

Every runner takes a *scenario*, a list of graphs that are started together (one graph for
the chain/fanout/DAG cases, many small ones for the concurrent case), runs a no-op task per
node while honouring dependencies, and returns a :class:`Timing`. Setup that a real
deployment pays once (process start, ``ray.init``, worker warm-up) is kept outside the
timed region; per-workflow setup that is not the run itself (LangGraph's compile) is timed
separately as ``build_s``.
"""

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from types import TracebackType
from typing import Any, TypedDict

from _graphs import Graph, sinks


@dataclass(frozen=True)
class Timing:
    """Wall seconds of one measured scenario."""

    run_s: float
    # Time to turn the graphs into the runner's own representation; None where the runner
    # has no separate build step (plain asyncio, Ray submit tasks as part of running).
    build_s: float | None = None


# --------------------------------------------------------------------------- asyncio


async def _noop() -> None:
    return None


async def _asyncio_node(deps: list[asyncio.Task[None]]) -> None:
    # Awaiting an already finished task returns at once, so checking predecessors one by
    # one costs no more than gathering them and allocates no extra future.
    for dep in deps:
        await dep
    await _noop()


async def _asyncio_scenario(graphs: list[Graph]) -> float:
    start = perf_counter()
    every: list[asyncio.Task[None]] = []
    for graph in graphs:
        tasks: list[asyncio.Task[None]] = []
        for preds in graph:
            tasks.append(asyncio.create_task(_asyncio_node([tasks[p] for p in preds])))
        every.extend(tasks)
    await asyncio.gather(*every)
    return perf_counter() - start


def run_asyncio(graphs: list[Graph]) -> Timing:
    """Lower bound: one bare asyncio.Task per node, nothing else (no state, no tracking)."""
    return Timing(run_s=asyncio.run(_asyncio_scenario(graphs)))


# ------------------------------------------------------------------------- LangGraph


class _LGState(TypedDict, total=False):
    # LangGraph requires a state schema; no node writes to it, so one unused key suffices.
    x: int


async def _lg_noop(state: _LGState) -> None:
    # Returning None means "no state update"; LangGraph still fires the outgoing edges.
    return None


def _lg_compile(graph: Graph, checkpointer: Any = None) -> Any:
    """One StateGraph node per task; ``checkpointer`` (a LangGraph saver) makes it durable."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(_LGState)
    for i in range(len(graph)):
        builder.add_node(f"t{i}", _lg_noop)
    for i, preds in enumerate(graph):
        if not preds:
            builder.add_edge(START, f"t{i}")
        elif len(preds) == 1:
            builder.add_edge(f"t{preds[0]}", f"t{i}")
        else:
            # A list of sources becomes a barrier channel: the node runs once, after all of
            # them. Separate single edges would instead run it once per predecessor step.
            builder.add_edge([f"t{p}" for p in preds], f"t{i}")
    for i in sinks(graph):
        builder.add_edge(f"t{i}", END)
    return builder.compile(checkpointer=checkpointer)


async def _lg_scenario(compiled: list[Any], limits: list[int]) -> float:
    start = perf_counter()
    await asyncio.gather(
        *(
            app.ainvoke({"x": 0}, {"recursion_limit": limit})
            for app, limit in zip(compiled, limits, strict=True)
        )
    )
    return perf_counter() - start


def run_langgraph(graphs: list[Graph]) -> Timing:
    """LangGraph StateGraph, one node per task; compile timed as build, ainvoke as run."""
    start = perf_counter()
    compiled = [_lg_compile(graph) for graph in graphs]
    build_s = perf_counter() - start
    # Pregel counts supersteps, and a chain of n tasks needs n of them; the default limit
    # (25) would abort long graphs with GraphRecursionError.
    limits = [len(graph) + 10 for graph in graphs]
    return Timing(run_s=asyncio.run(_lg_scenario(compiled, limits)), build_s=build_s)


# ------------------------------------------------------------------------------- Ray


def _ray_noop(*deps: None) -> None:
    # Ray resolves ObjectRef arguments before calling, so by the time this body runs every
    # predecessor has finished; the values themselves are unused.
    return None


class RayBaseline:
    """Local Ray cluster started once for all Ray measurements (start-up is not timed)."""

    def __init__(self, num_cpus: int = 2) -> None:
        self.num_cpus = num_cpus
        self._remote: Any = None

    def __enter__(self) -> "RayBaseline":
        import ray

        ray.init(
            # "local" always starts a private cluster, even if RAY_ADDRESS points elsewhere:
            # a shared or remote cluster would measure something else.
            address="local",
            num_cpus=self.num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        self._remote = ray.remote(_ray_noop)
        # Workers start lazily; without a warm-up the first measurement would include
        # spawning worker processes and importing into them.
        ray.get([self._remote.remote() for _ in range(200)])
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import ray

        try:
            ray.shutdown()
        except Exception as err:  # a failed shutdown must not hide the benchmark output
            print(f"ray.shutdown failed: {err!r}", file=sys.stderr)

    def run(self, graphs: list[Graph]) -> Timing:
        """Submit every node with its predecessors' refs as arguments, then wait on sinks."""
        import ray

        remote = self._remote
        start = perf_counter()
        waits: list[Any] = []
        for graph in graphs:
            refs: list[Any] = []
            for preds in graph:
                refs.append(remote.remote(*[refs[p] for p in preds]))
            # Every node is an ancestor of some sink, so the sinks finishing means all did.
            waits.extend(refs[i] for i in sinks(graph))
        ray.get(waits)
        return Timing(run_s=perf_counter() - start)


Runner = Callable[[list[Graph]], Timing]
