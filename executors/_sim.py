"""A simulated GPU serving engine behind the `LLMBackend` protocol.

`SimServer` drives a `SimEngine` on the injected clock: on a `VirtualClock` an hour of GPU
work replays in seconds, identically every time; on the system clock it behaves like a
real server in real time (the HTTP endpoint serves it so). It honours every hint: urgency
orders its queue, keep-alive pins a finished call's KV blocks for the program's next call,
a last call releases them at once, a cache salt keeps its prompt's blocks apart from those
of other salts.

    async with SimServer("h100-llama3-8b") as sim:
        async with Engine(backends={"default": sim}) as engine:
            ...
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

from orchestrator import (
    BackendError,
    Clock,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    SystemClock,
    Usage,
)
from orchestrator.ext import ServerCapacity, running_clock

from ._simagent import agent_reply
from ._simengine import SimEngine, SimRequest, StepPlan
from ._simprofile import Profile, get_profile
from ._simtext import chat_block_hashes, count_tokens, generate, render, salted, text_hash

DEFAULT_MAX_TOKENS = 256


class RequestTooLongError(BackendError):
    """The request cannot fit the model's context or the whole KV cache (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class SimStats:
    running: int
    waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    steps: int
    busy_s: float
    preemptions: int
    requests: int

    @property
    def hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )


class SimServer:
    """One simulated serving engine. Use it as an async context manager (it runs a loop)."""

    def __init__(
        self,
        profile: str | Profile = "h100-llama3-8b",
        *,
        seed: int = 0,
        clock: Clock | None = None,
        honour_priority: bool = True,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        record: bool = False,
    ) -> None:
        self.profile = get_profile(profile)
        self.engine = SimEngine(self.profile)
        self.seed = seed
        self._clock = clock
        self.honour_priority = honour_priority
        self.default_max_tokens = default_max_tokens
        self._ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[SimRequest]] = {}
        self._arrived = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._tg: asyncio.TaskGroup | None = None
        self.requests = 0
        self.record = record
        self.recorded: list[tuple[float, int, list[int]]] = []
        """With `record`: (arrival, prompt tokens, block hashes) of every request, for
        offline analysis such as the best hit rate any cache could have had."""

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            self._clock = SystemClock()
        return self._clock

    async def __aenter__(self) -> SimServer:
        if self._clock is None:
            self._clock = running_clock()
        self._arrived = asyncio.Event()
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._driver = self._tg.create_task(self._drive(), name=f"sim-{self.profile.name}")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._driver is None or self._tg is None:
            return
        self._driver.cancel()
        self._driver = None
        tg, self._tg = self._tg, None
        # The driver is cancelled, so the group only waits for it; the body's own error
        # (if any) then propagates as it is instead of wrapped in an ExceptionGroup.
        await tg.__aexit__(None, None, None)

    # --- the LLMBackend protocol -------------------------------------------------------------

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        if self._driver is None:
            raise BackendError(
                "the simulated server is not running; use `async with SimServer(...) as sim`"
            )
        prompt = render(request.messages)
        output_tokens = request.max_tokens or self.default_max_tokens
        prompt_tokens = count_tokens(prompt)
        # Sizes first: the text and block hashes of an output cost time in proportion to its
        # length, so a request that can never run must be refused before any of that work.
        self.check_sizes(prompt_tokens, output_tokens)
        prompt_hash = text_hash(prompt)
        output, call = "", None
        if request.tools or request.output is not None:
            output, call = agent_reply(request, self.seed, prompt_hash)
        # Text runs to the output limit: the request's own limit ends it (`length`), the
        # default length is where the simulated model stops of itself.
        finish = "length" if request.max_tokens is not None else "stop"
        if output or call is not None:  # an answer of its own length, as a model stops
            written = output or (call.arguments if call is not None else "")
            output_tokens = max(1, min(output_tokens, count_tokens(written)))
            finish = "tool_calls" if call is not None else "stop"
        else:
            output = generate(self.seed, prompt_hash, output_tokens)
        req = self.make_request(
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            hashes=salted(
                chat_block_hashes(request.messages, prompt + output, self.profile.block_size),
                hints.cache_salt,
            ),
            hints=hints,
        )
        done = await self.submit(req)
        return LLMResponse(
            text=output,
            usage=Usage(done.prompt_tokens, done.output_tokens, done.cached_tokens),
            finish_reason=finish,
            tool_calls=(call,) if call is not None else (),
            model=self.profile.model,
        )

    def prompt_tokens(self, messages: Iterable[Message]) -> int:
        """The prompt's length in tokens, as `complete` counts it (cheap: no hashing)."""
        return count_tokens(render(messages))

    # --- lower level: requests given as token counts and block hashes (trace replay) ---------

    def check_sizes(self, prompt_tokens: int, output_tokens: int) -> None:
        """Refuse (RequestTooLongError) a request that could never run on this server."""
        p = self.profile
        if output_tokens < 1:
            raise RequestTooLongError(f"max_tokens must be at least 1, got {output_tokens}")
        total = prompt_tokens + output_tokens
        if total > p.max_model_len:
            raise RequestTooLongError(
                f"this request needs {prompt_tokens} prompt + {output_tokens} output tokens, "
                f"more than the model's context of {p.max_model_len} tokens; shorten the "
                "prompt or lower max_tokens"
            )
        if total > p.kv_tokens:
            raise RequestTooLongError(
                f"this request needs {total} tokens of KV cache but the whole cache holds "
                f"{p.kv_tokens}; it could never run"
            )

    def make_request(
        self, *, prompt_tokens: int, output_tokens: int, hashes: list[int], hints: Hints | None
    ) -> SimRequest:
        self.check_sizes(prompt_tokens, output_tokens)
        priority = -hints.urgency if hints is not None and self.honour_priority else 0.0
        return SimRequest(
            id=next(self._ids),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            hashes=hashes,
            arrival=self.clock.monotonic(),
            priority=priority,
            program=hints.program_id if hints is not None else None,
            keep_alive_s=hints.keep_alive_s if hints is not None else None,
            last_call=hints.last_call if hints is not None else False,
        )

    async def submit(self, req: SimRequest) -> SimRequest:
        """Queue `req` and wait until it has finished; aborts it if the caller goes away."""
        future: asyncio.Future[SimRequest] = asyncio.get_running_loop().create_future()
        self._futures[req.id] = future
        if self.record:
            self.recorded.append((req.arrival, req.prompt_tokens, req.hashes))
        self.engine.add(req)
        self.requests += 1
        self._arrived.set()
        try:
            return await future
        except asyncio.CancelledError:
            if req.state in ("waiting", "running"):
                self.engine.abort(req)
            raise
        finally:
            self._futures.pop(req.id, None)

    async def capacity(self) -> ServerCapacity:
        """Its size as its HTTP front says it in `/metrics` (`CapacityReporting`): the
        profile's KV cache and block; the sequences it runs at once, as vLLM, it does not
        say. It keeps a paused program's KV while asked."""
        profile = self.profile
        return ServerCapacity(
            kv_tokens=profile.kv_tokens,
            block_tokens=profile.block_size,
            source=f"the simulator's profile {profile.name}",
            keeps_kv=True,
        )

    def describe(self) -> str:
        """One line for people: what the simulated GPU did and how much its cache saved."""
        s = self.stats()
        return (
            f"simulated {self.profile.name}: {s.requests} requests, "
            f"{s.prefix_cache_hits:,} of {s.prefix_cache_queries:,} prompt tokens from the "
            f"prefix cache ({s.hit_rate:.0%}), busy {s.busy_s:.2f} s in {s.steps} steps, "
            f"{s.preemptions} preemptions"
        )

    def stats(self) -> SimStats:
        cache = self.engine.pool.stats()
        return SimStats(
            running=len(self.engine.running),
            waiting=len(self.engine.waiting),
            kv_cache_usage=cache.usage,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            steps=self.engine.steps,
            busy_s=self.engine.busy_s,
            preemptions=self.engine.preemptions,
            requests=self.requests,
        )

    # --- the driver --------------------------------------------------------------------------

    async def _drive(self) -> None:
        clock = self.clock
        engine = self.engine
        while True:
            plan = engine.plan(clock.monotonic())
            if plan is None:
                await self._idle(engine.next_expiry())
                continue
            steps = await self._run(plan)
            for req in engine.apply(plan, steps, clock.monotonic()):
                future = self._futures.get(req.id)
                if future is not None and not future.done():
                    future.set_result(req)

    async def _idle(self, expiry: float | None) -> None:
        self._arrived.clear()
        if expiry is None:
            await self._arrived.wait()
            return
        timeout = max(0.0, expiry - self.clock.monotonic())
        try:
            async with asyncio.timeout(timeout):
                await self._arrived.wait()
        except TimeoutError:
            pass

    async def _run(self, plan: StepPlan) -> int:
        """Spend the plan's time; a run of decode steps stops at the first step boundary
        after a new request arrives, so it can join the batch as it would on a GPU."""
        durations = plan.durations
        if len(durations) == 1:
            await self.clock.sleep(durations[0])
            return 1
        ends = list(itertools.accumulate(durations))
        start = self.clock.monotonic()
        self._arrived.clear()
        try:
            async with asyncio.timeout(ends[-1]):
                await self._arrived.wait()
        except TimeoutError:
            return len(durations)
        elapsed = self.clock.monotonic() - start
        steps = min(bisect.bisect_left(ends, elapsed) + 1, len(durations))
        await self.clock.sleep(max(0.0, ends[steps - 1] - elapsed))
        return steps
