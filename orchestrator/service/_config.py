"""`plait serve`'s config file: the usual engine and backend tables, plus `[service]` and
`[[tenants]]`.

    [service]
    port = 8470
    store = "plait-serve.db"             # beside this file; or a database URL
    registry = ["serve_registry.py"]     # modules (or .py files beside this file)

    [[tenants]]
    name = "demo"
    token_sha256 = "..."                 # `plait serve --hash-token` prints it

A token is kept only as its sha256 (or read from an environment variable named by
`token_env` and hashed at start-up), so the file can be committed and no log shows one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from ..durability._registry import Rebuildable, Registry
from ..durability._retention import Retention
from ..engine._config import (
    Config,
    ConfigSection,
    load_config,
    problem_text,
    problems_report,
    read_config_file,
)
from ..model._errors import UsageError
from ..model._template import MAX_PROMPT_CHARS
from ._spec import MAX_BATCH_ROWS, MAX_EDGES, MAX_TASKS


class RetentionSettings(ConfigSection):
    """`[service.retention]`: what the store keeps of finished workflows (docs/durability.md);
    "never" turns a bound off."""

    compact_after_s: Annotated[float, Field(ge=0)] | Literal["never"] = 3600.0
    delete_after_s: Annotated[float, Field(ge=0)] | Literal["never"] = 7 * 86400.0
    keep_last: int | None = Field(default=None, ge=0)
    every_s: float = Field(default=300.0, gt=0)

    def policy(self) -> Retention:
        def seconds(value: float | str) -> float | None:
            return None if value == "never" else float(value)

        return Retention(
            compact_after=seconds(self.compact_after_s),
            delete_after=seconds(self.delete_after_s),
            keep_last=self.keep_last,
            every=self.every_s,
        )


class ServiceSettings(ConfigSection):
    """The `[service]` table."""

    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    store: str = "plait-serve.db"
    """A SQLite file (relative to the config file) or a database URL."""
    registry: list[str] = Field(default_factory=list)
    """Modules whose agents, tools and functions the service may run: a module name, or a
    .py file relative to the config file. A module that defines `registry` (a Registry, or
    a function returning one) gives exactly that; otherwise everything it defines."""
    registry_entry_points: list[str] = Field(default_factory=list)
    """Entry point groups whose entries are modules, agents, tools or functions to add."""
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_tasks: int = Field(default=MAX_TASKS, ge=1, le=MAX_TASKS)
    max_edges: int = Field(default=MAX_EDGES, ge=0, le=MAX_EDGES)
    max_prompt_chars: int = Field(default=MAX_PROMPT_CHARS, ge=1, le=MAX_PROMPT_CHARS)
    """The longest prompt one task of a request may fill to with the request's inputs
    (characters; longer is refused with 413 before anything is built)."""
    max_request_prompt_chars: int = Field(default=8 * MAX_PROMPT_CHARS, ge=1)
    """The most text all the prompts and tool arguments of one request may fill to (422)."""
    heartbeat_s: float = Field(default=15.0, gt=0)
    """How often an idle event stream sends a comment to keep proxies from closing it."""
    drain_s: float = Field(default=10.0, ge=0)
    """On shutdown, how long running workflows may take to finish before they are left in
    the store for the next start to resume."""
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """A connection must send its request line and headers within this long of opening
    (or of its last answer, kept alive); else it is closed."""
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    """A request's body must arrive whole within this long; else the answer is 408."""
    max_connections: int | None = Field(default=None, ge=1)
    """Connections open at once (None: the open-file limit less 256). At the limit a new
    connection closes the oldest one that has not sent a request yet, or is closed."""
    max_wait_s: float = Field(default=60.0, gt=0)
    """The longest `?wait=` a request may ask for."""
    batch_dir: str = "plait-batches"
    """Where batch jobs keep their input, output and state (relative to the config file)."""
    max_batch_rows: int = Field(default=MAX_BATCH_ROWS, ge=1, le=MAX_BATCH_ROWS)
    """Rows in one `POST /v1/batches` (its body is also bounded by `max_body_bytes`)."""
    lease_s: float | None = Field(default=None, gt=0, le=3600)
    """Set: this service is one of several engines sharing the store (docs/scaling.md):
    its runs are leased for this many seconds and renewed by heartbeat, and it takes over
    the runs of an engine that stopped renewing. None (the default): the only engine."""
    engine_id: str | None = Field(default=None, min_length=1, max_length=200)
    """This engine's name in the store with `lease_s` (default: host, pid and a suffix)."""
    ray_address: str | None = Field(default=None, min_length=1)
    """Connect to this Ray cluster at start ("host:port" of its head node, "ray://...",
    "auto"), for the tasks marked for Ray (docs/ray.md)."""
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    """Finished workflows are compacted after an hour and deleted after a week."""
    notify: str | None = None
    """With `lease_s`: how engines wake each other (a cancel asked of one engine for a
    workflow another runs): "postgresql" (LISTEN/NOTIFY on the store's database, the
    default with a PostgreSQL store), a Redis URL ("redis://host:6379/0"), or "none"."""

    @field_validator("notify")
    @classmethod
    def _notify(cls, value: str | None) -> str | None:
        if value is None or value in ("postgresql", "none"):
            return value
        if value.startswith(("redis://", "rediss://", "unix://")):
            return value
        raise ValueError("use 'postgresql', a redis:// (or rediss://) URL, or 'none'")

    @model_validator(mode="after")
    def _cluster_keys(self) -> ServiceSettings:
        if self.lease_s is None and (self.notify is not None or self.engine_id is not None):
            raise ValueError("notify and engine_id are for several engines: set lease_s too")
        if self.notify == "postgresql" and not self.store.startswith("postgresql"):
            raise ValueError(
                "notify = 'postgresql' needs a PostgreSQL store; use a redis:// URL or 'none'"
            )
        return self


class TenantSettings(ConfigSection):
    """One `[[tenants]]` entry: who may call, and how much."""

    name: str = Field(min_length=1, max_length=200)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    token_env: str | None = None
    """An environment variable holding the token (hashed when the service starts)."""
    max_running: int = Field(default=1000, ge=1)
    """Workflows of this tenant running at once; more are refused with 429."""
    rate_per_s: float = Field(default=100.0, gt=0)
    """Requests per second, on average..."""
    burst: int = Field(default=200, ge=1)
    """... with up to this many at once."""
    max_batches: int = Field(default=4, ge=1)
    """Batch jobs of this tenant running at once; more are refused with 429."""
    max_streams: int = Field(default=32, ge=1)
    """Event streams of this tenant open at once; more are refused with 429. As many of its
    requests may wait (`?wait=`) at once; past that a wait is answered at once."""

    @model_validator(mode="after")
    def _one_token(self) -> TenantSettings:
        if (self.token_sha256 is None) == (self.token_env is None):
            raise ValueError("give the tenant's token as exactly one of token_sha256, token_env")
        return self


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    token_sha256: str
    max_running: int
    rate_per_s: float
    burst: int
    max_batches: int = 4
    max_streams: int = 32


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """A checked `plait serve` config: `load_serve_config` makes one."""

    source: str
    service: ServiceSettings
    tenants: tuple[Tenant, ...]
    engine: Config
    """The engine and backends tables, as `plait run` reads them."""
    base: Path
    """The config file's directory: relative paths in it are relative to this."""

    @property
    def batch_dir(self) -> Path:
        target = Path(self.service.batch_dir)
        return target if target.is_absolute() else self.base / target

    @property
    def store(self) -> str:
        target = self.service.store
        if "://" in target or Path(target).is_absolute():
            return target
        return str(self.base / target)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_serve_config(path: str | os.PathLike[str]) -> ServeConfig:
    """Read and check the file; `UsageError` naming every problem."""
    data = read_config_file(path)
    service_table = data.pop("service", {})
    tenant_tables = data.pop("tenants", [])
    problems: list[str] = []
    service = ServiceSettings()
    try:
        service = ServiceSettings.model_validate(service_table)
    except ValidationError as exc:
        problems.extend(problem_text(e, ("service",)) for e in exc.errors())
    tenants: list[Tenant] = []
    if not isinstance(tenant_tables, list):
        problems.append("tenants: must be an array of tables ([[tenants]])")
        tenant_tables = []
    for i, table in enumerate(tenant_tables):
        try:
            settings = TenantSettings.model_validate(table)
        except ValidationError as exc:
            problems.extend(problem_text(e, ("tenants", i)) for e in exc.errors())
            continue
        digest = settings.token_sha256
        if settings.token_env is not None:
            token = os.environ.get(settings.token_env)
            if not token:
                problems.append(
                    f"tenants[{i}].token_env: the environment variable {settings.token_env} "
                    "is not set (or empty)"
                )
                continue
            digest = hash_token(token)
        assert digest is not None
        tenants.append(
            Tenant(
                settings.name,
                digest,
                settings.max_running,
                settings.rate_per_s,
                settings.burst,
                settings.max_batches,
                settings.max_streams,
            )
        )
    names = [t.name for t in tenants]
    for name in {n for n in names if names.count(n) > 1}:
        problems.append(f"tenants: {name!r} is listed twice")
    tokens = [t.token_sha256 for t in tenants]
    if len(set(tokens)) != len(tokens):
        problems.append("tenants: two tenants have the same token")
    if not tenant_tables and not problems:
        problems.append(
            "tenants: none; add at least one [[tenants]] with a token (plait serve "
            "--hash-token prints a token's token_sha256)"
        )
    try:
        engine = load_config(data, name=str(path))
    except UsageError as exc:
        problems.append(str(exc).removeprefix(f"{path}: "))
        engine = load_config({})
    if problems:
        raise UsageError(problems_report(str(path), problems))
    return ServeConfig(
        source=str(path),
        service=service,
        tenants=tuple(tenants),
        engine=engine,
        base=Path(path).resolve().parent,
    )


def load_registry(config: ServeConfig) -> Registry:
    """What the service may run: the config's modules and entry point groups. Never found by
    import at run time (`imports=False`): a request cannot name code nobody registered."""
    registry = Registry(imports=False)
    for target in config.service.registry:
        registry.merge(_module_registry(_load_module(target, config.base)))
    for group in config.service.registry_entry_points:
        for entry in entry_points(group=group):
            try:
                value = entry.load()
            except Exception as exc:
                raise UsageError(
                    f"{config.source}: entry point {entry.name} (group {group}) failed to "
                    f"load: {type(exc).__name__}: {exc}"
                ) from exc
            if isinstance(value, ModuleType):
                registry.merge(_module_registry(value))
            else:
                registry.add(value)
    return registry


def _module_registry(module: ModuleType) -> Registry:
    given: Any = getattr(module, "registry", None)
    if given is None:
        return Registry(imports=False).scan(module)
    if callable(given) and not isinstance(given, Registry | Rebuildable):
        given = given()
    if not isinstance(given, Registry):
        raise UsageError(
            f"{module.__name__}.registry must be a Registry or a function returning one, "
            f"got {type(given).__name__}"
        )
    return given


def _load_module(target: str, base: Path) -> ModuleType:
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else base / target
        if not path.is_file():
            raise UsageError(f"service.registry: no file {str(path)!r}")
        name = f"plait_serve_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"service.registry: cannot load {str(path)!r} as a module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise UsageError(
                f"service.registry: {path} raised {type(exc).__name__} while loading: {exc}"
            ) from exc
        return module
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise UsageError(f"service.registry: cannot import {target!r}: {exc}") from exc
