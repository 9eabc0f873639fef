"""The simulated server over HTTP: OpenAI-compatible answers, vLLM metrics, clear 400s.

Server and client share one loop on the virtual clock: simulated GPU time costs nothing,
while the HTTP traffic is real (loopback sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from executors import SimHTTP, SimServer
from orchestrator import VirtualClock

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
            "model": "any",
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
                model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=5
            )
            text = await client.completions.create(model="m", prompt="once upon", max_tokens=3)
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
    assert "more than the model's context" in messages[6]


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


def test_sim_serve_refuses_impossible_fault_rates(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator._cli import main

    code = main(["sim", "serve", "--error-rate", "0.8", "--timeout-rate", "0.5"])
    assert code == 2
    assert "error_rate + timeout_rate must be at most 1" in capsys.readouterr().out
