"""The LLM call path, start to end: backend, admission slot, hold-back budget, circuit
breaker, call retries, hints and learned keep-alive pauses.

One component owns it (`LLMCalls`); the engine builds it and the task context calls it.
Nothing here calls back up: what it must know about the calling program (its identity,
priority, deadline, what its task does next) is passed down with the call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from pydantic import TypeAdapter

from ..admission._knee import KneeController
from ..admission._queue import Admission, Limits, Ticket
from ..admission._scheduler import Policy, PriorityClass, ProgramView, slack_of, urgency
from ..model._clock import Clock
from ..model._errors import UsageError
from ..model._events import CallRetrying
from ..model._llm import (
    Capabilities,
    Hints,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    ProgramAware,
    ServiceClass,
    capabilities,
)
from ..model._text import storable
from ._bus import EventBus
from ._keepalive import CacheBudget, KeepAlive, PausePredictor
from ._resilience import (
    Breaker,
    CallRetry,
    CircuitBreaker,
    call_with_retries,
    through_circuit,
)
from ._tracing import CallSpan, Tracing


class Program(Protocol):
    """The calling program, as the call path sees it (a run implements it)."""

    @property
    def id(self) -> str: ...

    @property
    def priority_class(self) -> PriorityClass: ...

    @property
    def deadline(self) -> float | None: ...

    @property
    def tenant(self) -> str | None: ...

    def view(self, now: float) -> ProgramView: ...


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where a call comes from: facts the caller knows and passes down with the call.

    `holds_slot`: the task is itself admitted on this backend (an LLM task), so the call
    uses the task's slot instead of queueing for one. `next_steps`: (label, resource) of the
    tasks that wait for this one, whose pauses the keep-alive predicts. `last_call`: nothing
    of the program is left after this call."""

    task_id: str
    holds_slot: bool
    next_steps: Sequence[tuple[str, str]] = ()
    last_call: bool = False
    attempt: int = 1
    """The task's attempt making the call."""
    index: int = 0
    """How many calls the task made before this one (in any attempt)."""


class CallMemo(Protocol):
    """Where LLM call results are kept, so a program run again after a crash does not pay
    for a call twice (a durable engine gives one; see docs/durability.md)."""

    async def recall(self, program: str, key: str) -> bytes | None:
        """The recorded result of call `key` of `program`, if it has one."""
        ...

    def remember(self, program: str, key: str, result: bytes) -> None:
        """Record a call's result (committed with the program's next events)."""
        ...


_REQUEST = TypeAdapter(LLMRequest)
RESPONSE_ADAPTER: TypeAdapter[LLMResponse] = TypeAdapter(LLMResponse)


def tenant_salt(key: bytes, tenant: str) -> str:
    """The prefix-cache salt of `tenant`: HMAC-SHA256 under `key`, 43 URL-safe base64
    characters (256 bits, as vLLM advises), so a server never sees a tenant's name and
    nobody without the key can compute another tenant's salt."""
    digest = hmac.new(key, tenant.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def call_key(site: CallSite, request: LLMRequest) -> str:
    """A call's identity within its program: the task, its attempt, the call's place among
    the task's calls, and the request itself (headers aside: they carry no content). A
    rerun task that sends what it sent before gets what it got before; one that sends
    something else (its inputs changed) pays for the new call."""
    body = _REQUEST.dump_json(request, exclude={"extra_headers"})
    digest = hashlib.sha256(f"{site.task_id}\0{site.attempt}\0{site.index}\0".encode())
    digest.update(body)
    return digest.hexdigest()


class LLMCalls:
    """Sends LLM calls for the engine's programs. Policy objects below it are pure; this is
    where they meet the backends, the clock and the admission queues."""

    def __init__(
        self,
        backends: Mapping[str, LLMBackend],
        *,
        policy: Policy,
        limits: Mapping[str, Limits],
        admission: Admission,
        bus: EventBus,
        wake: Callable[[], None],
        next_seq: Callable[[], int],
        keep_alive: KeepAlive | None,
        call_retry: CallRetry,
        breaker: Breaker | None,
        knees: Mapping[str, KneeController] | None = None,
        service: Callable[[Program, float, ProgramView], ServiceClass] | None = None,
    ) -> None:
        self.backends: dict[str, LLMBackend] = dict(backends)
        self.service = service
        """How a program is served now (`Hints.service`; None: not judged)."""
        self.knees: Mapping[str, KneeController] = knees or {}
        """Per backend: fed every call's latency per token and the level in flight."""
        # Keep-alive hints go to LLM backends: without one, nothing to learn pauses for.
        self.pauses = PausePredictor(keep_alive) if keep_alive and self.backends else None
        self.policy = policy
        self.call_retry = call_retry
        self.breaker = breaker
        self.budgets = {
            name: CacheBudget(lim.kv_tokens)
            for name, lim in limits.items()
            if lim.kv_tokens is not None
        }
        self._admission = admission
        self._bus = bus
        self._wake = wake
        self._next_seq = next_seq
        # What each backend declared, read once: its circuit breaker follows from it.
        self._caps = {name: capabilities(b) for name, b in self.backends.items()}
        self._program_aware = [
            cast(ProgramAware, self.backends[name])
            for name, caps in self._caps.items()
            if caps.program_aware
        ]
        # A backend that isolates failures (a router) gets a circuit only to wait out an
        # outage of all of it (`wait_s`), opened by its "no replica reachable" alone.
        self._circuits: dict[str, CircuitBreaker | None] = {
            name: (
                CircuitBreaker(breaker.failures, breaker.cooldown_s, breaker.wait_s)
                if breaker is not None and (not caps.isolates_failures or breaker.wait_s > 0)
                else None
            )
            for name, caps in self._caps.items()
        }
        self._clock: Clock | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self._salt_key = secrets.token_bytes(32)
        """Keys the tenants' cache salts (`tenant_salt`): one per engine, so a tenant's
        salt holds for the engine's life and is unknown outside it."""
        self.memo: CallMemo | None = None
        """Set by a durable engine: call results are recorded and reused from there."""
        self.tracing: Tracing | None = None
        """Spans of the calls, while the engine traces (`Tracing`)."""
        self._replayed: set[tuple[str, str]] = set()
        """(program, task) whose results came (in part) from a record, not from running:
        what such a task took says nothing of what its kind takes (`take_replayed`)."""

    def set_budget(self, backend: str, tokens: int | None) -> None:
        """`backend`'s hold-back budget from now on (None: no hold-back), before any call."""
        if tokens is None:
            self.budgets.pop(backend, None)
        elif backend not in self.budgets or self.budgets[backend].tokens != tokens:
            self.budgets[backend] = CacheBudget(tokens)

    def mark_replayed(self, program: str, task: str) -> None:
        """The task's result was recalled from a record (`take_replayed` says so once)."""
        self._replayed.add((program, task))

    def take_replayed(self, program: str, task: str) -> bool:
        """Whether the task's result, or one of its calls, came from a record; forgets it."""
        if (program, task) in self._replayed:
            self._replayed.discard((program, task))
            return True
        return False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, clock: Clock, tg: asyncio.TaskGroup, *, virtual: bool) -> None:
        """Start sending on `clock`; refuse a backend that cannot work on it (a backend
        that waits on a socket, on a virtual clock that would jump over the wait)."""
        self._clock = clock
        self._tg = tg
        if virtual:
            for name, caps in self._caps.items():
                if caps.needs_wall_clock:
                    raise UsageError(
                        f"backend {name!r} ({type(self.backends[name]).__name__}) talks to a "
                        "server over the network and needs the system clock, but the engine "
                        "runs on a VirtualClock (virtual time would jump over the wait to the "
                        "call's timeout); use clock=SystemClock() in Python, or "
                        'clock = "system" / --clock system with plait run'
                    )

    def stop(self) -> None:
        self._tg = None
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def capabilities(self, backend: str) -> Capabilities:
        """What `backend` declared (read once, when the engine was built)."""
        self.backend(backend)
        return self._caps[backend]

    # --- what the engine tells it ------------------------------------------------------------

    def task_ended(self, program: str, label: str, resource: str, elapsed: float, ok: bool) -> None:
        """A task that made no LLM call ended: a tool's pause to learn from, and a program
        let in under a hold-back budget that never used it."""
        if self.pauses is not None and ok:
            self.pauses.observe(label, elapsed)
        budget = self.budgets.get(resource)
        if budget is not None:
            budget.unreserve(program)

    def held_back(self, program: Program, resource: str) -> bool:
        assert self._clock is not None
        return self.budgets[resource].holds_back(program.id, self._clock.monotonic())

    def program_done(self, program: str) -> None:
        """The program has ended: forget its cache holdings and tell backends that keep
        something per program (an SGLang session), best effort, in the background."""
        for budget in self.budgets.values():
            budget.drop(program)
        if self.budgets:
            self._admission.look_again()
        if self._tg is None:
            return
        for backend in self._program_aware:
            self._tg.create_task(_quietly(backend.program_done(program)))

    # --- one call ----------------------------------------------------------------------------

    def backend(self, name: str) -> LLMBackend:
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(sorted(self.backends)) or "none"
            raise UsageError(
                f"no LLM backend named {name!r} (known: {known}); with plait run, add a "
                f"[backends.{name}] table to the config file or return it from the module's "
                "backends(clock); in Python, pass it to Engine(backends={...})"
            ) from None

    def circuit(self, backend: str) -> CircuitBreaker | None:
        """The circuit breaker of `backend`: None if `Engine(breaker=None)`, or if the
        backend isolates failures itself (`FailureIsolating`: a router over replicas ejects
        the failing one; one breaker over all of them would stop the healthy too) and the
        breaker does not wait (`wait_s` 0). With a wait, such a backend's circuit counts
        only its calls that reached no replica (`BackendUnavailableError`)."""
        if backend not in self._circuits:
            self.backend(backend)
            return None
        return self._circuits[backend]

    def hints(self, program: Program, **fields: object) -> Hints:
        assert self._clock is not None
        now = self._clock.monotonic()
        view = program.view(now)
        tenant = program.tenant
        return Hints(
            program_id=program.id,
            cache_salt=None if tenant is None else tenant_salt(self._salt_key, tenant),
            urgency=urgency(self.policy, view, now),
            service=None if self.service is None else self.service(program, now, view),
            slack_s=None
            if view.guessed or not self.policy.needs_remaining
            else slack_of(view, now),
            **fields,  # type: ignore[arg-type]
        )

    def keep_alive_for(self, site: CallSite, request: LLMRequest) -> float | None:
        """The pause expected after this call: that of the tools the request offers the
        model (an agent loop: the reply may call any of them), else of the tools the task's
        dependents run."""
        if self.pauses is None:
            return None
        tools = [f"tool {t.name}" for t in request.tools]
        if not tools:
            tools = [label for label, resource in site.next_steps if resource not in self.backends]
        return self.pauses.predict(tools)

    async def complete(
        self,
        program: Program,
        site: CallSite,
        request: LLMRequest,
        backend: str,
        *,
        expected_output_tokens: int | None = None,
        keep_alive_s: float | None = None,
        last_call: bool = False,
        prefix_key: str | None = None,
    ) -> LLMResponse:
        """One LLM call on behalf of `program`, carrying its hints.

        Failed sends are retried as `call_retry` says, each retry an event, and every send
        passes the backend's circuit breaker. With a `memo`, a call whose result is recorded
        is answered from the record, and every answer is recorded."""
        tracing = self.tracing
        call = None
        if tracing is not None:
            llm = self.backends.get(backend)
            call = tracing.call(program.id, site.task_id, backend, llm, request)
        send = functools.partial(
            self._send,
            program,
            site,
            request,
            backend,
            expected_output_tokens=expected_output_tokens,
            keep_alive_s=keep_alive_s,
            last_call=last_call,
            prefix_key=prefix_key,
            traced=call,
        )
        if call is None:
            response, _ = await self._remembered(program, site, request, send)
            return response
        try:
            response, replayed = await self._remembered(program, site, request, send)
        except BaseException as exc:
            call.ended(None, exc)
            raise
        call.ended(response, replayed=replayed)
        return response

    async def _remembered(
        self,
        program: Program,
        site: CallSite,
        request: LLMRequest,
        send: Callable[[], Awaitable[LLMResponse]],
    ) -> tuple[LLMResponse, bool]:
        """`send()`'s answer, and whether it came from the record instead: with a `memo`,
        the recorded answer if there is one, and every answer recorded."""
        memo = self.memo
        if memo is None:
            return await send(), False
        key = call_key(site, request)
        recorded = await memo.recall(program.id, key)
        if recorded is not None:
            self._replayed.add((program.id, site.task_id))
            return RESPONSE_ADAPTER.validate_json(recorded), True
        response = await send()
        memo.remember(program.id, key, RESPONSE_ADAPTER.dump_json(response))
        return response, False

    async def _send(
        self,
        program: Program,
        site: CallSite,
        request: LLMRequest,
        backend: str,
        *,
        expected_output_tokens: int | None,
        keep_alive_s: float | None,
        last_call: bool,
        prefix_key: str | None,
        traced: CallSpan | None = None,
    ) -> LLMResponse:
        clock = self._clock
        if clock is None:
            raise UsageError("the engine is not running")
        llm = self.backend(backend)
        if keep_alive_s is None:
            keep_alive_s = self.keep_alive_for(site, request)
        last_call = last_call or site.last_call
        circuit = self.circuit(backend)
        budget = self.budgets.get(backend)
        context = sum(len(m.content) for m in request.messages) // 4  # ~4 characters a token
        knee = self.knees.get(backend)
        admission = self._admission

        async def send() -> LLMResponse:
            # Past the backend's circuit, which may hold the call while the backend is down.
            if circuit is None:
                return await measured_send()
            return await through_circuit(
                circuit,
                measured_send,
                backend=backend,
                monotonic=clock.monotonic,
                sleep=clock.sleep,
                unreachable_only=self._caps[backend].isolates_failures,
            )

        async def measured_send() -> LLMResponse:
            # The program holds cache on the backend from here (after any slot was granted:
            # a call still queued for one holds nothing) until its keep-alive runs out.
            if budget is not None:
                budget.start(program.id, context)
            held, keep = context, 0.0
            if knee is not None:
                started, level = clock.monotonic(), float(admission.in_flight(backend))
            try:
                response = await hinted_send()
                usage = response.usage
                if knee is not None:
                    # The level it ran at: the mean of those at its start and its end.
                    level = (level + admission.in_flight(backend)) / 2
                    knee.observe(level, clock.monotonic() - started, usage.completion_tokens)
                held = usage.prompt_tokens + usage.completion_tokens or context
                keep = 0.0 if last_call else keep_alive_s or 0.0
                return response
            finally:
                if budget is not None:
                    self._call_ended(budget, program.id, context, held, keep)

        async def hinted_send() -> LLMResponse:
            # Hints are taken per attempt: urgency and the deadline move while a retry waits.
            hints = self.hints(
                program,
                expected_output_tokens=expected_output_tokens,
                keep_alive_s=keep_alive_s,
                last_call=last_call,
                prefix_key=prefix_key,
                traceparent=None if traced is None else traced.traceparent,
            )
            if traced is not None:
                traced.hinted(hints)
            return await llm.complete(request, hints)

        if site.holds_slot:
            # The task itself holds the slot, and keeps it while a retry waits: the slot is
            # the task's admission, released once by the engine when the task ends; giving
            # it back mid-task would let the backend's limit be exceeded when it resumes.
            attempt = send
        else:

            async def attempt() -> LLMResponse:
                # A slot taken for this call alone is given back while a retry waits, and
                # queued for again in the scheduler's order.
                async with self.slot(program, backend):
                    return await send()

        def retrying(number: int, error: BaseException, delay: float) -> None:
            self._bus.emit(
                program.id,
                CallRetrying(
                    workflow=program.id,
                    task=site.task_id,
                    backend=backend,
                    attempt=number,
                    error=storable(f"{type(error).__name__}: {error}"),
                    delay=delay,
                    at=clock.monotonic(),
                ),
            )
            self._wake()

        return await call_with_retries(
            attempt, self.call_retry, sleep=clock.sleep, on_retry=retrying
        )

    @contextlib.asynccontextmanager
    async def slot(self, program: Program, resource: str) -> AsyncIterator[None]:
        """Hold one in-flight place of `resource`, waiting for it in the scheduler's order."""
        admission = self._admission
        loop = asyncio.get_running_loop()
        ticket = Ticket(resource, self._next_seq(), loop.create_future())
        admission.push(program, ticket)  # OverloadedError if its queue is full
        self._wake()
        try:
            await ticket.future
        except asyncio.CancelledError:
            if ticket.state == "ready":
                admission.discard(ticket)
            elif ticket.state == "running":
                admission.release(resource, ticket)
                self._wake()
            ticket.state = "cancelled"
            raise
        try:
            yield
        finally:
            ticket.state = "done"
            admission.release(resource, ticket)
            self._wake()

    def _call_ended(
        self, budget: CacheBudget, program: str, context: int, held: int, keep_s: float
    ) -> None:
        """A call is over; `held` tokens stay in the server's cache for `keep_s`."""
        assert self._clock is not None
        budget.end(program, context, held, keep_s, self._clock.monotonic())
        self._admission.look_again()
        self._wake()
        if keep_s > 0:  # then the budget frees: look again (a little late, never early)
            timer = asyncio.get_running_loop().call_later(
                keep_s * 1.0001 + 1e-6, self._cache_expired
            )
            self._timers.add(timer)

    def _cache_expired(self) -> None:
        self._timers = {t for t in self._timers if not t.cancelled() and t.when() > _now()}
        self._admission.look_again()
        self._wake()


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _quietly(note: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):  # a courtesy to the server: nothing depends on it
        await note
