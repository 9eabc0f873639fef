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
GET /metrics (vLLM's metric names), GET /health. Requests name the served model (see
/v1/models) or leave `model` empty.

Point plait at it with a config file:

  [engine]
  clock = "system"            # an HTTP backend needs the system clock

  [backends.default]
  kind = "openai"
  url = "http://127.0.0.1:8000/v1"
  dialect = "sim"             # sends priority, session, keep-alive and last-call hints
  model = "meta-llama/Llama-3.1-8B-Instruct"   # the profile's model
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
    serve.add_argument(
        "--port", type=_port, default=8000, help="port to listen on, 1-65535 (default: %(default)s)"
    )
    serve.add_argument(
        "--seed", type=int, default=0, help="seed of the generated text (default: %(default)s)"
    )
    serve.add_argument(
        "--error-rate",
        type=_share,
        default=0.0,
        help="share of completions answered with a 500, 0-1 (default: %(default)s)",
    )
    serve.add_argument(
        "--timeout-rate",
        type=_share,
        default=0.0,
        help="share of completions held for an hour, past any client's timeout, 0-1 "
        "(default: %(default)s)",
    )
    serve.set_defaults(handler=serve_command)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range; give 1-65535")
    return port


def _share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share between 0 and 1")
    return share


def serve_command(args: argparse.Namespace) -> int:
    try:
        faults = Faults(args.error_rate, args.timeout_rate, seed=args.seed)
    except UsageError as exc:
        print(f"plait: error: {exc}", file=sys.stderr)
        return 2
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.profile, args.host, args.port, args.seed, faults))
    except OSError as exc:
        # A port in use, an address this machine does not have, no permission to bind.
        print(
            f"plait: error: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}; "
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
