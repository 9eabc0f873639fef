"""A recording fake LLM server for the crash harness (bench/crash.py).

An OpenAI-compatible `/v1/chat/completions` (not streamed) whose reply is a pure function of
the request's messages (`answer`), after a small random latency so that a kill lands in the
middle of calls. It runs in a process of its own, which outlives the killed clients, and
appends one JSON line per request as it arrives and one when its response has been written,
flushed line by line, so the harness can read the whole story after any kill:

    {"ev": "arrive", "i": 7, "epoch": 2, "hash": "<sha256 of the body>", "answer": "ans-...",
     "t": <time.monotonic()>}
    {"ev": "done", "i": 7, "t": ...}      (or "ev": "broken" when the client had gone)

`epoch` is the client process's generation, sent as its API key (`Bearer epoch-N`): a
request read after its sender was killed still counts for that sender. Times are
`time.monotonic()`, which is one clock for every process on the machine.

The harness waits on progress through `GET /control/wait?arrivals=N` (or `responses=N`),
which answers once the server has seen that many requests (or finished that many
responses): kills are placed by progress, not by wall time.

    python bench/_recording_llm.py --log calls.jsonl [--port 0] [--latency-ms 2,20] [--seed 1]

prints `listening <port>` on stdout once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiohttp import web

ANSWER_PREFIX = "ans-"
"""Every reply starts with it, then 16 hex digits. Prompts quote replies upper-cased, so the
lower-case pattern is found only where a reply itself was stored."""


def answer(messages: Iterable[tuple[str, str]]) -> str:
    """The reply to a conversation: a digest of its (role, content) pairs."""
    canonical = json.dumps([[role, content] for role, content in messages])
    return ANSWER_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def request_hash(body: Any) -> str:
    """A request's identity: the sha256 of its body as canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Arrival:
    """One request as the log tells it. `done` is when its response had been written
    (None: it never was, the client had gone or the log ended first)."""

    index: int
    epoch: int
    hash: str
    answer: str
    at: float
    done: float | None = None


def read_log(path: Path) -> list[Arrival]:
    """The log's requests in arrival order. A line cut short at the end is ignored."""
    arrivals: dict[int, Arrival] = {}
    with path.open() as file:
        for line in file:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry["ev"] == "arrive":
                arrivals[entry["i"]] = Arrival(
                    entry["i"], entry["epoch"], entry["hash"], entry["answer"], entry["t"]
                )
            elif entry["ev"] == "done" and entry["i"] in arrivals:
                arrivals[entry["i"]].done = entry["t"]
    return [arrivals[i] for i in sorted(arrivals)]


@dataclass
class Recorder:
    """The server's state: the log file and the counts the harness waits on."""

    log: IO[str]
    latency_s: tuple[float, float]
    rng: random.Random
    arrivals: int = 0
    responses: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def write(self, entry: dict[str, Any]) -> None:
        self.log.write(json.dumps(entry) + "\n")
        self.log.flush()

    async def bump(self, counter: str) -> None:
        async with self.changed:
            setattr(self, counter, getattr(self, counter) + 1)
            self.changed.notify_all()

    async def wait(self, reached: Callable[[], bool]) -> None:
        async with self.changed:
            await self.changed.wait_for(reached)


RECORDER = web.AppKey("recorder", Recorder)


def _epoch(request: web.Request) -> int:
    key = request.headers.get("Authorization", "").removeprefix("Bearer ")
    _, _, number = key.partition("epoch-")
    return int(number) if number.isdigit() else -1


async def _complete(request: web.Request) -> web.StreamResponse:
    recorder = request.app[RECORDER]
    try:
        body = await request.json()
    except ConnectionResetError:  # its client was killed while sending it: never arrived
        return web.Response(status=499)
    messages: Sequence[dict[str, Any]] = body.get("messages", [])
    text = answer((m["role"], m.get("content") or "") for m in messages)
    index = recorder.arrivals
    digest = request_hash(body)
    recorder.write(
        {
            "ev": "arrive",
            "i": index,
            "epoch": _epoch(request),
            "hash": digest,
            "answer": text,
            "t": time.monotonic(),
        }
    )
    await recorder.bump("arrivals")
    await asyncio.sleep(recorder.rng.uniform(*recorder.latency_s))
    prompt_tokens = sum(len((m.get("content") or "").split()) for m in messages)
    payload = {
        "id": f"chatcmpl-{digest[:12]}",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 1,
            "total_tokens": prompt_tokens + 1,
        },
    }
    data = json.dumps(payload).encode()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(data)
    try:
        await response.prepare(request)
        await response.write(data)
        await response.write_eof()
    except (ConnectionError, RuntimeError) as exc:  # the client was killed meanwhile
        recorder.write({"ev": "broken", "i": index, "t": time.monotonic(), "error": str(exc)})
        return response
    recorder.write({"ev": "done", "i": index, "t": time.monotonic()})
    await recorder.bump("responses")
    return response


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


async def _wait(request: web.Request) -> web.Response:
    """Answer once `arrivals` requests have arrived or `responses` have been written."""
    recorder = request.app[RECORDER]
    arrivals = int(request.query.get("arrivals", 0))
    responses = int(request.query.get("responses", 0))
    await recorder.wait(lambda: recorder.arrivals >= arrivals and recorder.responses >= responses)
    return web.json_response({"arrivals": recorder.arrivals, "responses": recorder.responses})


def app(log: IO[str], latency_s: tuple[float, float], seed: int) -> web.Application:
    application = web.Application(client_max_size=64 * 1024 * 1024)
    application[RECORDER] = Recorder(log, latency_s, random.Random(seed))
    application.router.add_post("/v1/chat/completions", _complete)
    application.router.add_get("/v1/models", _models)
    application.router.add_get("/control/wait", _wait)
    return application


async def serve(log_path: Path, port: int, latency_s: tuple[float, float], seed: int) -> None:
    with log_path.open("a", buffering=1) as log:
        runner = web.AppRunner(app(log, latency_s, seed), access_log=None)
        await runner.setup()
        # Control waits that never came true (a kill due after the run ended) hold no one up.
        await web.TCPSite(runner, "127.0.0.1", port, shutdown_timeout=0.5).start()
        print(f"listening {runner.addresses[0][1]}", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            await stop.wait()  # until the harness terminates the process
        finally:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", default="2,20", help="uniform latency range, ms")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    low, high = (float(x) / 1000 for x in args.latency_ms.split(","))
    try:
        asyncio.run(serve(args.log, args.port, (low, high), args.seed))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
