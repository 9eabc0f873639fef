"""Opening what a configuration names: its backends for as long as an engine runs, and the
store a path or URL names (found by entry point, so the core never imports `memory`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from importlib.metadata import entry_points

from ._errors import UsageError
from ._llm import LLMBackend
from ._store import Store


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
