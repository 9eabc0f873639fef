"""Each config model is checked against the class it configures: the same keys (less the few
that are the config's own or the class's own, each listed with its reason), the same
defaults, compatible types. A setting added to one side and not the other fails here."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from executors import OpenAIBackend, PrefixGrouper, Router, SimServer
from executors._config import (
    EndpointSettings,
    LaneSettings,
    RouterMember,
    RouterSettings,
    SimSettings,
)
from orchestrator import Engine, Limits
from orchestrator.durability._retention import Retention
from orchestrator.engine._config import EngineSettings, LimitsSettings
from orchestrator.service._config import RetentionSettings, Tenant, TenantSettings

REQUIRED = object()
"""A parameter or key without a default."""


@dataclass(frozen=True)
class Pair:
    """A config model and the classes (or functions) its keys are arguments of."""

    model: type[BaseModel]
    targets: tuple[Callable[..., Any], ...]
    config_only: Mapping[str, str] = field(default_factory=dict)
    """Keys that are no argument of the targets, each with what becomes of it."""
    class_only: Mapping[str, str] = field(default_factory=dict)
    """Arguments no config sets, each with why (or what sets it instead)."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    """Config key -> the argument it is (a unit in the key's name, say)."""
    converted: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    """Config key -> the argument its value becomes, where the file spells it otherwise."""

    @property
    def name(self) -> str:
        return self.model.__name__

    def parameters(self) -> dict[str, tuple[Any, Any]]:
        """The targets' keyword parameters: name -> (default or REQUIRED, type); the first
        target's where two take the same one."""
        found: dict[str, tuple[Any, Any]] = {}
        for target in self.targets:
            function = target.__init__ if isinstance(target, type) else target
            namespace = dict(vars(inspect.getmodule(target)))
            for name, param in inspect.signature(target).parameters.items():
                if name == "self" or name in found:
                    continue
                default = REQUIRED if param.default is param.empty else param.default
                hint = typing.get_type_hints(function, namespace).get(name, Any)
                found[name] = (default, hint)
        return found

    def shared(self) -> list[tuple[str, str]]:
        """(config key, argument) for every key that is an argument."""
        return [
            (key, self.renamed.get(key, key))
            for key in self.model.model_fields
            if key not in self.config_only
        ]


# Arguments of the router that no config sets, with why; shared by the router and the sim.
ROUTER_OWN = {
    "backends": "the members: a router's urls or endpoints, a sim's replicas",
    "tokenize": "built from the router's tokenizer (a Hugging Face name)",
    "cache_blocks": "derived: the servers' KV cache (kv_cache_tokens where a server does not "
    "say it; a sim's profile)",
    "clock": "the run's clock",
    "peers": "set by plait serve when engines share a store (join_peers)",
    "lanes": "the lane policy spelled out (LaneTuning), for experiments: no config sets it",
}
GROUPER_OWN = {
    "backend": "the router (or server) it wraps",
    "remember": "internal tuning: the prefixes it remembers",
}

PAIRS = [
    Pair(
        LimitsSettings,
        (Limits,),
        class_only={
            "kv_tokens": "derived from the server's KV cache (derived_limits); the config's "
            "key is retired",
        },
    ),
    Pair(
        EngineSettings,
        (Engine,),
        config_only={"deadline": "given to each workflow run (engine.iter(deadline=...))"},
        class_only={
            "backends": "the [backends] tables",
            "limits": "the [limits] tables and each backend's limits",
            "store": "plait run --store, [service] store",
            "retention": "[service.retention]",
            "max_workflows": "internal tuning: a bound on workflows held at once",
            "threads": "internal tuning: the pool for synchronous functions",
            "keep_alive": "derived from the backends' declared capabilities",
            "call_retry": "internal tuning: the engine's retry of failed calls",
            "breaker": "internal tuning: the engine's circuit breaker",
            "cluster": "plait serve with [service] lease_s",
        },
        converted={
            "clock": lambda name: None,  # a name; plait run builds the Clock it names
        },
    ),
    Pair(
        RetentionSettings,
        (Retention,),
        renamed={"compact_after_s": "compact_after", "delete_after_s": "delete_after"}
        | {"every_s": "every"},
        converted={
            "compact_after_s": lambda s: None if s == "never" else s,
            "delete_after_s": lambda s: None if s == "never" else s,
        },
    ),
    Pair(
        TenantSettings,
        (Tenant,),
        config_only={"token_env": "read from the environment and hashed into token_sha256"},
        # unset: the hash of token_env's token (one of the two is required)
        converted={"token_sha256": lambda digest: digest},
    ),
    Pair(
        EndpointSettings,
        (OpenAIBackend,),
        renamed={"url": "base_url"},
        config_only={"api_key_env": "read from the environment into api_key"},
        converted={"api_key": lambda key: "none" if key is None else key},
        class_only={
            "name": "the backend's name in the file",
            "api": "the chat API always (completions is for the simulator's tests)",
            "stream": "internal: the engine asks for streaming per call",
            "render": "internal: how a completions prompt is rendered",
            "probe_timeout_s": "internal tuning: the capacity probe's patience",
            "local": "internal: a server in this process (the simulator's HTTP front)",
            "clock": "the run's clock",
        },
    ),
    Pair(
        RouterSettings,
        (Router, PrefixGrouper),
        config_only={
            "urls": "the members (backends), all alike",
            "endpoints": "the members (backends), each its own",
            "dialect": "each member's (an OpenAIBackend argument)",
            "model": "each member's",
            "api_key": "each member's",
            "api_key_env": "each member's",
            "timeout_s": "each member's",
            "slots": "each member's",
            "kv_cache_tokens": "each member's; the router's cache_blocks derive from it",
            "tokenizer": "loaded into tokenize",
            "group_prefixes": "wraps the router in a PrefixGrouper",
        },
        class_only=ROUTER_OWN | GROUPER_OWN,
        converted={"health_interval_s": lambda s: s or None},
    ),
    Pair(
        SimSettings,
        (SimServer, Router, PrefixGrouper),
        config_only={
            "replicas": "how many SimServers, behind a Router when more than one",
            "group_prefixes": "wraps the backend in a PrefixGrouper",
        },
        class_only=ROUTER_OWN
        | GROUPER_OWN
        | {
            "default_max_tokens": "internal: a request's max_tokens where it gives none",
            "record": "internal: the simulator's tests keep every request",
            "block_tokens": "the profile's KV block",
            "readmit_after_s": "in-process replicas never fail",
            "health_interval_s": "in-process replicas never fail",
            "health_timeout_s": "in-process replicas never fail",
        },
    ),
]


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_a_config_model_has_the_keys_of_the_classes_it_configures(pair: Pair) -> None:
    keys = set(pair.model.model_fields)
    parameters = set(pair.parameters())
    assert set(pair.config_only) <= keys, "config_only names keys the model does not have"
    assert set(pair.class_only) <= parameters, "class_only names arguments that do not exist"
    arguments = {argument for _, argument in pair.shared()}
    assert not arguments - parameters, (
        f"{pair.name} has keys no target takes: {sorted(arguments - parameters)}; add them to "
        "the class, or to config_only with what becomes of them"
    )
    unset = parameters - arguments - set(pair.class_only)
    assert not unset, (
        f"{pair.name} sets no {sorted(unset)}; add the keys to the model (and its docs table), "
        "or to class_only with why no config sets them"
    )


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_a_config_models_defaults_are_the_classes(pair: Pair) -> None:
    parameters = pair.parameters()
    for key, argument in pair.shared():
        if argument not in parameters:
            continue  # the keys' test says so
        info = pair.model.model_fields[key]
        ours = info.get_default(call_default_factory=True)
        ours = REQUIRED if ours is PydanticUndefined else ours
        theirs = parameters[argument][0]
        if theirs is REQUIRED:
            continue  # the config's default is the only one
        assert ours is not REQUIRED, f"{pair.name}.{key} is required; {argument} is not"
        given = pair.converted.get(key, lambda value: value)(ours)
        assert given == theirs, f"{pair.name}.{key} defaults to {ours!r}, {argument} to {theirs!r}"


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p.name)
def test_a_config_models_types_are_the_classes(pair: Pair) -> None:
    parameters = pair.parameters()
    for key, argument in pair.shared():
        if key in pair.converted or argument not in parameters:
            continue  # the value is converted: the defaults' test covers it
        ours = pair.model.model_fields[key].annotation
        theirs = parameters[argument][1]
        assert _fits(ours, theirs), f"{pair.name}.{key}: {ours} is not {argument}'s {theirs}"


def test_the_lane_keys_are_the_router_arguments_of_the_same_names() -> None:
    router = set(inspect.signature(Router).parameters)
    assert set(LaneSettings.model_fields) <= router
    retired = LaneSettings.retired()
    assert {"urgent_lanes", "lane_urgent_calls", "lane_quiet_s"} <= set(retired)
    assert all("LaneTuning" in retired[k] for k in retired if k != "lane_share_slack")


def test_a_router_member_takes_the_endpoint_keys_a_router_passes_down() -> None:
    member = set(RouterMember.model_fields) - {"name"}
    assert member == set(EndpointSettings.model_fields)
    assert member <= set(RouterSettings.model_fields) | {"url"}


def _members(hint: Any) -> list[Any]:
    """A type's alternatives: unions spread, Annotated stripped, each Literal's values."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _members(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(hint) for m in _members(arg)]
    if origin is Literal:
        return [("literal", value) for value in typing.get_args(hint)]
    return [hint]


def _fits(ours: Any, theirs: Any) -> bool:
    """Every value of the config's type is one the argument takes."""
    if theirs is Any:
        return True
    allowed = _members(theirs)
    for member in _members(ours):
        if member in allowed:
            continue
        if isinstance(member, tuple):
            if type(member[1]) in allowed:
                continue
            return False
        if member is int and float in allowed:
            continue
        origin = typing.get_origin(member)
        if origin is not None and any(typing.get_origin(a) is origin for a in allowed):
            continue
        return False
    return True
