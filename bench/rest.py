"""The REST service under load: `plait serve` on loopback, a bounded load generator, a SIGKILL
in the middle of it, a restart, and a count of what was accepted and what finished.

    python bench/rest.py --quick              # 1,000 + 1,000 submissions, about 25 s
    python bench/rest.py --requests 5000 --concurrency 32 --seconds 60

The service runs as a child process (`plait serve --config F`) on a config this script
writes: the simulated H100 on wall-clock time, a SQLite store in a temporary directory,
examples/serve_registry.py, and one tenant whose rate and running limits are far above the
load, so the figures are the service's, not its limiter's. Every submission is a small
workflow that really runs (an agent's LLM call on the simulator, then a tool after it), with
an `Idempotency-Key` of its own. The client runs in this process, on the same machine.

1. **Steady state.** After `--warmup` submissions (accepted and checked like the others, left
   out of the figures), `--requests` submissions with at most `--concurrency` in flight, for
   at most `--seconds`: accepted submissions per second (202s over the wall time from the
   first request to the last answer) and the p50 / p99 of each request's latency as the
   client sees it. A sampler reads `/readyz` every 100 ms for how many workflows run at once.
2. **Crash.** `--crash-requests` more submissions; once half of them are answered the
   service gets SIGKILL and no new request starts. A request without an answer is not
   accepted. The same command starts the service again (it resumes the unfinished
   workflows), and each unanswered request is sent once more with its key: a key whose
   workflow was committed before the kill must answer 200 with that workflow's id.
3. **Check.** Every workflow the service accepted (both phases and the retries) is polled
   until it has finished, for at most `--finish-s`. `lost` counts the accepted ones that are
   missing, failed or still unfinished (`missing`, `failed`, `unfinished` on their own). The
   store is then read directly: two workflows under one idempotency key are `duplicates`, a
   workflow the client never heard of is an `orphan`, and a replayed retry whose id is not
   the one its key made is a `retry_mismatch`.

Progress goes to stderr, a summary to stdout, and the last line of stdout is one JSON object
with `submissions_per_s`, `p50_ms`, `p99_ms`, `accepted` and `lost` (and the rest). The exit
status is 1 if anything accepted was lost or made twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _results
import aiohttp

_ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
TENANT = "bench"
IDEMPOTENCY_LABEL = "plait.idempotency_key"
"""The label the service keeps a submission's key under (orchestrator/service/_app.py)."""
FINISHED = ("succeeded", "failed", "cancelled")
TARGET_PER_S = 1_000.0
TARGET_P99_MS = 50.0


# --- the service -------------------------------------------------------------------------------


def write_config(workdir: Path, port: int, max_in_flight: int) -> Path:
    """The service's config: the simulator on wall time, SQLite, one unlimited tenant."""
    from orchestrator.service import hash_token

    registry = _ROOT / "examples" / "serve_registry.py"
    text = f"""\
[service]
host = "127.0.0.1"
port = {port}
store = {json.dumps(str(workdir / "serve.db"))}
registry = [{json.dumps(str(registry))}]
drain_s = 1

[[tenants]]
name = "{TENANT}"
token_sha256 = "{hash_token(TOKEN)}"
max_running = 1000000
rate_per_s = 1000000
burst = 1000000

[engine]
admission = "deadlines"
clock = "system"

[backends.default]
kind = "sim"
profile = "h100-llama3-8b"
seed = 0

[backends.default.limits]
max_in_flight = {max_in_flight}
"""
    path = workdir / "serve.toml"
    path.write_text(text)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(config: Path) -> list[str]:
    """`plait serve` of this interpreter's environment."""
    plait = Path(sys.executable).with_name("plait")
    if plait.exists():
        return [str(plait), "serve", "--config", str(config)]
    entry = "from orchestrator.cli._cli import _entry; _entry()"
    return [sys.executable, "-c", entry, "serve", "--config", str(config)]


@dataclass
class Server:
    """One `plait serve` child process at a time; their output goes to `log`."""

    command: list[str]
    url: str
    log: Path
    proc: asyncio.subprocess.Process | None = None

    async def start(self, session: aiohttp.ClientSession, limit_s: float = 120.0) -> float:
        """Start it and wait until /readyz says ready; the seconds that took."""
        started = time.perf_counter()
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, stdout=out, stderr=asyncio.subprocess.STDOUT
            )
        async with asyncio.timeout(limit_s):
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(
                        f"plait serve exited with {self.proc.returncode}:\n{self.log.read_text()}"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with session.get(f"{self.url}/readyz") as response:
                        if response.status == 200:
                            return time.perf_counter() - started
                await asyncio.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """SIGTERM, then wait for it (SIGKILL if it takes too long)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(30):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()

    def resumed(self) -> int:
        """Workflows the latest start resumed, as its output says."""
        count = told = 0
        for line in self.log.read_text().splitlines():
            if line.startswith("plait serve: resumed "):  # said before "listening"
                told = int(line.split()[3])
            elif line.startswith("plait serve: listening"):
                count, told = told, 0
        return count


# --- the load ----------------------------------------------------------------------------------


def spec(i: int) -> dict[str, Any]:
    """A small workflow that really runs: one LLM call on the simulator, then a tool."""
    return {
        "name": "bench",
        "inputs": {"topic": f"KV cache eviction, case {i}"},
        "tasks": [
            {"id": "facts", "agent": "researcher", "prompt": "What matters about ${inputs.topic}?"},
            {
                "id": "words",
                "tool": "word_count",
                "args": {"text": {"$input": "topic"}},
                "after": ["facts"],
            },
        ],
    }


@dataclass
class Attempt:
    """One submission as the client saw it."""

    key: str
    i: int
    started: float
    latency: float = 0.0
    status: int | None = None
    """The HTTP status; None: no answer (refused, reset, or the service died)."""
    run_id: str | None = None
    error: str | None = None


async def submit(session: aiohttp.ClientSession, url: str, key: str, i: int) -> Attempt:
    """POST workflow `i` under `key`; what came back, and how long it took."""
    attempt = Attempt(key, i, time.perf_counter())
    try:
        async with session.post(
            f"{url}/v1/workflows", json=spec(i), headers={"Idempotency-Key": key}
        ) as response:
            body = await response.json()
            attempt.status = response.status
            if response.status in (200, 202):
                attempt.run_id = body["id"]
            else:
                attempt.error = body.get("error")
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        attempt.error = f"{type(exc).__name__}: {exc}"
    attempt.latency = time.perf_counter() - attempt.started
    return attempt


@dataclass
class Load:
    """A bounded load: `requests` submissions, `concurrency` at once, for at most `seconds`.
    With `kill_after`, once that many have been answered `kill` is called and no new request
    starts."""

    session: aiohttp.ClientSession
    url: str
    prefix: str
    requests: int
    concurrency: int
    seconds: float
    kill_after: int | None = None
    kill: Callable[[], None] | None = None
    attempts: list[Attempt] = field(default_factory=list)
    answered: int = 0
    killed_at: float | None = None
    """Seconds into the load when `kill` was called."""
    wall: float = 0.0

    async def run(self) -> None:
        started = time.perf_counter()
        deadline = started + self.seconds
        numbers = iter(range(self.requests))

        async def worker() -> None:
            for i in numbers:
                if self.killed_at is not None or time.perf_counter() >= deadline:
                    return
                attempt = await submit(self.session, self.url, f"{self.prefix}-{i}", i)
                self.attempts.append(attempt)
                self.answered += attempt.status is not None
                if self.kill is not None and self.killed_at is None and self._due():
                    self.killed_at = time.perf_counter() - started
                    self.kill()

        async with asyncio.TaskGroup() as tg:
            for _ in range(self.concurrency):
                tg.create_task(worker())
        self.wall = time.perf_counter() - started

    def _due(self) -> bool:
        return self.kill_after is not None and self.answered >= self.kill_after

    def answers(self, *statuses: int) -> list[Attempt]:
        return [a for a in self.attempts if a.status in statuses]


@contextlib.asynccontextmanager
async def sampling(session: aiohttp.ClientSession, url: str) -> AsyncIterator[list[int]]:
    """Read /readyz's count of running workflows every 100 ms while the block runs."""
    samples: list[int] = []

    async def sample() -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, ValueError):
                async with session.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        samples.append(int((await response.json())["running"]))
            await asyncio.sleep(0.1)

    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(sample())
        try:
            yield samples
        finally:
            task.cancel()


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0 < q < 1) of `values`, interpolated."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def answers(attempts: Iterable[Attempt]) -> dict[str, int]:
    """How many got each status ("none": no answer)."""
    counts = Counter(str(a.status) if a.status is not None else "none" for a in attempts)
    return dict(sorted(counts.items()))


def ids(attempts: Iterable[Attempt]) -> set[str]:
    return {a.run_id for a in attempts if a.run_id is not None}


# --- the check -------------------------------------------------------------------------------


async def finished_ids(session: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """Every finished workflow of the tenant and its status, from the list, page by page."""
    found: dict[str, str] = {}
    for status in FINISHED:
        offset = 0
        while True:
            query = {"status": status, "limit": "500", "offset": str(offset)}
            async with session.get(f"{url}/v1/workflows", params=query) as response:
                response.raise_for_status()
                page = await response.json()
            found.update((w["id"], w["status"]) for w in page["workflows"])
            if page["next"] is None:
                break
            offset += 500
    return found


async def await_finished(
    session: aiohttp.ClientSession, url: str, wanted: set[str], seconds: float
) -> dict[str, str]:
    """Poll until every id in `wanted` has finished, or `seconds` pass; the status of each
    then (`missing` when the service does not know it)."""
    deadline = time.perf_counter() + seconds
    while True:
        finished = await finished_ids(session, url)
        waiting = wanted - finished.keys()
        if not waiting or time.perf_counter() >= deadline:
            break
        print(f"  {len(waiting)} accepted workflows not finished yet", file=sys.stderr)
        await asyncio.sleep(1.0)
    statuses = {i: finished[i] for i in wanted - waiting}
    for run_id in waiting:
        async with session.get(f"{url}/v1/workflows/{run_id}") as response:
            if response.status == 404:
                statuses[run_id] = "missing"
            else:
                response.raise_for_status()
                statuses[run_id] = (await response.json())["status"]
    return statuses


def store_keys(db: Path) -> dict[str, list[str]]:
    """The store's workflow ids by idempotency key, read from the file itself."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT id, json_extract(labels, ?) FROM plait_workflows",
            (f'$."{IDEMPOTENCY_LABEL}"',),
        ).fetchall()
    finally:
        conn.close()
    keys: dict[str, list[str]] = {}
    for run_id, key in rows:
        keys.setdefault(key or "", []).append(run_id)
    return keys


# --- the bench ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    requests: int
    crash_requests: int
    concurrency: int
    seconds: float
    warmup: int
    finish_s: float
    max_in_flight: int


async def bench(options: Options, workdir: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(workdir, port, options.max_in_flight)
    server = Server(serve_command(config), url, workdir / "serve.log")
    async with aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {TOKEN}"},
        connector=aiohttp.TCPConnector(limit=options.concurrency + 4),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as session:
        try:
            return await _run(options, server, session, workdir / "serve.db")
        finally:
            await server.stop()


async def _run(
    options: Options, server: Server, session: aiohttp.ClientSession, db: Path
) -> dict[str, Any]:
    url = server.url
    start_s = await server.start(session)
    print(f"service up in {start_s:.2f} s on {url}", file=sys.stderr)
    c, s = options.concurrency, options.seconds

    # 1. Steady state.
    warmup = Load(session, url, "warmup", options.warmup, c, s)
    await warmup.run()
    steady = Load(session, url, "steady", options.requests, c, s)
    async with sampling(session, url) as samples:
        await steady.run()
    latencies = sorted(a.latency * 1000 for a in steady.attempts if a.status is not None)
    per_s = len(steady.answers(202)) / steady.wall if steady.wall else 0.0
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    running_max = max(samples, default=0)
    print(
        f"steady: {len(steady.attempts)} requests in {steady.wall:.2f} s, "
        f"{len(steady.answers(202))} accepted ({per_s:.0f}/s), p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms, up to {running_max} workflows running; "
        f"answers {answers(steady.attempts)}",
        file=sys.stderr,
    )

    # 2. Crash: SIGKILL once half of the requests are answered, then the same command again.
    crash = Load(session, url, "crash", options.crash_requests, c, s)
    crash.kill_after, crash.kill = max(1, options.crash_requests // 2), server.kill
    await crash.run()
    if server.proc is not None:
        await server.proc.wait()
    unanswered = [a for a in crash.attempts if a.status is None]
    print(
        f"crash: SIGKILL after {crash.answered} answers ({crash.killed_at or 0:.2f} s in); "
        f"{len(crash.attempts)} requests, answers {answers(crash.attempts)}",
        file=sys.stderr,
    )
    restart_s = await server.start(session)
    resumed = server.resumed()
    print(f"restarted in {restart_s:.2f} s; it resumed {resumed} workflows", file=sys.stderr)
    retried = [await submit(session, url, a.key, a.i) for a in unanswered]
    replayed = [a for a in retried if a.status == 200]
    print(
        f"retried {len(retried)} unanswered with their keys: answers {answers(retried)} "
        f"({len(replayed)} had been committed before the kill)",
        file=sys.stderr,
    )

    # 3. Every accepted workflow finishes, once.
    accepted = ids(warmup.answers(202) + steady.answers(202) + crash.answers(202))
    recovered = ids(a for a in retried if a.status in (200, 202)) - accepted
    started = time.perf_counter()
    statuses = await await_finished(session, url, accepted | recovered, options.finish_s)
    finish_s = time.perf_counter() - started
    lost = {i for i in accepted if statuses[i] != "succeeded"}
    keys = store_keys(db)
    stored = sum(len(v) for v in keys.values())
    print(
        f"check: {len(accepted | recovered)} to finish; after {finish_s:.1f} s "
        f"{dict(Counter(statuses.values()))}; the store holds {stored} workflows",
        file=sys.stderr,
    )
    errors = [a for a in steady.attempts + warmup.attempts if a.status != 202]
    errors += [a for a in crash.attempts + retried if a.status not in (None, 200, 202)]
    for a in errors[:5]:
        print(f"  error: {a.key}: {a.status} {a.error}", file=sys.stderr)
    return {
        "submissions_per_s": round(per_s, 1),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "accepted": len(accepted),
        "lost": len(lost),
        "failed": sum(1 for i in lost if statuses[i] in ("failed", "cancelled")),
        "unfinished": sum(1 for i in lost if statuses[i] in ("pending", "running")),
        "missing": sum(1 for i in lost if statuses[i] == "missing"),
        "duplicates": sum(len(v) - 1 for v in keys.values() if len(v) > 1),
        "orphans": sum(1 for v in keys.values() for i in v if i not in accepted | recovered),
        "requests": len(warmup.attempts) + len(steady.attempts) + len(crash.attempts),
        "errors": len(errors),
        "concurrency": c,
        "steady_requests": len(steady.attempts),
        "steady_s": round(steady.wall, 3),
        "running_max": running_max,
        "crash_requests": len(crash.attempts),
        "crash_accepted": len(crash.answers(202)),
        "killed_at": None if crash.killed_at is None else round(crash.killed_at, 3),
        "unanswered": len(unanswered),
        "retried_replayed": len(replayed),
        "retried_new": sum(1 for a in retried if a.status == 202),
        "retried_lost": sum(1 for i in recovered if statuses[i] != "succeeded"),
        "retry_mismatch": sum(1 for a in replayed if keys.get(a.key) != [a.run_id]),
        "resumed": resumed,
        "start_s": round(start_s, 2),
        "restart_s": round(restart_s, 2),
        "finish_s": round(finish_s, 2),
    }


def summary(result: dict[str, Any]) -> str:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    per_s, p99, lost = result["submissions_per_s"], result["p99_ms"], result["lost"]
    return "\n".join(
        [
            f"submissions/s {per_s:>9.1f}  target >= {TARGET_PER_S:,.0f}: "
            f"{verdict(per_s >= TARGET_PER_S)}",
            f"p50 ms        {result['p50_ms']:>9.2f}",
            f"p99 ms        {p99:>9.2f}  target < {TARGET_P99_MS:.0f}: "
            f"{verdict(p99 < TARGET_P99_MS)}",
            f"running, most {result['running_max']:>9}",
            f"accepted      {result['accepted']:>9}",
            f"lost          {lost:>9}  target 0: {verdict(lost == 0)} (failed "
            f"{result['failed']}, unfinished {result['unfinished']}, missing {result['missing']})",
            f"duplicates    {result['duplicates']:>9}  (orphans {result['orphans']}, retry "
            f"mismatches {result['retry_mismatch']})",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 + 1,000 submissions")
    parser.add_argument(
        "--requests", type=int, default=None, help="steady-state submissions (5,000; quick 1,000)"
    )
    parser.add_argument(
        "--crash-requests", type=int, default=None, help="crash-phase submissions (= --requests)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (32)")
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="each phase's load stops after this (60)"
    )
    parser.add_argument(
        "--warmup", type=int, default=32, help="submissions before the steady state (32)"
    )
    parser.add_argument(
        "--finish-s",
        type=float,
        default=None,
        help="how long accepted workflows may take to finish after the restart (300; quick 60)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        help="LLM calls at once on the simulated H100 (256, its max_num_seqs)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the store and the service log")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    requests = args.requests or (1_000 if args.quick else 5_000)
    options = Options(
        requests=requests,
        crash_requests=args.crash_requests or requests,
        concurrency=args.concurrency,
        seconds=args.seconds,
        warmup=args.warmup,
        finish_s=args.finish_s or (60.0 if args.quick else 300.0),
        max_in_flight=args.max_in_flight,
    )
    workdir = Path(tempfile.mkdtemp(prefix="plait-rest-"))
    try:
        result = asyncio.run(bench(options, workdir))
    finally:
        if args.keep:
            print(f"kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(summary(result))
    print(json.dumps(result))
    _results.save("rest", result, parser, args, argv, ignore=("keep",))
    bad = result["lost"] or result["duplicates"] or result["orphans"] or result["retry_mismatch"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
