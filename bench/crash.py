"""The crash harness: a process runs N workflows against a recording fake LLM server and is
killed with SIGKILL K times, each time restarted, until it runs to its end; then the store
and the server's log say whether anything was lost, done twice or paid for twice.

    python bench/crash.py --quick                      # 40 workflows, 4 kills, both stores
    python bench/crash.py --workflows 500 --kills 20 --store both --seed 1

Kills are placed by progress, not by wall time (see `Trigger`): after a random number of
requests arrive at the server (mid-call) or of responses written (between a reply and its
commit), after a commit that recorded calls (the reply is durable, its task maybe not), or
as soon as a restarted process says its engine is up (inside `resume()`). A kill that finds
the process already finished is no kill. The children fork from a fork server that imported
plait once (`multiprocessing`'s forkserver), so a restart costs a fork, not seconds of imports.

Checked at the end, from the store: every workflow name has exactly one run, which succeeded
with every task's expected result (`completed_once`); names with no run or one that did not
succeed (`lost`); names with two runs, or a log with two `workflow_finished`, two final events
or two `task_added` of one task (`duplicated`); logs whose seqs have gaps or that do not
rebuild (`broken_logs`). From the server's log and the store's call records as they stood
at each kill, every request the server saw more than once is one of:

- `repeated_llm_calls`: its reply had been recorded in the store before the kill. Resume
  must answer these from the store: the "no call paid twice" guarantee, must be 0.
- `repeated_unrecorded`: its reply had been delivered, but the kill came before the commit
  that records it (docs/durability.md says this window exists).
- `repeated_in_flight`: no reply had been delivered when the process was killed.
- `repeated_in_process`: sent twice by one process (a retry); expected 0 here.

A table goes to stdout, progress to stderr; the last line of stdout is one JSON object with
those figures (per store under "sqlite" / "postgres" with `--store both`, summed on top).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402

if TYPE_CHECKING:
    from _recording_llm import Arrival

PG_URL = os.environ.get("PLAIT_BENCH_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
FINAL_KINDS = frozenset({"task_succeeded", "task_failed", "task_skipped", "task_cancelled"})
_ANSWER = re.compile("ans-[0-9a-f]{16}")
"""A reply of the fake server (`_recording_llm.answer`); prompts quote replies upper-cased."""
SUMMED = (
    "workflows",
    "kills",
    "restarts",
    "completed_once",
    "lost",
    "duplicated",
    "wrong_results",
    "broken_logs",
    "llm_calls",
    "llm_requests",
    "repeated_llm_calls",
    "repeated_unrecorded",
    "repeated_in_flight",
    "repeated_in_process",
    "reusable_at_kills",
    "tasks_run_again",
    "replanned",
    "commits",
    "errors",
)

TriggerKind = Literal["arrivals", "responses", "commits", "start"]


@dataclass(frozen=True)
class Trigger:
    """When a process is killed, counted from its start: once the server has seen `after`
    more requests arrive (the kill lands mid-call) or `after` more responses written (between
    a reply and its commit), once the process has made `after` commits that recorded LLM
    calls (just after replies became durable), or once it says its engine is up (`start`:
    the kill lands in `resume()`)."""

    kind: TriggerKind
    after: int = 0


def plan_kills(rng: random.Random, kills: int, calls: int) -> list[Trigger]:
    """`kills` triggers, one per process but the last. A process killed by progress makes on
    average `calls / kills` requests first, so the kills spread over the run however many
    requests are sent again after each one."""
    most = max(1, 2 * calls // max(kills, 1))
    triggers: list[Trigger] = []
    for _ in range(kills):
        kind: TriggerKind = rng.choices(
            ("arrivals", "responses", "commits", "start"), (4, 4, 3, 1)
        )[0]
        after = {"start": 0, "commits": rng.randint(1, 3)}.get(kind, rng.randint(1, most))
        triggers.append(Trigger(kind, after))
    return triggers


# --- the fake server ---------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    control: Any  # aiohttp.ClientSession

    async def counts(self, *, arrivals: int = 0, responses: int = 0) -> dict[str, int]:
        """The server's counts once it has seen that many (at once for zeros)."""
        query = {"arrivals": arrivals, "responses": responses}
        async with self.control.get(f"{self.url}/control/wait", params=query) as response:
            response.raise_for_status()
            counts: dict[str, int] = await response.json()
            return counts


@contextlib.asynccontextmanager
async def fake_server(log: Path, seed: int, latency_ms: str) -> AsyncIterator[Server]:
    import aiohttp

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(_BENCH / "_recording_llm.py"),
        "--log",
        str(log),
        "--seed",
        str(seed),
        "--latency-ms",
        latency_ms,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line.startswith("listening "):
            raise RuntimeError(f"the fake LLM server did not start: {line!r}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            yield Server(url, session)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        await proc.wait()


# --- the child process -------------------------------------------------------------------------


def _context() -> Any:
    """Children fork from a server that imported plait once: a restart costs a fork."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["_crash_child"])
    # Python 3.11's fork server ignores the parent's sys.path when it preloads (an import
    # error there is silent, and every child would import plait again): it finds bench/
    # and this checkout through PYTHONPATH, set while it starts.
    before = os.environ.get("PYTHONPATH")
    paths = [str(_BENCH), str(_BENCH.parent), *([before] if before else [])]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    return context


class Child:
    """One child process and what it said through its pipe."""

    def __init__(self, context: Any, spec: Any) -> None:
        from _crash_child import main

        reader, writer = context.Pipe(duplex=False)
        self.process = context.Process(target=main, args=(spec, writer), daemon=True)
        self.process.start()
        writer.close()
        self._reader: Connection = reader
        self.said: list[tuple[Any, ...]] = []
        self._heard = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self.process.sentinel, self._on_exit)
        loop.add_reader(reader.fileno(), self._on_message)

    def _on_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self.process.sentinel)
        if not self.exited.done():
            self.exited.set_result(None)

    def _on_message(self) -> None:
        try:
            self.said.append(self._reader.recv())
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._reader.fileno())
        self._heard.set()

    async def says(self, word: str) -> None:
        await self._until(lambda: any(message[0] == word for message in self.said))

    async def recorded(self, commits: int) -> None:
        """Until it has made `commits` commits that recorded LLM calls."""

        def made() -> int:
            return sum(m[0] == "committed" and m[1] > 0 for m in self.said)

        await self._until(lambda: made() >= commits)

    async def _until(self, heard: Callable[[], bool]) -> None:
        while not heard():
            self._heard.clear()
            await self._heard.wait()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    async def ended(self) -> int:
        await self.exited
        self.process.join()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, OSError):
            loop.remove_reader(self._reader.fileno())
        while self._reader.poll():  # what it said before it died
            try:
                self.said.append(self._reader.recv())
            except (EOFError, OSError):
                break
        self._reader.close()
        code = self.process.exitcode
        assert code is not None
        return code


@dataclass
class Epoch:
    """One child process's life: what was due to kill it, and how it ended."""

    trigger: Trigger | None
    exit_code: int = 0
    killed_at: float | None = None
    recorded: frozenset[str] = frozenset()
    """Replies recorded in the store when this process started."""
    reusable: int = 0
    """Replies recorded when it was killed whose task had not finished: resume must take
    them from the store (an agent loop between two calls, say)."""
    said: list[Any] = field(default_factory=list)


# --- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    workflows: int
    kills: int
    seed: int = 0
    latency_ms: str = "10,100"
    epoch_timeout_s: float = 300.0
    keep: bool = False
    triggers: tuple[Trigger, ...] | None = None
    """The kills, in order (default: `plan_kills` from the seed)."""


async def crash_run(store_kind: str, options: Options, workdir: Path) -> dict[str, Any]:
    """Run the workflows to their end through `options.kills` kills on one store (`sqlite`,
    or a PostgreSQL URL / `postgres`), and check the store and the server's log."""
    from _crash_child import ChildSpec
    from _crash_work import expected, llm_calls
    from _recording_llm import read_log

    from memory import SQLStore

    started = time.perf_counter()
    label = "sqlite" if store_kind == "sqlite" else "postgres"
    names = tuple(f"w{i}" for i in range(options.workflows))
    calls = sum(llm_calls(name) for name in names)
    rng = random.Random(options.seed)
    triggers = list(options.triggers or plan_kills(rng, options.kills, calls))
    schema = None
    if store_kind == "sqlite":
        target = str(workdir / "crash.db")
    else:
        target = PG_URL if store_kind == "postgres" else store_kind
        schema = f"crash_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    log = workdir / f"llm-{uuid.uuid4().hex[:8]}.jsonl"
    context = _context()
    epochs: list[Epoch] = []
    errors: list[str] = []
    commit_s: list[float] = []
    store = SQLStore(target, schema=schema)
    await store.open()
    try:
        async with fake_server(log, options.seed, options.latency_ms) as server:
            held = Held(frozenset(), frozenset())
            while True:
                number = len(epochs)
                trigger = triggers[number] if number < len(triggers) else None
                epoch = Epoch(trigger, recorded=held.recorded)
                epochs.append(epoch)
                spec = ChildSpec(target, schema, f"{server.url}/v1", names, number)
                began = time.perf_counter()
                error = await _one_process(context, spec, server, epoch, options.epoch_timeout_s)
                killed = epoch.killed_at is not None
                if killed:
                    held = await held_replies(store)
                    epoch.reusable = len(held.recorded - held.finished)
                commits = [m[1:] for m in epoch.said if m[0] == "committed"]
                commit_s.extend(seconds for _, seconds in commits)
                how = "killed" if killed else f"exited {epoch.exit_code}"
                print(
                    f"crash {label}: process {number} {how} after "
                    f"{time.perf_counter() - began:.2f} s (due {trigger}); {len(commits)} "
                    f"commits recorded {sum(calls for calls, _ in commits)} calls"
                    + (
                        f"; the store held {len(held.recorded)} replies, {epoch.reusable} "
                        "for unfinished tasks"
                        if killed
                        else ""
                    ),
                    file=sys.stderr,
                )
                if error:
                    errors.append(error)
                if not killed:
                    break
        report = await check(store, names, expected)
        report.update(repeats(read_log(log), epochs))
        if schema is not None and not options.keep:
            await _drop_schema(store, schema)
    finally:
        await store.close()
    for epoch in epochs:
        for message in epoch.said:
            if message[0] == "resumed" and message[2]:
                errors.append(f"not resumed: {message[2][:3]}")
    kills = sum(e.killed_at is not None for e in epochs)
    return {
        "store": label,
        "workflows": options.workflows,
        "kills": kills,
        "restarts": len(epochs) - 1,
        "recorded_at_kills": max((len(e.recorded) for e in epochs), default=0),
        "reusable_at_kills": sum(e.reusable for e in epochs),
        **report,
        "llm_calls": calls,
        "commits": len(commit_s),
        "commit_ms_median": round(statistics.median(commit_s) * 1000, 1) if commit_s else None,
        "commit_ms_max": round(max(commit_s) * 1000, 1) if commit_s else None,
        "errors": len(errors),
        "error_messages": errors,
        "seconds": round(time.perf_counter() - started, 2),
    }


async def _one_process(
    context: Any, spec: Any, server: Server, epoch: Epoch, timeout_s: float
) -> str | None:
    """Run one child until it exits or its kill is due; say what went wrong, if anything."""
    child = Child(context, spec)
    try:
        async with asyncio.timeout(timeout_s):
            await _live(child, epoch.trigger, server, epoch)
            epoch.exit_code = await child.ended()
    except TimeoutError:
        child.kill()
        epoch.exit_code = await child.ended()
        epoch.killed_at = None
        return f"process {spec.epoch} hung: killed after {timeout_s:g} s"
    finally:
        epoch.said = child.said
    if epoch.killed_at is not None and epoch.exit_code == -signal.SIGKILL:
        return None
    epoch.killed_at = None  # it had finished by itself: no kill
    return None if epoch.exit_code == 0 else _why(epoch)


async def _live(child: Child, trigger: Trigger | None, server: Server, epoch: Epoch) -> None:
    """Wait until the child exits or its kill is due; kill it then."""
    if trigger is None:
        return
    if trigger.kind == "start":
        due: asyncio.Future[Any] = asyncio.ensure_future(child.says("resuming"))
    elif trigger.kind == "commits":
        due = asyncio.ensure_future(child.recorded(trigger.after))
    else:
        now = await server.counts()
        target = {trigger.kind: now[trigger.kind] + trigger.after}
        due = asyncio.ensure_future(server.counts(**target))
    try:
        await asyncio.wait({due, child.exited}, return_when=asyncio.FIRST_COMPLETED)
        if due.done() and not child.exited.done():
            epoch.killed_at = time.monotonic()
            child.kill()
    finally:
        due.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await due


def _why(epoch: Epoch) -> str:
    for message in epoch.said:
        if message[0] == "error":
            return str(message[1]).strip().splitlines()[-1]
        if message[0] == "done" and message[1]:
            return f"{len(message[1])} workflows did not succeed: {message[1][:5]}"
    return f"the process exited with {epoch.exit_code}"


@dataclass(frozen=True)
class Held:
    """Replies in the store: `recorded` in call records, `finished` as an LLM task's result."""

    recorded: frozenset[str]
    finished: frozenset[str]


async def held_replies(store: Any) -> Held:
    """What the store holds of the fake server's replies, as it stands (read after a kill)."""
    import sqlalchemy as sa

    calls = "SELECT p.data FROM plait_calls c JOIN plait_payloads p ON p.digest = c.digest"
    done = "SELECT data FROM plait_events WHERE kind = 'task_succeeded'"
    found: list[set[str]] = []
    async with store.engines[-1].connect() as conn:
        for query in (calls, done):
            rows = (await conn.execute(sa.text(query))).all()
            text = " ".join(
                bytes(data).decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
                for (data,) in rows
            )
            found.append(set(_ANSWER.findall(text)))
    return Held(frozenset(found[0]), frozenset(found[1]))


async def _drop_schema(store: Any, schema: str) -> None:
    import sqlalchemy as sa

    async with store.engines[0].begin() as conn:
        await conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


# --- the checks ----------------------------------------------------------------------------------


@dataclass
class LogAudit:
    """What one run's log says beyond its rebuilt image."""

    finished: int = 0
    """`workflow_finished` events (one, in a finished run)."""
    twice: list[str] = field(default_factory=list)
    """Tasks with two final events, or added twice."""
    run_again: int = 0
    """Tasks started more than once (no task here retries: each was running at a kill)."""
    replanned: bool = False
    """The planner started again after the tasks it adds were in the log."""


def audit(events: Sequence[dict[str, Any]]) -> LogAudit:
    finals: Counter[str] = Counter()
    added: Counter[str] = Counter()
    started: Counter[str] = Counter()
    result = LogAudit()
    for event in events:
        kind = event["kind"]
        if kind in FINAL_KINDS:
            finals[event["task"]] += 1
        elif kind == "task_added":
            added[event["task"]] += 1
        elif kind == "task_started":
            started[event["task"]] += 1
            if event["task"] == "plan" and added["section 0"]:
                result.replanned = True
        elif kind == "workflow_finished":
            result.finished += 1
    result.twice = [t for t, n in (finals | added).items() if n > 1]
    result.run_again = sum(n > 1 for n in started.values())
    return result


async def check(store: Any, names: Sequence[str], expected: Any) -> dict[str, Any]:
    """Every name run exactly once, succeeded, with the expected results and a whole log."""
    from orchestrator import EVENT_ADAPTER, UsageError
    from orchestrator.durability._replay import rebuild
    from orchestrator.ext import read_events

    rows = await store.workflows(limit=len(names) * 10 + 100)
    by_name: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_name[row.name].append(row)
    counts: Counter[str] = Counter()
    problems: list[str] = []
    for name in names:
        runs = by_name.pop(name, [])
        doubled = len(runs) > 1
        whole = good = False
        for row in runs:
            records = await store.events(row.id)
            whole = [r.seq for r in records] == list(range(1, len(records) + 1))
            if not whole:
                problems.append(f"{row.id}: its seqs have gaps")
            events = await read_events(store, row.id)
            found = audit(events)
            counts["tasks_run_again"] += found.run_again
            counts["replanned"] += found.replanned
            if found.finished > 1 or found.twice:
                doubled = True
                problems.append(f"{row.id}: {found.finished} workflow_finished; {found.twice}")
            try:
                image = rebuild(EVENT_ADAPTER.validate_python(e) for e in events)
            except (UsageError, ValueError) as exc:
                whole = False
                problems.append(f"{row.id}: does not rebuild: {exc}")
                continue
            if row.status == image.status == "succeeded" and not image.unfinished():
                good = image.results() == expected(name)
                if not good:
                    counts["wrong_results"] += 1
                    problems.append(f"{row.id}: results differ from the expected ones")
        counts["duplicated"] += doubled
        counts["broken_logs"] += bool(runs) and not whole
        if good and whole and not doubled:
            counts["completed_once"] += 1
        elif not good:
            counts["lost"] += 1
            problems.append(f"{name}: no run succeeded ({[r.status for r in runs]})")
    return {
        "completed_once": counts["completed_once"],
        "lost": counts["lost"],
        "duplicated": counts["duplicated"],
        "wrong_results": counts["wrong_results"],
        "broken_logs": counts["broken_logs"],
        "stray_runs": len(by_name),
        "tasks_run_again": counts["tasks_run_again"],
        "replanned": counts["replanned"],
        "problems": problems[:20],
    }


def repeats(arrivals: Sequence[Arrival], epochs: Sequence[Epoch]) -> dict[str, int]:
    """Sort every request the server saw again (see the module docstring)."""
    seen: dict[str, list[Arrival]] = defaultdict(list)
    counts: Counter[str] = Counter()
    for arrival in arrivals:
        earlier = list(seen[arrival.hash])
        seen[arrival.hash].append(arrival)
        if not earlier:
            continue
        if any(e.epoch == arrival.epoch for e in earlier):
            counts["repeated_in_process"] += 1
        elif arrival.answer in epochs[arrival.epoch].recorded:
            counts["repeated_llm_calls"] += 1
        elif any(_delivered(e, epochs) for e in earlier):
            counts["repeated_unrecorded"] += 1
        else:
            counts["repeated_in_flight"] += 1
    return {
        "llm_requests": len(arrivals),
        "repeated_llm_calls": counts["repeated_llm_calls"],
        "repeated_unrecorded": counts["repeated_unrecorded"],
        "repeated_in_flight": counts["repeated_in_flight"],
        "repeated_in_process": counts["repeated_in_process"],
    }


def _delivered(arrival: Arrival, epochs: Sequence[Epoch]) -> bool:
    """Its response was written before its process was killed."""
    killed = epochs[arrival.epoch].killed_at
    return arrival.done is not None and (killed is None or arrival.done < killed)


# --- the command ---------------------------------------------------------------------------------


def summary(per_store: list[dict[str, Any]]) -> dict[str, Any]:
    if len(per_store) == 1:
        return per_store[0]
    out: dict[str, Any] = {"store": "+".join(r["store"] for r in per_store)}
    for key in SUMMED:
        out[key] = sum(r[key] for r in per_store)
    out["seconds"] = round(sum(r["seconds"] for r in per_store), 2)
    for r in per_store:
        out[r["store"]] = {k: v for k, v in r.items() if k != "store"}
    return out


def _line(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON line: figures only (the problems went to stderr)."""
    return {
        k: _line(v) if isinstance(v, dict) else v
        for k, v in result.items()
        if k not in ("problems", "error_messages")
    }


def table(per_store: list[dict[str, Any]]) -> str:
    columns = ("store", "workflows", "kills", "completed_once", "lost", "duplicated")
    columns += ("llm_requests", "repeated_llm_calls", "repeated_unrecorded", "seconds")
    lines = ["  ".join(f"{c:>{max(len(c), 8)}}" for c in columns)]
    for r in per_store:
        lines.append("  ".join(f"{r[c]!s:>{max(len(c), 8)}}" for c in columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 workflows, 4 kills, both stores")
    parser.add_argument("--workflows", type=int, default=None, help="default 500 (quick 40)")
    parser.add_argument("--kills", type=int, default=None, help="default 20 (quick 4)")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL URL (env PLAIT_BENCH_PG)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency-ms", default="10,100", help="the fake server's latency, ms")
    parser.add_argument("--keep", action="store_true", help="keep the store and the server log")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    options = Options(
        workflows=args.workflows or (40 if args.quick else 500),
        kills=args.kills if args.kills is not None else (4 if args.quick else 20),
        seed=args.seed,
        latency_ms=args.latency_ms,
        keep=args.keep,
    )
    stores = ["sqlite", "postgres"] if args.store == "both" else [args.store]
    per_store = []
    workdir = Path(tempfile.mkdtemp(prefix="plait-crash-"))
    try:
        for kind in stores:
            target = args.pg_url if kind == "postgres" else kind
            result = asyncio.run(crash_run(target, options, workdir))
            per_store.append(result)
            for problem in result["problems"] + result["error_messages"]:
                print(f"crash {kind}: {problem}", file=sys.stderr)
    finally:
        if args.keep:
            print(f"kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir)
    print(table(per_store))
    result = summary(per_store)
    print(json.dumps(_line(result)))
    _results.save("crash", _line(result), parser, args, argv, ignore=("pg_url", "keep"))
    bad = any(
        r["completed_once"] != r["workflows"] or r["repeated_llm_calls"] or r["errors"]
        for r in per_store
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
