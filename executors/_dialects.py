"""Dialects: how each server spells plait's backend-neutral `Hints` (docs/backends.md).

A dialect is pure: hints in, body fields and headers out. Servers silently ignore fields
they do not know, so each spelling is pinned by a test against a recording server.

Urgency is a float, higher sooner. Servers take an integer priority: we send
`round(urgency * 1000)` (milliseconds of slack keep their order), negated for servers where
lower runs sooner (vLLM, the simulator). How the program is served (`Hints.service`) is said
only where a server has a word for it: Dynamo's queue head start (`DYNAMO_HEAD_START_S`).
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator import Hints, UsageError
from orchestrator.ext import URGENT_CLASSES, OutputSchema

DialectName = Literal["vllm", "vllm-continuum", "sglang", "dynamo", "llamacpp", "openai", "sim"]
DIALECTS: tuple[DialectName, ...] = (
    "vllm",
    "vllm-continuum",
    "sglang",
    "dynamo",
    "llamacpp",
    "openai",
    "sim",
)

DYNAMO_HEAD_START_S = 1.2
"""Dynamo's `latency_sensitivity` for a call of urgent work (`URGENT_CLASSES`): its router's
queue treats the call as if it had arrived this many seconds earlier (the value Dynamo
recommends for latency-sensitive agent requests). Work that may wait sends none: its place
among programs is the `priority` already sent."""


@dataclass(frozen=True, slots=True)
class Encoded:
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def _priority(hints: Hints) -> int:
    return round(hints.urgency * 1000)


def encode(dialect: str, hints: Hints, *, slots: int | None = None) -> Encoded:
    """The body fields and headers that carry `hints` to a server speaking `dialect`, and
    the call's W3C trace context (`traceparent`) to any server when it is traced.

    `slots`: llama.cpp's number of server slots; a program keeps one slot (its KV stays).
    """
    encoded = _encode(dialect, hints, slots=slots)
    if hints.traceparent:
        encoded.headers["traceparent"] = hints.traceparent
    return encoded


def _encode(dialect: str, hints: Hints, *, slots: int | None) -> Encoded:
    program = hints.program_id
    # The prefix-cache salt (vLLM's `cache_salt`, also read by SGLang and the simulator;
    # Dynamo's `nvext.cache_salt`). llama.cpp and the OpenAI API have none: not sent.
    salt = {"cache_salt": hints.cache_salt} if hints.cache_salt else {}
    if dialect == "openai":
        return Encoded()
    if dialect == "vllm":
        body: dict[str, Any] = {"priority": -_priority(hints), **salt}
        if program:
            body["session_id"] = program
        # Ask for the load report header on the answer (vLLM's endpoint-load-metrics).
        return Encoded(body, {"endpoint-load-metrics-format": "TEXT"})
    if dialect == "vllm-continuum":
        body = {"priority": -_priority(hints), "is_last_step": hints.last_call, **salt}
        if program:
            body["job_id"] = program
        return Encoded(body)
    if dialect == "sglang":
        body = {"priority": _priority(hints), **salt}
        if program:
            body["session_id"] = program
        return Encoded(body)
    if dialect == "dynamo":
        agent_hints: dict[str, Any] = {"priority": _priority(hints)}
        if hints.service in URGENT_CLASSES:
            agent_hints["latency_sensitivity"] = DYNAMO_HEAD_START_S
        if hints.expected_output_tokens is not None:
            agent_hints["osl"] = hints.expected_output_tokens
        headers = {}
        if program:
            headers["X-Dynamo-Session-ID"] = program
        if hints.last_call:
            headers["X-Dynamo-Session-Final"] = "true"
        return Encoded({"nvext": {"agent_hints": agent_hints, **salt}}, headers)
    if dialect == "llamacpp":
        body = {"cache_prompt": True}
        if program and slots:
            body["id_slot"] = zlib.crc32(program.encode()) % slots
        return Encoded(body)
    if dialect == "sim":
        body = {"priority": -_priority(hints), "last_call": hints.last_call, **salt}
        if program:
            body["session_id"] = program
        if hints.keep_alive_s is not None:
            body["keep_alive_s"] = hints.keep_alive_s
        return Encoded(body)
    raise UsageError(f"unknown dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")


def structured_output(dialect: str, output: OutputSchema) -> dict[str, Any]:
    """The body field that makes a server speaking `dialect` hold its reply to `output`.

    vLLM (0.12 and later) reads `structured_outputs.json` (its older `guided_json` is gone);
    SGLang, llama.cpp's server, Dynamo and OpenAI read OpenAI's `response_format` with a
    `json_schema`. Either way the reply is validated again by the caller: a server without
    a grammar backend may ignore the field."""
    if dialect in ("vllm", "vllm-continuum"):
        return {"structured_outputs": {"json": output.schema}}
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": output.name, "schema": output.schema},
        }
    }


def merge(
    dialect: str,
    encoded: Encoded,
    typed: Collection[str],
    extra_body: Mapping[str, Any],
    extra_headers: Mapping[str, str],
) -> Encoded:
    """The hint fields with the request's pass-through fields laid beside them.

    `typed`: the body fields the backend sets from the request's own attributes (model,
    messages, max_tokens...). A pass-through field that either would also send is refused:
    silently replacing plait's priority or the request's max_tokens would be a bug nobody sees.
    """
    for key in extra_body:
        if key in typed:
            raise UsageError(
                f"extra_body[{key!r}] clashes with the field plait sends from the request "
                f"itself; set it through LLMRequest/Agent instead of extra_body"
            )
        if key in encoded.body:
            raise UsageError(
                f"extra_body[{key!r}] clashes with the field the {dialect!r} dialect sends for "
                "plait's hints; drop it from extra_body, or use dialect='openai', which sends "
                "no hints"
            )
    taken = {name.lower() for name in encoded.headers}
    for name in extra_headers:
        if name.lower() in taken:
            raise UsageError(
                f"extra_headers[{name!r}] clashes with the header the {dialect!r} dialect "
                "sends for plait's hints; drop it, or use dialect='openai', which sends none"
            )
    return Encoded({**encoded.body, **extra_body}, {**encoded.headers, **extra_headers})
