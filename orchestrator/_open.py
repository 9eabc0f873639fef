"""Opening what a configuration names: its backends for as long as an engine runs, and the
store a path or URL names (found by entry point, so the core never imports `memory`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ._clock import Clock
from ._config import Config, load_config
from ._errors import UsageError
from ._llm import LLMBackend
from ._store import Store

if TYPE_CHECKING:
    from ._engine import Engine


def open_store(target: str) -> Store:
    """The store at `target` (a SQLite path or a database URL), unopened. Stores come from
    the package that implements them (`memory`), found by entry point so that the core
    does not import it."""
    found = entry_points(group="plait.stores", name="sql")
    if not found:
        raise UsageError(
            "no store implementation is installed (the `memory` package registers one); "
            "reinstall plait: pip install -e ."
        )
    factory = next(iter(found)).load()
    store: Store = factory(target)
    return store


async def open_backends(
    stack: contextlib.AsyncExitStack, backends: Mapping[str, LLMBackend]
) -> None:
    """Enter every backend that runs something of its own (a simulated server, a connection
    pool: an async context manager) on `stack`, so it lives as long as the stack."""
    for backend in backends.values():
        if isinstance(backend, contextlib.AbstractAsyncContextManager):
            await stack.enter_async_context(backend)


@contextlib.asynccontextmanager
async def engine_from_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | Config,
    *,
    store: str | Store | None,
    clock: Clock | None,
) -> AsyncIterator[Engine]:
    """`Engine.from_config`: the config's backends opened, the store opened, the engine
    running; all closed again, in reverse order, when the block ends."""
    from ._engine import Engine  # the engine imports this module for from_config

    config = source if isinstance(source, Config) else load_config(source)
    if clock is None and config.engine.clock == "virtual":
        raise UsageError(
            f'{config.source}: [engine] clock = "virtual" needs a clock that drives the '
            "program: pass Engine.from_config(..., clock=clock) with clock = VirtualClock(), "
            "and run the program with clock.run(main())"
        )
    backends = config.build_backends(clock)
    async with contextlib.AsyncExitStack() as stack:
        await open_backends(stack, backends)
        opened: Store | None
        if isinstance(store, str):
            opened = await stack.enter_async_context(open_store(store))
        else:
            opened = store
        engine = Engine(
            backends=backends,
            clock=clock,
            policy=config.engine.policy,
            limits=config.limits,
            store=opened,
            gate=config.engine.deadline_gate(),
        )
        async with engine:
            yield engine
