"""Resilience of single LLM calls: call-level retries and a circuit breaker per backend.

Task retries (`Retry`) run a whole task again; these act on one backend call inside a task,
so a dropped connection or a 503 costs one call, not the task's other calls. The circuit
breaker is a pure state machine: it reads no clock (`now` is passed in) and does no I/O;
the engine keeps one per backend name and consults it on every call.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from ..model._errors import BackendError, BackendUnavailableError, CircuitOpenError, UsageError

T = TypeVar("T")

CircuitState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class CallRetry:
    """How often to send one LLM call and how long to wait in between.

    `attempts` counts the first try (1 turns call retries off). Retried: every
    `BackendError` whose `retryable` is true (unreachable, timed out, 429, 5xx, an open
    circuit); never a refused request (400: `BackendRequestError`) nor any other error.
    The wait is exponential from `initial_delay`, jittered by up to `jitter` seconds, capped
    at `max_delay`, and never shorter than the error's `retry_after`. A server that asks for
    more than `max_delay` is not retried: waiting that long is the caller's decision (a task
    `Retry`), not a call's.
    """

    attempts: int = 4
    initial_delay: float = 0.5
    max_delay: float = 20.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise UsageError(f"CallRetry(attempts={self.attempts}) must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.jitter < 0:
            raise UsageError("CallRetry delays and jitter must not be negative")

    def should_retry(self, error: BaseException) -> bool:
        if not isinstance(error, BackendError) or not error.retryable:
            return False
        return error.retry_after is None or error.retry_after <= self.max_delay

    def delay(self, attempt: int, error: BaseException | None, draw: float) -> float:
        """The wait after failed attempt number `attempt`; `draw` in [0, 1) picks the jitter."""
        backoff = min(
            self.initial_delay * 2.0 ** (attempt - 1) + draw * self.jitter, self.max_delay
        )
        retry_after = error.retry_after if isinstance(error, BackendError) else None
        return backoff if retry_after is None else max(backoff, retry_after)

    @property
    def max_total_delay(self) -> float:
        """The longest one call can spend waiting between its attempts."""
        return (self.attempts - 1) * self.max_delay


DEFAULT_CALL_RETRY = CallRetry()
NO_CALL_RETRY = CallRetry(attempts=1)


async def call_with_retries(
    send: Callable[[], Awaitable[T]],
    spec: CallRetry,
    *,
    sleep: Callable[[float], Awaitable[None]],
    on_retry: Callable[[int, BaseException, float], None],
) -> T:
    """Await `send()` until it succeeds or `spec` gives up (then its last error is raised).

    `on_retry(attempt, error, delay)` is called before each wait; `sleep` is the clock's.
    """
    if spec.attempts == 1:
        return await send()

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        return spec.delay(state.attempt_number, error, random.random())

    def stop(state: RetryCallState) -> bool:
        return state.attempt_number >= spec.attempts

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        assert error is not None
        on_retry(state.attempt_number, error, state.upcoming_sleep)

    retrying = AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=retry_if_exception(spec.should_retry),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await send()
    raise AssertionError("unreachable: tenacity reraises the last error")


@dataclass(frozen=True, slots=True)
class Breaker:
    """When the engine stops sending to a backend: after `failures` consecutive failed calls
    it opens the backend's circuit for `cooldown_s`, then lets one probe call through.

    `wait_s`: how long a call waits for a backend whose circuit is open, counted from the
    first failure of the backend's current run of failures. 0 (the default) fails the call
    at once with `CircuitOpenError`; more makes calls wait for a backend that comes back
    (a batch, where no one is waiting on a row), and fail once it has been down that long.
    A waiting call is not sent and counts no attempt; a failed probe, or the failure that
    opened the circuit, makes its call wait as well instead of failing."""

    failures: int = 5
    cooldown_s: float = 10.0
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.failures < 1:
            raise UsageError(f"Breaker(failures={self.failures}) must be at least 1")
        if self.cooldown_s < 0:
            raise UsageError(f"Breaker(cooldown_s={self.cooldown_s}) must not be negative")
        if self.wait_s < 0:
            raise UsageError(f"Breaker(wait_s={self.wait_s}) must not be negative")


DEFAULT_BREAKER = Breaker()


class CircuitBreaker:
    """One backend's circuit: closed (calls go), open (calls fail fast), half-open (one probe).

    A call asks `acquire(now)` first: None lets it go, a number is how many seconds to wait
    before asking again. The call then reports `succeeded()`, `failed(now)`, or
    `abandoned()` when it ended without saying anything about the backend (cancelled).
    What counts as a failure is the caller's choice; the engine counts retryable
    `BackendError`s (a 400 shows that the server is up, so it counts as a success).
    """

    __slots__ = (
        "cooldown_s",
        "failures",
        "wait_s",
        "_consecutive",
        "_failing_since",
        "_opened_at",
        "_probing",
        "_state",
    )

    def __init__(self, failures: int = 5, cooldown_s: float = 10.0, wait_s: float = 0.0) -> None:
        Breaker(failures, cooldown_s, wait_s)  # validates
        self.failures = failures
        self.cooldown_s = cooldown_s
        self.wait_s = wait_s
        self._state: CircuitState = "closed"
        self._consecutive = 0
        self._failing_since = 0.0
        self._opened_at = 0.0
        self._probing = False

    @property
    def state(self) -> CircuitState:
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._consecutive

    def down_for(self, now: float) -> float | None:
        """Seconds since the first failure of the run that opened the circuit; None while
        the circuit is closed (the backend is taken to be up)."""
        if self._state == "closed":
            return None
        return max(0.0, now - self._failing_since)

    def acquire(self, now: float) -> float | None:
        if self._state == "closed":
            return None
        if self._state == "open":
            remaining = self._opened_at + self.cooldown_s - now
            if remaining > 0:
                return remaining
            self._state = "half_open"
        if self._probing:
            # The probe's verdict is not in; if it fails the circuit opens for a whole
            # cooldown, so that is how long the others wait.
            return self.cooldown_s
        self._probing = True
        return None

    def succeeded(self) -> None:
        self._state = "closed"
        self._consecutive = 0
        self._probing = False

    def failed(self, now: float) -> None:
        if self._consecutive == 0:
            self._failing_since = now
        self._consecutive += 1
        if self._state == "half_open" or (
            self._state == "closed" and self._consecutive >= self.failures
        ):
            self._state = "open"
            self._opened_at = now
            self._probing = False

    def abandoned(self) -> None:
        self._probing = False

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self._state!r}, consecutive_failures={self._consecutive})"


async def through_circuit(
    circuit: CircuitBreaker,
    send: Callable[[], Awaitable[T]],
    *,
    backend: str,
    monotonic: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
    unreachable_only: bool = False,
) -> T:
    """Await `send()` once the circuit lets it go, telling the circuit how it went.

    On an open circuit the call waits for it while the backend has been down less than
    `circuit.wait_s` (the probe's verdict included), then raises `CircuitOpenError`; with
    `wait_s` 0 it raises at once. A retryable `BackendError` that leaves the circuit open
    (it opened it, or was a failed probe) makes the call wait too; one that leaves it
    closed is raised, for the caller's retries. `unreachable_only`: only a
    `BackendUnavailableError` counts as a failure (a router raises one only when none of
    its replicas could be reached; any other error shows the backend answered).
    """
    while True:
        now = monotonic()
        wait = circuit.acquire(now)
        if wait is not None:
            down = circuit.down_for(now) or 0.0
            if down >= circuit.wait_s:
                waited = down if circuit.wait_s > 0 else None
                raise CircuitOpenError(backend, circuit.consecutive_failures, wait, waited_s=waited)
            await sleep(min(wait, circuit.wait_s - down))
            continue
        try:
            result = await send()
        except BackendError as exc:
            down = exc.retryable and (
                not unreachable_only or isinstance(exc, BackendUnavailableError)
            )
            if not down:
                circuit.succeeded()  # it answered: the server is up (the request was bad)
                raise
            circuit.failed(monotonic())
            since = circuit.down_for(monotonic())
            if since is None or since >= circuit.wait_s:
                raise
            continue  # the backend is down: wait for it with the others
        except BaseException:
            circuit.abandoned()
            raise
        circuit.succeeded()
        return result
