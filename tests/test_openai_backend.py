"""The OpenAI-compatible backend against a recording server: the exact fields and headers
each dialect sends (a wrong spelling passes silently on real servers, so this is the only
guard), answers parsed, errors translated."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agents import Agent
from executors import OpenAIBackend
from orchestrator import (
    BackendError,
    Engine,
    Hints,
    LLMRequest,
    LLMResponse,
    Message,
    Retry,
    RunResult,
    ToolCall,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import (
    BackendOverloadedError,
    BackendRequestError,
    BackendUnavailableError,
    OutputSchema,
    Sampling,
    ServiceClass,
    ToolSpec,
)

STANDARD = {"model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop", "tools"}
HINTS = Hints(
    program_id="prog-7",
    urgency=-3.5,
    service="tight",
    slack_s=4.0,
    expected_output_tokens=64,
    keep_alive_s=2.5,
    last_call=True,
)


LOAD_HEADER = "TEXT named_metrics.kv_cache_usage_perc=0.25, named_metrics.num_requests_waiting=2.0"
TOOL_CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "search", "arguments": '{"q": "kv"}'},
}
USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 3,
    "total_tokens": 23,
    "prompt_tokens_details": {"cached_tokens": 16},
}


@dataclass
class Recorder:
    """A small OpenAI-compatible server that records what it is sent.

    Streamed answers send the role at once, the first token after `first_token_s` (virtual)
    seconds, then the rest; `fail_stream` ends a stream after its first token, by dropping
    the connection ("drop") or with an error event ("error")."""

    seen: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    health_status: int = 200
    first_token_s: float = 0.5
    fail_stream: str | None = None

    async def _record(self, request: web.Request) -> dict[str, Any]:
        body = await request.json() if request.can_read_body else {}
        self.seen.append((request.path, body, dict(request.headers)))
        return body

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if self.status != 200:
            error = {"error": {"message": f"nope ({self.status})", "type": "x"}}
            return web.json_response(error, status=self.status, headers=self.headers)
        tools = bool(body.get("tools"))
        if body.get("stream"):
            return await self.stream(request, body, chat=True, tools=tools)
        message: dict[str, Any] = {"role": "assistant", "content": "hello back"}
        if tools:
            message["tool_calls"] = [TOOL_CALL]
        answer = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": USAGE,
        }
        return web.json_response(answer, headers={"endpoint-load-metrics": LOAD_HEADER})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if body.get("stream"):
            return await self.stream(request, body, chat=False, tools=False)
        answer = {
            "id": "x",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "text": "hello back", "finish_reason": "length"}],
            "usage": USAGE,
        }
        return web.json_response(answer)

    async def stream(
        self, request: web.Request, body: dict[str, Any], *, chat: bool, tools: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "endpoint-load-metrics": LOAD_HEADER}
        )
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {"id": "x", "object": kind, "created": 0, "model": body["model"]}
            await response.write(
                f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n".encode()
            )

        def piece(text: str, finish: str | None = None, **delta: Any) -> dict[str, Any]:
            if chat:
                content = {"content": text} if text else {}
                return {"index": 0, "delta": {**content, **delta}, "finish_reason": finish}
            return {"index": 0, "text": text, "finish_reason": finish}

        if chat:
            await send([piece("", role="assistant")])
        await asyncio.sleep(self.first_token_s)
        await send([piece("hello")])
        if self.fail_stream == "drop":
            assert request.transport is not None
            request.transport.close()
            return response
        if self.fail_stream == "error":
            await send([], error={"message": "the engine died", "type": "internal"})
            return response
        await send([piece(" back")])
        if tools:
            call, function = TOOL_CALL, TOOL_CALL["function"]
            await send(
                [
                    piece(
                        "",
                        tool_calls=[
                            {
                                "index": 0,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": function["name"], "arguments": ""},
                            }
                        ],
                    )
                ]
            )
            for part in ('{"q": ', '"kv"}'):
                await send([piece("", tool_calls=[{"index": 0, "function": {"arguments": part}}])])
        await send([piece("", "stop" if chat else "length")])
        if body.get("stream_options", {}).get("include_usage"):
            await send([], usage=USAGE)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def session(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"success": True})

    async def health(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=self.health_status, text="ok")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/open_session", self.session)
        app.router.add_post("/close_session", self.session)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.health)
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
        {"nvext": {"agent_hints": {"priority": -3500, "latency_sensitivity": 1.2, "osl": 64}}},
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


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSE_FORMAT = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "Place", "schema": SCHEMA},
    }
}
STRUCTURED: dict[str, dict[str, Any]] = {
    "vllm": {"structured_outputs": {"json": SCHEMA}},
    "vllm-continuum": {"structured_outputs": {"json": SCHEMA}},
    "sglang": RESPONSE_FORMAT,
    "dynamo": RESPONSE_FORMAT,
    "llamacpp": RESPONSE_FORMAT,
    "openai": RESPONSE_FORMAT,
    "sim": RESPONSE_FORMAT,
}


@pytest.mark.parametrize("dialect", sorted(STRUCTURED))
def test_each_dialect_asks_for_structured_output_its_own_way(
    clock: VirtualClock, dialect: str
) -> None:
    recorder = Recorder()
    request = dataclasses.replace(REQUEST, output=OutputSchema("Place", SCHEMA))
    call(clock, dialect, recorder, request=request, slots=4 if dialect == "llamacpp" else None)
    _, body, _ = recorder.seen[0]
    hint_fields = EXPECTED[dialect][0].keys()
    sent = {k: v for k, v in body.items() if k not in STANDARD and k not in hint_fields}
    assert sent == STRUCTURED[dialect]


def test_extra_body_may_not_replace_the_structured_output_field(clock: VirtualClock) -> None:
    request = dataclasses.replace(
        REQUEST,
        output=OutputSchema("Place", SCHEMA),
        extra_body={"structured_outputs": {"regex": "x"}},
    )
    with pytest.raises(UsageError, match="structured_outputs"):
        call(clock, "vllm", Recorder(), request=request)


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


@pytest.mark.parametrize(
    ("service", "head_start"),
    [("urgent", 1.2), ("tight", 1.2), ("shareable", 1.2), ("slack_rich", None), (None, None)],
)
def test_dynamo_gives_urgent_work_a_queue_head_start(
    clock: VirtualClock, service: ServiceClass | None, head_start: float | None
) -> None:
    """Urgent work (`URGENT_CLASSES`) reaches Dynamo's queue as if it came earlier; work
    that may wait, or that nothing judged, sends no `latency_sensitivity` at all."""
    recorder = Recorder()
    call(clock, "dynamo", recorder, hints=Hints("p", service=service, slack_s=30.0))
    sent = recorder.seen[0][1]["nvext"]["agent_hints"]
    assert sent.get("latency_sensitivity") == head_start


SALTED: dict[str, dict[str, Any]] = {
    "vllm": {"cache_salt": "s4lt"},
    "vllm-continuum": {"cache_salt": "s4lt"},
    "sglang": {"cache_salt": "s4lt"},
    "dynamo": {"nvext": {"agent_hints": {"priority": 0}, "cache_salt": "s4lt"}},
    "llamacpp": {},  # no salt: llama.cpp's slots share their prompt cache
    "openai": {},
    "sim": {"cache_salt": "s4lt"},
}


@pytest.mark.parametrize("dialect", sorted(SALTED))
def test_each_dialect_sends_the_cache_salt_its_own_way(clock: VirtualClock, dialect: str) -> None:
    recorder = Recorder()
    call(clock, dialect, recorder, hints=Hints(program_id="", cache_salt="s4lt"))
    _, body, _ = recorder.seen[0]
    sent = {k: v for k, v in body.items() if k in ("cache_salt", "nvext")}
    assert sent == SALTED[dialect]
    recorder = Recorder()
    call(clock, dialect, recorder, hints=Hints(program_id=""))  # unsalted: no field at all
    assert "cache_salt" not in json.dumps(recorder.seen[0][1])


def test_a_runs_tenant_reaches_vllm_as_a_keyed_cache_salt(clock: VirtualClock) -> None:
    """Engine.submit(tenant=...) -> Hints.cache_salt -> vLLM's `cache_salt` body field: the
    same salt for a tenant's runs, another for another tenant, none without a tenant; the
    tenant's name never leaves the process."""
    recorder = Recorder()
    agent = Agent("a", "You are brief.")

    async def main() -> list[RunResult]:
        async with (
            recording(recorder) as url,
            OpenAIBackend(url, dialect="vllm", local=True) as llm,
            Engine(backends={"default": llm}) as engine,
        ):
            runs = []
            for i, tenant in enumerate(["acme-corp", "acme-corp", "globex", None]):
                wf = Workflow(f"run-{i}")
                wf.add("ask", agent.ask("same question", max_tokens=4))
                runs.append(await engine.submit(wf, tenant=tenant))
            return runs

    assert all(r.ok for r in clock.run(main()))
    salts = [body.get("cache_salt") for _, body, _ in recorder.seen]
    acme, acme_again, globex, nobody = salts
    assert acme == acme_again and acme != globex and nobody is None
    assert isinstance(acme, str) and re.fullmatch(r"[A-Za-z0-9_-]{43}", acme)
    assert all("acme" not in json.dumps(body) for _, body, _ in recorder.seen)


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
        async with (
            recording(recorder) as url,
            OpenAIBackend(url, dialect="vllm", local=True) as llm,
        ):
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
                async with OpenAIBackend(
                    url, dialect="sim", local=True, model=sim.profile.model
                ) as llm:

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


# --- streaming, text completions, SGLang sessions, load header --------------------------------

TOOLS_REQUEST = LLMRequest(
    (Message("user", "find it"),),
    "m",
    tools=(ToolSpec("search", "Search the docs", {"type": "object"}),),
)


def test_a_streamed_answer_equals_the_whole_one(clock: VirtualClock) -> None:
    whole, streamed = Recorder(), Recorder()
    plain = call(clock, "vllm", whole)
    answer = call(clock, "vllm", streamed, stream=True)
    body = streamed.seen[0][1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "stream" not in whole.seen[0][1]
    assert plain.first_token_s is None
    # The role arrives at once; the first token after the server's 0.5 s, on the virtual clock.
    assert answer.first_token_s == 0.5
    assert replace(answer, first_token_s=None) == plain
    assert answer.usage.cached_prompt_tokens == 16


def test_streamed_tool_call_deltas_are_assembled(clock: VirtualClock) -> None:
    plain = call(clock, "vllm", Recorder(), request=TOOLS_REQUEST)
    answer = call(clock, "vllm", Recorder(), request=TOOLS_REQUEST, stream=True)
    assert answer.tool_calls == (ToolCall("call-1", "search", '{"q": "kv"}'),)
    assert replace(answer, first_token_s=None) == plain


@pytest.mark.parametrize("stream", [False, True])
def test_the_completions_api_sends_the_rendered_prompt(clock: VirtualClock, stream: bool) -> None:
    recorder = Recorder()
    request = replace(REQUEST, sampling=Sampling(seed=7, stop=("\n\n",)))
    answer = call(
        clock,
        "sglang",
        recorder,
        hints=Hints(program_id="prog-7", urgency=1.0),
        request=request,
        api="completions",
        stream=stream,
        render=lambda messages: "|".join(m.content for m in messages),
    )
    path, body, _ = recorder.seen[0]
    expected: dict[str, Any] = {
        "model": "m",
        "prompt": "sys|hi",
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 8,
        "seed": 7,
        "stop": ["\n\n"],
        "priority": 1000,
        "session_id": "prog-7",
    }
    if stream:
        expected |= {"stream": True, "stream_options": {"include_usage": True}}
    assert path == "/v1/completions" and body == expected
    assert answer.text == "hello back" and answer.finish_reason == "length"
    assert answer.usage == Usage(20, 3, 16)
    assert (answer.first_token_s == 0.5) if stream else (answer.first_token_s is None)


def test_the_completions_api_renders_with_the_simulators_template_by_default(
    clock: VirtualClock,
) -> None:
    recorder = Recorder()
    call(clock, "openai", recorder, api="completions")
    assert recorder.seen[0][1]["prompt"] == "<|system|>\nsys\n<|user|>\nhi\n<|assistant|>\n"


def test_the_completions_api_refuses_tools_and_unknown_apis_are_refused(
    clock: VirtualClock,
) -> None:
    with pytest.raises(UsageError, match='use api="chat"'):
        call(clock, "vllm", Recorder(), request=TOOLS_REQUEST, api="completions")
    with pytest.raises(UsageError, match="unknown api 'responses'"):
        OpenAIBackend("http://x/v1", api="responses")  # type: ignore[arg-type]


def test_a_connection_dropped_mid_stream_is_unavailable(clock: VirtualClock) -> None:
    with pytest.raises(BackendUnavailableError, match="cannot reach backend"):
        call(clock, "vllm", Recorder(fail_stream="drop"), stream=True)


def test_an_error_event_mid_stream_is_a_retryable_backend_error(clock: VirtualClock) -> None:
    with pytest.raises(BackendError, match="failed while answering: the engine died") as info:
        call(clock, "vllm", Recorder(fail_stream="error"), stream=True)
    assert type(info.value) is BackendError and info.value.retryable


def test_sglang_opens_a_programs_session_once_before_its_first_call(clock: VirtualClock) -> None:
    recorder = Recorder()
    turns = [
        Hints(program_id="prog-7", keep_alive_s=4.0),
        Hints(program_id="prog-7", keep_alive_s=9.0),
        Hints(program_id="prog-7", last_call=True),
    ]

    async def main() -> None:
        async with recording(recorder) as url, OpenAIBackend(url, dialect="sglang") as llm:
            # Two calls at once: the second waits for the first one's open, never opens again.
            await asyncio.gather(*(llm.complete(REQUEST, hints) for hints in turns[:2]))
            await llm.complete(REQUEST, turns[2])

    clock.run(main())
    paths = [p for p, _, _ in recorder.seen]
    assert paths == [
        "/open_session",
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/v1/chat/completions",
        "/close_session",
    ]
    opened = recorder.seen[0][1]
    assert opened == {"capacity_of_str_len": 1 << 20, "session_id": "prog-7", "timeout": 4.0}
    assert recorder.seen[-1][1] == {"session_id": "prog-7"}


def test_sglang_opens_no_session_for_a_program_that_will_not_be_back(clock: VirtualClock) -> None:
    recorder = Recorder()
    call(clock, "sglang", recorder, hints=Hints(program_id="p"))
    assert [p for p, _, _ in recorder.seen] == ["/v1/chat/completions"]


def test_vllms_load_header_is_kept_raw_and_read(clock: VirtualClock) -> None:
    from executors import LoadReport

    async def main(stream: bool) -> tuple[str | None, LoadReport | None]:
        async with (
            recording(Recorder()) as url,
            OpenAIBackend(url, dialect="vllm", stream=stream) as llm,
        ):
            await llm.complete(REQUEST, HINTS)
            return llm.last_load_report, llm.last_load

    for stream in (False, True):
        raw, load = clock.run(main(stream))
        assert raw == LOAD_HEADER
        assert load == LoadReport(waiting=2, kv_cache_usage=0.25)


# --- health probe -----------------------------------------------------------------------------


def probe(clock: VirtualClock, url: str, dialect: str = "vllm") -> None:
    async def main() -> None:
        async with OpenAIBackend(url, dialect=dialect) as llm:
            await llm.check()

    clock.run(main())


def probe_recorder(clock: VirtualClock, recorder: Recorder, dialect: str = "vllm") -> None:
    async def main() -> None:
        async with recording(recorder) as url, OpenAIBackend(url, dialect=dialect) as llm:
            await llm.check()

    clock.run(main())


def test_check_gets_health_or_the_model_list(clock: VirtualClock) -> None:
    for dialect, path in (("vllm", "/health"), ("sglang", "/health"), ("openai", "/v1/models")):
        recorder = Recorder()
        probe_recorder(clock, recorder, dialect)
        assert [p for p, _, _ in recorder.seen] == [path]


def test_check_fails_on_a_closed_port(clock: VirtualClock) -> None:
    with pytest.raises(BackendUnavailableError, match="did not answer its health probe"):
        probe(clock, "http://127.0.0.1:9/v1")


@pytest.mark.parametrize("status", [500, 503])
def test_check_fails_on_a_5xx(clock: VirtualClock, status: int) -> None:
    with pytest.raises(BackendUnavailableError, match=f"/health answered {status}") as info:
        probe_recorder(clock, Recorder(health_status=status))
    assert info.value.status == status


def test_check_passes_on_a_4xx_a_live_server_answers(clock: VirtualClock) -> None:
    probe_recorder(clock, Recorder(health_status=404))


def test_load_fails_clearly_without_metrics_or_a_server(clock: VirtualClock) -> None:
    async def main() -> None:
        async with recording(Recorder()) as url, OpenAIBackend(url, dialect="llamacpp") as llm:
            await llm.load()

    with pytest.raises(BackendRequestError, match="answered 404"):
        clock.run(main())

    async def closed() -> None:
        async with OpenAIBackend("http://127.0.0.1:9/v1", dialect="vllm") as llm:
            await llm.load()

    with pytest.raises(BackendUnavailableError, match="cannot reach backend"):
        clock.run(closed())


def test_the_engine_closes_an_sglang_session_its_program_left_open(clock: VirtualClock) -> None:
    """The workflow ends with a function task, so no call is marked last; when the run
    finishes, the engine tells the backend, which closes the session it opened."""
    recorder = Recorder()
    agent = Agent("a", "You are brief.")

    def decide(ctx: object) -> str:
        return "done"

    wf = Workflow("ends-in-python")
    wf.add("ask", agent.ask("hi", max_tokens=4))
    wf.add("decide", decide, after=["ask"])

    async def main() -> RunResult:
        # The call is followed by a function task: it gets a keep-alive, so a session.
        async with (
            recording(recorder) as url,
            OpenAIBackend(url, dialect="sglang", local=True) as llm,
            Engine(backends={"default": llm}) as engine,
        ):
            return await engine.run(wf)

    assert clock.run(main()).ok
    paths = [p for p, _, _ in recorder.seen]
    assert paths == ["/open_session", "/v1/chat/completions", "/close_session"]
    assert recorder.seen[-1][1] == {"session_id": wf.name}


# --- server-specific fields passed through --------------------------------------------------

PASSED = {
    "ignore_eos": True,
    "min_tokens": 8,
    "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}},
}


@pytest.mark.parametrize("dialect", sorted(EXPECTED))
def test_extra_body_reaches_the_server_beside_each_dialects_fields(
    clock: VirtualClock, dialect: str
) -> None:
    recorder = Recorder()
    request = replace(REQUEST, extra_body=PASSED, extra_headers={"X-Trace": "t1"})
    call(clock, dialect, recorder, request=request, slots=4 if dialect == "llamacpp" else None)
    _, body, headers = recorder.seen[0]
    want_body, want_headers = EXPECTED[dialect]
    assert {k: v for k, v in body.items() if k not in STANDARD} == {**want_body, **PASSED}
    lowered = {k.lower(): v for k, v in headers.items()}
    assert all(lowered.get(k.lower()) == v for k, v in want_headers.items())
    assert body["max_tokens"] == 8 and body["model"] == "m"
    assert lowered.get("x-trace") == "t1"


@pytest.mark.parametrize(
    ("dialect", "extra", "named"),
    [
        ("vllm", {"priority": 1}, "the 'vllm' dialect sends for plait's hints"),
        ("sglang", {"session_id": "x"}, "the 'sglang' dialect"),
        ("dynamo", {"nvext": {}}, "the 'dynamo' dialect"),
        ("llamacpp", {"cache_prompt": False}, "the 'llamacpp' dialect"),
        ("openai", {"max_tokens": 3}, "plait sends from the request itself"),
        ("openai", {"model": "other"}, "plait sends from the request itself"),
        ("vllm", {"stream": True}, "plait sends from the request itself"),
    ],
)
def test_a_pass_through_field_that_clashes_is_an_error_naming_it(
    clock: VirtualClock, dialect: str, extra: dict[str, Any], named: str
) -> None:
    recorder = Recorder()
    request = replace(REQUEST, extra_body=extra)
    with pytest.raises(UsageError, match=re.escape(named)) as info:
        call(clock, dialect, recorder, request=request, slots=4)
    assert repr(next(iter(extra))) in str(info.value)
    assert recorder.seen == []  # nothing was sent


def test_a_header_that_clashes_with_a_hint_header_is_an_error(clock: VirtualClock) -> None:
    request = replace(REQUEST, extra_headers={"x-dynamo-session-id": "mine"})
    with pytest.raises(UsageError, match="x-dynamo-session-id"):
        call(clock, "dynamo", Recorder(), request=request)


def test_extra_body_must_be_json() -> None:
    with pytest.raises(UsageError, match=r"extra_body\['when'\] cannot be sent as JSON"):
        LLMRequest((Message("user", "hi"),), "m", extra_body={"when": object()})
    with pytest.raises(UsageError, match="extra_body"):
        LLMRequest((Message("user", "hi"),), "m", extra_body={"x": float("nan")})


def test_an_agent_passes_extra_body_and_checks_it_at_ask() -> None:
    agent = Agent("a", "sys")
    assert agent.request("hi", extra_body={"ignore_eos": True}).extra_body == {"ignore_eos": True}
    with pytest.raises(UsageError, match="extra_body"):
        agent.ask("hi", extra_body={"bad": {1, 2}})
