"""Configuration from a file: engine settings, backends by name, and their limits.

    [engine]
    admission = "deadlines"
    clock = "virtual"

    [backends.default]
    kind = "sim"
    profile = "h100-llama3-8b"
    limits = { max_in_flight = 64 }

The file is a trust boundary, so every table is a strict pydantic model that rejects unknown
keys, and every mistake becomes one `UsageError` naming the file, the key path and what is
allowed. What a backend's table may hold depends on its `kind`; the kinds live in the
packages that implement backends (`executors`) and announce themselves through the
`plait.backends` entry point group, so this module never imports them.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from ..admission._mode import Mode
from ..admission._queue import Limits
from ..model._clock import Clock
from ..model._errors import UsageError
from ..model._llm import LLMBackend
from ._capacity import HOLD_BACK_SHARE

SUFFIXES = (".toml", ".yaml", ".yml")


class ConfigSection(BaseModel):
    """Base of every table in a config file: strict types, no unknown keys, immutable.

    Strict: `"8"` is not a number and `1` is not a string, so a typo in the file is an
    error rather than a guess.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    retired_keys: ClassVar[Mapping[str, str]] = {}
    """Keys a table no longer takes, each with what to write instead (a table's own, added
    to those of the tables it extends: `retired`)."""

    @classmethod
    def retired(cls) -> dict[str, str]:
        """The keys this table no longer takes: its own and its bases' `retired_keys`."""
        return {
            key: fix
            for base in reversed(cls.__mro__)
            for key, fix in vars(base).get("retired_keys", {}).items()
        }

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        # pydantic's own "extra" error names the key but not what is allowed; say both,
        # and with it every problem of the keys that are known (all in one pass).
        if not isinstance(data, Mapping):
            return data
        fixes = cls.retired()
        retired = [key for key in data if key in fixes]
        unknown = [key for key in data if key not in cls.model_fields and key not in retired]
        if not unknown and not retired:
            return data
        errors = [
            InitErrorDetails(
                type=_error("value_error", f"no longer a key: {fixes[key]}"),
                loc=(key,),
                input=data[key],
            )
            for key in retired
        ]
        if unknown:
            keys = ", ".join(repr(k) for k in unknown)
            said = f"unknown key{'s' if len(unknown) > 1 else ''} {keys}; allowed: " + ", ".join(
                cls.model_fields
            )
            errors.append(InitErrorDetails(type=_error("value_error", said), loc=(), input=data))
        try:
            cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as exc:
            errors.extend(
                InitErrorDetails(type=_error(e["type"], e["msg"]), loc=e["loc"], input=e["input"])
                for e in exc.errors()
            )
        raise ValidationError.from_exception_data(cls.__name__, errors)

    def changed(self) -> dict[str, Any]:
        """The keys whose values are not their defaults, in the table's order (what a check
        prints beside what it always says)."""
        fields = type(self).model_fields
        return {
            key: value
            for key, info in fields.items()
            if (value := getattr(self, key)) != info.get_default(call_default_factory=True)
        }


def _error(kind: str, message: str) -> PydanticCustomError:
    """An error of this type and message, as it is (braces in it are not a template)."""
    return PydanticCustomError(kind, "{message}", {"message": message})


class EngineSettings(ConfigSection):
    """The `[engine]` table."""

    retired_keys: ClassVar[Mapping[str, str]] = {
        "policy": 'the order follows the admission mode: admission = "deadlines" (runs with a '
        'deadline least slack first, the default) or "throughput" (arrival order); '
        "docs/admission.md",
        "gate": 'the deadline gate is part of admission = "deadlines" (the default) and off '
        'with "throughput" or "off"; its settings are internal tuning (docs/admission.md)',
    }

    admission: Mode = "deadlines"
    """What the engine does about deadlines and load: deadlines, throughput or off."""
    clock: Literal["system", "virtual"] | None = None
    """`virtual`: simulated latencies cost no wall time. Unset: the workflow module's CLOCK."""
    deadline: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Seconds from each workflow's start by which it should be done; `--deadline` overrides."""


_DEFAULT_LIMITS = Limits()


class LimitsSettings(ConfigSection):
    """A `limits` table: the bounds of one resource (a backend, `local`, `tools`). A
    backend's hold-back budget is not one of them: the engine derives it from the server's
    KV cache (`derived_limits`), which the server says or the backend's `kv_cache_tokens`."""

    retired_keys: ClassVar[Mapping[str, str]] = {
        "kv_tokens": f"the engine holds new programs back at {HOLD_BACK_SHARE:.0%} of the "
        "server's KV cache, "
        "read from the server (vLLM, SGLang, llama.cpp); where it does not say it, give the "
        "backend's kv_cache_tokens (its whole cache, in tokens)"
    }

    max_in_flight: int = Field(default=_DEFAULT_LIMITS.max_in_flight, ge=1)
    max_waiting: int = Field(default=_DEFAULT_LIMITS.max_waiting, ge=1)
    batch_in_flight: int | None = Field(default=None, ge=1)
    hold_back: bool = True
    """False: never hold new programs back for the server's KV cache."""

    @model_validator(mode="after")
    def _consistent(self) -> LimitsSettings:
        try:
            self.to_limits()  # what the keys say together (batch_in_flight within max_in_flight)
        except UsageError as exc:
            raise ValueError(str(exc).removeprefix("Limits(").replace(")", "", 1)) from None
        return self

    def to_limits(self) -> Limits:
        return Limits(
            max_in_flight=self.max_in_flight,
            max_waiting=self.max_waiting,
            batch_in_flight=self.batch_in_flight,
            hold_back=self.hold_back,
        )


class TelemetrySettings(ConfigSection):
    """The `[telemetry]` table: export traces of every run over OTLP/HTTP (docs/tracing.md)."""

    endpoint: str | None = None
    """The OTLP/HTTP traces URL (`http://collector:4318/v1/traces`); unset: the standard
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`),
    else `http://localhost:4318/v1/traces`."""
    service_name: str = "plait"
    """The `service.name` of the spans (`OTEL_SERVICE_NAME` wins when set)."""

    @model_validator(mode="after")
    def _http_endpoint(self) -> TelemetrySettings:
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {self.endpoint!r}")
        return self


class _File(ConfigSection):
    engine: EngineSettings = EngineSettings()
    backends: dict[str, dict[str, Any]] = {}
    limits: dict[str, LimitsSettings] = {}
    telemetry: TelemetrySettings | None = None


S = TypeVar("S", bound=ConfigSection)


@dataclass(frozen=True, slots=True)
class BackendKind(Generic[S]):
    """A kind of backend that a config file names with `kind = "..."`: the model of its
    table, how to build one and how to describe one without connecting to it.

    Packages that implement backends list theirs under the `plait.backends` entry point
    group (in their pyproject.toml), so `load_config` finds them without importing them.
    """

    name: str
    settings: type[S]
    build: Callable[[str, S, Clock | None], LLMBackend]
    """(backend name, settings, clock) -> an unopened backend; UsageError when it cannot."""
    describe: Callable[[S], str]
    wall_clock: bool = False
    """Its backends wait on a server over the network, so a run needs the system clock."""
    env_vars: Callable[[S], Sequence[str]] | None = None
    """The environment variables a backend of these settings reads when it is built (its
    secrets), so a check can name the unset ones without failing on them."""


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """One backend of a config: its kind, its validated settings, its limits if set."""

    name: str
    kind: BackendKind[Any]
    settings: ConfigSection
    limits: Limits | None
    source: str

    def build(self, clock: Clock | None = None) -> LLMBackend:
        """The backend object, not opened: nothing is connected or started yet."""
        try:
            return self.kind.build(self.name, self.settings, clock)
        except UsageError as exc:
            raise UsageError(f"{self.source}: backends.{self.name}: {exc}") from exc

    def describe(self) -> str:
        return self.kind.describe(self.settings)

    def unset_env_vars(self) -> list[str]:
        """The environment variables this backend reads that are not set now."""
        names = self.kind.env_vars(self.settings) if self.kind.env_vars is not None else ()
        return [name for name in names if name not in os.environ]


@dataclass(frozen=True, slots=True)
class Config:
    """A validated configuration; `load_config` makes one."""

    source: str
    """The file it was read from, or `<dict>`."""
    engine: EngineSettings
    backends: Mapping[str, BackendConfig]
    limits: Mapping[str, Limits]
    """The limits set in the file, by resource: each backend's and the `[limits]` table's."""
    telemetry: TelemetrySettings | None = None
    """The `[telemetry]` table, if the file has one."""

    def build_backends(self, clock: Clock | None = None) -> dict[str, LLMBackend]:
        """The configured backends by name, not opened (open each with `async with`)."""
        return {name: backend.build(clock) for name, backend in self.backends.items()}


def backend_kinds() -> dict[str, BackendKind[Any]]:
    """The backend kinds installed packages register under `plait.backends`."""
    found: dict[str, BackendKind[Any]] = {}
    for entry in entry_points(group="plait.backends"):
        kind = entry.load()
        if not isinstance(kind, BackendKind):
            raise UsageError(
                f"entry point {entry.name} = {entry.value!r} (group plait.backends) is not "
                "an orchestrator.ext.BackendKind; fix the package that registers it"
            )
        found[kind.name] = kind
    return found


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    kinds: Mapping[str, BackendKind[Any]] | None = None,
    name: str | None = None,
) -> Config:
    """Read and check a config: a `.toml`, `.yaml` or `.yml` file, or its contents as a dict.

    `kinds`: the backend kinds allowed (default: those registered under `plait.backends`);
    `name`: what messages call a dict's source (a file it was read from, say).
    Raises `UsageError` naming the file, the key path and what is allowed.
    """
    if isinstance(source, Mapping):
        name, data = name or "<dict>", dict(source)
    else:
        name, data = str(source), read_config_file(source)
    kinds = backend_kinds() if kinds is None else kinds
    problems: list[str] = []
    try:
        top = _File.model_validate(data)
    except ValidationError as exc:
        # Report every problem in one pass: the top-level ones, then each section on its
        # own, so a bad [engine] does not hide a bad backend.
        problems.extend(problem_text(e) for e in exc.errors())
        top = _sections_that_validate(data)
    backends: dict[str, BackendConfig] = {}
    limits = {resource: lim.to_limits() for resource, lim in top.limits.items()}
    for backend, table in top.backends.items():
        where = ("backends", backend)
        if backend in top.limits:
            problems.append(
                f"limits.{backend}: backend {backend!r} has its own limits table; "
                f"set them once, in backends.{backend}.limits"
            )
        table = dict(table)
        kind_name = table.pop("kind", None)
        raw_limits = table.pop("limits", None)
        kind = kinds.get(kind_name) if isinstance(kind_name, str) else None
        settings: ConfigSection | None = None
        if kind is None:
            known = ", ".join(kinds) or "none (is plait installed? run `pip install -e .`)"
            said = "missing" if kind_name is None else f"unknown backend kind {kind_name!r}"
            problems.append(f"{key_path((*where, 'kind'))}: {said}; choose one of {known}")
        else:
            try:
                settings = kind.settings.model_validate(table)
            except ValidationError as exc:
                problems.extend(problem_text(e, where) for e in exc.errors())
        backend_limits: Limits | None = None
        if raw_limits is not None:
            try:
                backend_limits = LimitsSettings.model_validate(raw_limits).to_limits()
            except ValidationError as exc:
                problems.extend(problem_text(e, (*where, "limits")) for e in exc.errors())
        if kind is not None and settings is not None:
            backends[backend] = BackendConfig(backend, kind, settings, backend_limits, name)
            if backend_limits is not None:
                limits[backend] = backend_limits
    if problems:
        raise UsageError(problems_report(name, problems))
    return Config(
        source=name, engine=top.engine, backends=backends, limits=limits, telemetry=top.telemetry
    )


def _sections_that_validate(data: Mapping[str, Any]) -> _File:
    """The file's sections that are valid on their own (others left empty), so that the
    backends are still checked when something else in the file is wrong."""
    engine = data.get("engine", {})
    limits = data.get("limits", {})
    backends = data.get("backends", {})
    valid: dict[str, Any] = {}
    with contextlib.suppress(ValidationError):
        valid["engine"] = EngineSettings.model_validate(engine)
    if isinstance(limits, Mapping):
        good_limits = {}
        for key, table in limits.items():
            with contextlib.suppress(ValidationError):
                good_limits[key] = LimitsSettings.model_validate(table)
        valid["limits"] = good_limits
    if isinstance(backends, Mapping):
        valid["backends"] = {
            key: table for key, table in backends.items() if isinstance(table, Mapping)
        }
    if "telemetry" in data:
        with contextlib.suppress(ValidationError):
            valid["telemetry"] = TelemetrySettings.model_validate(data["telemetry"])
    return _File.model_validate(valid)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The contents of a `.toml`, `.yaml` or `.yml` file, unchecked; `UsageError` if it
    cannot be read or parsed (with the line, when the parser says where)."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in SUFFIXES:
        raise UsageError(
            f"{path}: unknown config file type {suffix or '(no extension)'!r}; "
            "use a .toml, .yaml or .yml file"
        )
    if not file.is_file():
        raise UsageError(f"no config file at {str(path)!r}; check the path")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it: {exc}") from exc
    data: Any
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path}: not valid TOML: {exc}") from exc
    else:
        try:
            data = yaml.load(text, Loader=_YAMLLoader)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from exc
    if data is None:  # an empty YAML file
        return {}
    if not isinstance(data, dict):
        raise UsageError(
            f"{path}: the top level must be a mapping with the keys engine, backends, "
            f"limits; found a {type(data).__name__}"
        )
    return data


class _YAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice is an error (as in TOML), not
    silently the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return str(problem)
    return f"{problem} (at line {mark.line + 1}, column {mark.column + 1})"


def key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def problem_text(error: ErrorDetails, prefix: tuple[int | str, ...] = ()) -> str:
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        message = "missing; this key is required"
    elif error["type"] != "value_error" and not isinstance(error.get("input"), Mapping | list):
        message += f" (got {error['input']!r})"  # our own messages quote the value already
    loc = (*prefix, *error["loc"])
    return f"{key_path(loc)}: {message}" if loc else message


def problems_report(source: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)
