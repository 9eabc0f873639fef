"""How `plait run` and `plait config check` read a configuration: the file a module names,
the clock, the backends and limits that a run uses, and the check's report."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TextIO

from ..admission._mode import SAYS
from ..admission._queue import Limits
from ..engine._config import Config, TelemetrySettings, load_config, read_config_file
from ..engine._tracing import export_wanted
from ..model._clock import Clock
from ..model._errors import UsageError
from ..model._llm import LLMBackend

if TYPE_CHECKING:
    from ..service._config import Tenant


def clock_of(given: str | None, config: Config | None, module: ModuleType) -> tuple[str, list[str]]:
    """The clock a run uses: the command line's, else the config's, else the module's CLOCK;
    and notes for the run's summary.

    A virtual clock jumps over a socket's wait, so backends that talk to a server need the
    system clock. Asked for explicitly (flag or config), a virtual clock with such a backend
    is an error; a module's CLOCK is a default for its own simulated backends, so when the
    config brings network backends it gives way to the system clock, with a note."""
    remote = [] if config is None else [b for b in config.backends.values() if b.kind.wall_clock]
    from_file = config.engine.clock if config is not None else None
    explicit = given or from_file
    if explicit is not None:
        if explicit == "virtual" and remote and config is not None:
            first = remote[0]
            where = "--clock virtual" if given else f'clock = "virtual" in {config.source}'
            raise UsageError(
                f"backend {first.name!r} ({first.describe()}) talks to a server over the "
                f"network and needs the system clock, but {where} asks for virtual time "
                "(it would jump over every wait to the call's timeout); "
                + ("drop --clock virtual" if given else '[engine] clock = "system"')
            )
        return str(explicit), []
    own = str(getattr(module, "CLOCK", "system"))
    if own == "virtual" and remote and config is not None:
        names = ", ".join(repr(b.name) for b in remote)
        return "system", [
            f'clock: system, not the module\'s CLOCK = "virtual": backend(s) {names} from '
            f"{config.source} talk to a server over the network"
        ]
    return own, []


def config_of(module: ModuleType, path: str | None) -> Config | None:
    """The config named by `--config`, else by the module's CONFIG (beside the module)."""
    if path is None:
        own = getattr(module, "CONFIG", None)
        if own is None:
            return None
        path = str(Path(module.__file__ or ".").parent / own)
    return load_config(path)


def backends_of(
    module: ModuleType, config: Config | None, clock: Clock
) -> tuple[dict[str, LLMBackend], list[str]]:
    """The module's `backends(clock)` with the config's laid over them (a config's backend
    wins over the module's of the same name: the file is what the user chose for this run);
    and notes for the run's summary saying which were replaced."""
    make_backends = getattr(module, "backends", None)
    backends = dict(make_backends(clock)) if callable(make_backends) else {}
    notes: list[str] = []
    if config is not None:
        from_file = config.build_backends(clock)
        module_file = Path(module.__file__ or "the module").name
        for name in sorted(backends.keys() & from_file.keys()):
            notes.append(
                f"backend {name!r}: from {config.source} (replaces the one backends() in "
                f"{module_file} defines)"
            )
        backends.update(from_file)
    return backends, notes


def limits_of(
    backends: Iterable[str],
    config: Config | None,
    max_in_flight: int | None = None,
    max_waiting: int | None = None,
) -> dict[str, Limits]:
    """The config's limits, with the command line's bounds laid over every LLM backend's."""
    limits = dict(config.limits) if config is not None else {}
    if max_in_flight is None and max_waiting is None:
        return limits
    for name in backends:
        own = limits.get(name, Limits())
        limits[name] = replace(
            own,
            max_in_flight=own.max_in_flight if max_in_flight is None else max_in_flight,
            max_waiting=own.max_waiting if max_waiting is None else max_waiting,
        )
    return limits


def check_config(path: str, out: TextIO, *, strict: bool = False) -> int:
    """Validate a config file and print what it defines; builds the backends but connects to
    nothing and starts nothing. An environment variable a backend reads that is not set here
    is a warning (the file may be meant for another machine); with `strict`, a failure.
    Returns the exit status: 0 valid, 1 warnings under `strict`. A `plait serve` config
    (one with [service] or [[tenants]]) is checked whole, its service and tenants too."""
    served = None
    if {"service", "tenants"} & read_config_file(path).keys():
        from ..service import load_serve_config  # the service's tables are its own

        served = load_serve_config(path)
        config = served.engine
    else:
        config = load_config(path)
    warnings: list[str] = []
    for name, backend in config.backends.items():
        unset = backend.unset_env_vars()
        if unset:
            warnings.append(
                f"backends.{name}: the environment variable {', '.join(unset)} is not set "
                "here; set it where plait runs"
            )
        else:
            backend.build()
    engine = config.engine
    clock = engine.clock or "the module's CLOCK"
    deadline = f", deadline {engine.deadline:g} s" if engine.deadline is not None else ""
    out.write(
        f"{config.source}: valid\nengine: clock {clock}{deadline}\n"
        f"admission: {engine.admission}: {SAYS[engine.admission]}\n"
    )
    for name, backend in config.backends.items():
        out.write(f"backend {name!r} ({backend.kind.name}): {backend.describe()}\n")
        if backend.limits is not None:
            out.write(f"  limits: {_limits_text(backend.limits)}\n")
    if not config.backends:
        out.write("no backends defined\n")
    out.write(f"telemetry: {telemetry_text(config.telemetry)}\n")
    for name, limits in config.limits.items():
        if name not in config.backends:
            out.write(f"resource {name!r}: {_limits_text(limits)}\n")
    if served is not None:
        service = served.service
        cluster = (
            ""
            if service.lease_s is None
            else f", one of several engines (lease {service.lease_s:g} s)"
        )
        out.write(
            f"service: http://{service.host}:{service.port}/, store "
            f"{_no_password(served.store)}{cluster}; "
            f"registry {', '.join(service.registry) or 'none'}\n"
        )
        told = {"host", "port", "store", "registry", "lease_s", "retention"}
        settings = {k: v for k, v in service.changed().items() if k not in told}
        if settings:
            out.write(f"  settings: {_settings_text(settings)}\n")
        retention = service.retention.changed()
        if retention:
            out.write(f"  retention: {_settings_text(retention)}\n")
        out.write(f"tenants: {', '.join(_tenant_text(t) for t in served.tenants)}\n")
    for warning in warnings:
        print(f"plait: warning: {warning}", file=sys.stderr)
    if warnings and strict:
        print(f"plait: error: {len(warnings)} warning(s) and --strict", file=sys.stderr)
        return 1
    return 0


def _no_password(url: str) -> str:
    """A store URL as it can be shown: a password in it is replaced by ***."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def _settings_text(settings: Mapping[str, object]) -> str:
    """`key value, ...`, with any password in a URL replaced by ***."""
    return ", ".join(
        f"{key} {_no_password(value) if isinstance(value, str) else value!r}"
        for key, value in settings.items()
    )


def _tenant_text(tenant: Tenant) -> str:
    """A tenant's name, and its limits that are not the defaults."""
    from ..service._config import TenantSettings

    defaults = TenantSettings.model_fields
    changed = {
        name: getattr(tenant, name)
        for name in ("max_running", "rate_per_s", "burst", "max_batches", "max_streams")
        if getattr(tenant, name) != defaults[name].default
    }
    return tenant.name + (f" ({_settings_text(changed)})" if changed else "")


def _limits_text(limits: Limits) -> str:
    text = f"at most {limits.max_in_flight} in flight, {limits.max_waiting} waiting"
    if limits.batch_in_flight is not None:
        text += f", {limits.batch_in_flight} for slack-rich work while urgent work is around"
    return text if limits.hold_back else text + ", no hold-back"


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above zero")
    return value


def telemetry_text(settings: TelemetrySettings | None) -> str:
    """Whether traces are exported, where to and as what service, as the file and this
    environment say it."""
    env = os.environ
    if not export_wanted(settings):
        off = "OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none" if settings is not None else ""
        return f"no traces exported ({off} in the environment)" if off else "no traces exported"
    where = (
        (settings.endpoint if settings is not None else None)
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or (env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").rstrip("/") + "/v1/traces")
    )
    if where == "/v1/traces":
        where = "http://localhost:4318/v1/traces"
    service = env.get("OTEL_SERVICE_NAME") or (settings.service_name if settings else "plait")
    return f"traces of every run exported over OTLP/HTTP to {where}, service {service!r}"
