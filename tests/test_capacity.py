"""A server's size as it says it: vLLM's `vllm:cache_config_info`, SGLang's `/server_info`
and llama.cpp's `/props` (samples written from the fields in their source), hostile answers
read as not said, and `OpenAIBackend.capacity()` asking a server over HTTP."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from executors import FunctionLLM, OpenAIBackend, PrefixGrouper, echo
from executors._capacity import (
    MAX_KV_TOKENS,
    cache_blocks,
    capacity_from_llamacpp,
    capacity_from_metrics,
    capacity_from_sglang,
    combined,
    explain_capacity,
    router_block,
)
from orchestrator import (
    UsageError,
    VirtualClock,
)
from orchestrator.ext import ServerCapacity

# vLLM with two data-parallel engines, in a newer version that says its KV capacity in
# tokens (`kv_cache_size_tokens`), beside the load metrics it always sends.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",\
cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",\
is_attention_free="False",kv_cache_max_concurrency="3.05",kv_cache_size_tokens="400000",\
num_cpu_blocks="None",num_gpu_blocks="25000",num_gpu_blocks_override="None",\
prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",\
engine="1",kv_cache_size_tokens="400000",num_gpu_blocks="25000"} 1.0
"""

# vLLM 0.32 on a CPU (the version tests_vllm runs): no `kv_cache_size_tokens` label.
VLLM_CPU = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",\
engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="512",\
num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",\
swap_space="4"} 1.0
"""

# A hybrid model: its capacity in tokens is not num_gpu_blocks x block_size.
VLLM_HYBRID = (
    'vllm:cache_config_info{block_size="1056",engine="0",kv_cache_size_tokens="1200000",'
    'num_gpu_blocks="3000"} 1.0\n'
)

# SGLang's /server_info: the server arguments, the scheduler's start-up info and one
# internal state per data-parallel rank (most keys left out; all of these are there).
SGLANG = {
    "model_path": "qwen/qwen2.5-0.5b-instruct",
    "page_size": 1,
    "max_running_requests": None,
    "max_total_tokens": None,
    "dp_size": 1,
    "status": "ready",
    "max_total_num_tokens": 20480,
    "max_req_input_len": 20474,
    "internal_states": [
        {
            "page_size": 1,
            "max_running_requests": 128,
            "last_gen_throughput": 129.3,
            "memory_usage": {"weight": 0.98, "kvcache": 0.23, "token_capacity": 20480},
            "effective_max_running_requests_per_dp": 128,
        }
    ],
    "version": "0.5.5",
}
SGLANG_DP = {
    **SGLANG,
    "page_size": 16,
    "dp_size": 2,
    "max_total_num_tokens": 100_000,
    "internal_states": [
        {"effective_max_running_requests_per_dp": 64},
        {"effective_max_running_requests_per_dp": 64},
    ],
}
# An older SGLang: no internal state says its cap; the argument was given.
SGLANG_OLD = {"page_size": 1, "max_running_requests": 256, "max_total_num_tokens": 50_000}

# llama-server's /props, and an older one with n_ctx at the top level.
LLAMACPP = {
    "default_generation_settings": {"n_ctx": 8192, "params": {"temperature": 0.8}},
    "total_slots": 4,
    "model_alias": "tiny",
    "model_path": "/models/tiny.gguf",
    "modalities": {"vision": False, "audio": False},
    "build_info": "b6000",
}
LLAMACPP_OLD = {"n_ctx": 4096, "total_slots": 1, "default_generation_settings": {"n_ctx": None}}

HTML = "<!doctype html><html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (VLLM, ServerCapacity(800_000, 16, None, "here")),
        (VLLM_CPU, ServerCapacity(65_536, 128, None, "here")),
        (VLLM_HYBRID, ServerCapacity(1_200_000, 1056, None, "here")),
        ('vllm:num_requests_running{engine="0"} 1\n', ServerCapacity()),
        ("", ServerCapacity()),
        (HTML, ServerCapacity()),
    ],
    ids=["vllm-dp2", "vllm-cpu", "vllm-hybrid", "no-info", "empty", "html"],
)
def test_vllms_cache_config_info_says_its_kv_cache_and_block(
    text: str, expected: ServerCapacity
) -> None:
    assert capacity_from_metrics(text, "here") == expected


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (SGLANG, ServerCapacity(20_480, 1, 128, "here")),
        (SGLANG_DP, ServerCapacity(200_000, 16, 128, "here")),
        (SGLANG_OLD, ServerCapacity(50_000, 1, 256, "here")),
        ({"version": "0.5.5"}, ServerCapacity()),
    ],
    ids=["sglang", "sglang-dp2", "sglang-old", "says-nothing"],
)
def test_sglangs_server_info_says_its_kv_cache_page_and_running_cap(
    info: Mapping[str, object], expected: ServerCapacity
) -> None:
    assert capacity_from_sglang(json.dumps(info), "here") == expected


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        (LLAMACPP, ServerCapacity(8192, None, 4, "here")),
        (LLAMACPP_OLD, ServerCapacity(4096, None, 1, "here")),
        ({"model_path": "x"}, ServerCapacity()),
    ],
    ids=["llamacpp", "llamacpp-old", "says-nothing"],
)
def test_llamacpps_props_say_its_slots_and_context(
    props: Mapping[str, object], expected: ServerCapacity
) -> None:
    assert capacity_from_llamacpp(json.dumps(props), "here") == expected


def _info(**labels: str) -> str:
    text = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return f"vllm:cache_config_info{{{text}}} 1.0\n"


@pytest.mark.parametrize(
    "text",
    [
        _info(engine="0", block_size="16", num_gpu_blocks="None"),
        _info(engine="0", block_size="16", num_gpu_blocks="-5"),
        _info(engine="0", block_size="16", num_gpu_blocks="1e400"),
        _info(engine="0", block_size="16", num_gpu_blocks="NaN"),
        _info(engine="0", block_size="16", num_gpu_blocks="9" * 5000),
        _info(engine="0", block_size="16", num_gpu_blocks=str(MAX_KV_TOKENS)),  # x 16: too big
        _info(engine="0", block_size="16", kv_cache_size_tokens=str(MAX_KV_TOKENS + 1)),
        _info(engine="0", block_size="16", num_gpu_blocks="\uff11\uff12"),  # not ASCII digits
        _info(engine="0", block_size="16", num_gpu_blocks="2.5"),
        # Two engines, one of which says nothing: the total is unknown.
        _info(engine="0", block_size="16", num_gpu_blocks="100") + _info(engine="1"),
    ],
)
def test_a_broken_or_hostile_vllm_figure_is_not_said(text: str) -> None:
    assert capacity_from_metrics(text).kv_tokens is None


def test_vllm_engines_that_disagree_on_the_block_give_no_block_but_their_total() -> None:
    text = _info(engine="0", block_size="16", num_gpu_blocks="10") + _info(
        engine="1", block_size="32", num_gpu_blocks="10"
    )
    assert capacity_from_metrics(text) == ServerCapacity(kv_tokens=480)
    # The same engine twice (a scrape of several processes) counts once.
    twice = _info(engine="0", block_size="16", num_gpu_blocks="10") * 2
    assert capacity_from_metrics(twice).kv_tokens == 160
    assert capacity_from_metrics(_info(block_size="16.5", num_gpu_blocks="10")).kv_tokens is None


@pytest.mark.parametrize(
    "body",
    [
        HTML,
        "[1, 2, 3]",
        '"a string"',
        "{",
        "[" * 100_000 + "]" * 100_000,
        '{"max_total_num_tokens": ' + "9" * 5000 + "}",
        '{"max_total_num_tokens": NaN, "page_size": Infinity, "total_slots": -Infinity}',
        '{"max_total_num_tokens": 1e30, "page_size": 0, "total_slots": -4}',
        '{"max_total_num_tokens": true, "page_size": "sixteen", "total_slots": [4]}',
        '{"max_total_num_tokens": 2048.5, "dp_size": "many", "n_ctx": {"a": 1}}',
        '{"default_generation_settings": "none", "internal_states": "none"}',
        '{"default_generation_settings": [], "internal_states": [1, 2]}',
        '{"internal_states": [{"effective_max_running_requests_per_dp": 1e9}]}',
    ],
)
def test_hostile_json_says_nothing_and_raises_nothing(body: str) -> None:
    for read in (capacity_from_sglang, capacity_from_llamacpp):
        said = read(body, "here")
        assert said == ServerCapacity(), (read.__name__, body[:60])


def test_a_sane_figure_beside_a_hostile_one_is_still_read() -> None:
    said = capacity_from_sglang('{"max_total_num_tokens": 4096, "page_size": -1}', "here")
    assert said == ServerCapacity(kv_tokens=4096, source="here")
    # dp_size that makes the total absurd: not said.
    big = json.dumps({"max_total_num_tokens": MAX_KV_TOKENS, "dp_size": 2})
    assert capacity_from_sglang(big).kv_tokens is None


def test_describe_says_each_figure_and_where_it_came_from() -> None:
    said = ServerCapacity(400_000, 16, None, "GET http://gpu1:8000/metrics")
    assert said.describe() == (
        "KV cache 400,000 tokens, blocks of 16, sequences unknown; "
        "read from GET http://gpu1:8000/metrics"
    )
    assert ServerCapacity(1000, kv_from_config=True).describe() == (
        "KV cache 1,000 tokens (kv_cache_tokens in the config), block unknown, "
        "sequences unknown; the server said none of it"
    )
    assert ServerCapacity().describe().startswith("KV cache unknown (set kv_cache_tokens)")


@pytest.mark.parametrize(
    ("dialect", "kv", "says"),
    [
        (
            "vllm",
            None,
            "KV cache and block read from GET http://g:8000/metrics as the run starts, else "
            "unknown (no kv_cache_tokens); where it is known, new programs are held back as "
            "paused ones fill it",
        ),
        (
            "llamacpp",
            4096,
            "context and slots (max_in_flight where no limits are set) read from GET "
            "http://g:8000/props as the run starts, else kv_cache_tokens 4,096; new programs "
            "are held back as paused ones fill it",
        ),
        (
            "sim",
            None,
            "KV cache and block read from GET http://g:8000/metrics as the run starts, else "
            "unknown (no kv_cache_tokens); no hold-back: the server keeps paused programs' KV "
            "itself",
        ),
        ("openai", None, "unknown (openai servers do not say it; set kv_cache_tokens)"),
        (
            "dynamo",
            250_000,
            "kv_cache_tokens 250,000 (dynamo servers do not say their own); new programs are "
            "held back as paused ones fill it",
        ),
    ],
)
def test_the_check_says_where_each_figure_will_come_from(
    dialect: str, kv: int | None, says: str
) -> None:
    assert explain_capacity(dialect, "http://g:8000", kv) == says


# --- asking a server over HTTP -----------------------------------------------------------------


class Answers:
    """A server that answers fixed bodies by path (404 elsewhere) and counts what it is
    asked; `failing` paths answer 503 that many times first."""

    def __init__(self, bodies: Mapping[str, str], failing: Mapping[str, int] | None = None):
        self.bodies = dict(bodies)
        self.failing = dict(failing or {})
        self.asked: list[str] = []

    async def answer(self, request: web.Request) -> web.Response:
        path = request.path
        self.asked.append(path)
        if self.failing.get(path, 0) > 0:
            self.failing[path] -= 1
            return web.Response(status=503, text="loading model")
        if path not in self.bodies:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self.bodies[path])

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.answer)
        return app


@asynccontextmanager
async def answering(answers: Answers) -> AsyncIterator[str]:
    server = TestServer(answers.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/v1"))
    finally:
        await server.close()


def ask(
    clock: VirtualClock, answers: Answers, dialect: str, times: int = 1, **options: object
) -> tuple[list[ServerCapacity], str]:
    async def main() -> tuple[list[ServerCapacity], str]:
        async with (
            answering(answers) as url,
            OpenAIBackend(url, dialect=dialect, local=True, **options) as llm,  # type: ignore[arg-type]
        ):
            return [await llm.capacity() for _ in range(times)], llm.root

    return clock.run(main())


@pytest.mark.parametrize(
    ("dialect", "bodies", "expected", "path"),
    [
        ("vllm", {"/metrics": VLLM_CPU}, ServerCapacity(65_536, 128), "/metrics"),
        ("vllm-continuum", {"/metrics": VLLM}, ServerCapacity(800_000, 16), "/metrics"),
        (
            "sglang",
            {"/server_info": json.dumps(SGLANG_DP)},
            ServerCapacity(200_000, 16, 128),
            "/server_info",
        ),
        ("llamacpp", {"/props": json.dumps(LLAMACPP)}, ServerCapacity(8192, None, 4), "/props"),
    ],
)
def test_the_backend_asks_where_its_dialect_says_and_reads_the_answer(
    clock: VirtualClock,
    dialect: str,
    bodies: Mapping[str, str],
    expected: ServerCapacity,
    path: str,
) -> None:
    answers = Answers(bodies)
    [said], root = ask(clock, answers, dialect)
    assert (said.kv_tokens, said.block_tokens, said.max_seqs) == (
        expected.kv_tokens,
        expected.block_tokens,
        expected.max_seqs,
    )
    assert said.source == f"GET {root}{path}"
    assert said.keeps_kv is (dialect in ("sglang", "vllm-continuum"))
    assert answers.asked == [path]


def test_an_older_sglang_is_asked_at_its_old_path(clock: VirtualClock) -> None:
    answers = Answers({"/get_server_info": json.dumps(SGLANG_OLD)})
    [said], root = ask(clock, answers, "sglang")
    assert said.kv_tokens == 50_000 and said.source == f"GET {root}/get_server_info"
    assert answers.asked == ["/server_info", "/get_server_info"]


@pytest.mark.parametrize("dialect", ["openai", "dynamo"])
def test_servers_that_say_nothing_are_not_asked(clock: VirtualClock, dialect: str) -> None:
    answers = Answers({"/metrics": VLLM})
    [said], _ = ask(clock, answers, dialect, kv_cache_tokens=250_000)
    assert said == ServerCapacity(kv_tokens=250_000, kv_from_config=True)
    assert answers.asked == []


def test_the_configured_kv_cache_is_the_fallback_not_an_override(clock: VirtualClock) -> None:
    [said], _ = ask(clock, Answers({"/metrics": VLLM_CPU}), "vllm", kv_cache_tokens=1)
    assert said.kv_tokens == 65_536 and not said.kv_from_config
    [said], _ = ask(clock, Answers({"/metrics": HTML}), "vllm", kv_cache_tokens=1000)
    assert said == ServerCapacity(kv_tokens=1000, kv_from_config=True)


def test_an_answer_is_kept_and_a_server_still_loading_is_asked_again(
    clock: VirtualClock,
) -> None:
    answers = Answers({"/props": json.dumps(LLAMACPP)}, failing={"/props": 1})
    (loading, ready, again), _ = ask(clock, answers, "llamacpp", times=3)
    assert loading == ServerCapacity() and ready.max_seqs == again.max_seqs == 4
    assert answers.asked == ["/props", "/props"]  # asked until it answered, then no more


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_a_server_that_is_down_or_a_backend_not_open_says_nothing_and_raises_nothing() -> None:
    async def main() -> tuple[ServerCapacity, ServerCapacity]:
        url = f"http://127.0.0.1:{free_port()}/v1"
        closed = await OpenAIBackend(url, dialect="sglang", kv_cache_tokens=10).capacity()
        async with OpenAIBackend(url, dialect="vllm", probe_timeout_s=1.0) as llm:
            return closed, await llm.capacity()

    closed, down = asyncio.run(main())
    assert closed == ServerCapacity(kv_tokens=10, kv_from_config=True, keeps_kv=True)
    assert down == ServerCapacity()


def test_a_kv_cache_below_one_token_is_refused() -> None:
    with pytest.raises(UsageError, match="kv_cache_tokens=0"):
        OpenAIBackend("http://gpu1:8000/v1", kv_cache_tokens=0)


def test_a_wrapper_answers_with_what_it_wraps(clock: VirtualClock) -> None:
    async def main() -> tuple[ServerCapacity, ServerCapacity, list[str]]:
        answers = Answers({"/metrics": VLLM_CPU})
        async with (
            answering(answers) as url,
            PrefixGrouper(OpenAIBackend(url, dialect="vllm", local=True)) as grouped,
        ):
            return (
                await grouped.capacity(),
                await PrefixGrouper(FunctionLLM(echo)).capacity(),
                answers.asked,
            )

    through, over_a_fake, asked = clock.run(main())
    assert (through.kv_tokens, through.block_tokens) == (65_536, 128) and asked == ["/metrics"]
    assert over_a_fake == ServerCapacity()


def test_replicas_together_add_up_their_caches_and_agree_on_a_block() -> None:
    a = ServerCapacity(65_536, 128, None, "GET http://a/metrics")
    b = ServerCapacity(131_072, 128, None, "GET http://b/metrics")
    assert combined([a, b]) == ServerCapacity(
        196_608, 128, None, "GET http://a/metrics; GET http://b/metrics"
    )
    assert cache_blocks([a, b], 16) == 4096  # the smaller replica's 65,536 tokens
    # One replica that says nothing: no total and no per-replica size.
    assert combined([a, ServerCapacity()]).kv_tokens is None
    assert cache_blocks([a, ServerCapacity()], 16) is None and cache_blocks([], 16) is None
    # Blocks that differ: none; sequence limits add up; KV kept only if every one keeps it.
    c = ServerCapacity(1000, 16, 64, "c", keeps_kv=True)
    d = ServerCapacity(1000, 1, 32, "d", kv_from_config=True, keeps_kv=True)
    assert combined([c, d]) == ServerCapacity(2000, None, 96, "c; d", True, True)
    assert not combined([c, a]).keeps_kv and combined([]) == ServerCapacity()
    assert cache_blocks([ServerCapacity(kv_tokens=10)], 16) == 1  # never below one block


def test_a_routers_block_is_the_replicas_block_made_at_least_sixteen_tokens() -> None:
    def block(*sizes: int | None) -> int | None:
        return router_block([ServerCapacity(block_tokens=size) for size in sizes])

    assert block(16, 16) == 16 and block(128) == 128 and block(1056) == 1056
    assert block(1) == 16 and block(5) == 20  # SGLang's one-token pages
    assert block(16, 32) is None and block(16, None) is None and block() is None
