"""`plait serve --config FILE`: open the store and the backends, resume what an earlier
process left running, serve until SIGTERM or Ctrl-C, then drain and stop.

Shutdown: new work is refused (503, `/readyz` says so) and event streams end; running
workflows get `drain_s` to finish; what is still running then stays in the store, as
committed, and the next start resumes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from importlib.metadata import entry_points
from typing import TextIO

from aiohttp import web

from ..cluster._cluster import Cluster
from ..cluster._notify import Notifier
from ..engine._engine import Engine
from ..engine._open import open_backends, open_store
from ..engine._tracing import exporting
from ..model._clock import SystemClock
from ..model._errors import UsageError
from ..model._events import Event
from ._app import Service
from ._batches import batch_runs
from ._config import ServeConfig, load_registry
from ._door import Door, raise_open_file_limit


async def serve(
    config: ServeConfig,
    *,
    out: TextIO = sys.stdout,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    """Run the service until `stop` is set (default: SIGTERM or SIGINT)."""
    registry = load_registry(config)
    clock = SystemClock()
    stop = stop or _on_signals()
    async with contextlib.AsyncExitStack() as stack:
        if await stack.enter_async_context(exporting(config.engine.telemetry)) is not None:
            print("plait serve: traces exported over OTLP/HTTP", file=out)
        settings = config.service
        backends = config.engine.build_backends(clock)
        notifier = None
        if settings.lease_s is not None:
            notifier = await stack.enter_async_context(_notifier(settings.notify, config.store))
            if notifier is not None:
                _join_peers(backends, notifier)
        await open_backends(stack, backends)
        store = await stack.enter_async_context(open_store(config.store))
        if settings.ray_address is not None:
            await stack.enter_async_context(_ray(settings.ray_address))
        stack.enter_context(_long_lived())
        raise_open_file_limit()
        cluster = None
        if settings.lease_s is not None:
            cluster = Cluster(
                lease_s=settings.lease_s,
                engine_id=settings.engine_id,
                registry=registry,
                share_every_s=min(0.25, settings.lease_s / 4),
            )
        engine = Engine(
            backends=backends,
            admission=config.engine.engine.admission,
            clock=clock,
            limits=config.engine.limits,
            store=store,
            cluster=cluster,
            retention=settings.retention.policy(),
        )
        async with engine:
            if cluster is None:
                # Each batch job resumes its own rows (Service's start): the others, here.
                skip = await batch_runs(store, config.batch_dir)
                unfinished = [w for w in await store.unfinished() if w not in skip]
                report = await engine.resume(registry, workflows=unfinished)
                for plan in report.plans:
                    if plan.error is not None:
                        print(f"plait serve: not resumed: {plan.workflow}: {plan.error}", file=out)
                if report.runs:
                    print(f"plait serve: resumed {len(report.runs)} workflow(s)", file=out)
                for plan in report.needs_decision:
                    print(_waits(plan.workflow, plan.needs_decision, config.source), file=out)
            # In a cluster, the engine's leases claim what no live engine holds, as they
            # run out: the runs left by an earlier process included.
            service = Service(
                engine,
                registry,
                config.tenants,
                config.service,
                clock=clock,
                batch_dir=config.batch_dir,
                notifier=notifier,
            )
            door = Door(
                max_connections=settings.max_connections,
                header_timeout_s=settings.header_timeout_s,
                counted=lambda reason: service.metrics.cut_off.labels(reason).inc(),
            )
            runner = web.AppRunner(service.app(), handle_signals=False, **door.runner_options())
            await runner.setup()  # its start goes on with the batch jobs left running
            again = service.batches.counts().get("running", 0)
            if again:
                print(f"plait serve: went on with {again} batch job(s)", file=out)
            site = door.site(runner, config.service.host, config.service.port)
            try:
                await site.start()
            except OSError as exc:
                await runner.cleanup()
                raise _cannot_listen(config, exc) from None
            names = registry.names()
            print(
                f"plait serve: listening on http://{config.service.host}:{_port(runner)}/ "
                f"(store {config.store}; "
                + ("" if engine.leases is None else f"engine {engine.leases.owner}; ")
                + f"{len(names['agents'])} agents, "
                f"{len(names['tools'])} tools, {len(names['functions'])} functions; "
                f"{len(config.tenants)} tenant(s))",
                file=out,
                flush=True,
            )
            if ready is not None:
                ready.set()
            try:
                await stop.wait()
            finally:
                service.stop_accepting()
                await _drain(engine, config.service.drain_s)
                left = engine.running()
                await runner.cleanup()
                if left:
                    print(
                        f"plait serve: {left} workflow(s) still running are kept in the store; "
                        "the next start resumes them",
                        file=out,
                    )
    print("plait serve: stopped", file=out, flush=True)


def _cannot_listen(config: ServeConfig, exc: OSError) -> UsageError:
    """Why the service cannot take its address, and what to do about it."""
    host, port = config.service.host, config.service.port
    if exc.errno == errno.EADDRINUSE:
        return UsageError(
            f"port {port} on {host} is in use (another plait serve, or another program); stop "
            f"that, or pick another port: plait serve --config {config.source} --port N "
            "([service] port in the file; 0 takes any free port)"
        )
    return UsageError(
        f"cannot listen on {host}:{port}: {exc.strerror or exc}; check [service] host and "
        f"port in {config.source} (or --port)"
    )


def _waits(workflow: str, tasks: tuple[str, ...], source: str) -> str:
    """The start-up line for a workflow held until someone decides its tasks."""
    names = ", ".join(repr(t) for t in tasks)
    return (
        f"plait serve: waits for a decision: workflow {workflow}: task(s) {names} not "
        "idempotent and running when the service stopped; run them again or fail them with "
        f'POST /v1/workflows/{workflow}/decision {{"decision": "rerun"}} (or "fail"), '
        f"or, with the service stopped, plait resume --config {source} --decide "
        f"'{workflow}=rerun'"
    )


def _join_peers(backends: Mapping[str, object], notifier: Notifier) -> None:
    """Every router among the backends (inside wrappers too) shares its placements with
    the routers of the other engines, one channel per backend name."""
    for name, backend in backends.items():
        seen: object | None = backend
        while seen is not None:
            join = getattr(seen, "join_peers", None)
            if callable(join):
                join(notifier, f"plait_router_{name}")
                break
            seen = getattr(seen, "backend", None)


def _ray(address: str) -> contextlib.AbstractAsyncContextManager[object]:
    """The Ray connection `[service] ray_address` names (executors.RayCluster, found by
    entry point so the core does not import it)."""
    found = entry_points(group="plait.clusters", name="ray")
    if not found:
        raise UsageError("[service] ray_address needs executors' Ray support: pip install -e .")
    cluster: contextlib.AbstractAsyncContextManager[object] = next(iter(found)).load()(address)
    return cluster


@contextlib.asynccontextmanager
async def _notifier(notify: str | None, store: str) -> AsyncIterator[Notifier | None]:
    """The notifier `[service] notify` names (opened), or None."""
    if notify == "none" or (notify is None and not store.startswith("postgresql")):
        yield None
        return
    kind, url = (
        ("redis", notify) if notify and notify.startswith("redis") else ("postgresql", store)
    )
    if notify not in (None, "postgresql") and kind != "redis":
        raise UsageError(
            f"[service] notify = {notify!r}: use 'postgresql', a redis:// URL or 'none'"
        )
    found = entry_points(group="plait.notifiers", name=kind)
    if not found:
        raise UsageError(f"no {kind} notifier is installed (the memory package registers them)")
    opened = next(iter(found)).load()(url)
    async with opened as notifier:
        yield notifier


@contextlib.contextmanager
def _long_lived() -> Iterator[None]:
    """What is loaded by now (modules, the registry, the backends, the store: some 180,000
    objects) lives until the service stops: kept out of the garbage collector's sight
    meanwhile, so a full collection under load scans the work only. It scanned them all
    again, and held the loop for 120-190 ms at a time, the requests' p99."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def _drain(engine: Engine, seconds: float) -> None:
    """Wait until no workflow runs, or `seconds` have passed."""
    finished: asyncio.Queue[Event] = asyncio.Queue()
    engine.bus.listen(finished)
    try:
        async with asyncio.timeout(seconds):
            while engine.running():
                await finished.get()  # any event: look again
    except TimeoutError:
        pass
    finally:
        engine.bus.unlisten(finished)


def _on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):  # not on every platform
            loop.add_signal_handler(sig, stop.set)
    return stop


def _port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0
