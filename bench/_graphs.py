"""Task-graph shapes for the overhead benchmark.

A graph is a DAG in topological order: ``preds[i]`` lists the predecessors of node ``i``,
each smaller than ``i``. Keeping graphs as plain index lists (rather than building any
runner's own structure) lets every runner translate the same shape itself, so that
translation can be timed, or excluded, per runner.
"""

import random

Graph = list[list[int]]


def chain(n: int) -> Graph:
    """Node i depends on node i-1: the longest possible critical path, no parallelism."""
    return [[]] + [[i - 1] for i in range(1, n)]


def fanout(n: int) -> Graph:
    """One source, n-2 parallel middle tasks, one sink that joins all of them."""
    if n < 3:
        raise ValueError("fanout needs at least 3 tasks")
    middle = list(range(1, n - 1))
    return [[]] + [[0] for _ in middle] + [middle]


def random_dag(n: int, seed: int, window: int = 1000, max_preds: int = 3) -> Graph:
    """Each node depends on 0..max_preds distinct earlier nodes drawn from the last ``window``.

    Drawing only from recent nodes keeps the graph deep and its ready set moderate, like a
    long-running pipeline, instead of collapsing into a shallow, very wide graph (which is
    what uniform choice over all earlier nodes tends to give).
    """
    rng = random.Random(seed)
    graph: Graph = []
    for i in range(n):
        k = min(rng.randint(0, max_preds), i)
        lo = max(0, i - window)
        graph.append(sorted(rng.sample(range(lo, i), k)))
    return graph


def scenario(kind: str, size: int | tuple[int, int], seed: int) -> list[Graph]:
    """The graphs of one benchmark scenario: `chain`, `fanout` or `dag` of `size` tasks (one
    graph), or `concurrent` (`size` = (workflows, tasks each))."""
    if kind == "concurrent" and isinstance(size, tuple):
        return concurrent(*size, seed)
    if isinstance(size, int):
        if kind == "chain":
            return [chain(size)]
        if kind == "fanout":
            return [fanout(size)]
        if kind == "dag":
            return [random_dag(size, seed)]
    raise ValueError(f"size {size!r} does not fit graph kind {kind!r}")


def concurrent(workflows: int, size: int, seed: int) -> list[Graph]:
    """Many small independent random DAGs, meant to be run at the same time."""
    # Derive each workflow's seed from one RNG so the whole set depends only on ``seed``.
    rng = random.Random(seed)
    return [random_dag(size, rng.randrange(2**32)) for _ in range(workflows)]


def sinks(graph: Graph) -> list[int]:
    """Nodes nothing depends on; waiting for all of them means the whole graph has run."""
    has_successor = [False] * len(graph)
    for preds in graph:
        for p in preds:
            has_successor[p] = True
    return [i for i, used in enumerate(has_successor) if not used]


def depth(graph: Graph) -> int:
    """Length of the critical path, in tasks."""
    level = [0] * len(graph)
    for i, preds in enumerate(graph):
        level[i] = 1 + max((level[p] for p in preds), default=0)
    return max(level, default=0)
