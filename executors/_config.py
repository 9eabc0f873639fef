"""The backend kinds a config file may name, and building backends from a config.

    [backends.gpu]                       [backends.pool]
    kind = "openai"                      kind = "router"
    url = "http://gpu1:8000/v1"          urls = ["http://gpu1:8000/v1", "http://gpu2:8000/v1"]
    dialect = "vllm"                     dialect = "vllm"

`OPENAI`, `ROUTER` and `SIM` are registered under the `plait.backends` entry point group
(pyproject.toml), which is how `orchestrator.load_config` and the CLI find them.
Secrets stay out of files: `api_key_env` names the environment variable that holds the key,
and it is read when the backend is built, not when the file is checked.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from orchestrator import Clock, LLMBackend, UsageError, load_config
from orchestrator.ext import BackendKind, ConfigSection

from ._capacity import MAX_KV_TOKENS, explain_capacity
from ._dialects import DIALECTS
from ._grouping import PrefixGrouper
from ._openai import OpenAIBackend
from ._prefix import Tokenize
from ._router import Router
from ._sim import SimServer
from ._simprofile import PROFILES


def _known_dialect(value: str) -> str:
    if value not in DIALECTS:
        raise ValueError(f"unknown dialect {value!r}; choose one of {', '.join(DIALECTS)}")
    return value


def _known_profile(value: str) -> str:
    if value not in PROFILES:
        raise ValueError(
            f"unknown simulator profile {value!r}; choose one of {', '.join(PROFILES)}"
        )
    return value


Dialect = Annotated[str, AfterValidator(_known_dialect)]
ProfileName = Annotated[str, AfterValidator(_known_profile)]


def _one_key_source(api_key: str | None, api_key_env: str | None) -> None:
    if api_key is not None and api_key_env is not None:
        raise ValueError("give api_key or api_key_env, not both (prefer api_key_env for secrets)")


def _api_root(url: str) -> str:
    """An OpenAI-compatible API root: http(s), a host, and a path (`/v1` on vLLM, SGLang,
    llama.cpp, Dynamo and plait's simulator); checked here, not as a bare 404 at run time."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"{url!r} is not an http(s) URL; give http:// or https://, e.g. "
            f"'http://{url.split('://')[-1].rstrip('/') or 'gpu1:8000'}/v1'"
            if "://" not in url
            else f"{url!r} is not an http(s) URL with a host; e.g. 'http://gpu1:8000/v1'"
        )
    if parts.path in ("", "/"):
        raise ValueError(
            f"{url!r} has no API path, so every call would get a 404; did you mean "
            f"{url.rstrip('/') + '/v1'!r}?"
        )
    return url


ApiRoot = Annotated[str, AfterValidator(_api_root)]


class EndpointSettings(ConfigSection):
    """`kind = "openai"`: one OpenAI-compatible endpoint."""

    url: ApiRoot
    dialect: Dialect = "openai"
    model: str | None = None
    api_key: str | None = None
    """A key written in the file: only for placeholders such as local servers' "none"."""
    api_key_env: str | None = None
    """The environment variable that holds the key (read when the backend is built)."""
    timeout_s: float = Field(default=600.0, gt=0)
    slots: int | None = Field(default=None, ge=1)
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=MAX_KV_TOKENS)
    """The server's KV cache in tokens, where the server does not say its own (vLLM, SGLang
    and llama.cpp say it; Dynamo and the OpenAI API do not)."""

    @model_validator(mode="after")
    def _one_key(self) -> EndpointSettings:
        _one_key_source(self.api_key, self.api_key_env)
        return self


class RouterMember(ConfigSection):
    """One endpoint of a router; what it leaves unset, it takes from the router's table."""

    url: ApiRoot
    name: str | None = None
    dialect: Dialect | None = None
    model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)
    slots: int | None = Field(default=None, ge=1)
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=MAX_KV_TOKENS)

    @model_validator(mode="after")
    def _one_key(self) -> RouterMember:
        _one_key_source(self.api_key, self.api_key_env)
        return self


_LANE_TUNING = (
    "lanes size themselves from the replicas' learned throughput knee, and only lane_clear "
    "is set in a file; to experiment, pass Router(lanes=LaneTuning(...)) in Python "
    "(docs/admission.md)"
)


class LaneSettings(ConfigSection):
    """The urgent-lane key a `router` table and a `sim` table with replicas share (the
    `Router` argument of the same name; docs/admission.md, "Urgent lanes")."""

    retired_keys: ClassVar[Mapping[str, str]] = {
        "lane_share_slack": "a lane is shared beside urgent work whose programs have at least "
        "their remaining path to spare (the engine's shareable class)",
        **dict.fromkeys(
            (
                "urgent_lanes",
                "lane_urgent_calls",
                "lane_batch_in_flight",
                "lane_batch_programs",
                "lane_prefill_tokens",
                "lane_share_calls",
                "lane_quiet_s",
            ),
            _LANE_TUNING,
        ),
    }

    lane_clear: bool = True
    """A replica becoming a lane is cleared of the router's batch calls: each is cancelled
    there and routed again. False (a hosted API that bills a cancelled call anyway): they
    are left to finish."""


class RouterSettings(LaneSettings):
    """`kind = "router"`: several endpoints of one model, used as one backend.

    Members come from `urls` (all alike) or `endpoints` (tables that may differ); the
    endpoint keys given here (dialect, model, ...) apply to every member that leaves them out.
    """

    retired_keys: ClassVar[Mapping[str, str]] = {
        "cache_blocks": "the router reads each server's KV cache from the server (vLLM, "
        "SGLang, llama.cpp); where a server does not say it, give kv_cache_tokens, in tokens "
        "(cache_blocks x block_tokens)"
    }

    urls: list[ApiRoot] | None = None
    endpoints: list[RouterMember] | None = None
    dialect: Dialect = "openai"
    model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    slots: int | None = Field(default=None, ge=1)
    block_tokens: int | None = Field(default=None, ge=1)
    """Prompts are hashed in blocks of this many tokens; unset: the members' KV block, as
    their servers say it (16 where they do not)."""
    max_imbalance: float = Field(default=1.5, ge=1.0)
    readmit_after_s: float = Field(default=30.0, ge=0)
    health_interval_s: float = Field(default=10.0, ge=0)
    """Seconds between health probes of the members; 0: no probes."""
    health_timeout_s: float = Field(default=5.0, gt=0)
    tokenizer: str | None = None
    """A Hugging Face tokenizer name: hash prompts on its tokens (needs `transformers`)."""
    kv_cache_tokens: int | None = Field(default=None, ge=1, le=MAX_KV_TOKENS)
    """Each member's KV cache in tokens, where its server does not say its own; with every
    member's cache known, from the server or from here, the router models their eviction."""
    group_prefixes: bool = False
    """Hold calls sharing an uncomputed prefix with one in flight until it is computed (for
    servers that reuse a prefix only once computed; vLLM shares it within a step)."""
    min_shared_blocks: int = Field(default=8, ge=1)
    """How many shared blocks make calls siblings (with `group_prefixes`)."""

    @model_validator(mode="after")
    def _members(self) -> RouterSettings:
        _one_key_source(self.api_key, self.api_key_env)
        if (self.urls is None) == (self.endpoints is None):
            raise ValueError("give the members as either urls or endpoints (exactly one)")
        names = [m.name or m.url for m in self.members()]
        if not names:
            raise ValueError("a router needs at least one endpoint")
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"endpoint {twice[0]!r} is listed twice; give each endpoint a distinct url or name"
            )
        return self

    def members(self) -> list[RouterMember]:
        if self.endpoints is not None:
            return self.endpoints
        return [RouterMember(url=url) for url in self.urls or ()]

    def resolved(self, member: RouterMember) -> EndpointSettings:
        """`member`'s settings with the router's filling what it leaves unset."""
        own_key = member.api_key is not None or member.api_key_env is not None
        return EndpointSettings(
            url=member.url,
            dialect=member.dialect or self.dialect,
            model=member.model if member.model is not None else self.model,
            api_key=member.api_key if own_key else self.api_key,
            api_key_env=member.api_key_env if own_key else self.api_key_env,
            timeout_s=member.timeout_s if member.timeout_s is not None else self.timeout_s,
            slots=member.slots if member.slots is not None else self.slots,
            kv_cache_tokens=(
                member.kv_cache_tokens
                if member.kv_cache_tokens is not None
                else self.kv_cache_tokens
            ),
        )


class SimSettings(LaneSettings):
    """`kind = "sim"`: the simulated GPU server, in-process on the run's clock."""

    profile: ProfileName = "h100-llama3-8b"
    seed: int = 0
    replicas: int = Field(default=1, ge=1)
    """More than one: that many simulated servers (seeds seed, seed+1, ...) behind a router."""
    honour_priority: bool = True
    max_imbalance: float = Field(default=1.5, ge=1.0)
    """With replicas: the router's load cap (block size is the profile's)."""
    group_prefixes: bool = False
    """Hold calls sharing an uncomputed prefix with one in flight until it is computed
    (`PrefixGrouper`; `plait batch run` turns it on for its default backend)."""
    min_shared_blocks: int = Field(default=8, ge=1)
    """How many shared blocks make calls siblings (with `group_prefixes`)."""


# --- building -----------------------------------------------------------------------------


def _api_key(settings: EndpointSettings) -> str:
    if settings.api_key_env is None:
        return settings.api_key or "none"
    key = os.environ.get(settings.api_key_env)
    if not key:
        raise UsageError(
            f"api_key_env: the environment variable {settings.api_key_env} is not set; "
            "export it before running, or remove api_key_env for a server without keys"
        )
    return key


def _endpoint(name: str, settings: EndpointSettings) -> OpenAIBackend:
    return OpenAIBackend(
        settings.url,
        dialect=settings.dialect,
        model=settings.model,
        api_key=_api_key(settings),
        name=name,
        timeout_s=settings.timeout_s,
        slots=settings.slots,
        kv_cache_tokens=settings.kv_cache_tokens,
    )


def build_openai(name: str, settings: EndpointSettings, clock: Clock | None) -> LLMBackend:
    return _endpoint(name, settings)


def build_router(name: str, settings: RouterSettings, clock: Clock | None) -> LLMBackend:
    members = {
        member.name or member.url: _endpoint(f"{name}/{member.name or member.url}", resolved)
        for member in settings.members()
        for resolved in [settings.resolved(member)]
    }
    tokenize = None if settings.tokenizer is None else _tokenizer(settings.tokenizer)
    router = Router(
        members,
        block_tokens=settings.block_tokens,
        max_imbalance=settings.max_imbalance,
        readmit_after_s=settings.readmit_after_s,
        health_interval_s=settings.health_interval_s or None,
        health_timeout_s=settings.health_timeout_s,
        tokenize=tokenize,
        clock=clock,
        lane_clear=settings.lane_clear,
    )
    if not settings.group_prefixes:
        return router
    return PrefixGrouper(
        router,
        block_tokens=settings.block_tokens,
        min_shared_blocks=settings.min_shared_blocks,
        tokenize=tokenize,
    )


def _tokenizer(name: str) -> Tokenize:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        raise UsageError(
            f"tokenizer: {name!r} needs the transformers package, which is not installed; "
            "`pip install transformers`, or remove tokenizer to hash prompts by characters"
        ) from None
    try:
        encode: Tokenize = transformers.AutoTokenizer.from_pretrained(name).encode
    except Exception as exc:  # a missing or broken tokenizer, whatever the library raises
        raise UsageError(f"tokenizer: cannot load {name!r}: {exc}") from exc
    return encode


def build_sim(name: str, settings: SimSettings, clock: Clock | None) -> LLMBackend:
    def server(seed: int) -> SimServer:
        return SimServer(
            settings.profile, seed=seed, clock=clock, honour_priority=settings.honour_priority
        )

    backend: LLMBackend
    if settings.replicas == 1:
        backend = server(settings.seed)
    else:
        replicas = {f"{name}-{i}": server(settings.seed + i) for i in range(settings.replicas)}
        backend = Router(  # its block and cache as the servers say them: the profile's
            replicas,
            max_imbalance=settings.max_imbalance,
            clock=clock,
            lane_clear=settings.lane_clear,
        )
    if not settings.group_prefixes:
        return backend
    return PrefixGrouper(backend, min_shared_blocks=settings.min_shared_blocks)


# --- describing (without connecting) ---------------------------------------------------------


def _key_source(settings: EndpointSettings) -> str:
    if settings.api_key_env is not None:
        state = "set" if os.environ.get(settings.api_key_env) else "NOT SET"
        return f"key from ${settings.api_key_env} ({state})"
    return "key in the file" if settings.api_key is not None else "no key"


def describe_openai(settings: EndpointSettings) -> str:
    model = settings.model or "the request's"
    slots = f", {settings.slots} slots" if settings.slots else ""
    capacity = explain_capacity(
        settings.dialect, settings.url.rstrip("/").removesuffix("/v1"), settings.kv_cache_tokens
    )
    return (
        f"{settings.dialect} endpoint {settings.url}, model {model}, {_key_source(settings)}, "
        f"timeout {settings.timeout_s:g} s{slots}; capacity: {capacity}"
    )


def describe_router(settings: RouterSettings) -> str:
    members = settings.members()
    lines = [
        f"router over {len(members)} endpoint(s), {_blocks_text(settings.block_tokens)}, "
        f"max imbalance {settings.max_imbalance:g}, readmit after {settings.readmit_after_s:g} s, "
        + (
            f"health probe every {settings.health_interval_s:g} s"
            if settings.health_interval_s
            else "no health probes"
        )
        + (f" (timeout {settings.health_timeout_s:g} s)" if settings.health_interval_s else "")
        + (f", tokenizer {settings.tokenizer}" if settings.tokenizer else "")
        + (
            f", prefix grouping from {settings.min_shared_blocks} shared blocks"
            if settings.group_prefixes
            else ""
        )
        + _lanes_text(settings)
    ]
    for member in members:
        lines.append(f"  {member.name or member.url}: {describe_openai(settings.resolved(member))}")
    return "\n".join(lines)


def _blocks_text(block_tokens: int | None) -> str:
    if block_tokens is not None:
        return f"blocks of {block_tokens} tokens"
    return "blocks of the members' KV block (read from them; 16 where they do not say it)"


def _lanes_text(settings: LaneSettings) -> str:
    clear = "cleared of batch calls as they form" if settings.lane_clear else "left to drain"
    return f", urgent lanes as the urgent load needs (one per learned knee of calls; {clear})"


def describe_sim(settings: SimSettings) -> str:
    profile = PROFILES[settings.profile]
    text = (
        f"simulated {profile.name} ({profile.model}), seed {settings.seed}, the profile's "
        f"{profile.kv_tokens:,} tokens of KV cache in blocks of {profile.block_size}"
    )
    if not settings.honour_priority:
        text += ", ignoring the priority hint"
    if settings.replicas > 1:
        text += (
            f", {settings.replicas} replicas behind a router (max imbalance "
            f"{settings.max_imbalance:g})"
        )
        text += _lanes_text(settings)
    if settings.group_prefixes:
        text += f", prefix grouping from {settings.min_shared_blocks} shared blocks"
    return text


def _endpoint_env(settings: EndpointSettings) -> list[str]:
    return [settings.api_key_env] if settings.api_key_env else []


def _router_env(settings: RouterSettings) -> list[str]:
    names = (settings.resolved(m).api_key_env for m in settings.members())
    return sorted({name for name in names if name})


OPENAI = BackendKind(
    "openai", EndpointSettings, build_openai, describe_openai, wall_clock=True,
    env_vars=_endpoint_env,
)  # fmt: skip
ROUTER = BackendKind(
    "router", RouterSettings, build_router, describe_router, wall_clock=True,
    env_vars=_router_env,
)  # fmt: skip
SIM = BackendKind("sim", SimSettings, build_sim, describe_sim)
BACKEND_KINDS: Mapping[str, BackendKind[Any]] = {k.name: k for k in (OPENAI, ROUTER, SIM)}


def backends_from_config(
    source: str | os.PathLike[str] | Mapping[str, Any], clock: Clock | None = None
) -> dict[str, LLMBackend]:
    """The backends a config file (or its contents as a dict) defines, by name, not opened.

    Open each with `async with` (an `AsyncExitStack` holds them all) before the engine runs;
    `orchestrator.load_config` gives the engine settings and limits of the same file.
    """
    return load_config(source, kinds=BACKEND_KINDS).build_backends(clock)
