"""`plait batch run`: run every row of an input file, write the output as rows finish.

Registered under the `plait.cli` entry point group (pyproject.toml) as other packages'
verbs are. docs/batch.md describes the formats, the planning, resume and the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ..admission._queue import Limits
from ..durability._registry import Registry
from ..engine._config import Config, load_config
from ..engine._open import load_module, open_store
from ..model._clock import Clock, SystemClock
from ..model._errors import UsageError, error_text
from ..model._llm import DEFAULT_BACKEND, LLMBackend
from ._api import BACKEND_WAIT_S, BATCH_BREAKER, run_batch
from ._job import BatchJob, BatchProgress, Factory
from ._output import sink_for
from ._rows import read_rows

BATCH_HELP = """\
Run every row of INPUT (JSONL, CSV or Parquet; or OpenAI Batch API request lines) and
write one output line per row as it finishes (OpenAI batch output format; Parquet when
--output ends .parquet). Rows sharing a prompt prefix run together, identical calls are
computed once, and the run is recorded in a store (OUTPUT.plait.db unless --store): the
same command run again after a crash goes on where it stopped. Rows wait for a backend
that goes down (up to --backend-wait seconds, shown in the progress) rather than fail, and
--retry-failed runs again the rows an earlier run wrote as failed.

Without --workflow a row is one LLM call: columns custom_id (or id, optional), prompt or
messages (a list of {role, content}; JSON text in a CSV), system, max_tokens, model,
temperature, top_p, seed, stop (all optional but the prompt). With --workflow
module:factory, factory(row: dict) returns an orchestrator.Workflow run for that row.

Without --config the backend is a simulated H100 (Llama-3 8B) with 4 replicas, so the
command runs out of the box. Exit status: 0 every row succeeded, 1 some row failed,
2 bad usage (nothing was run).
"""


def register(sub: Any) -> None:
    """Add `plait batch run` to the `plait` command."""
    batch = sub.add_parser("batch", help="run a batch of rows (an input file) to an output file")
    verbs = batch.add_subparsers(dest="batch_command", required=True)
    run = verbs.add_parser(
        "run",
        help="run every row of an input file",
        description=BATCH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--input", required=True, metavar="FILE", help=".jsonl, .csv or .parquet")
    run.add_argument("--output", required=True, metavar="FILE", help=".jsonl or .parquet")
    run.add_argument("--format", choices=["jsonl", "csv", "parquet"], help="the input's format")
    run.add_argument(
        "--workflow",
        metavar="MODULE:FACTORY",
        help="factory(row) -> Workflow per row (a module name or a .py path, then :name)",
    )
    run.add_argument(
        "--config", metavar="FILE", help="backends, limits and admission (as plait run)"
    )
    run.add_argument(
        "--backend",
        metavar="NAME|MODULE:FUNCTION",
        help="the backend rows call (default: 'default'); or MODULE:FUNCTION, a function of "
        "the clock returning {name: backend}, as a workflow module's backends(clock)",
    )
    run.add_argument(
        "--replicas", type=int, default=4, help="simulated replicas without --config (4)"
    )
    run.add_argument(
        "--store",
        metavar="PATH_OR_URL",
        help="where runs are recorded for resume (default: OUTPUT.plait.db beside the output)",
    )
    run.add_argument(
        "--max-in-flight", type=int, default=256, metavar="N", help="LLM calls at once (256)"
    )
    run.add_argument(
        "--max-running", type=int, default=512, metavar="N", help="rows running at once (512)"
    )
    run.add_argument("--no-dedup", action="store_true", help="send identical calls each time")
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="run again the rows an earlier run of this command wrote as failed (those that "
        "succeeded are kept; the output keeps one line per row)",
    )
    run.add_argument(
        "--backend-wait",
        type=float,
        default=BACKEND_WAIT_S,
        metavar="SECONDS",
        help="how long rows wait for a backend that went down before they fail "
        f"({BACKEND_WAIT_S:.0f}; 0: fail at once)",
    )
    run.add_argument("--summary-json", metavar="FILE", help="also write the summary as JSON")
    run.add_argument(
        "--progress",
        choices=["auto", "rich", "plain", "none"],
        default="auto",
        help="auto: a live display on a terminal, log lines otherwise",
    )
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    out: TextIO = args.out
    for flag in ("replicas", "max_in_flight", "max_running"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.backend_wait < 0:
        raise UsageError("--backend-wait must not be negative")
    if Path(args.input).resolve() == Path(args.output).resolve():
        raise UsageError(f"--output {args.output!r} is the input: write the output elsewhere")
    if args.summary_json and Path(args.summary_json).is_dir():
        raise UsageError(f"--summary-json {args.summary_json!r} is a directory; give a file path")
    factory, module = _factory(args.workflow) if args.workflow else (None, None)
    rows = read_rows(args.input, fmt=args.format, llm_rows=factory is None)
    sink = sink_for(args.output)
    registry = Registry() if module is None else Registry().scan(module)
    config = load_config(args.config) if args.config else None
    if config is not None and config.engine.clock == "virtual":
        raise UsageError(
            f'{args.config}: clock = "virtual" cannot run a batch: its store (for resume) '
            'does real I/O, which virtual time would jump over; use clock = "system"'
        )
    clock = SystemClock()
    backends, target = _backends(args.backend, config, args.replicas, clock)
    limits = dict(config.limits) if config is not None else {}
    for name in backends:
        limits.setdefault(name, Limits(max_in_flight=args.max_in_flight))
    admission = config.engine.admission if config is not None else "deadlines"
    store_target = args.store or f"{args.output}.plait.db"
    job = BatchJob(
        rows,
        sink,
        factory=factory,
        backend=target,
        max_running=args.max_running,
        registry=registry,
        dedup=not args.no_dedup,
        retry_failed=args.retry_failed,
    )
    mode = args.progress
    if mode == "auto":
        mode = "rich" if sys.stderr.isatty() else "plain"
    plan = job.plan.figures()
    print(
        f"plait batch: {len(rows)} rows; plan: {plan['groups']} group(s) sharing a prefix, "
        f"{plan['shared_prefix_tokens']:,} of {plan['prompt_tokens']:,} prompt tokens shared, "
        f"{plan['duplicates']} duplicate call(s)",
        file=sys.stderr,
        flush=True,
    )

    async def main() -> Any:
        job.open_sink()  # before anything else: an output that cannot be written, or that
        sink.close()  # holds another job's rows, stops here
        async with contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_store(store_target))
            watch = {"rich": _rich, "plain": _plain}.get(mode)
            return await run_batch(
                job,
                backends=backends,
                store=store,
                clock=clock,
                limits=limits,
                admission=admission,
                coalesce=not args.no_dedup,
                watch=watch,
                breaker=replace(BATCH_BREAKER, wait_s=args.backend_wait),
            )

    if config is None and (args.backend is None or ":" not in args.backend):
        print(
            f"plait batch: no --config: the answers come from a simulated H100 ({args.replicas} "
            "replicas), not a model; pass --config FILE to call real servers",
            file=sys.stderr,
        )
    try:
        summary = asyncio.run(main())
    except KeyboardInterrupt:
        print(
            f"plait batch: interrupted; rows finished are kept in {args.output} and the store: "
            "run the same command again to go on with the rest",
            file=sys.stderr,
        )
        raise
    out.write(summary.text() + "\n")
    failed = summary.failed + summary.skipped_failed
    if failed:
        out.write(
            f"{failed} row(s) failed: the same command with --retry-failed runs them again "
            "(the rows that succeeded are kept)\n"
        )
    out.flush()
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary.as_json(), indent=2) + "\n")
    return 0 if summary.all_ok else 1


def _factory(spec: str) -> tuple[Factory, Any]:
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(f"--workflow {spec!r}: write MODULE:FACTORY or path/to/file.py:FACTORY")
    if where.endswith(".py"):
        module = load_module(where)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise UsageError(f"--workflow {spec!r}: cannot import {where!r} ({exc})") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise UsageError(f"--workflow {spec!r}: {where} has no function {name!r}")
    if inspect.iscoroutinefunction(factory):
        raise UsageError(
            f"--workflow {spec!r}: {name} is async; a factory builds the row's Workflow and "
            "returns it (its tasks may be async)"
        )
    return factory, module


def _backends(
    spec: str | None, config: Config | None, replicas: int, clock: Clock
) -> tuple[dict[str, LLMBackend], str]:
    """The backends, and the name of the one rows call."""
    if spec is not None and ":" in spec:
        function, _ = _factory(spec)
        try:
            made = function(clock)  # type: ignore[arg-type]
        except Exception as exc:
            raise UsageError(f"--backend {spec!r} raised {error_text(exc)}") from exc
        if not isinstance(made, Mapping) or not made:
            raise UsageError(f"--backend {spec!r} must return a dict of backends by name")
        backends = dict(made)
        name = DEFAULT_BACKEND if DEFAULT_BACKEND in backends else next(iter(backends))
        return backends, name
    if config is None:
        # Rows sharing a prefix not yet cached wait for the first to compute it: the bound
        # on prompt tokens, at some cost in time (docs/batch.md, "Planning").
        sim = {
            "kind": "sim",
            "profile": "h100-llama3-8b",
            "replicas": replicas,
            "group_prefixes": True,
        }
        config = load_config({"backends": {DEFAULT_BACKEND: sim}}, name="the default backend")
    backends = config.build_backends(clock)
    name = spec or DEFAULT_BACKEND
    if name not in backends:
        known = ", ".join(sorted(backends)) or "none"
        raise UsageError(f"--backend {name!r}: no such backend (known: {known})")
    return backends, name


def _line(p: BatchProgress) -> str:
    eta = "?" if p.eta_s is None else f"{p.eta_s:.0f} s"
    line = (
        f"rows {p.finished}/{p.total} (failed {p.failed}, running {p.running})  "
        f"{p.tokens_per_s:,.0f} tokens/s  cache {p.cache_hit_share:.0%}  left {eta}"
    )
    for name, down_s in sorted(p.waiting.items()):
        line += f"  waiting for backend {name!r} (down {down_s:.0f} s)"
    return line


async def _plain(job: BatchJob) -> None:
    """A log line every 5 seconds (not on a terminal)."""
    while True:
        await asyncio.sleep(5.0)
        print(f"plait batch: {_line(job.progress())}", file=sys.stderr, flush=True)


async def _rich(job: BatchJob) -> None:
    """A live bar on the terminal."""
    from rich.progress import BarColumn, Progress, TextColumn

    with Progress(
        TextColumn("[bold]batch"), BarColumn(), TextColumn("{task.description}"), transient=True
    ) as bar:
        task = bar.add_task("", total=len(job.rows))
        try:
            while True:
                p = job.progress()
                bar.update(task, completed=p.finished, description=_line(p))
                await asyncio.sleep(0.2)
        finally:
            p = job.progress()
            bar.update(task, completed=p.finished, description=_line(p))
