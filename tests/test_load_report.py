"""Load and health as each server reports them: Prometheus text from vLLM, SGLang and
llama.cpp (samples written from the metric definitions in their source), vLLM's ORCA load
header, and `OpenAIBackend.load()` / streaming against the simulator over HTTP."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Literal

import pytest
from aiohttp.test_utils import TestServer

from executors import LoadReport, OpenAIBackend, SimHTTP, SimServer
from executors._load import parse_prometheus, report_from_header, report_from_metrics
from orchestrator import Hints, LLMRequest, LLMResponse, Message, VirtualClock

# vLLM v1 with two data-parallel engines: prometheus_client appends `_total` to counters and
# adds `_created` samples; histograms add `_bucket` series with an `le` label.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6000.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4000.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4500.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1500.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 12.0
"""

# vLLM before 0.10 (V0 engine) named the KV gauge `gpu_cache_usage_perc` and had no engine label.
VLLM_OLD = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.75
"""

# SGLang: scheduler gauges labelled by model and rank; cached tokens split by cache source.
SGLANG_LABELS = (
    'engine_type="unified",model_name="Qwen/Qwen2.5-7B-Instruct",pp_rank="0",tp_rank="0"'
)
SGLANG = f"""\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{SGLANG_LABELS}}} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{SGLANG_LABELS}}} 3.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{{SGLANG_LABELS}}} 0.42
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{{SGLANG_LABELS}}} 0.61
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{{SGLANG_LABELS}}} 10000.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{cache_source="device",{SGLANG_LABELS}}} 6000.0
sglang:cached_tokens_total{{cache_source="host",{SGLANG_LABELS}}} 500.0
"""

# llama.cpp's `llama-server --metrics`: no labels, integer-looking values.
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1024
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, LoadReport(5, 4, 0.375, 6000, 10000)),
        (VLLM_OLD, LoadReport(1, 0, 0.75)),
        (SGLANG, LoadReport(7, 3, 0.42, 6500, 10000, 0.61)),
        (LLAMACPP, LoadReport(1, 2, 0.125)),
        ("", LoadReport()),
    ],
    ids=["vllm", "vllm-v0", "sglang", "llamacpp", "empty"],
)
def test_each_servers_metrics_become_one_load_report(text: str, expected: LoadReport) -> None:
    assert report_from_metrics(text) == expected


def test_the_hit_rate_prefers_the_counters_over_the_servers_window() -> None:
    assert report_from_metrics(VLLM).hit_rate == 0.6
    assert report_from_metrics(SGLANG).hit_rate == 0.65
    assert LoadReport(cache_hit_rate=0.61).hit_rate == 0.61
    assert LoadReport(prefix_cache_hits=0, prefix_cache_queries=0).hit_rate is None


def test_the_parser_reads_labels_special_values_and_skips_what_it_cannot_read() -> None:
    text = r"""
# a comment, then odd but valid lines
x{path="/a,b",quote="say \"hi\"",brace="{}",nl="a\nb"} 1.5 1700000000000
y NaN
z{a="1",} +Inf
w -Inf
v{le="0.5"} 2 # {trace_id="abc"} 0.4 1.0
broken{a="1" 3
no_value
"""
    samples = parse_prometheus(text)
    assert samples["x"] == [
        ({"path": "/a,b", "quote": 'say "hi"', "brace": "{}", "nl": "a\nb"}, 1.5)
    ]
    assert math.isnan(samples["y"][0][1])
    assert samples["z"] == [({"a": "1"}, math.inf)]
    assert samples["w"] == [({}, -math.inf)]
    assert samples["v"] == [({"le": "0.5"}, 2.0)]
    assert set(samples) == {"x", "y", "z", "w", "v"}


def test_nan_counts_as_absent() -> None:
    text = 'vllm:kv_cache_usage_perc{engine="0"} NaN\nvllm:num_requests_running{engine="0"} 2\n'
    assert report_from_metrics(text) == LoadReport(running=2)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            "TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=3.0",
            LoadReport(waiting=3, kv_cache_usage=0.4),
        ),
        (
            'JSON {"named_metrics": {"kv_cache_usage_perc": 0.1, "num_requests_waiting": 0.0}}',
            LoadReport(waiting=0, kv_cache_usage=0.1),
        ),
        ("TEXT named_metrics.something_else=1.0", None),
        ("TEXT ", None),
        ("JSON {not json", None),
        ("running=1", None),
        (None, None),
    ],
)
def test_vllms_orca_header_becomes_a_load_report(
    header: str | None, expected: LoadReport | None
) -> None:
    assert report_from_header(header) == expected


# --- against the simulator over HTTP ----------------------------------------------------------

SYSTEM = "You answer questions about GPUs. " * 30
REQUEST = LLMRequest(
    (Message("system", SYSTEM), Message("user", "hi")),
    "meta-llama/Llama-3.1-8B-Instruct",
    max_tokens=12,
)


@asynccontextmanager
async def simulated() -> AsyncIterator[tuple[str, SimServer]]:
    async with SimServer("h100-llama3-8b") as sim:
        server = TestServer(SimHTTP(sim).app(), host="127.0.0.1")
        await server.start_server()
        try:
            yield str(server.make_url("/v1")), sim
        finally:
            await server.close()


def test_load_reads_the_simulators_metrics(clock: VirtualClock) -> None:
    async def main() -> tuple[LoadReport, LoadReport, SimServer]:
        async with simulated() as (url, sim), OpenAIBackend(url, dialect="sim") as llm:
            before = await llm.load()
            for _ in range(2):
                await llm.complete(REQUEST, Hints("p"))
            await llm.check()
            return before, await llm.load(), sim

    before, after, sim = clock.run(main())
    stats = sim.stats()
    assert before == LoadReport(0, 0, 0.0, 0, 0)
    assert after.prefix_cache_hits == stats.prefix_cache_hits > 0
    assert after.prefix_cache_queries == stats.prefix_cache_queries
    assert after.running == 0 and after.waiting == 0
    assert after.kv_cache_usage == pytest.approx(stats.kv_cache_usage, abs=1e-6)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_streaming_from_the_simulator_equals_the_whole_answer(
    clock: VirtualClock, api: Literal["chat", "completions"]
) -> None:
    async def ask(stream: bool) -> list[LLMResponse]:
        # A fresh server each time, so both see the same (cold, then warm) cache.
        async with (
            simulated() as (url, _),
            OpenAIBackend(url, dialect="sim", api=api, stream=stream) as llm,
        ):
            return [await llm.complete(REQUEST, Hints("p")) for _ in range(2)]

    plain = clock.run(ask(False))
    streamed = clock.run(ask(True))
    assert [replace(r, first_token_s=None) for r in streamed] == plain
    assert plain[1].usage.cached_prompt_tokens and plain[1].usage.completion_tokens == 12
    assert len(plain[0].text) == 48
    # The simulator streams once the request is done: the first token comes with the last.
    assert all(r.first_token_s is not None and r.first_token_s > 0 for r in streamed)
