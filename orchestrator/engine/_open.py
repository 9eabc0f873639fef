"""Opening what a configuration names: its backends for as long as an engine runs, the
store a path or URL names (found by entry point, so the core never imports `memory`), and
a workflow module by its path."""

from __future__ import annotations

import contextlib
import importlib.util
import traceback
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from ..durability._store import Store
from ..model._errors import UsageError, error_text
from ..model._llm import LLMBackend


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


def load_module(path: str) -> ModuleType:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no workflow file at {path!r}; give the path of a .py file")
    spec = importlib.util.spec_from_file_location(f"plait_workflow_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise UsageError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from exc
    except Exception as exc:
        raise user_code_error(f"importing {path}", file, exc) from exc
    return module


def user_code_error(what: str, file: Path, exc: BaseException) -> UsageError:
    """The user's own code failed: say where in their file, not where in ours."""
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve() == file.resolve()
    ]
    where = f" (at {file}:{lines[-1]})" if lines else ""
    return UsageError(f"{what} raised {error_text(exc)}{where}")
