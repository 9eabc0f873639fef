"""`plait runs list|show|delete|compact|gc`: the runs a store keeps, from the command line.

Registered through the `plait.cli` entry point. Every command opens the store named by
`--store` (a SQLite file or a URL; `PLAIT_STORE` by default), does one thing and says what
it did; failures are one line (`plait: error: ...`), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from orchestrator import EVENT_ADAPTER, RunError, UsageError
from orchestrator.ext import RunImage, TaskImage, WorkflowRow, read_events, rebuild

from ._sql import SQLStore

STORE_ENV = "PLAIT_STORE"
FINISHED = ("succeeded", "failed", "cancelled")

RUNS_HELP = f"""\
The runs a durable engine recorded (Engine(store=SQLStore(...))): list them, show one rebuilt
from its log, delete them, compact finished ones, collect unused payloads.

Every command takes --store PATH_OR_URL: a SQLite file (as given to SQLStore) or a URL
(postgresql://user@host/db); ${STORE_ENV} when --store is not given.

WHEN (--finished-before) is a date and time, local unless it names a zone
(2025-05-01, "2025-05-01 12:00", 2025-05-01T12:00:00+00:00), or an age: 90s, 30m, 12h, 7d, 2w
(that long ago).
"""

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PREVIEW = 60
_COLUMN = 40
"""The widest a column of a table is padded to."""
"""Characters of a result shown by `show` (its whole text is in `show --events`)."""


class RunNotFoundError(RunError):
    """A workflow id the store does not have."""


def register_runs(commands: Any) -> None:
    """Add the `runs` command to plait's CLI (found through the `plait.cli` entry point)."""
    runs = commands.add_parser(
        "runs",
        help="list, show, delete and compact the runs a store keeps",
        description=RUNS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument(
        "--store",
        metavar="PATH_OR_URL",
        help=f"a SQLite file or a database URL (default: ${STORE_ENV})",
    )
    store.add_argument(
        "--schema", metavar="NAME", help="the PostgreSQL schema of the store, if it has its own"
    )
    verbs = runs.add_subparsers(dest="runs_command", required=True)

    listing = verbs.add_parser("list", parents=[store], help="one line per run, newest first")
    listing.add_argument("--status", choices=["pending", "running", *FINISHED])
    listing.add_argument(
        "--limit", type=_count, default=50, metavar="N", help="at most N runs (default: 50)"
    )
    listing.set_defaults(handler=_handler(list_runs))

    show = verbs.add_parser(
        "show", parents=[store], help="one run: its row and its tasks, rebuilt from its log"
    )
    show.add_argument("id", help="the run's workflow id (as `plait runs list` shows it)")
    show.add_argument("--events", action="store_true", help="print its event log too")
    show.set_defaults(handler=_handler(show_run))

    delete = verbs.add_parser(
        "delete",
        parents=[store],
        help="delete runs by id, or finished runs by age or count",
        description="Delete the runs named, or the finished runs that finished before WHEN "
        "and all but the N most recently finished. A run that is not finished is refused "
        "unless --force (an engine still running it then fails its next commit). Payloads "
        "nothing uses any more are collected after.",
    )
    delete.add_argument("ids", nargs="*", metavar="ID", help="workflow ids")
    delete.add_argument("--finished-before", type=_when, metavar="WHEN")
    delete.add_argument("--keep-last", type=_count, metavar="N")
    delete.add_argument("--force", action="store_true", help="delete unfinished runs named too")
    delete.set_defaults(handler=_handler(delete_runs))

    compact = verbs.add_parser(
        "compact",
        parents=[store],
        help="compact finished runs: drop the events their rebuild does without",
        description="Compact the finished runs named (all finished runs when none is named), "
        "or those that finished before WHEN: their logs keep what rebuilds them (tasks, "
        "edges, final states, results), their call records go, and unused payloads are "
        "collected. Unfinished runs are left whole.",
    )
    compact.add_argument("ids", nargs="*", metavar="ID", help="workflow ids")
    compact.add_argument("--finished-before", type=_when, metavar="WHEN")
    compact.set_defaults(handler=_handler(compact_runs))

    gc = verbs.add_parser(
        "gc", parents=[store], help="delete the payloads no event or call record uses"
    )
    gc.set_defaults(handler=_handler(collect))


Command = Callable[[SQLStore, argparse.Namespace, TextIO], Awaitable[int]]


def _handler(command: Command) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        out: TextIO = getattr(args, "out", None) or sys.stdout
        store = open_store(args.store, schema=args.schema)

        async def main() -> int:
            async with store:
                return await command(store, args, out)

        return asyncio.run(main())

    return handle


def open_store(target: str | None, *, schema: str | None = None) -> SQLStore:
    """The store `--store` or $PLAIT_STORE names; a SQLite file must exist already (a
    mistyped path would otherwise be a new, empty store)."""
    target = target or os.environ.get(STORE_ENV)
    if not target:
        raise UsageError(f"no store given: pass --store PATH_OR_URL, or set ${STORE_ENV}")
    store = SQLStore(target, schema=schema)
    path = store.url.database
    if store.url.get_backend_name() == "sqlite" and path and not Path(path).is_file():
        why = "a directory" if Path(path).is_dir() else "no such file"
        raise UsageError(
            f"no store at {path!r} ({why}); give the path of a plait store's SQLite file, "
            "or a database URL"
        )
    return store


# --- list ----------------------------------------------------------------------------------------


async def list_runs(store: SQLStore, args: argparse.Namespace, out: TextIO) -> int:
    rows = await store.workflows(status=args.status, limit=args.limit)
    if not rows:
        what = f"{args.status} runs" if args.status else "runs"
        out.write(f"no {what} in the store\n")
        return 0
    table = [("ID", "NAME", "STATUS", "CREATED", "FINISHED", "")]
    for row in rows:
        table.append(
            (
                row.id,
                row.name,
                row.status,
                _time(row.created),
                _time(row.finished),
                "compacted" if row.compacted else "",
            )
        )
    # A column is as wide as its values, up to _COLUMN: a longer value (an id, whole, so
    # that it can be copied) runs past its column rather than pad every other line.
    widths = [min(_COLUMN, max(len(line[i]) for line in table)) for i in range(len(table[0]))]
    for line in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        out.write("\n")
    return 0


# --- show ----------------------------------------------------------------------------------------


async def show_run(store: SQLStore, args: argparse.Namespace, out: TextIO) -> int:
    row = await _row(store, args.id)
    events = await read_events(store, row.id)
    fields = [
        ("workflow", row.id),
        ("name", row.name),
        ("status", row.status),
        ("priority", row.priority),
        ("created", _time(row.created)),
        ("finished", _finished(row)),
    ]
    if row.deadline is not None:
        fields.append(("deadline", _time(row.deadline)))
    if row.tenant is not None:
        fields.append(("tenant", row.tenant))
    if row.labels:
        fields.append(("labels", ", ".join(f"{k}={v}" for k, v in sorted(row.labels.items()))))
    log = f"{len(events)} events"
    if row.compacted:
        log += " (compacted: the events its rebuild does without were dropped; seqs have gaps)"
    fields.append(("log", log))
    for name, value in fields:
        out.write(f"{name:<9} {value}\n")
    try:
        image = rebuild(EVENT_ADAPTER.validate_python(e) for e in events)
    except (UsageError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        detail = str(exc).strip().splitlines()[0]
        out.write(f"tasks     cannot be rebuilt from the log: {detail}\n")
    else:
        if image.resumes:
            out.write(f"resumed   {image.resumes} time(s) in a new process\n")
        _write_tasks(image, out)
    if args.events:
        out.write("events:\n")
        records = await store.events(row.id)
        for record, data in zip(records, events, strict=True):
            shown = {k: v for k, v in data.items() if k not in ("workflow", "kind", "at")}
            text = json.dumps(shown, separators=(",", ":"), ensure_ascii=False)
            out.write(f"  {record.seq:>6}  {record.at:>12.3f}  {record.kind:<16} {text}\n")
    return 0


def _write_tasks(image: RunImage, out: TextIO) -> None:
    tasks = list(image.tasks.values())
    states = Counter(task.state for task in tasks)
    summary = ", ".join(f"{state} {n}" for state, n in sorted(states.items()))
    out.write(f"tasks     {len(tasks)}" + (f" ({summary})" if summary else "") + "\n")
    if not tasks:
        return
    width = min(_COLUMN, max(len(task.id) for task in tasks))
    for task in tasks:
        out.write(
            f"  {_cut(task.id, _COLUMN):<{width}}  {task.state:<9}  {_cut(task.action.label, 80)}"
            f"{_attempts(task)}{_outcome(task)}\n"
        )


def _cut(text: str, most: int) -> str:
    """`text` in at most `most` characters: a longer one keeps its start and its end."""
    if len(text) <= most:
        return text
    half = (most - 3) // 2
    return text[:half] + "..." + text[len(text) - (most - 3 - half) :]


def _attempts(task: TaskImage) -> str:
    return f"  attempts {task.attempts}" if task.attempts > 1 else ""


def _outcome(task: TaskImage) -> str:
    if task.state == "done":
        return f"  -> {_preview(task.result)}"
    if task.state == "failed":
        return f"  error: {task.error}"
    if task.reason:
        return f"  ({task.reason})"
    return ""


def _preview(value: Any) -> str:
    """A result on one line: a text as it reads, anything else as JSON; cut at _PREVIEW."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 3] + "..."


# --- delete, compact, gc -------------------------------------------------------------------------


async def delete_runs(store: SQLStore, args: argparse.Namespace, out: TextIO) -> int:
    by_policy = args.finished_before is not None or args.keep_last is not None
    if args.ids and by_policy:
        raise UsageError(
            "give workflow ids, or --finished-before/--keep-last, not both (nothing was deleted)"
        )
    if not args.ids and not by_policy:
        raise UsageError(
            "say what to delete: workflow ids, --finished-before WHEN or --keep-last N"
        )
    if args.ids:
        rows = [await _row(store, id) for id in dict.fromkeys(args.ids)]
        running = [row for row in rows if row.status not in FINISHED]
        if running and not args.force:
            names = ", ".join(f"{row.id} ({row.status})" for row in running)
            raise UsageError(
                f"not finished: {names}; an engine may still be running it, so it is kept "
                "(pass --force to delete it anyway); nothing was deleted"
            )
        deleted = await store.delete([row.id for row in rows])
        out.write(f"deleted {deleted} run(s): {', '.join(row.id for row in rows)}\n")
    else:
        deleted = await store.retain(finished_before=args.finished_before, keep_last=args.keep_last)
        why = []
        if args.finished_before is not None:
            why.append(f"finished before {_time(args.finished_before)}")
        if args.keep_last is not None:
            why.append(f"beyond the {args.keep_last} most recently finished")
        out.write(f"deleted {deleted} finished run(s): {' or '.join(why)}\n")
    await _collect(store, out)
    return 0


async def compact_runs(store: SQLStore, args: argparse.Namespace, out: TextIO) -> int:
    rows = [await _row(store, id) for id in dict.fromkeys(args.ids)]
    before = await store.size()
    compacted = await store.compact(
        [row.id for row in rows] if rows else None, finished_before=args.finished_before
    )
    out.write(f"compacted {compacted} run(s)\n")
    left = [row.id for row in rows if row.status not in FINISHED]
    if left:
        out.write(f"left whole (not finished): {', '.join(left)}\n")
    await _collect(store, out)
    after = await store.size()
    out.write(
        f"store: {before.events} -> {after.events} events, "
        f"{_bytes(before.event_bytes + before.payload_bytes)} -> "
        f"{_bytes(after.event_bytes + after.payload_bytes)} of events and payloads\n"
    )
    return 0


async def collect(store: SQLStore, args: argparse.Namespace, out: TextIO) -> int:
    await _collect(store, out)
    return 0


async def _collect(store: SQLStore, out: TextIO) -> None:
    out.write(f"collected {await store.collect_garbage()} unused payload(s)\n")


# --- inside -------------------------------------------------------------------------------------


async def _row(store: SQLStore, id: str) -> WorkflowRow:
    row = await store.workflow(id)
    if row is None:
        raise RunNotFoundError(
            f"no run {id!r} in the store, {store.where}; `plait runs list` shows the ids "
            "there (nothing was changed)"
        )
    return row


def _when(text: str) -> float:
    """Epoch seconds from a date and time or an age (`7d`: seven days ago)."""
    age = _AGE.fullmatch(text.strip())
    if age:
        return time.time() - float(age.group(1)) * _AGE_SECONDS[age.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a date and time (2025-05-01, '2025-05-01 12:00') nor an "
            "age (90s, 30m, 12h, 7d, 2w)"
        ) from None
    return moment.timestamp()  # a naive time is local, as `list` shows times


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 or more")
    return value


def _time(epoch: float | None) -> str:
    if epoch is None or not math.isfinite(epoch):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _finished(row: WorkflowRow) -> str:
    if row.finished is None:
        return "-"
    return f"{_time(row.finished)} (after {row.finished - row.created:.3f} s)"


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"
