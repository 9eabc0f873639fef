"""One contract for every `LLMBackend` plait ships, so fakes stay as honest as servers.

The same tests run against the function-driven fake, the simulator in process, the simulator
over HTTP through `OpenAIBackend` in each dialect (whole, streamed, text completions), and the
wrappers (`Router`, `PrefixGrouper`) over them. Everything runs on the virtual clock: the
HTTP traffic is real (loopback), the waiting is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from executors import (
    DIALECTS,
    Faults,
    FunctionLLM,
    OpenAIBackend,
    PrefixGrouper,
    Router,
    SimHTTP,
    SimServer,
)
from executors._simengine import SimRequest
from orchestrator import (
    BackendError,
    Hints,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    Message,
    VirtualClock,
)
from orchestrator.ext import (
    CapacityReporting,
    FailureIsolating,
    HealthChecked,
    LoadReport,
    LoadReporting,
    ProgramAware,
    ServerCapacity,
)
from orchestrator.model._llm import Capabilities, capabilities

MAX_TOKENS = 8
HINTS = Hints("contract")


def request(i: int, extra: str = "") -> LLMRequest:
    return LLMRequest(
        (Message("system", "You answer briefly."), Message("user", f"question {i}{extra}")),
        "m",
        max_tokens=MAX_TOKENS,
    )


@dataclass
class Subject:
    """A backend under test and the handles the contract needs on it."""

    backend: LLMBackend
    arrivals: Arrivals
    """The calls that have reached the bottom (the fake, the simulated server)."""
    fail: Callable[[LLMRequest], LLMRequest]
    """Make the next calls fail; says which request to send for that."""
    heal: Callable[[], None]
    remote: bool
    """Whether it waits on a server outside this process (so needs the system clock)."""
    inner: Sequence[LLMBackend] = field(default_factory=tuple)
    """What a wrapper wraps."""


# --- the backends ---------------------------------------------------------------------------


class Arrivals:
    """Counts calls arriving at the bottom, and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._event = asyncio.Event()

    def note(self) -> None:
        self.count += 1
        self._event.set()

    async def beyond(self, count: int) -> None:
        while self.count <= count:
            self._event.clear()
            await self._event.wait()


class CountedLLM(FunctionLLM):
    def __init__(self, reply: Breakable, arrivals: Arrivals) -> None:
        super().__init__(reply, latency=0.5)
        self.arrivals = arrivals

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self.arrivals.note()
        return await super().complete(request, hints)


class CountedSim(SimServer):
    def __init__(self, arrivals: Arrivals) -> None:
        super().__init__("h100-llama3-8b")
        self.arrivals = arrivals

    async def submit(self, req: SimRequest) -> SimRequest:
        self.arrivals.note()
        return await super().submit(req)


class Breakable:
    """A reply function that answers each question by name, or raises a server error."""

    def __init__(self) -> None:
        self.failing = False

    def __call__(self, request: LLMRequest, hints: Hints) -> str:
        if self.failing:
            raise BackendError("the fake server answered 500", status=500)
        return f"re: {request.messages[-1].content}"

    def fail(self, request: LLMRequest) -> LLMRequest:
        self.failing = True
        return request

    def heal(self) -> None:
        self.failing = False


def fakes(n: int) -> tuple[list[CountedLLM], list[Breakable]]:
    arrivals = Arrivals()
    replies = [Breakable() for _ in range(n)]
    return [CountedLLM(reply, arrivals) for reply in replies], replies


def fake_subject(backend: LLMBackend, llms: list[CountedLLM], replies: list[Breakable]) -> Subject:
    def fail(r: LLMRequest) -> LLMRequest:
        for reply in replies:
            reply.fail(r)
        return r

    def heal() -> None:
        for reply in replies:
            reply.heal()

    return Subject(
        backend,
        arrivals=llms[0].arrivals,
        fail=fail,
        heal=heal,
        remote=False,
        inner=tuple(llms),
    )


@contextlib.asynccontextmanager
async def fake() -> AsyncIterator[Subject]:
    (llm,), replies = fakes(1)
    yield replace(fake_subject(llm, [llm], replies), inner=())


@contextlib.asynccontextmanager
async def router_over_fakes() -> AsyncIterator[Subject]:
    llms, replies = fakes(2)
    async with Router({"a": llms[0], "b": llms[1]}, health_interval_s=None) as router:
        yield fake_subject(router, llms, replies)


@contextlib.asynccontextmanager
async def grouper_over_fake() -> AsyncIterator[Subject]:
    (llm,), replies = fakes(1)
    async with PrefixGrouper(llm) as grouper:
        yield fake_subject(grouper, [llm], replies)


@contextlib.asynccontextmanager
async def grouper_over_router() -> AsyncIterator[Subject]:
    llms, replies = fakes(2)
    router = Router({"a": llms[0], "b": llms[1]}, health_interval_s=None)
    async with PrefixGrouper(router) as grouper:
        yield replace(fake_subject(grouper, llms, replies), inner=(router,))


def too_long(r: LLMRequest) -> LLMRequest:
    return replace(r, max_tokens=10_000_000)  # refused by the server: more than its context


@contextlib.asynccontextmanager
async def sim() -> AsyncIterator[Subject]:
    arrivals = Arrivals()
    async with CountedSim(arrivals) as server:
        yield Subject(server, arrivals, too_long, lambda: None, remote=False)


@contextlib.asynccontextmanager
async def router_over_sims() -> AsyncIterator[Subject]:
    arrivals = Arrivals()
    async with (
        CountedSim(arrivals) as a,
        CountedSim(arrivals) as b,
        Router({"a": a, "b": b}, health_interval_s=None) as router,
    ):
        yield Subject(router, arrivals, too_long, lambda: None, False, (a, b))


@contextlib.asynccontextmanager
async def served_sim() -> AsyncIterator[tuple[str, CountedSim, SimHTTP]]:
    server = CountedSim(Arrivals())
    async with server:
        front = SimHTTP(server)
        http = TestServer(front.app(), host="127.0.0.1")
        await http.start_server()
        try:
            yield str(http.make_url("/v1")), server, front
        finally:
            await http.close()


def over_http(
    **options: Any,
) -> Callable[[], contextlib.AbstractAsyncContextManager[Subject]]:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[Subject]:
        async with served_sim() as (url, server, front):
            settings = {"local": True, **options}
            if settings.get("dialect") == "llamacpp":
                settings["slots"] = 4
            backend = OpenAIBackend(url, model=server.profile.model, **settings)
            async with backend:
                yield http_subject(backend, server, front, remote=not settings["local"])

    return make


def http_subject(backend: LLMBackend, server: CountedSim, front: SimHTTP, remote: bool) -> Subject:
    def fail(r: LLMRequest) -> LLMRequest:
        front.faults = Faults(error_rate=1.0)  # every completion answers 500
        return r

    def heal() -> None:
        front.faults = None

    return Subject(backend, server.arrivals, fail, heal, remote)


@contextlib.asynccontextmanager
async def grouper_over_http() -> AsyncIterator[Subject]:
    async with (
        served_sim() as (url, server, front),
        OpenAIBackend(url, dialect="vllm", model=server.profile.model, local=True) as llm,
        PrefixGrouper(llm) as grouper,
    ):
        yield replace(http_subject(grouper, server, front, remote=False), inner=(llm,))


SUBJECTS: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[Subject]]] = {
    "fake": fake,
    "sim": sim,
    **{f"http-{dialect}": over_http(dialect=dialect) for dialect in sorted(DIALECTS)},
    "http-stream": over_http(dialect="sim", stream=True),
    "http-completions": over_http(dialect="vllm", api="completions"),
    "http-completions-stream": over_http(dialect="vllm", api="completions", stream=True),
    "http-remote": over_http(dialect="vllm", local=False),
    "router-fakes": router_over_fakes,
    "router-sims": router_over_sims,
    "grouper-fake": grouper_over_fake,
    "grouper-router": grouper_over_router,
    "grouper-http": grouper_over_http,
}


@pytest.fixture(params=sorted(SUBJECTS))
def subject(request: pytest.FixtureRequest) -> Callable[[], Any]:
    return SUBJECTS[request.param]


Make = Callable[[], contextlib.AbstractAsyncContextManager[Subject]]


# --- the contract ---------------------------------------------------------------------------


def check_usage(response: LLMResponse) -> None:
    assert isinstance(response, LLMResponse)
    assert isinstance(response.text, str) and response.text
    usage = response.usage
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    cached = usage.cached_prompt_tokens
    assert cached is None or 0 <= cached <= usage.prompt_tokens


def test_an_answer_is_text_with_consistent_usage(clock: VirtualClock, subject: Make) -> None:
    async def main() -> list[LLMResponse]:
        async with subject() as s:
            short = request(1)
            longer = request(1, " and " + "more detail " * 40)
            return [await s.backend.complete(r, HINTS) for r in (short, short, longer)]

    first, again, longer = clock.run(main())
    for response in (first, again, longer):
        check_usage(response)
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert again.text == first.text
    assert longer.usage.prompt_tokens > first.usage.prompt_tokens


def test_concurrent_calls_each_get_their_own_answer(clock: VirtualClock, subject: Make) -> None:
    n = 12

    async def main() -> tuple[list[str], list[str]]:
        async with subject() as s:
            together = await asyncio.gather(
                *(s.backend.complete(request(i), HINTS) for i in range(n))
            )
            alone = [(await s.backend.complete(request(i), HINTS)).text for i in range(n)]
            return [r.text for r in together], alone

    together, alone = clock.run(main())
    assert together == alone  # nobody got another call's answer
    assert len(set(together)) == n


def test_a_call_cancelled_in_flight_leaves_the_backend_usable(
    clock: VirtualClock, subject: Make
) -> None:
    async def main() -> LLMResponse:
        async with subject() as s:
            before = s.arrivals.count
            call = asyncio.create_task(s.backend.complete(request(1), HINTS))
            await s.arrivals.beyond(before)  # it has reached the server, which is working on it
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            # The same prompt again: a wrapper must not wait for the cancelled call.
            return await s.backend.complete(request(1), HINTS)

    check_usage(clock.run(main()))


def test_a_failure_is_a_backend_error_and_the_backend_recovers(
    clock: VirtualClock, subject: Make
) -> None:
    async def main() -> LLMResponse:
        async with subject() as s:
            doomed = s.fail(request(1))
            with pytest.raises(BackendError):
                await s.backend.complete(doomed, HINTS)
            s.heal()
            return await s.backend.complete(request(2), HINTS)

    check_usage(clock.run(main()))


def test_declared_capabilities_hold(clock: VirtualClock, subject: Make) -> None:
    async def main() -> None:
        async with subject() as s:
            backend = s.backend
            caps = capabilities(backend)
            assert caps.needs_wall_clock == s.remote
            if isinstance(backend, HealthChecked):
                await backend.check()  # healthy: passes
            if isinstance(backend, LoadReporting):
                assert isinstance(await backend.load(), LoadReport)
            if isinstance(backend, CapacityReporting):
                assert isinstance(await backend.capacity(), ServerCapacity)
            if isinstance(backend, ProgramAware):
                await backend.program_done("no-such-program")  # harmless
            if isinstance(backend, FailureIsolating):
                assert caps.isolates_failures == backend.isolates_failures()
            check_usage(await backend.complete(request(1), HINTS))

    clock.run(main())


def test_wrappers_declare_what_they_wrap(clock: VirtualClock, subject: Make) -> None:
    async def main() -> None:
        async with subject() as s:
            if not s.inner:
                return
            outer = capabilities(s.backend)
            inner = [capabilities(b) for b in s.inner]
            for name in (f.name for f in dataclasses.fields(Capabilities)):
                if any(getattr(c, name) for c in inner):
                    assert getattr(outer, name), name
            if isinstance(s.backend, PrefixGrouper):
                (only,) = inner
                assert outer.isolates_failures == only.isolates_failures
                assert outer.needs_wall_clock == only.needs_wall_clock
            if isinstance(s.backend, Router):
                assert outer.isolates_failures
                assert outer.needs_wall_clock == any(c.needs_wall_clock for c in inner)

    clock.run(main())
