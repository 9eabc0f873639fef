"""The LLM backend protocol: a request plus backend-neutral hints in, a response out.

Real servers (vLLM, SGLang, Dynamo, llama.cpp) each spell the hints differently; a backend's
dialect translates `Hints` at the HTTP boundary, so nothing above it knows those spellings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ._errors import UsageError

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: name, description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments as the model wrote them: JSON text, not yet validated."""


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LLMRequest:
    messages: tuple[Message, ...]
    model: str
    sampling: Sampling = Sampling()
    max_tokens: int | None = None
    tools: tuple[ToolSpec, ...] = ()
    extra_body: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Server-specific body fields sent as they are (vLLM's `ignore_eos`, `min_tokens`,
    `logprobs`, `response_format`, `structured_outputs`...). A backend merges them with the
    fields its dialect sends for the hints; a field both would send is an error, never a
    silent overwrite. Backends that are not HTTP servers (the fakes, the in-process
    simulator) ignore them."""
    extra_headers: Mapping[str, str] = field(default_factory=dict, hash=False)
    """Request headers sent as they are, under the same rule."""

    def __post_init__(self) -> None:
        for key, value in self.extra_body.items():
            if not isinstance(key, str) or not key:
                raise UsageError(f"LLMRequest.extra_body: keys must be field names, got {key!r}")
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise UsageError(
                    f"LLMRequest.extra_body[{key!r}] cannot be sent as JSON ({exc}); give "
                    "plain data: str, numbers, bools, None, lists and dicts"
                ) from None
        for key, value in self.extra_headers.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise UsageError(
                    f"LLMRequest.extra_headers: names and values must be strings, got "
                    f"{key!r}: {value!r}"
                )


@dataclass(frozen=True, slots=True)
class Hints:
    """What the scheduler knows that the server does not.

    `urgency`: higher runs sooner (dialects flip the sign for servers where lower runs
    sooner, such as vLLM). All calls of one program share it. `keep_alive_s`: how long the
    server should keep this call's KV cache after it ends, because the same program will be
    back. `last_call`: the program makes no further calls, so its cache can go at once.
    `prefix_key`: calls with equal keys share a prompt prefix.
    """

    program_id: str
    urgency: float = 0.0
    priority_class: str = "batch"
    deadline_s: float | None = None
    expected_output_tokens: int | None = None
    keep_alive_s: float | None = None
    last_call: bool = False
    prefix_key: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int | None = None
    """Prompt tokens the server served from its prefix cache, when it reports them."""

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        cached: int | None
        if self.cached_prompt_tokens is None and other.cached_prompt_tokens is None:
            cached = None
        else:
            cached = (self.cached_prompt_tokens or 0) + (other.cached_prompt_tokens or 0)
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            cached,
        )


@dataclass(frozen=True, slots=True)
class LLMResponse:
    text: str
    usage: Usage = Usage()
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    model: str | None = None
    first_token_s: float | None = None
    """Seconds from sending the request to its first generated token, when it was streamed."""


@runtime_checkable
class LLMBackend(Protocol):
    """One serving endpoint. Implementations raise `BackendError` (or a subclass) on failure."""

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse: ...


@runtime_checkable
class WallClockBackend(Protocol):
    """A backend that waits on the world outside the process (a socket, a server).

    A virtual clock jumps to the next timer whenever every task waits, so it would jump over
    a socket's wait straight to the call's timeout: such a backend needs the system clock.
    Wrappers (a router, a grouper) declare it too and answer for what they wrap.
    """

    def needs_wall_clock(self) -> bool: ...
