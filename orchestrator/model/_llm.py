"""The LLM backend protocol: a request plus backend-neutral hints in, a response out.

Real servers (vLLM, SGLang, Dynamo, llama.cpp) each spell the hints differently; a backend's
dialect translates `Hints` at the HTTP boundary, so nothing above it knows those spellings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, runtime_checkable

from ._errors import UsageError

Role = Literal["system", "user", "assistant", "tool"]

DEFAULT_BACKEND = "default"
"""The backend an LLM task uses unless it names another."""
DEFAULT_FUNCTION_RESOURCE = "local"
"""The resource a Python function task is admitted on unless it names another."""
DEFAULT_TOOL_RESOURCE = "tools"
"""The resource a tool call is admitted on unless it names another."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments as the model wrote them: JSON text, not yet validated."""


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    """On a "tool" message: the call it answers."""
    tool_calls: tuple[ToolCall, ...] = ()
    """On an "assistant" message: the tool calls the model made (sent back in the history)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call: name, description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OutputSchema:
    """The shape the reply must have: a JSON schema, named. Each backend's dialect sends it
    the way its server enforces it (vLLM `structured_outputs`, OpenAI and SGLang
    `response_format`); backends that are not HTTP servers ignore it, and the caller
    validates the reply either way (`agents.Agent.ask(output=...)`)."""

    name: str
    schema: dict[str, Any] = field(hash=False)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.schema, dict):
            raise UsageError(
                f"OutputSchema needs a name and a JSON schema dict, got {self.name!r}, "
                f"{type(self.schema).__name__}"
            )


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
    output: OutputSchema | None = None
    """The schema the reply must follow (structured output), or None for free text."""
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


ServiceClass = Literal["urgent", "tight", "shareable", "slack_rich", "hopeless"]
"""How a live program is served now (the engine's urgency controller judges it).

- `urgent`: interactive, no deadline: never held back, and its calls need short steps;
- `tight`: a deadline it can meet, with less slack than its remaining path: short steps;
- `shareable`: a deadline near enough to be urgent work, with at least its remaining path
  to spare: it can afford longer steps (a router's lane may take batch work beside it);
- `slack_rich`: batch work, or a deadline far enough away to wait behind urgent work;
- `hopeless`: its deadline is out of reach even alone: it must not crowd out the rest.
"""

URGENT_CLASSES: frozenset[ServiceClass] = frozenset({"urgent", "tight", "shareable"})
"""The classes that count as urgent work (the others may be held back)."""


@dataclass(frozen=True, slots=True)
class Hints:
    """What the scheduler knows that the server does not.

    Urgency is said in three fields, each with one meaning. `urgency`: the program's place
    among programs, higher runs sooner (dialects turn it into the server's priority number,
    flipping the sign where lower runs sooner, such as vLLM); all calls of one program share
    it. `service`: how the program is served now (`ServiceClass`): urgent work
    (`URGENT_CLASSES`) or work that may wait, and whether its calls need short steps; None
    where nothing judged it (a backend called directly), which counts as slack-rich work.
    `slack_s`: the seconds the program has to spare at what its tasks take lately (its
    deadline less its remaining critical path); None without a deadline or where nothing
    estimated it.

    `keep_alive_s`: how long the server should keep this call's KV cache after it ends,
    because the same program will be back. `last_call`: the program makes no further calls,
    so its cache can go at once. `prefix_key`: calls with equal keys share a prompt prefix.
    `cache_salt`: an opaque string that puts the call's prompt in its own prefix-cache
    namespace on servers that support it (vLLM, SGLang, Dynamo, the simulator;
    docs/backends.md): calls share cached prefixes only with calls of the same salt. The
    engine derives it from the run's tenant (a keyed hash, never the name itself); None (a
    run without a tenant) shares the cache with every unsalted call.
    """

    program_id: str
    urgency: float = 0.0
    service: ServiceClass | None = None
    expected_output_tokens: int | None = None
    keep_alive_s: float | None = None
    last_call: bool = False
    prefix_key: str | None = None
    slack_s: float | None = None
    cache_salt: str | None = None
    traceparent: str | None = None
    """The call's W3C trace context (`traceparent` header) when the engine traces it: sent
    to the server, whose own spans then join the trace."""


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


@dataclass(frozen=True, slots=True)
class LoadReport:
    """One server's load at one moment; a field is None where the server does not say.

    `running` and `waiting`: requests in the batch and in the queue. `kv_cache_usage`: the
    fraction of the KV cache in use (0 to 1). `prefix_cache_hits` / `prefix_cache_queries`:
    prompt tokens served from the prefix cache / looked up, since the server started.
    `cache_hit_rate`: a hit rate the server computes itself over a recent window (SGLang).
    """

    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None
    prefix_cache_hits: int | None = None
    prefix_cache_queries: int | None = None
    cache_hit_rate: float | None = None

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hits over lookups since start, else the server's own recent rate."""
        if self.prefix_cache_hits is not None and self.prefix_cache_queries:
            return self.prefix_cache_hits / self.prefix_cache_queries
        return self.cache_hit_rate


@dataclass(frozen=True, slots=True)
class ServerCapacity:
    """What a server says of its own size; a field is None where it does not say.

    `kv_tokens`: its KV cache in tokens (all its data-parallel ranks together).
    `block_tokens`: its KV block in tokens (the prefix cache's granularity). `max_seqs`: the
    sequences it runs at once. `source`: where the server said it (the request and the
    field), empty where it said nothing. `kv_from_config`: `kv_tokens` is the backend's
    configured `kv_cache_tokens`, since the server did not say its own. `keeps_kv`: the
    server keeps a paused program's KV for as long as plait asks (SGLang sessions, the
    simulator, vllm-continuum's pin), so nothing need hold new programs back for it.
    """

    kv_tokens: int | None = None
    block_tokens: int | None = None
    max_seqs: int | None = None
    source: str = ""
    kv_from_config: bool = False
    keeps_kv: bool = False

    def describe(self) -> str:
        """Each figure and where it comes from (for run summaries and logs)."""
        if self.kv_tokens is None:
            kv = "KV cache unknown (set kv_cache_tokens)"
        else:
            config = " (kv_cache_tokens in the config)" if self.kv_from_config else ""
            kv = f"KV cache {self.kv_tokens:,} tokens{config}"
        block = f"blocks of {self.block_tokens}" if self.block_tokens else "block unknown"
        seqs = f"{self.max_seqs} sequences at once" if self.max_seqs else "sequences unknown"
        said = f"read from {self.source}" if self.source else "the server said none of it"
        return f"{kv}, {block}, {seqs}; {said}"


# --- capabilities ---------------------------------------------------------------------------
# An optional feature of a backend is its own small protocol, checked once when the engine
# starts (`capabilities`), never looked up with getattr per call. A wrapper (a router, a
# grouper) implements each of them and answers for what it wraps, by the same protocols.


@runtime_checkable
class ProgramAware(Protocol):
    """A backend that keeps something per program (an SGLang session) and wants to hear
    when a program has ended, whether or not its last call said so."""

    async def program_done(self, program_id: str) -> None: ...


@runtime_checkable
class HealthChecked(Protocol):
    """A backend that can be probed: `check()` raises `BackendUnavailableError` when down."""

    async def check(self) -> None: ...


@runtime_checkable
class LoadReporting(Protocol):
    """A backend that can say how busy its server is (from the server's own metrics)."""

    async def load(self) -> LoadReport: ...


@runtime_checkable
class CapacityReporting(Protocol):
    """A backend that can say how big its server is (its KV cache, its KV block, the
    sequences it runs at once), from the server's own answer or, where the server does not
    say, its configuration. Asked once, when the engine starts; it answers within a short
    timeout and never raises for a server that is down or says nothing (None fields)."""

    async def capacity(self) -> ServerCapacity: ...


@runtime_checkable
class FailureIsolating(Protocol):
    """A backend that isolates its own failures (a router ejects a failing replica), so the
    engine puts no circuit breaker over it: one breaker would stop the healthy replicas too."""

    def isolates_failures(self) -> bool: ...


@runtime_checkable
class UrgentIsolating(Protocol):
    """A backend that keeps urgent calls apart from batch calls itself (a router with urgent
    lanes: replicas that batch work keeps off while urgent work is around), so
    the engine does not also hold slack-rich work to a learned knee over all of it: that
    would idle the replicas urgent work never uses."""

    def isolates_urgent(self) -> bool: ...


@runtime_checkable
class WallClockBackend(Protocol):
    """A backend that waits on the world outside the process (a socket, a server).

    A virtual clock jumps to the next timer whenever every task waits, so it would jump over
    a socket's wait straight to the call's timeout: such a backend needs the system clock.
    Wrappers (a router, a grouper) declare it too and answer for what they wrap.
    """

    def needs_wall_clock(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What one backend declared, read once when the engine is built."""

    program_aware: bool = False
    health_checked: bool = False
    load_reporting: bool = False
    isolates_failures: bool = False
    needs_wall_clock: bool = False
    isolates_urgent: bool = False
    capacity_reporting: bool = False


def capabilities(backend: object) -> Capabilities:
    """Read the optional protocols `backend` implements (the isinstance checks are slow:
    call this once per backend, not per call)."""
    return Capabilities(
        program_aware=isinstance(backend, ProgramAware),
        health_checked=isinstance(backend, HealthChecked),
        load_reporting=isinstance(backend, LoadReporting),
        isolates_failures=isinstance(backend, FailureIsolating) and backend.isolates_failures(),
        needs_wall_clock=isinstance(backend, WallClockBackend) and backend.needs_wall_clock(),
        isolates_urgent=isinstance(backend, UrgentIsolating) and backend.isolates_urgent(),
        capacity_reporting=isinstance(backend, CapacityReporting),
    )


class WrappedBackend(
    ProgramAware,
    HealthChecked,
    LoadReporting,
    CapacityReporting,
    FailureIsolating,
    UrgentIsolating,
    WallClockBackend,
):
    """A backend in front of another (a grouper, a deduplicator): it declares every optional
    capability and answers each as `backend` does (read once), enters and leaves `backend`
    with itself. A subclass writes `complete` (and `describe`)."""

    def __init__(self, backend: LLMBackend) -> None:
        self.backend = backend
        self._inner = capabilities(backend)

    async def __aenter__(self) -> Self:
        if isinstance(self.backend, AbstractAsyncContextManager):
            await self.backend.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(self.backend, AbstractAsyncContextManager):
            await self.backend.__aexit__(exc_type, exc, tb)

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        raise NotImplementedError

    def isolates_failures(self) -> bool:
        return self._inner.isolates_failures

    def isolates_urgent(self) -> bool:
        return self._inner.isolates_urgent

    def needs_wall_clock(self) -> bool:
        return self._inner.needs_wall_clock

    async def program_done(self, program_id: str) -> None:
        if isinstance(self.backend, ProgramAware):
            await self.backend.program_done(program_id)

    async def check(self) -> None:
        """The backend's health check; passes if it has none."""
        if isinstance(self.backend, HealthChecked):
            await self.backend.check()

    async def load(self) -> LoadReport:
        """The backend's load; a report of unknowns if it reports none."""
        if isinstance(self.backend, LoadReporting):
            return await self.backend.load()
        return LoadReport()

    async def capacity(self) -> ServerCapacity:
        """The backend's capacity; one of unknowns if it reports none."""
        if isinstance(self.backend, CapacityReporting):
            return await self.backend.capacity()
        return ServerCapacity()

    def inner_description(self) -> str | None:
        describe = getattr(self.backend, "describe", None)
        return describe() if callable(describe) else None
