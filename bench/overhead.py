"""Per-task orchestration overhead of no-op task graphs: plait vs asyncio, LangGraph, Ray.

Every task does nothing, so the measured time is pure scheduling and bookkeeping. Runners
are compared in microseconds per task, because the slow baselines are run on smaller
graphs to keep the benchmark short (LangGraph's cost per task grows somewhat with graph
size, so its figures are, if anything, flattering).

    python bench/overhead.py --quick
    python bench/overhead.py --only asyncio,plait --seed 1
    python bench/overhead.py --quick --only plait --tracing   # also traced (OpenTelemetry)

A table goes to stdout, progress and errors to stderr, and the last line of stdout is one
JSON object with the headline figures and a per-graph breakdown.
"""

import argparse
import asyncio
import gc
import importlib
import json
import statistics
import sys
import traceback
import tracemalloc
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

# Run as a script, only bench/ is on sys.path; the repository root is needed for
# ``orchestrator`` and bench/ for the helper modules when run as ``python -m bench.overhead``.
_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _baselines import RayBaseline, Timing, run_asyncio, run_langgraph  # noqa: E402
from _graphs import Graph, random_dag, scenario  # noqa: E402

RUNNERS = ("plait", "asyncio", "langgraph", "ray")
GRAPHS = ("chain", "fanout", "dag", "concurrent")
DAG100K = 100_000
# A scheduling bug that never completes a workflow should
# cost one null figure, not a benchmark that hangs forever.
PLAIT_RUN_TIMEOUT_S = 300.0

# Scenario sizes: an int is the task count of a single graph, a pair is
# (workflows, tasks per workflow) for the concurrent case. LangGraph and Ray cost
# ~0.3-1.3 ms per task on 2 cores, so they get smaller graphs than plait and asyncio.
Size = int | tuple[int, int]
SIZES: dict[str, dict[str, dict[str, Size]]] = {
    "quick": {
        "plait": {"chain": 2_000, "fanout": 2_000, "dag": 20_000, "concurrent": (200, 10)},
        "asyncio": {"chain": 2_000, "fanout": 2_000, "dag": 20_000, "concurrent": (200, 10)},
        "langgraph": {"chain": 1_000, "fanout": 1_000, "dag": 2_000, "concurrent": (100, 10)},
        "ray": {"chain": 2_000, "fanout": 2_000, "dag": 2_000, "concurrent": (100, 10)},
    },
    "full": {
        "plait": {"chain": 10_000, "fanout": 10_000, "dag": DAG100K, "concurrent": (1000, 10)},
        "asyncio": {"chain": 10_000, "fanout": 10_000, "dag": DAG100K, "concurrent": (1000, 10)},
        "langgraph": {"chain": 5_000, "fanout": 10_000, "dag": 10_000, "concurrent": (1000, 10)},
        "ray": {"chain": 10_000, "fanout": 10_000, "dag": 20_000, "concurrent": (1000, 10)},
    },
}


@dataclass(frozen=True)
class Measurement:
    graph: str
    runner: str
    tasks: int
    workflows: int
    timing: Timing

    @property
    def us_per_task(self) -> float:
        return self.timing.run_s / self.tasks * 1e6

    @property
    def build_us_per_task(self) -> float | None:
        if self.timing.build_s is None:
            return None
        return self.timing.build_s / self.tasks * 1e6


# ----------------------------------------------------------------------------- plait


async def _plait_noop(ctx: object) -> None:
    return None


def plait_workflow(workflow_cls: Any, graph: Graph, name: str) -> Any:
    wf = workflow_cls(name)
    for i, preds in enumerate(graph):
        wf.add(f"t{i}", _plait_noop, after=[f"t{p}" for p in preds])
    return wf


async def _plait_scenario(graphs: list[Graph]) -> Timing:
    from orchestrator import Engine, Workflow

    start = perf_counter()
    workflows = [plait_workflow(Workflow, g, f"wf{j}") for j, g in enumerate(graphs)]
    build_s = perf_counter() - start
    # Engine start-up and shutdown are one-off costs, like ray.init, so they stay untimed.
    async with Engine() as engine:
        start = perf_counter()
        runs = asyncio.gather(*(engine.run(wf) for wf in workflows))
        results = await asyncio.wait_for(runs, PLAIT_RUN_TIMEOUT_S)
        run_s = perf_counter() - start
    failed = [r.status for r in results if r.status != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} plait workflow(s) did not succeed: {failed[:5]}")
    return Timing(run_s=run_s, build_s=build_s)


def run_plait(graphs: list[Graph]) -> Timing:
    return asyncio.run(_plait_scenario(graphs))


def plait_bytes_per_pending_task(graph: Graph) -> float:
    """Traced memory growth of building (not running) a workflow, per task."""
    from orchestrator import Workflow

    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        wf = plait_workflow(Workflow, graph, "memory")
        gc.collect()  # count only what the workflow keeps alive, not collectable garbage
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del wf
    return (after - before) / len(graph)


def plait_available() -> bool:
    try:
        from orchestrator import Engine, Workflow  # noqa: F401
    except Exception as err:  # a broken checkout should cost one null figure, not the run
        print(
            f"plait unavailable, reporting null: import orchestrator failed: {err!r}",
            file=sys.stderr,
        )
        return False
    return True


# ---------------------------------------------------------------------------- driver


class GraphCache:
    """Builds each (shape, size) once so every runner of that size gets the same graph."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._cache: dict[tuple[str, Size], list[Graph]] = {}

    def get(self, kind: str, size: Size) -> list[Graph]:
        key = (kind, size)
        if key not in self._cache:
            self._cache[key] = self._make(kind, size)
        return self._cache[key]

    def _make(self, kind: str, size: Size) -> list[Graph]:
        return scenario(kind, size, self.seed)


def measure(
    runner_name: str,
    runner: Callable[[list[Graph]], Timing],
    kind: str,
    graphs: list[Graph],
    repeat: int,
) -> Measurement | None:
    """Best of ``repeat`` runs; None (after printing why) if the runner fails."""
    tasks = sum(len(g) for g in graphs)
    print(f"  {runner_name:<9} {kind:<10} {tasks:>7} tasks ...", file=sys.stderr, flush=True)
    best: Timing | None = None
    for _ in range(repeat):
        # Collect leftovers of the previous run so its garbage is not charged to this one.
        gc.collect()
        try:
            timing = runner(graphs)
        except Exception:
            print(f"{runner_name} failed on {kind}:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            return None
        if best is None or timing.run_s < best.run_s:
            best = timing
    assert best is not None
    return Measurement(kind, runner_name, tasks, len(graphs), best)


def warm_up(runner: Callable[[list[Graph]], Timing]) -> None:
    # First calls pay for imports and code-path warm-up that a long-lived service would not.
    # Errors are ignored here: the real measurement reports them.
    with suppress(Exception):
        runner([random_dag(50, 0)])


def run_benchmark(
    selected: list[str], quick: bool, seed: int, repeat: int, tracing: bool = False
) -> dict[str, Any]:
    sizes = SIZES["quick" if quick else "full"]
    cache = GraphCache(seed)
    results: dict[str, dict[str, Measurement | None]] = {g: {} for g in GRAPHS}
    extras: dict[str, float | None] = {"dag100k_s": None, "bytes_per_pending_task": None}

    with ExitStack() as stack:
        for name in selected:
            runner: Callable[[list[Graph]], Timing] | None
            print(f"[{name}]", file=sys.stderr, flush=True)
            if name == "asyncio":
                runner = run_asyncio
            elif name == "langgraph":
                runner = run_langgraph
            elif name == "plait":
                runner = run_plait if plait_available() else None
            else:
                try:
                    runner = stack.enter_context(RayBaseline(num_cpus=2)).run
                except Exception as err:
                    print(f"ray unavailable, reporting null: {err!r}", file=sys.stderr)
                    runner = None
            if runner is None:
                for kind in GRAPHS:
                    results[kind][name] = None
                continue
            if name != "ray":  # RayBaseline warms its workers up on entry
                warm_up(runner)
            for kind in GRAPHS:
                size = sizes[name][kind]
                results[kind][name] = measure(name, runner, kind, cache.get(kind, size), repeat)
            if name == "plait":
                extras.update(plait_targets(cache, results["dag"]["plait"]))
            if name == "ray":
                stack.close()  # free Ray's processes and memory before later runners

    summary = report(results, extras, sizes, quick, seed)
    if tracing and "plait" in selected:
        summary.update(traced(cache, sizes, repeat))
        untraced, traced_us = summary["plait_us_per_task"], summary["plait_us_per_task_traced"]
        summary["tracing_ratio"] = _round(_ratio(traced_us, untraced))
        print(f"plait traced: {_fmt(traced_us, '.1f')} us/task against {_fmt(untraced, '.1f')}")
    return summary


def traced(cache: GraphCache, sizes: dict[str, dict[str, Size]], repeat: int) -> dict[str, Any]:
    """plait again on the same graphs, traced: an OpenTelemetry SDK provider whose batch
    processor hands every span to an exporter that drops it (what tracing costs the engine,
    not a collector's network)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from orchestrator.engine._tracing import use_tracer_provider

    class Dropped(SpanExporter):
        def __init__(self) -> None:
            self.spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    exporter = Dropped()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 20))
    use_tracer_provider(provider)
    per_graph: dict[str, float | None] = {}
    try:
        for kind in GRAPHS:
            m = measure("traced", run_plait, kind, cache.get(kind, sizes["plait"][kind]), repeat)
            per_graph[kind] = None if m is None else round(m.us_per_task, 3)
    finally:
        use_tracer_provider(None)
        provider.shutdown()
    values = [v for v in per_graph.values() if v is not None]
    return {
        "plait_us_per_task_traced": round(statistics.fmean(values), 3) if values else None,
        "traced_graphs": per_graph,
        "spans_exported": exporter.spans,
    }


def plait_targets(cache: GraphCache, dag: Measurement | None) -> dict[str, float | None]:
    """The two absolute targets, both defined on a 100,000-task random DAG."""
    out: dict[str, float | None] = {"dag100k_s": None, "bytes_per_pending_task": None}
    if dag is not None and dag.tasks == DAG100K:
        assert dag.timing.build_s is not None
        out["dag100k_s"] = dag.timing.build_s + dag.timing.run_s
    else:
        m = measure("plait", run_plait, "dag100k", cache.get("dag", DAG100K), 1)
        if m is not None:
            assert m.timing.build_s is not None
            out["dag100k_s"] = m.timing.build_s + m.timing.run_s
    try:
        out["bytes_per_pending_task"] = plait_bytes_per_pending_task(cache.get("dag", DAG100K)[0])
    except Exception:
        print("plait memory measurement failed:", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
    return out


# ---------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str) -> str:
    # Pad missing values to the same width as the spec so the table columns stay aligned.
    width = spec.split(".")[0]
    return format("-", f">{width or 0}") if value is None else format(value, spec)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def report(
    results: dict[str, dict[str, Measurement | None]],
    extras: dict[str, float | None],
    sizes: dict[str, dict[str, Size]],
    quick: bool,
    seed: int,
) -> dict[str, Any]:
    header = (
        f"{'graph':<10} {'runner':<9} {'tasks':>7} {'build s':>8} {'run s':>8} "
        f"{'us/task':>9} {'build us/task':>13} {'x plait':>8}"
    )
    print(header)
    print("-" * len(header))
    per_graph: dict[str, dict[str, dict[str, Any] | None]] = {}
    for kind in GRAPHS:
        plait = results[kind].get("plait")
        plait_us = plait.us_per_task if plait else None
        per_graph[kind] = {}
        for name, m in results[kind].items():
            if m is None:
                per_graph[kind][name] = None
                print(f"{kind:<10} {name:<9} {'n/a':>7}")
                continue
            ratio = _ratio(m.us_per_task, plait_us)
            print(
                f"{kind:<10} {name:<9} {m.tasks:>7} {_fmt(m.timing.build_s, '8.3f')} "
                f"{m.timing.run_s:>8.3f} {m.us_per_task:>9.1f} "
                f"{_fmt(m.build_us_per_task, '13.1f')} {_fmt(ratio, '8.2f')}"
            )
            per_graph[kind][name] = {
                "tasks": m.tasks,
                "workflows": m.workflows,
                "build_s": _round(m.timing.build_s, 6),
                "run_s": round(m.timing.run_s, 6),
                "us_per_task": round(m.us_per_task, 3),
                "build_us_per_task": _round(m.build_us_per_task),
                "ratio_vs_plait": _round(ratio),
            }
    print()
    print(f"dag100k_s (plait build+run, 100,000 tasks): {_fmt(extras['dag100k_s'], '.3f')}")
    print(f"bytes_per_pending_task (plait): {_fmt(extras['bytes_per_pending_task'], '.0f')}")

    def mean_of(name: str, field: str) -> float | None:
        values = [
            v[field]
            for kind in GRAPHS
            if (v := per_graph[kind].get(name)) is not None and v[field] is not None
        ]
        return round(statistics.fmean(values), 3) if values else None

    means = {name: mean_of(name, "us_per_task") for name in RUNNERS}
    summary: dict[str, Any] = {f"{name}_us_per_task": means[name] for name in RUNNERS}
    summary.update(
        {
            "langgraph_ratio": _round(_ratio(means["langgraph"], means["plait"])),
            "ray_ratio": _round(_ratio(means["ray"], means["plait"])),
            "asyncio_ratio": _round(_ratio(means["asyncio"], means["plait"])),
            "plait_build_us_per_task": mean_of("plait", "build_us_per_task"),
            "langgraph_build_us_per_task": mean_of("langgraph", "build_us_per_task"),
            "dag100k_s": _round(extras["dag100k_s"]),
            "bytes_per_pending_task": _round(extras["bytes_per_pending_task"], 1),
            "quick": quick,
            "seed": seed,
            "sizes": {name: sizes[name] for name in RUNNERS},
            "graphs": per_graph,
        }
    )
    return summary


BASELINE_PACKAGES = {"langgraph": "langgraph", "ray": "ray"}
"""The runners that need a package of the bench extra."""


def _installed(runner: str) -> bool:
    try:
        importlib.import_module(BASELINE_PACKAGES[runner])
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller graphs (well under 2 min)")
    parser.add_argument(
        "--only",
        default=",".join(RUNNERS),
        help=f"comma-separated subset of {','.join(RUNNERS)}",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the random DAGs")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per graph")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="also plait with OpenTelemetry tracing on (plait_us_per_task_traced)",
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)

    selected = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(selected) - set(RUNNERS))
    if unknown or not selected:
        parser.error(f"--only takes names from {', '.join(RUNNERS)}; got {args.only!r}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    # Keep the canonical order so plait (the reference for ratios) is printed first.
    selected = [name for name in RUNNERS if name in selected]
    missing = [name for name in selected if name in BASELINE_PACKAGES and not _installed(name)]
    if missing:
        print(
            f"overhead.py: error: {' and '.join(missing)} not installed; run `make bench` "
            "(installs the bench extra) or pip install -e '.[bench]', or leave "
            f"{'them' if len(missing) > 1 else 'it'} out of --only",
            file=sys.stderr,
        )
        raise SystemExit(2)

    started = perf_counter()
    summary = run_benchmark(selected, args.quick, args.seed, args.repeat, args.tracing)
    print(f"total wall time: {perf_counter() - started:.1f} s", file=sys.stderr)
    # Last stdout line: machine-readable, one line, nothing printed after it.
    print(json.dumps(summary, separators=(",", ":")), flush=True)
    _results.save("overhead", summary, parser, args, argv)


if __name__ == "__main__":
    main()
