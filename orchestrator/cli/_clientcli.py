"""`plait submit` and `plait watch`: `orchestrator.client` on the command line, against a
running `plait serve`. The client (and aiohttp) is imported when one of them runs, not for
every `plait` command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..model._errors import UsageError, error_text
from ._cliconfig import seconds

if TYPE_CHECKING:
    from ..client import Client, StreamEvent

SUBMIT_HELP = """\
Submit a workflow spec (JSON, docs/rest.md) to a running `plait serve` and print the
workflow's id; --watch then follows its events, --wait prints its result.

The service's address is --url, else $PLAIT_URL, else http://127.0.0.1:8470; the tenant's
token is $PLAIT_TOKEN (or --token, which other users can read in the process list). The
submission carries an Idempotency-Key (a new one unless --idempotency-key gives it), so the
retries the client makes after a lost connection never start a second workflow.

Exit status: 0 submitted (with --watch or --wait: and succeeded), 1 it failed, was
cancelled or was still running when --wait ended, 2 bad usage: a spec that cannot be read
or is refused, a token refused, a service that cannot be reached.
"""

WATCH_HELP = """\
Follow a workflow's events on a running `plait serve`: one line for each task started,
retried and finished (with its time) and for the workflow's end. A dropped connection is
resumed where it stopped. --json prints every event as it came, one JSON object a line.

Exit status: 0 the workflow succeeded, 1 it failed or was cancelled, 2 bad usage: an
unknown workflow, a token refused, a service that cannot be reached.
"""


def register(sub: Any) -> None:
    """Add `submit` and `watch` to the `plait` command's subparsers."""
    submit = sub.add_parser(
        "submit",
        help="submit a workflow spec to a running plait serve",
        description=SUBMIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument("spec", metavar="SPEC", help="a JSON file of the spec, or - for stdin")
    _service_options(submit)
    submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the submission's key: the same key and spec again answer with the same workflow",
    )
    submit.add_argument(
        "--wait",
        type=seconds,
        metavar="SECONDS",
        help="then wait up to SECONDS for the workflow to finish, and print its result",
    )
    submit.add_argument("--watch", action="store_true", help="then follow its events")
    submit.add_argument(
        "--json",
        action="store_true",
        help="print JSON, one object a line: the answer, each event (--watch), the result",
    )
    submit.set_defaults(handler=_submit)
    watch = sub.add_parser(
        "watch",
        help="follow a workflow's events on a running plait serve",
        description=WATCH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    watch.add_argument("id", metavar="ID", help="the workflow's id, as submit printed it")
    _service_options(watch)
    watch.add_argument(
        "--after", type=int, default=0, metavar="N", help="start after the N-th event"
    )
    watch.add_argument("--json", action="store_true", help="print each event as JSON")
    watch.set_defaults(handler=_watch)


def _service_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", help="the service (default: $PLAIT_URL, else http://127.0.0.1:8470)"
    )
    parser.add_argument(
        "--token",
        help="the tenant's bearer token (default: $PLAIT_TOKEN); given here it shows in "
        "process lists: prefer the variable",
    )


# --- the verbs --------------------------------------------------------------------------------


def _submit(args: argparse.Namespace) -> int:
    spec = _read_spec(args.spec)
    out: TextIO = args.out

    async def submit(client: Client) -> int:
        accepted = await client.submit(spec, idempotency_key=args.idempotency_key)
        _print(out, accepted.model_dump_json() if args.json else accepted.id)
        if not (args.watch or args.wait):
            return 0
        status: str = accepted.status
        if args.watch:
            status = await _follow(client, accepted.id, 0, out, as_json=args.json)
        if args.wait:
            result = await client.result(accepted.id, wait=args.wait)
            _print(out, result.model_dump_json(indent=None if args.json else 2))
            status = result.status
            if not result.finished:
                print(
                    f"plait: {accepted.id} is still running after {args.wait:g} s; "
                    f"follow it with: plait watch {accepted.id}",
                    file=sys.stderr,
                )
        return 0 if status == "succeeded" else 1

    return _with_client(args, submit)


def _watch(args: argparse.Namespace) -> int:
    if args.after < 0:
        raise UsageError(f"--after must be 0 or more, got {args.after}")
    out: TextIO = args.out

    async def watch(client: Client) -> int:
        status = await _follow(client, args.id, args.after, out, as_json=args.json)
        return 0 if status == "succeeded" else 1

    return _with_client(args, watch)


def _with_client(args: argparse.Namespace, work: Callable[[Client], Awaitable[int]]) -> int:
    """Run `work` with a client of the service the options name; a request that fails is
    one line and exit status 2."""
    from ..client import Client, ClientError

    if args.token is not None:
        print(
            "plait: warning: --token can be read in the process list by other users of this "
            "machine; prefer PLAIT_TOKEN=... in the environment",
            file=sys.stderr,
        )

    async def main() -> int:
        async with Client(args.url, args.token) as client:
            return await work(client)

    try:
        return asyncio.run(main())
    except ClientError as exc:
        if exc.status is None:
            raise UsageError(str(exc)) from exc
        hint = ""
        if exc.status == 401:
            hint = " (give the tenant's token in $PLAIT_TOKEN, or with --token)"
        raise UsageError(f"the service answered {exc}{hint}") from exc


def _read_spec(path: str) -> Any:
    """The JSON of `path` (`-`: stdin); a file that cannot be read or parsed is a UsageError
    naming the place."""
    where = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no spec file at {path!r}; give a JSON file, or - for stdin") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the spec {where!r}: {error_text(exc)}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{where}:{exc.lineno}:{exc.colno}: the spec is not valid JSON: {exc.msg}"
        ) from None


async def _follow(client: Client, run_id: str, after: int, out: TextIO, *, as_json: bool) -> str:
    """Print the workflow's events until it finishes; its final status. A stream that
    cannot be had says so in the command's terms (the service's address, `--after`)."""
    from ..client import ClientError

    origin: float | None = None
    seen = after
    try:
        async for event in client.events(run_id, after=after):
            seen = event.id
            if as_json:
                _print(out, json.dumps({"id": event.id, "event": event.kind, "data": event.data}))
            else:
                at = event.data.get("at")
                if origin is None and isinstance(at, int | float):
                    origin = at
                line = describe(event)
                if line is not None:
                    timed = isinstance(at, int | float) and origin is not None
                    since = at - origin if timed else 0.0  # type: ignore[operator]
                    _print(out, f"[{since:8.2f} s] {line}")
            if event.kind == "workflow_finished":
                return str(event.data.get("status", "unknown"))
    except ClientError as exc:
        if exc.status is not None:
            raise
        reason = _cause(exc)
        if seen == after and isinstance(exc.__cause__, OSError):
            raise UsageError(
                f"cannot reach the service at {client.url} ({reason}); check that `plait "
                "serve` runs there, and that --url (or $PLAIT_URL) names its host and port"
            ) from exc
        raise UsageError(
            f"lost the event stream of {run_id!r} at {client.url} after event {seen} "
            f"({reason}); follow it again from there: plait watch {run_id} --after {seen}"
        ) from exc
    raise AssertionError("unreachable: the stream ends with workflow_finished")


def _cause(exc: BaseException) -> str:
    """What went wrong underneath a client's error, in a few words."""
    cause = exc.__cause__
    if cause is None:
        return str(exc)
    if isinstance(cause, ConnectionRefusedError) or "Connect call failed" in str(cause):
        return "connection refused"
    if isinstance(cause, TimeoutError):
        return "no answer in time"
    return error_text(cause)


def describe(event: StreamEvent) -> str | None:
    """One line for an event worth a line (None for the graph's own changes: tasks added,
    edges, a task becoming ready)."""
    d = event.data
    task = d.get("task", "?")
    match event.kind:
        case "workflow_started":
            return f"workflow {d.get('workflow')} started ({d.get('priority')})"
        case "workflow_resumed":
            rerun = ", ".join(d.get("rerun") or []) or "none"
            return f"workflow {d.get('workflow')} resumed (running again: {rerun})"
        case "task_started":
            return f"{task} started (attempt {d.get('attempt')})"
        case "task_retrying":
            return (
                f"{task} failed on attempt {d.get('attempt')}: {d.get('error')}; "
                f"again in {d.get('delay', 0):.1f} s"
            )
        case "call_retrying":
            return (
                f"{task}: call to {d.get('backend')!r} failed on attempt {d.get('attempt')}: "
                f"{d.get('error')}; again in {d.get('delay', 0):.1f} s"
            )
        case "task_succeeded":
            return f"{task} succeeded in {d.get('duration', 0):.2f} s"
        case "task_failed":
            return f"{task} failed after {d.get('attempts')} attempt(s): {d.get('error')}"
        case "task_skipped" | "task_cancelled":
            return f"{task} {event.kind.removeprefix('task_')}: {d.get('reason')}"
        case "deadline_missed":
            return f"workflow {d.get('workflow')} missed its deadline; still running"
        case "deadline_hopeless":
            return (
                f"workflow {d.get('workflow')} cannot meet its deadline; it yields to runs that can"
            )
        case "workflow_finished":
            line = f"workflow {d.get('workflow')} {d.get('status')} in {d.get('duration', 0):.2f} s"
            slack = d.get("slack")
            if isinstance(slack, int | float):
                line += (
                    f"; deadline met with {slack:.2f} s to spare"
                    if d.get("deadline_met")
                    else f"; deadline MISSED by {-slack:.2f} s"
                )
            return line
    return None


def _print(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()
