"""The simulated server over HTTP: OpenAI-compatible answers, vLLM metrics, clear 400s.

Server and client share one loop on the virtual clock: simulated GPU time costs nothing,
while the HTTP traffic is real (loopback sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_examples import load

from agents import Agent
from executors import PROFILES, OpenAIBackend, SimHTTP, SimServer
from executors._simengine import SimRequest
from orchestrator import (
    Engine,
    RunResult,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import LoadReport, ServerCapacity

SYSTEM = "You answer questions about GPUs. " * 30


@asynccontextmanager
async def served() -> AsyncIterator[tuple[str, SimServer]]:
    async with SimServer("h100-llama3-8b") as sim:
        server = TestServer(SimHTTP(sim).app(), host="127.0.0.1")
        await server.start_server()
        try:
            yield str(server.make_url("")), sim
        finally:
            await server.close()


def run(clock: VirtualClock, body: Callable[[str, SimServer], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with served() as (url, sim):
            return await body(url, sim)

    return clock.run(main())


def test_chat_completion_reports_usage_and_cached_tokens(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> list[dict[str, Any]]:
        request = {
            "model": sim.profile.model,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
            "max_tokens": 12,
        }
        out = []
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(f"{url}/v1/chat/completions", json=request) as response:
                    assert response.status == 200
                    out.append(await response.json())
        return out

    first, second = run(clock, body)
    assert first["object"] == "chat.completion"
    assert first["usage"]["completion_tokens"] == 12
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (second["usage"]["prompt_tokens"] - 1) // 16 * 16 > 0
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_the_openai_client_talks_to_it(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        try:
            chat = await client.chat.completions.create(
                model=sim.profile.model,
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=5,
            )
            text = await client.completions.create(model="", prompt="once upon", max_tokens=3)
            models = await client.models.list()
        finally:
            await client.close()
        return chat, text, models

    chat, text, models = run(clock, body)
    assert chat.usage.completion_tokens == 5 and chat.choices[0].finish_reason == "length"
    assert len(text.choices[0].text) == 12
    assert models.data[0].id == "meta-llama/Llama-3.1-8B-Instruct"


def test_metrics_speak_vllms_names(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> str:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                payload = {"prompt": SYSTEM, "max_tokens": 2}
                async with http.post(f"{url}/v1/completions", json=payload) as response:
                    assert response.status == 200
            async with http.get(f"{url}/metrics") as response:
                return await response.text()

    text = run(clock, body)
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["vllm:prefix_cache_hits_total"] > 0
    assert values["vllm:prefix_cache_queries_total"] > values["vllm:prefix_cache_hits_total"]
    assert values["vllm:num_requests_running"] == 0
    assert values["vllm:num_requests_waiting"] == 0
    assert 0 <= values["vllm:kv_cache_usage_perc"] <= 1


@pytest.mark.parametrize("profile", ["h100-llama3-8b", "cpu-tiny"])
def test_its_cache_size_is_read_from_its_metrics_as_from_vllm(profile: str) -> None:
    """End to end on a free port: `OpenAIBackend.capacity()` reads the simulated server's
    `vllm:cache_config_info` as it would a real vLLM's, in either dialect."""

    async def main() -> tuple[list[ServerCapacity], LoadReport, dict[str, Any], str]:
        async with SimServer(profile) as sim:
            server = TestServer(SimHTTP(sim).app(), host="127.0.0.1", port=0)
            await server.start_server()
            url = str(server.make_url("/v1"))
            try:
                said = []
                for dialect in ("sim", "vllm"):
                    async with OpenAIBackend(url, dialect=dialect, local=True) as llm:
                        said.append(await llm.capacity())
                        load = await llm.load()  # the info gauge leaves the load as it was
                async with aiohttp.ClientSession() as http, http.get(f"{url}/models") as answer:
                    models = await answer.json()
            finally:
                await server.close()
        return said, load, models, url

    said, load, models, url = VirtualClock().run(main())
    p = PROFILES[profile]
    root = url.removesuffix("/v1")
    for capacity in said:
        assert (capacity.kv_tokens, capacity.block_tokens) == (
            p.num_blocks * p.block_size,
            p.block_size,
        )
        assert capacity.max_seqs is None  # vLLM does not say it: nor does its likeness
        assert capacity.source == f"GET {root}/metrics" and not capacity.kv_from_config
    assert [c.keeps_kv for c in said] == [True, False]  # the simulator hears keep-alive
    assert load == LoadReport(0, 0, 0.0, 0, 0)
    assert models["data"][0]["max_model_len"] == p.max_model_len


def test_bad_requests_get_400_with_the_field_and_the_server_goes_on(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> list[tuple[int, dict[str, Any]]]:
        cases: list[Any] = [
            b"{not json",
            b"[1, 2]",
            {"messages": []},
            {"messages": [{"role": "wizard", "content": "x"}]},
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            {"messages": [{"role": "user", "content": "x"}], "stream": "please"},
            {"messages": [{"role": "user", "content": "x" * 600_000}]},
        ]
        out = []
        async with aiohttp.ClientSession() as http:
            for case in cases:
                kwargs = {"data": case} if isinstance(case, bytes) else {"json": case}
                async with http.post(f"{url}/v1/chat/completions", **kwargs) as response:
                    out.append((response.status, await response.json()))
            ok = {"messages": [{"role": "user", "content": "still alive?"}], "max_tokens": 2}
            async with http.post(f"{url}/v1/chat/completions", json=ok) as response:
                out.append((response.status, await response.json()))
        return out

    results = run(clock, body)
    statuses = [status for status, _ in results]
    messages = [r["error"]["message"] for _, r in results[:-1]]
    assert statuses == [400] * 7 + [200]
    assert "not valid JSON" in messages[0]
    assert "must be a JSON object" in messages[1]
    assert "field 'messages'" in messages[2]
    assert "messages.0.role" in messages[3]
    assert "field 'max_tokens'" in messages[4]
    assert "field 'stream'" in messages[5]
    assert "maximum context length is 131072 tokens" in messages[6]
    assert results[6][1]["error"]["param"] == "messages"


def test_priority_in_the_body_orders_the_queue(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> list[str]:
        import asyncio

        finished: list[str] = []
        # Fill the server: one slow request, then a low and a high priority one queued.
        sim.engine.profile = sim.profile.replace(max_num_seqs=1)

        async def ask(name: str, priority: float, tokens: int) -> None:
            payload = {
                "messages": [{"role": "user", "content": name}],
                "max_tokens": tokens,
                "priority": priority,
            }
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{url}/v1/chat/completions", json=payload) as response,
            ):
                assert response.status == 200
                finished.append(name)

        first = asyncio.ensure_future(ask("first", 0, 50))
        await asyncio.sleep(0.01)
        await asyncio.gather(ask("low", 10, 5), ask("high", -10, 5))
        await first
        return finished

    assert run(clock, body) == ["first", "high", "low"]


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("chat/completions", {"max_tokens": 100_000_000}, "max_tokens"),
        ("chat/completions", {"max_completion_tokens": 100_000_000}, "max_completion_tokens"),
        ("chat/completions", {"max_tokens": 131_072}, "max_tokens"),  # the prompt tips it over
        ("completions", {"max_tokens": 100_000_000}, "max_tokens"),
    ],
)
def test_a_huge_max_tokens_is_refused_before_any_work_and_health_answers(
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    fields: dict[str, Any],
    param: str,
) -> None:
    """`max_tokens: 100000000` used to generate its text and hashes first, freezing the loop."""
    import executors._sim
    from executors._simtext import generate as real_generate

    generated: list[int] = []

    def generate(seed: int, prompt_hash: int, tokens: int) -> str:
        generated.append(tokens)
        return real_generate(seed, prompt_hash, min(tokens, 8))  # never the frozen loop itself

    monkeypatch.setattr(executors._sim, "generate", generate)

    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any], int]:
        prompt: dict[str, Any] = (
            {"prompt": "hi"}
            if route == "completions"
            else {"messages": [{"role": "user", "content": "hi"}]}
        )
        huge = {"model": sim.profile.model, **prompt, **fields}
        async with aiohttp.ClientSession() as http:

            async def post() -> tuple[int, dict[str, Any]]:
                async with http.post(f"{url}/v1/{route}", json=huge) as response:
                    return response.status, await response.json()

            async def health() -> int:
                async with http.get(f"{url}/health") as response:
                    return response.status

            (status, answer), ok = await asyncio.gather(post(), health())
        return status, answer, ok

    status, answer, ok = run(clock, body)
    assert status == 400 and ok == 200
    assert generated == []  # refused before any output was made
    assert answer["error"]["param"] == param
    message = answer["error"]["message"]
    assert message.startswith("This model's maximum context length is 131072 tokens.")
    where = "prompt" if route == "completions" else "messages"
    assert f"in the completion). Please reduce the length of the {where} or {param}." in message


def test_a_request_without_max_tokens_gets_what_the_context_leaves(clock: VirtualClock) -> None:
    """As vLLM: no max_tokens is never a 400 for a prompt that fits on its own."""
    long = "x" * (131_072 - 100) * 4  # leaves fewer tokens than the default 256

    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any]]:
        request = {"messages": [{"role": "user", "content": long}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/chat/completions", json=request) as response,
        ):
            return response.status, await response.json()

    status, answer = run(clock, body)
    assert status == 200, answer
    usage = answer["usage"]
    assert usage["total_tokens"] == 131_072 and usage["completion_tokens"] < 256


def post_chat(clock: VirtualClock, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any]]:
        full = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **request}
        full.setdefault("model", sim.profile.model)
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{url}/v1/chat/completions",
                data=json.dumps(full),  # allow_nan: NaN and Infinity go out as JSON extensions
                headers={"Content-Type": "application/json"},
            ) as response,
        ):
            return response.status, await response.json()

    result: tuple[int, dict[str, Any]] = run(clock, body)
    return result


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"n": 2}, "n"),
        ({"priority": float("nan")}, "priority"),
        ({"priority": float("inf")}, "priority"),
        ({"temperature": float("inf")}, "temperature"),
        ({"stream": "yes"}, "stream"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "x": 1}]}]}, "messages"),
    ],
)
def test_the_simulator_is_as_strict_as_the_openai_api(
    clock: VirtualClock, request_fields: dict[str, Any], field: str
) -> None:
    status, answer = post_chat(clock, request_fields)
    assert status == 400, answer
    assert answer["error"]["param"].split(".")[0] == field


def test_content_as_a_list_of_text_parts_is_accepted(clock: VirtualClock) -> None:
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]
    status, answer = post_chat(clock, {"messages": [{"role": "user", "content": parts}]})
    assert status == 200, answer
    as_text = post_chat(clock, {"messages": [{"role": "user", "content": "hello there"}]})[1]
    assert answer["usage"]["prompt_tokens"] == as_text["usage"]["prompt_tokens"]
    assert answer["choices"][0]["message"] == as_text["choices"][0]["message"]


def test_an_unknown_model_is_a_404_as_in_vllm(clock: VirtualClock) -> None:
    status, answer = post_chat(clock, {"model": "gpt-17"})
    assert status == 404
    assert answer["error"]["message"].startswith("The model `gpt-17` does not exist.")
    assert post_chat(clock, {"model": ""})[0] == 200  # empty: the served model


def test_a_streaming_client_that_leaves_leaves_no_traceback(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def body(url: str, sim: SimServer) -> int:
        request = {
            "model": sim.profile.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 60_000,
            "stream": True,
        }
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
            response = await http.post(f"{url}/v1/chat/completions", json=request)
            await response.content.readline()  # the first event, then hang up
            response.close()
        return 1

    with caplog.at_level(logging.DEBUG):
        assert run(clock, body) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_part_that_is_not_text_is_refused_naming_it(clock: VirtualClock) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}
    parts = [{"type": "text", "text": "what is this?"}, image]
    status, answer = post_chat(clock, {"messages": [{"role": "user", "content": parts}]})
    assert status == 400, answer
    assert answer["error"]["param"] == "messages.0.content"
    assert "part 1 has type 'image_url'" in answer["error"]["message"]
    assert "only text parts" in answer["error"]["message"]


def test_1e400_in_the_body_is_infinity_and_refused(clock: VirtualClock) -> None:
    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any]]:
        raw = b'{"messages": [{"role": "user", "content": "hi"}], "priority": 1e400}'
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/chat/completions", data=raw) as response,
        ):
            return response.status, await response.json()

    status, answer = run(clock, body)
    assert status == 400 and answer["error"]["param"] == "priority"


class Watched(SimServer):
    """A simulator that says when a request joins it and when its caller stops waiting."""

    def __init__(self) -> None:
        super().__init__("h100-llama3-8b")
        self.queued = asyncio.Event()
        self.left = asyncio.Event()
        self.submitted: list[SimRequest] = []

    async def submit(self, req: SimRequest) -> SimRequest:
        self.submitted.append(req)
        self.queued.set()
        try:
            return await super().submit(req)
        finally:
            self.left.set()


def test_a_client_that_hangs_up_mid_request_stops_its_simulation(clock: VirtualClock) -> None:
    """The runner cancels the handler of a client that leaves; the engine drops its request."""

    async def main() -> tuple[int, str]:
        sim = Watched()
        async with sim:
            front = SimHTTP(sim)
            runner = front.runner()
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60_000}
            try:
                async with aiohttp.ClientSession() as http:

                    async def ask() -> None:
                        async with http.post(
                            f"http://127.0.0.1:{port}/v1/chat/completions", json=request
                        ) as response:
                            await response.read()

                    asking = asyncio.ensure_future(ask())
                    await sim.queued.wait()
                    asking.cancel()  # hang up
                    with contextlib.suppress(asyncio.CancelledError):
                        await asking
                    await sim.left.wait()
            finally:
                await runner.cleanup()
            return front.disconnects, sim.submitted[0].state

    disconnects, state = clock.run(main())
    assert state == "aborted"  # dropped from the batch, not decoded to the end
    assert disconnects == 1


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "rain": {"type": "boolean"}},
    "required": ["city", "rain"],
}


@pytest.mark.parametrize("stream", [False, True])
def test_tools_are_called_in_the_openai_format_then_the_answer_fits_the_schema(
    clock: VirtualClock, stream: bool
) -> None:
    """Offered tools, it calls one (as the in-process simulator); given the tool's answer
    and a `response_format`, it answers JSON that fits the schema."""

    async def body(url: str, sim: SimServer) -> tuple[Any, Any]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        ask: list[Any] = [{"role": "user", "content": "Will it rain in Oslo?"}]
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
        try:
            if stream:
                parts: dict[str, str] = {"id": "", "name": "", "arguments": ""}
                finish = None
                chunks = await client.chat.completions.create(
                    model="", messages=ask, tools=[WEATHER], stream=True
                )
                async for chunk in chunks:
                    choice = chunk.choices[0]
                    finish = choice.finish_reason or finish
                    for call in choice.delta.tool_calls or ():
                        parts["id"] += call.id or ""
                        assert call.function is not None
                        parts["name"] += call.function.name or ""
                        parts["arguments"] += call.function.arguments or ""
                first: Any = (parts, finish)
            else:
                reply = await client.chat.completions.create(
                    model="", messages=ask, tools=[WEATHER]
                )
                [call] = reply.choices[0].message.tool_calls or []
                assert reply.choices[0].message.content is None
                first = (
                    {
                        "id": call.id,
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    },  # type: ignore[union-attr]
                    reply.choices[0].finish_reason,
                )
            made = first[0]
            history = [
                *ask,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": made["id"],
                            "type": "function",
                            "function": {"name": made["name"], "arguments": made["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": made["id"], "content": "rain all week"},
            ]
            final = await client.chat.completions.create(
                model="", messages=history, tools=[WEATHER], response_format=fmt
            )
        finally:
            await client.close()
        return first, final

    (call, finish), final = run(clock, body)
    assert finish == "tool_calls"
    assert call["name"] == "weather" and call["id"]
    arguments = json.loads(call["arguments"])
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)
    choice = final.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    answer = json.loads(choice.message.content)
    assert set(answer) == {"city", "rain"} and isinstance(answer["rain"], bool)


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"schema": ANSWER}}},
        {"structured_outputs": {"json": ANSWER}},  # vLLM's spelling
    ],
)
def test_structured_output_fits_the_schema_in_either_spelling(
    clock: VirtualClock, fields: dict[str, Any]
) -> None:
    status, answer = post_chat(clock, {"max_tokens": 200, **fields})
    assert status == 200, answer
    assert set(json.loads(answer["choices"][0]["message"]["content"])) == {"city", "rain"}
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_answers_in_text_and_an_unknown_named_tool_is_refused(
    clock: VirtualClock,
) -> None:
    status, answer = post_chat(clock, {"tools": [WEATHER], "tool_choice": "none"})
    assert status == 200 and "tool_calls" not in answer["choices"][0]["message"]
    named = {"type": "function", "function": {"name": "stocks"}}
    status, answer = post_chat(clock, {"tools": [WEATHER], "tool_choice": named})
    assert status == 400 and answer["error"]["param"] == "tool_choice"
    assert "'stocks', which is not among the tools (weather)" in answer["error"]["message"]


@pytest.mark.parametrize(
    ("route", "fields", "param"),
    [
        ("chat/completions", {"logprobs": True}, "logprobs"),
        ("chat/completions", {"logprobs": True, "top_logprobs": 3}, "logprobs"),
        ("completions", {"logprobs": 2}, "logprobs"),
        ("chat/completions", {"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ],
)
def test_what_the_simulator_cannot_do_is_a_400_naming_the_field(
    clock: VirtualClock, route: str, fields: dict[str, Any], param: str
) -> None:
    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any]]:
        prompt: dict[str, Any] = (
            {"prompt": "hi"}
            if route == "completions"
            else {"messages": [{"role": "user", "content": "hi"}]}
        )
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/{route}", json={**prompt, **fields}) as response,
        ):
            return response.status, await response.json()

    status, answer = run(clock, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param
    if param == "logprobs":
        assert "computes no log probabilities" in answer["error"]["message"]
    assert post_chat(clock, {"logprobs": False})[0] == 200


def test_finish_reason_is_stop_unless_the_answer_reaches_max_tokens(clock: VirtualClock) -> None:
    status, unbounded = post_chat(clock, {"max_tokens": None})
    assert status == 200, unbounded
    assert unbounded["choices"][0]["finish_reason"] == "stop"
    assert unbounded["usage"]["completion_tokens"] == 256  # the simulator's default length
    status, bounded = post_chat(clock, {"max_tokens": 7})
    assert bounded["choices"][0]["finish_reason"] == "length"
    assert bounded["usage"]["completion_tokens"] == 7


@pytest.mark.parametrize(("dialect", "stream"), [("sim", False), ("vllm", True)])
def test_the_tool_agent_example_runs_against_the_http_simulator(
    clock: VirtualClock, dialect: str, stream: bool
) -> None:
    """examples/tool_agent.py through the OpenAI backend against a served simulator on a
    free port: tool calls, then answers that validate as its `Finding`."""
    module = load("tool_agent")

    async def body(url: str, sim: SimServer) -> list[RunResult]:
        backend = OpenAIBackend(
            f"{url}/v1", dialect=dialect, model=sim.profile.model, stream=stream, local=True
        )
        async with backend, Engine(backends={"default": backend}) as engine:
            handles = [engine.submit(wf) for wf in module.workflows()]
            return [await h for h in handles]

    results = run(clock, body)
    for result in results:
        assert result.ok, result
        assert isinstance(result["finding"], module.Finding)
        assert any(".monthly_sales" in t or ".list_regions" in t for t in result.results)


@pytest.mark.parametrize("dialect", ["sim", "vllm"])
def test_the_cache_salt_keeps_tenants_apart_over_http(clock: VirtualClock, dialect: str) -> None:
    """Engine.submit(tenant=...) -> the dialect's `cache_salt` -> the served simulator: one
    tenant's repeat hits the cache, another tenant's same prompt gets cached_tokens 0."""
    agent = Agent("a", SYSTEM, max_tokens=8)

    async def body(url: str, sim: SimServer) -> list[int | None]:
        backend = OpenAIBackend(f"{url}/v1", dialect=dialect, model=sim.profile.model, local=True)
        cached = []
        async with backend, Engine(backends={"default": backend}) as engine:
            for i, tenant in enumerate(["alice", "bob", "alice"]):
                wf = Workflow(f"ask-{i}")
                wf.add("ask", agent.ask("What did alice ask?"))
                result = await engine.submit(wf, tenant=tenant)
                assert result.ok, result
                cached.append(result.usage.cached_prompt_tokens)
        return cached

    alice, bob, alice_again = run(clock, body)
    assert alice == 0 and bob == 0
    assert alice_again is not None and alice_again > 0


def test_an_empty_cache_salt_is_a_400_as_in_vllm(clock: VirtualClock) -> None:
    status, answer = post_chat(clock, {"cache_salt": ""})
    assert status == 400 and answer["error"]["param"] == "cache_salt"


FAN_OUT = {
    "$defs": {
        "n": {"type": "object", "properties": {f"k{i}": {"$ref": "#/$defs/n"} for i in range(100)}}
    },
    "$ref": "#/$defs/n",
}


@pytest.mark.parametrize(
    "schema",
    [
        FAN_OUT,  # 100 ** 3 values unless bounded
        {"type": "string", "minLength": 10**6},
        {"type": "object", "properties": {"a": 5, "b": {"$ref": 7}, "c": {"enum": 5}}},
        {"type": "array", "minItems": "many", "items": [1]},
        {"type": "integer", "minimum": "zero"},
        {"anyOf": [3, {"type": "number", "minimum": 1e308}]},
    ],
)
def test_a_hostile_schema_gets_a_small_answer_not_a_crash(
    clock: VirtualClock, schema: dict[str, Any]
) -> None:
    """A client's schema drives the simulator's work: whatever it says, the answer is made
    of at most MAX_NODES values and MAX_STRING-long strings, as a tool's arguments too."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    status, answer = post_chat(clock, {"response_format": fmt, "max_tokens": 1000})
    assert status == 200, answer
    assert len(answer["choices"][0]["message"]["content"]) < 200_000
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    status, answer = post_chat(clock, {"tools": [tool], "max_tokens": 1000})
    assert status == 200, answer
    [call] = answer["choices"][0]["message"]["tool_calls"]
    assert len(call["function"]["arguments"]) < 200_000


def post_raw(clock: VirtualClock, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
    async def body(url: str, sim: SimServer) -> tuple[int, dict[str, Any]]:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}{path}", data=raw) as response,
        ):
            return response.status, await response.json(content_type=None)

    result: tuple[int, dict[str, Any]] = run(clock, body)
    return result


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_lone_surrogate_is_a_400_naming_the_field(clock: VirtualClock, path: str) -> None:
    """`"\\udcff"` is valid JSON but not Unicode text: a 400 in OpenAI's format, not a 500."""
    if path == "/v1/chat/completions":
        raw = b'{"messages": [{"role": "user", "content": "hi \\udcff"}], "max_tokens": 4}'
        field = "messages.0.content"
    else:
        raw = b'{"prompt": "hi \\udcff", "max_tokens": 4}'
        field = "prompt"
    status, answer = post_raw(clock, path, raw)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["param"] == field
    assert "lone surrogate" in answer["error"]["message"]


@pytest.mark.parametrize("depth", [100_000, 1_000])
def test_a_body_nested_too_deep_is_a_400(clock: VirtualClock, depth: int) -> None:
    """Too deep for Python's parser (100,000) or for the server's limit: a 400 that says so."""
    nested = b"[" * depth + b"]" * depth
    raw = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + nested + b"}"
    status, answer = post_raw(clock, "/v1/chat/completions", raw)
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert "nested" in answer["error"]["message"]
    status, answer = post_raw(clock, "/v1/chat/completions", nested)
    assert status == 400, answer
    assert "nested" in answer["error"]["message"]
