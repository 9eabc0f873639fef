"""The OpenAI-compatible backend against a recording server: the exact fields and headers
each dialect sends (a wrong spelling passes silently on real servers, so this is the only
guard), answers parsed, errors translated."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agents import Agent
from executors import OpenAIBackend
from orchestrator import (
    BackendError,
    BackendOverloadedError,
    BackendRequestError,
    BackendUnavailableError,
    Engine,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    Retry,
    RunResult,
    ToolSpec,
    UsageError,
    VirtualClock,
    Workflow,
)

STANDARD = {"model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop", "tools"}
HINTS = Hints(
    program_id="prog-7",
    urgency=-3.5,
    deadline_s=12.0,
    expected_output_tokens=64,
    keep_alive_s=2.5,
    last_call=True,
)


@dataclass
class Recorder:
    """A small OpenAI-compatible server that records what it is sent."""

    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((request.path, body, dict(request.headers)))
        if self.status != 200:
            error = {"error": {"message": f"nope ({self.status})", "type": "x"}}
            return web.json_response(error, status=self.status, headers=self.headers)
        message: dict[str, Any] = {"role": "assistant", "content": "hello back"}
        if body.get("tools"):
            message["tool_calls"] = [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"q": "kv"}'},
                }
            ]
        answer = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 20,
                "completion_tokens": 3,
                "total_tokens": 23,
                "prompt_tokens_details": {"cached_tokens": 16},
            },
        }
        return web.json_response(answer, headers={"endpoint-load-metrics": "running=1"})

    async def close_session(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, await request.json(), dict(request.headers)))
        return web.json_response({"success": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/close_session", self.close_session)
        return app


@asynccontextmanager
async def recording(recorder: Recorder) -> AsyncIterator[str]:
    server = TestServer(recorder.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/v1"))
    finally:
        await server.close()


REQUEST = LLMRequest((Message("system", "sys"), Message("user", "hi")), "m", max_tokens=8)


def call(
    clock: VirtualClock,
    dialect: str,
    recorder: Recorder,
    hints: Hints = HINTS,
    request: LLMRequest = REQUEST,
    **options: Any,
) -> LLMResponse:
    async def main() -> LLMResponse:
        async with (
            recording(recorder) as url,
            OpenAIBackend(url, dialect=dialect, **options) as llm,
        ):
            return await llm.complete(request, hints)

    return clock.run(main())


EXPECTED: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "vllm": (
        {"priority": 3500, "session_id": "prog-7"},
        {"endpoint-load-metrics-format": "TEXT"},
    ),
    "vllm-continuum": ({"priority": 3500, "job_id": "prog-7", "is_last_step": True}, {}),
    "sglang": ({"priority": -3500, "session_id": "prog-7"}, {}),
    "dynamo": (
        {"nvext": {"agent_hints": {"priority": -3500, "latency_sensitivity": 12.0, "osl": 64}}},
        {"X-Dynamo-Session-ID": "prog-7", "X-Dynamo-Session-Final": "true"},
    ),
    "llamacpp": ({"cache_prompt": True, "id_slot": zlib.crc32(b"prog-7") % 4}, {}),
    "openai": ({}, {}),
    "sim": ({"priority": 3500, "session_id": "prog-7", "keep_alive_s": 2.5, "last_call": True}, {}),
}
HINT_HEADERS = {
    "endpoint-load-metrics-format",
    "x-dynamo-session-id",
    "x-dynamo-session-final",
}


@pytest.mark.parametrize("dialect", sorted(EXPECTED))
def test_each_dialect_sends_exactly_its_fields(clock: VirtualClock, dialect: str) -> None:
    recorder = Recorder()
    call(clock, dialect, recorder, slots=4 if dialect == "llamacpp" else None)
    path, body, headers = recorder.seen[0]
    want_body, want_headers = EXPECTED[dialect]
    assert path == "/v1/chat/completions"
    assert {k: v for k, v in body.items() if k not in STANDARD} == want_body
    sent = {k.lower(): v for k, v in headers.items() if k.lower() in HINT_HEADERS}
    assert sent == {k.lower(): v for k, v in want_headers.items()}
    assert body["max_tokens"] == 8 and body["messages"][1] == {"role": "user", "content": "hi"}


def test_sglang_closes_the_session_after_the_programs_last_call(clock: VirtualClock) -> None:
    recorder = Recorder()
    call(clock, "sglang", recorder)
    assert [p for p, _, _ in recorder.seen] == ["/v1/chat/completions", "/close_session"]
    assert recorder.seen[1][1] == {"session_id": "prog-7"}
    recorder = Recorder()
    call(clock, "sglang", recorder, hints=Hints(program_id="p", last_call=False))
    assert [p for p, _, _ in recorder.seen] == ["/v1/chat/completions"]


def test_priority_keeps_the_schedulers_order_in_every_dialect(clock: VirtualClock) -> None:
    sooner, later = Hints(program_id="a", urgency=-1.0), Hints(program_id="b", urgency=-2.0)
    for dialect, lower_runs_sooner in (("vllm", True), ("sglang", False), ("sim", True)):
        recorder = Recorder()
        call(clock, dialect, recorder, hints=sooner)
        call(clock, dialect, recorder, hints=later)
        first, second = (body["priority"] for _, body, _ in recorder.seen)
        assert (first < second) == lower_runs_sooner, dialect


def test_the_answer_is_parsed_with_cached_tokens_and_tool_calls(clock: VirtualClock) -> None:
    recorder = Recorder()
    request = LLMRequest(
        (Message("user", "find it"),),
        "m",
        tools=(ToolSpec("search", "Search the docs", {"type": "object"}),),
    )
    answer = call(clock, "vllm", recorder, request=request, model="served-name")
    assert answer.text == "hello back"
    assert answer.usage.prompt_tokens == 20 and answer.usage.cached_prompt_tokens == 16
    assert answer.tool_calls[0].name == "search" and answer.tool_calls[0].arguments == '{"q": "kv"}'
    body = recorder.seen[0][1]
    assert body["model"] == "served-name"
    assert body["tools"][0]["function"]["name"] == "search"


@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [
        (400, BackendRequestError, False),
        (422, BackendRequestError, False),
        (429, BackendOverloadedError, True),
        (503, BackendOverloadedError, True),
        (500, BackendError, True),
    ],
)
def test_http_errors_become_plaits_errors(
    clock: VirtualClock, status: int, error: type[BackendError], retryable: bool
) -> None:
    recorder = Recorder(status=status, headers={"Retry-After": "3"})
    with pytest.raises(error, match=f"answered {status}: nope") as info:
        call(clock, "vllm", recorder)
    assert type(info.value) is error
    assert info.value.status == status and info.value.retryable is retryable
    if isinstance(info.value, BackendOverloadedError):
        assert info.value.retry_after == 3.0


def test_an_unreachable_backend_is_unavailable(clock: VirtualClock) -> None:
    async def main() -> None:
        async with OpenAIBackend("http://127.0.0.1:9/v1", dialect="vllm") as llm:
            await llm.complete(REQUEST, HINTS)

    with pytest.raises(BackendUnavailableError, match="cannot reach backend"):
        clock.run(main())


def test_a_400_is_not_retried_by_the_engine(clock: VirtualClock) -> None:
    recorder = Recorder(status=400)
    agent = Agent("a", "sys")

    async def main() -> RunResult:
        async with recording(recorder) as url, OpenAIBackend(url, dialect="vllm") as llm:
            wf = Workflow("bad-request")
            wf.add("ask", agent.ask("hi"), retry=Retry(attempts=3, jitter=0))
            async with Engine(backends={"default": llm}) as engine:
                return await engine.run(wf)

    result = clock.run(main())
    assert result.status == "failed" and len(recorder.seen) == 1
    assert "answered 400" in result.failures["ask"]


def test_a_backend_must_be_opened(clock: VirtualClock) -> None:
    async def main() -> None:
        await OpenAIBackend("http://127.0.0.1:9/v1").complete(REQUEST, HINTS)

    with pytest.raises(UsageError, match="is not open"):
        clock.run(main())


def test_unknown_dialect_is_refused() -> None:
    with pytest.raises(UsageError, match="unknown dialect 'vlm'"):
        OpenAIBackend("http://x/v1", dialect="vlm")


def test_hints_reach_the_simulated_server_over_http(clock: VirtualClock) -> None:
    """Engine -> OpenAIBackend (sim dialect) -> HTTP -> SimServer: the program's keep-alive
    pins its KV blocks on the server, and its last call releases them."""
    from executors import SimHTTP, SimServer
    from orchestrator import TaskContext

    agent = Agent("a", "You are a patient agent. " * 40)
    pinned: list[set[str]] = []

    async def main() -> RunResult:
        async with SimServer("h100-llama3-8b") as sim:
            server = TestServer(SimHTTP(sim).app(), host="127.0.0.1")
            await server.start_server()
            try:
                url = str(server.make_url("/v1"))
                async with OpenAIBackend(url, dialect="sim") as llm:

                    async def turns(ctx: TaskContext) -> int:
                        request = agent.request("first", max_tokens=4)
                        await ctx.complete(request, keep_alive_s=30.0)
                        pinned.append(set(sim.engine.pins))
                        await ctx.complete(agent.request("second", max_tokens=4), last_call=True)
                        pinned.append(set(sim.engine.pins))
                        return 2

                    wf = Workflow("pinned")
                    wf.add("turns", turns)
                    async with Engine(backends={"default": llm}) as engine:
                        return await engine.run(wf)
            finally:
                await server.close()

    result = clock.run(main())
    assert result.ok
    assert pinned == [{"pinned"}, set()]
