"""`plait`: run a workflow module from the command line with a live progress view.

A workflow module defines `workflows()` returning a Workflow or a list of them, and may
define `backends(clock)` returning the LLM backends by name, `CLOCK = "virtual"` to run
on virtual time (simulated latencies without waiting for them) and `CONFIG = "plait.toml"`
(a config file beside it, used when `--config` is not given). A config file defines
backends, their limits and engine settings; `plait config check FILE` validates one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from ._cliconfig import backends_of, check_config, clock_of, config_of, limits_of
from ._clock import Clock, SystemClock, VirtualClock
from ._config import Config
from ._engine import Engine
from ._errors import PlaitError, UsageError
from ._events import Event
from ._scheduler import POLICIES
from ._workflow import Workflow


@dataclass
class _Row:
    status: str = "running"
    tasks: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    cancelled: int = 0
    llm_calls: int = 0
    call_retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started: float = 0.0
    duration: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)


class Progress:
    """Folds the event stream into per-workflow rows; draws a live line on a terminal."""

    def __init__(self, out: TextIO, *, live: bool) -> None:
        self.out = out
        self.live = live
        self.rows: dict[str, _Row] = {}
        self.notes: list[str] = []
        self.origin: float | None = None
        self.now = 0.0
        self._drawn_at = 0.0

    def apply(self, event: Event) -> None:
        if self.origin is None:
            self.origin = event.at
        self.now = event.at - self.origin
        row = self.rows.setdefault(event.workflow, _Row(started=event.at))
        match event.kind:
            case "task_added":
                row.tasks += 1
            case "task_removed":
                row.tasks -= 1
            case "task_succeeded":
                row.done += 1
                row.llm_calls += event.llm_calls
                if event.usage is not None:
                    row.prompt_tokens += event.usage.prompt_tokens
                    row.completion_tokens += event.usage.completion_tokens
            case "task_failed":
                row.failed += 1
                row.failures[event.task] = event.error
                self._say(f"  ! {event.workflow}/{event.task} failed: {event.error}")
            case "task_skipped":
                row.skipped += 1
            case "task_cancelled":
                row.cancelled += 1
            case "call_retrying":
                row.call_retries += 1
                self._say(
                    f"  ~ {event.workflow}/{event.task}: call to {event.backend!r} failed on "
                    f"attempt {event.attempt} ({event.error}); again in {event.delay:.1f} s"
                )
            case "workflow_finished":
                row.status = event.status
                row.duration = event.duration
                self._say(f"  {event.workflow} {event.status} in {event.duration:.2f} s")
            case _:
                pass
        if self.live and (
            event.kind == "workflow_finished" or time.monotonic() - self._drawn_at > 0.1
        ):
            self._draw()  # at most ten times a second: a terminal is slower than the engine

    def _say(self, line: str) -> None:
        if self.live:
            self.out.write("\r\x1b[K")
        self.out.write(line + "\n")

    def _draw(self) -> None:
        self._drawn_at = time.monotonic()
        finished = sum(1 for r in self.rows.values() if r.status != "running")
        tasks = sum(r.tasks for r in self.rows.values())
        settled = sum(r.done + r.failed + r.skipped + r.cancelled for r in self.rows.values())
        calls = sum(r.llm_calls for r in self.rows.values())
        self.out.write(
            f"\r\x1b[K[{self.now:8.2f} s] workflows {finished}/{len(self.rows)}  "
            f"tasks {settled}/{tasks}  llm calls {calls}"
        )
        self.out.flush()

    def summary(self, wall: float, clock_name: str) -> str:
        header = (
            f"{'workflow':<24} {'status':<10} {'time s':>8} {'tasks':>7} {'failed':>6} "
            f"{'skipped':>7} {'calls':>6} {'prompt tok':>10} {'output tok':>10}"
        )
        lines = ["", header, "-" * len(header)]
        for name, r in self.rows.items():
            lines.append(
                f"{name[:24]:<24} {r.status:<10} {r.duration:>8.2f} {r.done:>3}/{r.tasks:<3} "
                f"{r.failed:>6} {r.skipped:>7} {r.llm_calls:>6} {r.prompt_tokens:>10} "
                f"{r.completion_tokens:>10}"
            )
        ok = sum(1 for r in self.rows.values() if r.status == "succeeded")
        durations = [r.duration for r in self.rows.values()]
        mean = sum(durations) / len(durations) if durations else 0.0
        lines.append("-" * len(header))
        lines.append(
            f"{len(self.rows)} workflow(s), {ok} succeeded; mean completion {mean:.2f} s "
            f"on the {clock_name} clock; wall time {wall:.2f} s"
        )
        retries = sum(r.call_retries for r in self.rows.values())
        if retries:
            lines.append(f"{retries} LLM call(s) retried after a backend error")
        lines.extend(self.notes)
        return "\n".join(lines)


def load_module(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no workflow file at {path!r}; give the path of a .py file")
    spec = importlib.util.spec_from_file_location(f"plait_workflow_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workflows_of(module: ModuleType) -> list[Workflow]:
    factory = getattr(module, "workflows", None)
    if not callable(factory):
        raise UsageError(
            f"{module.__file__} defines no workflows() function; "
            "add `def workflows() -> list[Workflow]` returning the workflows to run"
        )
    produced = factory()
    found = [produced] if isinstance(produced, Workflow) else list(produced)
    if not found or not all(isinstance(w, Workflow) for w in found):
        raise UsageError(f"workflows() in {module.__file__} must return Workflow objects")
    return found


async def run_module(
    module: ModuleType,
    clock: Clock,
    policy: str,
    progress: Progress,
    *,
    config: Config | None = None,
    max_in_flight: int | None = None,
    max_waiting: int | None = None,
) -> Mapping[str, str]:
    backends, notes = backends_of(module, config, clock)
    progress.notes.extend(notes)
    limits = limits_of(backends, config, max_in_flight, max_waiting)
    flows: Iterable[Workflow] = workflows_of(module)
    statuses: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        for backend in backends.values():
            # Backends that run something of their own (a simulated server, a connection
            # pool) are async context managers; they live as long as the run.
            if isinstance(backend, contextlib.AbstractAsyncContextManager):
                await stack.enter_async_context(backend)
        async with Engine(backends=backends, clock=clock, policy=policy, limits=limits) as engine:
            async for event in engine.iter(*flows):
                progress.apply(event)
                if event.kind == "workflow_finished":
                    statuses[event.workflow] = event.status
        for name, backend in backends.items():
            describe = getattr(backend, "describe", None)
            if callable(describe):
                progress.notes.append(f"backend {name!r}: {describe()}")
    return statuses


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="plait", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the workflows of a Python module")
    run.add_argument("path", help="a .py file defining workflows()")
    run.add_argument("--policy", choices=sorted(POLICIES), help="default: the config's, else fcfs")
    run.add_argument(
        "--clock",
        choices=["virtual", "system"],
        help="virtual: simulated latencies cost no wall time "
        "(default: the config's, else the module's CLOCK)",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="a .toml/.yaml file of backends, limits and engine settings "
        "(default: the module's CONFIG, if it names one)",
    )
    run.add_argument(
        "--max-in-flight",
        type=int,
        metavar="N",
        help="calls in flight per LLM backend (overrides the config)",
    )
    run.add_argument(
        "--max-waiting",
        type=int,
        metavar="N",
        help="calls allowed to wait per LLM backend (overrides the config)",
    )
    config = sub.add_parser("config", help="configuration files")
    verbs = config.add_subparsers(dest="config_command", required=True)
    check = verbs.add_parser(
        "check", help="validate a config file and print its backends, without connecting"
    )
    check.add_argument("path", help="a .toml, .yaml or .yml file")
    check.add_argument(
        "--strict",
        action="store_true",
        help="also fail on warnings (an environment variable that is not set)",
    )
    # Other packages add commands (`plait sim ...`) without this one importing them.
    for entry in entry_points(group="plait.cli"):
        entry.load()(sub)
    args = parser.parse_args(argv)
    if args.command not in ("run", "config"):
        code: int = args.handler(args)
        return code
    try:
        if args.command == "config":
            return check_config(args.path, out, strict=args.strict)
        module = load_module(args.path)
        settings = config_of(module, args.config)
        engine = settings.engine if settings is not None else None
        clock_name, clock_notes = clock_of(args.clock, settings, module)
        policy = args.policy or (engine.policy if engine is not None else "fcfs")
        clock: Clock = VirtualClock() if clock_name == "virtual" else SystemClock()
        progress = Progress(out, live=out.isatty())
        progress.notes.extend(clock_notes)
        started = time.perf_counter()
        with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
            statuses = runner.run(
                run_module(
                    module,
                    clock,
                    policy,
                    progress,
                    config=settings,
                    max_in_flight=args.max_in_flight,
                    max_waiting=args.max_waiting,
                )
            )
        if progress.live:
            out.write("\n")
        out.write(progress.summary(time.perf_counter() - started, clock_name) + "\n")
    except PlaitError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return 2
    return 0 if all(s == "succeeded" for s in statuses.values()) else 1


def _entry() -> Any:  # pragma: no cover - console script shim
    raise SystemExit(main())
