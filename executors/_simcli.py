"""`plait sim serve`: the simulated GPU server on a port, in real time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from aiohttp import web

from orchestrator import SystemClock, UsageError

from ._sim import SimServer
from ._simhttp import Faults, SimHTTP
from ._simprofile import PROFILES


def register(commands: Any) -> None:
    """Add the `sim` command to plait's CLI (found through the `plait.cli` entry point)."""
    sim = commands.add_parser("sim", help="the simulated GPU serving engine")
    verbs = sim.add_subparsers(dest="sim_command", required=True)
    serve = verbs.add_parser("serve", help="serve it over an OpenAI-compatible HTTP API")
    serve.add_argument("--profile", default="h100-llama3-8b", choices=sorted(PROFILES))
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    serve.add_argument(
        "--error-rate", type=float, default=0.0, help="share of completions answered with a 500"
    )
    serve.add_argument(
        "--timeout-rate",
        type=float,
        default=0.0,
        help="share of completions held for an hour (past any client's timeout)",
    )
    serve.set_defaults(handler=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    try:
        faults = Faults(args.error_rate, args.timeout_rate, seed=args.seed)
    except UsageError as exc:
        print(f"plait sim serve: error: {exc}")
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.profile, args.host, args.port, args.seed, faults))
    return 0


async def serve(
    profile: str, host: str, port: int, seed: int, faults: Faults | None = None
) -> None:
    async with SimServer(profile, seed=seed, clock=SystemClock()) as sim:
        runner = web.AppRunner(SimHTTP(sim, faults=faults).app())
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            print(f"plait sim: {profile} serving {sim.profile.model} on http://{host}:{port}/v1")
            await asyncio.Event().wait()  # until interrupted
        finally:
            await runner.cleanup()
