"""`plait`: run a workflow module from the command line with a live progress view.

A workflow module defines `workflows()` returning a Workflow or a list of them, and may
define `backends(clock)` returning the LLM backends by name, `CLOCK = "virtual"` to run
on virtual time (simulated latencies without waiting for them) and `CONFIG = "plait.toml"`
(a config file beside it, used when `--config` is not given), and `lifespan()`, an async
context manager entered around the run (to open what its tasks use). A config file defines
backends, their limits and engine settings; `plait config check FILE` validates one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shlex
import sys
import sysconfig
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TextIO

from ..admission._mode import MODES, Mode
from ..durability._registry import RebuildError, Registry
from ..durability._resume import Decision, ResumePlan
from ..engine._config import Config, read_config_file
from ..engine._engine import Engine
from ..engine._open import load_module, open_backends, open_store, user_code_error
from ..engine._tracing import exporting
from ..model._clock import Clock, SystemClock, VirtualClock
from ..model._errors import PlaitError, UsageError, error_text
from ..model._events import Event
from ..model._task import describe
from ..model._workflow import Workflow
from ._cliconfig import backends_of, check_config, clock_of, config_of, limits_of, seconds
from ._clientcli import register as register_client_verbs

if TYPE_CHECKING:
    from ..service import ServeConfig


_PACKAGES = ("orchestrator", "agents", "executors", "memory")
"""plait's own packages: a failure's place is shown in the user's code, not in these."""


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
    deadline: str = ""
    """Met or missed, for workflows with a deadline."""


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
        self.failure: Callable[[str, str], BaseException | None] = lambda workflow, task: None
        """The exception a failed task raised (workflow id, task id), where it is known."""

    def follow(self, flows: Iterable[Workflow]) -> None:
        """Find failed tasks' exceptions in these workflows (their runs keep them)."""
        by_id: dict[str, Workflow] = {}
        flows = list(flows)

        def failure(workflow: str, task: str) -> BaseException | None:
            if workflow not in by_id:  # ids are known once the engine has started them
                by_id.update((wf.id, wf) for wf in flows)
            found = by_id.get(workflow)
            return found.run_of(task).error if found is not None and task in found else None

        self.failure = failure

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
                error = self.failure(event.workflow, event.task)
                self._say(f"  ! {event.workflow}/{event.task} failed: {event.error}{where(error)}")
                if error is not None and os.environ.get("PLAIT_DEBUG"):
                    for line in traceback.format_exception(error):
                        self._say("    " + line.rstrip("\n").replace("\n", "\n    "))
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
            case "deadline_missed":
                self._say(f"  ! {event.workflow} missed its deadline; still running")
            case "deadline_hopeless":
                self._say(
                    f"  ! {event.workflow} cannot meet its deadline ({event.remaining:.1f} s of "
                    "work left on its critical path); it now yields to runs that can"
                )
            case "workflow_finished":
                row.status = event.status
                row.duration = event.duration
                if event.slack is not None:
                    row.deadline = (
                        f"met, {event.slack:.2f} s to spare"
                        if event.deadline_met
                        else f"MISSED by {-event.slack:.2f} s"
                    )
                self._say(f"  {event.workflow} {event.status} in {event.duration:.2f} s")
            case _:
                pass
        if self.live and (
            event.kind == "workflow_finished" or time.monotonic() - self._drawn_at > 0.1
        ):
            self._draw()  # at most ten times a second: a terminal is slower than the engine

    def _since(self, row: _Row) -> float:
        """When `row`'s workflow started, on the same scale as `now`."""
        return row.started - (self.origin or 0.0)

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
            # A workflow still running (interrupted) shows how long it had run.
            duration = r.duration if r.status != "running" else self.now - self._since(r)
            lines.append(
                f"{name[:24]:<24} {r.status:<10} {duration:>8.2f} {r.done:>3}/{r.tasks:<3} "
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
        for name, r in self.rows.items():
            if r.deadline:
                lines.append(f"deadline of {name}: {r.deadline}")
        retries = sum(r.call_retries for r in self.rows.values())
        if retries:
            lines.append(f"{retries} LLM call(s) retried after a backend error")
        lines.extend(self.notes)
        return "\n".join(lines)


_LIBRARIES = tuple(
    {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib", "platlib")}
    | {str(Path(__file__).resolve().parent.parent / p) for p in _PACKAGES}
)


def where(error: BaseException | None) -> str:
    """` (at FILE:LINE in FUNCTION)`: the innermost frame of the traceback in the user's own
    code (not plait's packages, nor the standard library or installed ones); else ``."""
    if error is None:
        return ""
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if not frame.filename.startswith("<")
        and not str(Path(frame.filename).resolve()).startswith(_LIBRARIES)
    ]
    if not frames:
        return ""
    frame = frames[-1]
    name = frame.filename
    with contextlib.suppress(ValueError):
        name = str(Path(name).resolve().relative_to(Path.cwd()))
    return f" (at {name}:{frame.lineno}, in {frame.name})"


def workflows_of(module: ModuleType) -> list[Workflow]:
    factory = getattr(module, "workflows", None)
    if not callable(factory):
        raise UsageError(
            f"{module.__file__} defines no workflows() function; "
            "add `def workflows() -> list[Workflow]` returning the workflows to run"
        )
    try:
        produced = factory()
    except PlaitError:
        raise  # already says what is wrong (a cycle, an unknown task...)
    except Exception as exc:
        raise user_code_error(
            f"workflows() in {module.__file__}", Path(module.__file__ or "."), exc
        ) from exc
    if isinstance(produced, Workflow):
        return [produced]
    if produced is None or isinstance(produced, str) or not isinstance(produced, Iterable):
        raise UsageError(
            f"workflows() in {module.__file__} returned {type(produced).__name__} "
            f"{produced!r:.60}; return a Workflow or a list of them"
        )
    found = list(produced)
    wrong = [w for w in found if not isinstance(w, Workflow)]
    if not found or wrong:
        what = f"a {type(wrong[0]).__name__} among them" if wrong else "an empty list"
        raise UsageError(
            f"workflows() in {module.__file__} returned {what}; return a Workflow or a list of them"
        )
    return found


async def run_module(
    module: ModuleType,
    clock: Clock,
    admission: Mode,
    progress: Progress,
    *,
    config: Config | None = None,
    max_in_flight: int | None = None,
    max_waiting: int | None = None,
    deadline: float | None = None,
    store: str | None = None,
    flows: Iterable[Workflow] | None = None,
) -> Mapping[str, str]:
    """Run the module's workflows (or `flows`, made from it already) to their end."""
    statuses: dict[str, str] = {}
    async with _engine_for(
        module, clock, admission, progress, config, max_in_flight, max_waiting, store
    ) as engine:
        flows = list(workflows_of(module) if flows is None else flows)
        progress.follow(flows)
        async for event in engine.iter(*flows, deadline=deadline):
            progress.apply(event)
            if event.kind == "workflow_finished":
                statuses[event.workflow] = event.status
    return statuses


@contextlib.asynccontextmanager
async def _engine_for(
    module: ModuleType,
    clock: Clock,
    admission: Mode,
    progress: Progress,
    config: Config | None,
    max_in_flight: int | None,
    max_waiting: int | None,
    store: str | None,
) -> AsyncIterator[Engine]:
    """The engine `plait run` and `plait resume` use: the module's (or config's) backends,
    opened for as long as it runs, and the store at `store` if one is named."""
    backends, notes = backends_of(module, config, clock)
    progress.notes.extend(notes)
    limits = limits_of(backends, config, max_in_flight, max_waiting)
    async with contextlib.AsyncExitStack() as stack:
        exported = await stack.enter_async_context(
            exporting(None if config is None else config.telemetry)
        )
        if exported is not None:
            progress.notes.append("traces exported over OTLP/HTTP (docs/tracing.md)")
        await stack.enter_async_context(lifespan_of(module))
        await open_backends(stack, backends)
        opened = None if store is None else await stack.enter_async_context(open_store(store))
        engine = Engine(
            backends=backends, admission=admission, clock=clock, limits=limits, store=opened
        )
        async with engine:
            yield engine
        for name, capacity in engine.capacities.items():
            figures = (capacity.kv_tokens, capacity.block_tokens, capacity.max_seqs)
            if any(figure is not None for figure in figures):  # not a wrapper of a fake
                progress.notes.append(f"backend {name!r}: {capacity.describe()}")
        for name, backend in backends.items():
            describe = getattr(backend, "describe", None)
            if callable(describe):
                progress.notes.append(f"backend {name!r}: {describe()}")


def lifespan_of(module: ModuleType) -> contextlib.AbstractAsyncContextManager[Any]:
    """The module's `lifespan()`: an async context manager that `plait run` and `plait
    resume` enter before anything else and leave after the engine closes (to open and close
    what its tasks use: agent memory, a blackboard's store). None: nothing to enter."""
    factory = getattr(module, "lifespan", None)
    if factory is None:
        return contextlib.nullcontext()
    if not callable(factory):
        raise UsageError(f"lifespan in {module.__file__} must be a function, got {factory!r}")
    manager = factory()
    if not isinstance(manager, contextlib.AbstractAsyncContextManager):
        raise UsageError(
            f"lifespan() in {module.__file__} returned {type(manager).__name__}; define it "
            "with @contextlib.asynccontextmanager (an async generator that yields once)"
        )
    return manager


RUN_HELP = """\
Run the workflows a Python module defines, with a live progress line and a summary.

The module may define:
  workflows()       required: returns a Workflow or a list of them, to run together
  backends(clock)   optional: returns {name: LLM backend}; a config file's backend of the
                    same name replaces the module's
  CLOCK = "virtual" optional: "virtual" runs simulated latencies without waiting for them
                    (for simulated backends); "system" (the default) is wall time, and the
                    only clock for backends that talk to a server over the network
  CONFIG = "f.toml" optional: a config file beside the module, used when --config is not given
  lifespan()        optional: an async context manager entered before the run and left after
                    it (open what the tasks use: agent memory, a blackboard's store)

Exit status: 0 all workflows succeeded, 1 one failed (or a run-time error), 2 bad usage,
130 interrupted (Ctrl-C; the summary of what finished is printed first).
"""


RESUME_HELP = """\
Go on with the runs a store holds that had not finished (the process running them was
killed, crashed or was stopped): each is rebuilt from its log, tasks that had finished keep
their results, the others run, and LLM calls whose results were recorded are not sent again.

The module given is the one the runs came from: its top-level functions, agents and tools
are what the runs' tasks name (define `registry()` returning an orchestrator.Registry to add
more), and its backends answer the calls.

Exit status: 0 every resumed run succeeded (or nothing to resume), 1 one failed, could not
be rebuilt or waits for a decision (--decide), 2 bad usage.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plait", description=__doc__)
    parser.add_argument("--version", action="version", version=f"plait {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run the workflows of a Python module",
        description=RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("path", help="a .py file defining workflows()")
    run.add_argument(
        "--admission",
        choices=list(MODES),
        help="deadlines, throughput or off (docs/admission.md); default: the config's, "
        "else deadlines",
    )
    run.add_argument("--policy", action=_Retired, help=argparse.SUPPRESS)
    run.add_argument(
        "--clock",
        choices=["virtual", "system"],
        help="virtual: simulated latencies cost no wall time "
        "(default: the config's, else the module's CLOCK, else system)",
    )
    run.add_argument(
        "--config",
        metavar="FILE",
        help="a .toml/.yaml file of backends, limits and engine settings "
        "(default: the module's CONFIG, if it names one)",
    )
    run.add_argument(
        "--deadline",
        type=seconds,
        metavar="SECONDS",
        help="each workflow should finish within SECONDS of its start; the summary says met "
        "or missed (default: the config's [engine] deadline, else none)",
    )
    run.add_argument(
        "--max-in-flight",
        type=int,
        metavar="N",
        help="calls in flight per LLM backend (default: the config's, else 32)",
    )
    run.add_argument(
        "--max-waiting",
        type=int,
        metavar="N",
        help="calls allowed to wait per LLM backend (default: the config's, else unbounded)",
    )
    run.add_argument(
        "--store",
        metavar="PATH_OR_URL",
        default=os.environ.get("PLAIT_STORE"),
        help="record every run in this store (a SQLite file, or a database URL such as "
        "postgresql://user@host/db), so that `plait resume` can go on after a crash "
        "(default: $PLAIT_STORE, else none)",
    )
    resume = sub.add_parser(
        "resume",
        help="go on with the unfinished runs of a store",
        description=RESUME_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    resume.add_argument(
        "path",
        nargs="?",
        help="the .py file whose workflows the runs are (its code and backends); with a "
        "plait serve config, optional: the config's registry and backends are used",
    )
    resume.add_argument(
        "--store",
        metavar="PATH_OR_URL",
        default=os.environ.get("PLAIT_STORE"),
        help="the store the runs were recorded in (default: $PLAIT_STORE, else a plait "
        "serve config's store)",
    )
    resume.add_argument(
        "--dry-run",
        action="store_true",
        help="list what would run again and what it would cost; change nothing",
    )
    resume.add_argument(
        "--decide",
        action="append",
        default=[],
        metavar="RUN[/TASK]=rerun|fail",
        help="for a task declared not idempotent that was running at the crash: run it "
        "again, or fail it (repeatable; RUN alone decides all of that run's)",
    )
    resume.add_argument(
        "--config",
        metavar="FILE",
        help="as for plait run; or the config plait serve runs with (its store, registry "
        "and backends), to decide the runs the service holds",
    )
    resume.add_argument("--admission", choices=list(MODES), help="as for plait run")
    resume.add_argument("--policy", action=_Retired, help=argparse.SUPPRESS)
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
    serve = sub.add_parser(
        "serve",
        help="run the REST service (docs/rest.md)",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", metavar="FILE", help="the service's .toml/.yaml config")
    serve.add_argument("--port", type=int, help="listen on this port (default: the config's)")
    serve.add_argument(
        "--hash-token",
        action="store_true",
        help="read a token on stdin and print its token_sha256 for the config; serve nothing",
    )
    serve.set_defaults(handler=_serve)
    register_client_verbs(sub)  # plait submit, plait watch
    # Other packages add commands (`plait sim ...`) without this one importing them.
    for entry in entry_points(group="plait.cli"):
        entry.load()(sub)
    return parser


def _version() -> str:
    try:
        return version("plait")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "unknown (not installed)"


SERVE_HELP = """\
Serve the REST API: submit workflows and tasks, follow them, cancel them (docs/rest.md).

The config file holds the usual [engine] and [backends.*] tables, a [service] table (port,
store, the registry modules whose agents, tools and functions requests may name) and one
[[tenants]] entry per bearer token. Unfinished workflows in the store are resumed at start;
SIGTERM or Ctrl-C stops accepting, lets running work drain, and keeps the rest for the next
start. Example: plait serve --config examples/serve.toml
"""


def _serve(args: argparse.Namespace) -> int:
    from ..service import hash_token, load_serve_config
    from ..service._serve import serve

    out: TextIO = args.out
    if args.hash_token:
        token = sys.stdin.readline().strip()
        if not token:
            raise UsageError("no token on stdin; echo -n TOKEN | plait serve --hash-token")
        print(hash_token(token), file=out)
        return 0
    if args.config is None:
        raise UsageError("plait serve needs --config FILE (see examples/serve.toml)")
    config = load_serve_config(args.config)
    if args.port is not None:
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port must be 0 to 65535, got {args.port}")
        service = config.service.model_copy(update={"port": args.port})
        config = dataclasses.replace(config, service=service)
    asyncio.run(serve(config, out=out))
    return 0


class _Retired(argparse.Action):
    """`--policy`, which `--admission` replaced: an old command line is told what to write."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is no longer an option: the order follows --admission "
            "(deadlines: runs with a deadline least slack first, the default; throughput: "
            "arrival order; off) (docs/admission.md)"
        )


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """The `plait` command. Every failure ends in one line on stderr, never a traceback
    (set PLAIT_DEBUG=1 to see one): 2 for bad usage, 1 for a failure at run time."""
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    try:
        if args.command == "config":
            return check_config(args.path, out, strict=args.strict)
        if args.command == "run":
            return _run(args, out)
        if args.command == "resume":
            return _resume(args, out)
        args.out = out  # where commands added by other packages write
        code: int = args.handler(args)
        return code
    except UsageError as exc:
        _error(str(exc))
        return 2
    except PlaitError as exc:
        _error(str(exc))
        return 1
    except BrokenPipeError:
        _quiet_broken_pipe(out)
        return 141  # as a shell reports a command killed by SIGPIPE
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except Exception as exc:
        if os.environ.get("PLAIT_DEBUG"):
            raise
        _error(f"internal error: {error_text(exc)} (set PLAIT_DEBUG=1 to see the traceback)")
        return 1


def _run(args: argparse.Namespace, out: TextIO) -> int:
    module = load_module(args.path)
    settings = config_of(module, args.config)
    engine = settings.engine if settings is not None else None
    clock_name, clock_notes = clock_of(args.clock, settings, module)
    if args.store and clock_name == "virtual":
        raise UsageError(
            f"--store needs the system clock, but {args.path} runs on the virtual clock (its "
            "CLOCK, or the config's): a store does real I/O, which virtual time would jump "
            "over; add --clock system"
        )
    flows = None
    if args.store:
        flows = workflows_of(module)
        check_resumable(flows, registry_of(module), args.path)
    admission = args.admission or (engine.admission if engine is not None else "deadlines")
    deadline = args.deadline or (engine.deadline if engine is not None else None)
    clock: Clock = VirtualClock() if clock_name == "virtual" else SystemClock()
    progress = Progress(out, live=out.isatty())
    progress.notes.extend(clock_notes)
    started = time.perf_counter()
    interrupted = False
    statuses: Mapping[str, str] = {}
    try:
        with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
            statuses = runner.run(
                run_module(
                    module,
                    clock,
                    admission,
                    progress,
                    config=settings,
                    max_in_flight=args.max_in_flight,
                    max_waiting=args.max_waiting,
                    deadline=deadline,
                    store=args.store,
                    flows=flows,
                )
            )
    except KeyboardInterrupt:
        # What finished is still worth seeing: the summary shows it, and the rest as running.
        interrupted = True
        progress.notes.append("interrupted (Ctrl-C): workflows still running were stopped")
        progress.notes.append(_how_to_go_on(args))
    if progress.live:
        out.write("\n")
    out.write(progress.summary(time.perf_counter() - started, clock_name) + "\n")
    out.flush()
    if interrupted:
        return 130
    return 0 if all(s == "succeeded" for s in statuses.values()) else 1


def _how_to_go_on(args: argparse.Namespace) -> str:
    """After Ctrl-C: the command that goes on with the runs, or why there is none."""
    if not args.store:
        return (
            "nothing was recorded (no --store), so nothing can go on from here: run it again, "
            "with --store FILE to be able to resume after a stop"
        )
    command = ["plait", "resume", args.path, "--store", args.store]
    if args.config:
        command += ["--config", args.config]
    if args.admission:
        command += ["--admission", args.admission]
    return f"to go on where it stopped: {shlex.join(command)}"


def _resume(args: argparse.Namespace, out: TextIO) -> int:
    served = _serve_config(args.config)
    store = args.store or (served.store if served is not None else None)
    if not store:
        raise UsageError("plait resume needs --store PATH_OR_URL (or $PLAIT_STORE)")
    if args.path is None and served is None:
        raise UsageError(
            "plait resume needs the .py file the runs came from, or --config FILE naming "
            "the config plait serve runs with"
        )
    decisions = _decisions(args.decide)
    if args.path is not None:
        module = load_module(args.path)
        registry = registry_of(module)
    else:  # the service's runs: its registry's code, its config's backends
        module, registry = ModuleType("plait_serve_config"), Registry()
        module.__file__ = args.config
    settings: Config | None
    if served is not None:
        from ..service import load_registry

        registry.merge(load_registry(served))
        settings = served.engine
    else:
        settings = config_of(module, args.config)
    engine_settings = settings.engine if settings is not None else None
    admission = args.admission or (
        engine_settings.admission if engine_settings is not None else "deadlines"
    )
    progress = Progress(out, live=out.isatty())
    started = time.perf_counter()

    async def main() -> tuple[list[ResumePlan], Mapping[str, str]]:
        async with _engine_for(
            module, SystemClock(), admission, progress, settings, None, None, store
        ) as engine:
            if args.dry_run:
                return await engine.plan_resume(registry, decisions=decisions), {}
            events: asyncio.Queue[Event] = asyncio.Queue()
            engine.bus.listen(events)
            report = await engine.resume(registry, decisions=decisions)
            out.write(describe_plans(report.plans, dry_run=False) + "\n")
            out.flush()
            progress.follow(h.workflow for h in report.runs)
            for plan in report.plans:
                if plan.image is not None and plan.workflow in {h.id for h in report.runs}:
                    progress.rows[plan.workflow] = _Row(tasks=len(plan.image.tasks), done=plan.kept)
            statuses: dict[str, str] = {}
            while len(statuses) < len(report.runs):
                event = await events.get()
                progress.apply(event)
                if event.kind == "workflow_finished":
                    statuses[event.workflow] = event.status
            return report.plans, statuses

    with asyncio.Runner() as runner:
        plans, statuses = runner.run(main())
    if args.dry_run:
        out.write(describe_plans(plans, dry_run=True) + "\n")
        return 0 if all(p.error is None and not p.needs_decision for p in plans) else 1
    if statuses:
        out.write(progress.summary(time.perf_counter() - started, "system") + "\n")
    held = [p for p in plans if p.error is not None or p.needs_decision]
    return 0 if not held and all(s == "succeeded" for s in statuses.values()) else 1


def _serve_config(path: str | None) -> ServeConfig | None:
    """The `plait serve` config at `path` (one with a [service] or [[tenants]] table), or
    None for a plain config (or none)."""
    if path is None or not {"service", "tenants"} & read_config_file(path).keys():
        return None
    from ..service import load_serve_config

    return load_serve_config(path)


def registry_of(module: ModuleType) -> Registry:
    """The module's top-level code, and what its `registry()` adds, if it defines one."""
    registry = Registry().scan(module)
    factory = getattr(module, "registry", None)
    if callable(factory) and not isinstance(factory, Registry):
        extra = factory()
        if not isinstance(extra, Registry):
            raise UsageError(
                f"registry() in {module.__file__} returned {type(extra).__name__}; "
                "return an orchestrator.Registry"
            )
        registry.merge(extra)
    return registry


def check_resumable(flows: Iterable[Workflow], registry: Registry, path: str) -> None:
    """Refuse, before anything runs, a workflow that `plait resume` could not rebuild: each
    task's action, condition and key function must be found again by name, as resume finds
    them (`Registry`). Tasks added while a run goes on are checked when resume meets them."""
    for workflow in flows:
        for task in workflow:
            try:
                registry.task(task.id, describe(task.action), task.options())
            except RebuildError as exc:
                raise UsageError(
                    f"task {task.id!r} of workflow {workflow.name!r} could not be resumed "
                    f"from --store: {_rebuild_fix(str(exc), path)}"
                ) from None


def _rebuild_fix(problem: str, path: str) -> str:
    if "defined inside a function" not in problem:
        return problem
    # The registry's advice (register it) cannot help a function made anew by each call.
    return (
        problem.split(", so no other process")[0] + f", so `plait resume` cannot find it by "
        f"name; define it at the top level of {path}, and pass what it used from the "
        "enclosing function as a task's result or a tool's argument (docs/durability.md)"
    )


def _decisions(given: list[str]) -> dict[str, Decision]:
    decisions: dict[str, Decision] = {}
    for item in given:
        target, _, choice = item.rpartition("=")
        if not target or choice not in ("rerun", "fail"):
            raise UsageError(f"--decide {item!r}: write RUN/TASK=rerun or RUN/TASK=fail")
        decisions[target] = "rerun" if choice == "rerun" else "fail"
    return decisions


def describe_plans(plans: list[ResumePlan], *, dry_run: bool) -> str:
    """What resume does (or would do) with each unfinished run, one paragraph each."""
    if not plans:
        return "nothing to resume: every run in the store has finished"
    verb = "would run" if dry_run else "runs"
    lines = []
    for p in plans:
        lines.append(f"{p.workflow} ({p.name})")
        if p.error is not None:
            lines.append(f"  cannot be resumed: {p.error}")
            continue
        lines.append(
            f"  keeps {p.kept} finished task(s); {verb} again {len(p.rerun)} that had "
            f"started {_ids(p.rerun)}and {len(p.pending)} that had not"
        )
        cost = f"at most {p.llm_tasks} LLM call(s) (fewer where a result was recorded)"
        if p.estimate_s is not None:
            cost += f", about {p.estimate_s:.1f} s of task estimates"
        lines.append(f"  cost: {cost}")
        for task in p.needs_decision:
            lines.append(
                f"  waits for a decision: task {task!r} is not idempotent and was running; "
                f"add --decide '{p.workflow}/{task}=rerun' or '...=fail'"
            )
    return "\n".join(lines)


def _ids(ids: tuple[str, ...]) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return f"({shown}) "


def _error(message: str) -> None:
    print(f"plait: error: {message}", file=sys.stderr)


def _quiet_broken_pipe(out: TextIO) -> None:
    """The reader went away (`plait run ... | head`): stop writing, and keep Python's exit
    flush from failing again on the closed pipe (the recipe in Python's signal docs)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())


def _entry() -> Any:  # pragma: no cover - console script shim
    raise SystemExit(main())
