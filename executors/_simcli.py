"""`plait sim serve`: the simulated GPU server on a port, in real time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

from aiohttp import web

from orchestrator import SystemClock, UsageError

from ._sim import SimServer
from ._simhttp import Faults, SimHTTP
from ._simprofile import PROFILES

SERVE_HELP = """\
Serve the simulated GPU serving engine (continuous batching, a paged KV cache with prefix
caching, a priority queue, keep-alive pins) in real time over an OpenAI-compatible HTTP API.

Routes: POST /v1/chat/completions, POST /v1/completions (both also streamed), GET /v1/models,
GET /metrics (vLLM's metric names), GET /health. A request names the served model (see
/v1/models, or the line printed at start) or leaves `model` empty; any other name is a 404,
as in vLLM. Sizes, types and numbers are checked as strictly as vLLM's OpenAI server does.

Point plait at it with a config file:

  [engine]
  clock = "system"            # an HTTP backend needs the system clock

  [backends.default]
  kind = "openai"
  url = "http://127.0.0.1:8000/v1"
  dialect = "sim"             # sends priority, session, keep-alive and last-call hints
  model = "meta-llama/Llama-3.1-8B-Instruct"   # the served model (GET /v1/models)
"""


def register(commands: Any) -> None:
    """Add the `sim` command to plait's CLI (found through the `plait.cli` entry point)."""
    sim = commands.add_parser("sim", help="the simulated GPU serving engine")
    verbs = sim.add_subparsers(dest="sim_command", required=True)
    serve = verbs.add_parser(
        "serve",
        help="serve it over an OpenAI-compatible HTTP API",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--profile",
        default="h100-llama3-8b",
        choices=sorted(PROFILES),
        help="the hardware and model simulated (default: %(default)s)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    # Sizes and shares are checked by the command, not argparse, so that a bad one is the
    # same one-line `plait: error:` as a port in use.
    serve.add_argument(
        "--port", default="8000", help="port to listen on, 1-65535 (default: %(default)s)"
    )
    serve.add_argument(
        "--seed", type=int, default=0, help="seed of the generated text (default: %(default)s)"
    )
    serve.add_argument(
        "--error-rate",
        default="0",
        help="share of completions answered with a 500, 0-1 (default: %(default)s)",
    )
    serve.add_argument(
        "--timeout-rate",
        default="0",
        help="share of completions held for an hour, past any client's timeout, 0-1; "
        "--error-rate plus --timeout-rate is at most 1 (default: %(default)s)",
    )
    serve.set_defaults(handler=serve_command)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise UsageError(f"--port {text!r} is not a port number; give 1-65535") from None
    if not 1 <= port <= 65535:
        raise UsageError(f"--port {port} is out of range; give 1-65535")
    return port


def _share(option: str, text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a number; give a share from 0 to 1") from None
    if not 0.0 <= share <= 1.0:  # NaN fails this too
        raise UsageError(f"{option} {text} is not a share from 0 to 1")
    return share


def _faults(args: argparse.Namespace) -> Faults:
    error_rate = _share("--error-rate", args.error_rate)
    timeout_rate = _share("--timeout-rate", args.timeout_rate)
    if error_rate + timeout_rate > 1:
        raise UsageError(
            f"--error-rate {args.error_rate} plus --timeout-rate {args.timeout_rate} is more "
            "than 1; lower one of them"
        )
    return Faults(error_rate, timeout_rate, seed=args.seed)


def serve_command(args: argparse.Namespace) -> int:
    """Serve until interrupted; every failure is one line on stderr and exit 2, never a
    traceback (checked before binding, so nothing half-starts)."""
    try:
        port = _port(args.port)
        faults = _faults(args)
    except UsageError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.profile, args.host, port, args.seed, faults))
    except (OSError, UnicodeError) as exc:
        # A port in use, an address this machine does not have or cannot encode, no
        # permission to bind.
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        print(
            f"plait: error: cannot serve on {args.host}:{port}: {reason}; "
            "choose another --port or --host",
            file=sys.stderr,
        )
        return 2
    return 0


async def serve(
    profile: str, host: str, port: int, seed: int, faults: Faults | None = None
) -> None:
    async with SimServer(profile, seed=seed, clock=SystemClock()) as sim:
        runner = SimHTTP(sim, faults=faults).runner()
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            print(
                f"plait sim: {profile} serving {sim.profile.model} on http://{host}:{port}/v1",
                flush=True,
            )
            await asyncio.Event().wait()  # until interrupted
        finally:
            await runner.cleanup()
