"""A router sizes its model of its replicas' caches from what they say (vLLM's `/metrics`
`vllm:cache_config_info`, over HTTP from small real servers), tolerates a replica that says
nothing or is down, lets a given size win, and answers for its replicas together."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from executors import (
    LaneTuning,
    OpenAIBackend,
    PrefixGrouper,
    Router,
    SimServer,
    backends_from_config,
)
from executors._capacity import size_router
from orchestrator import Engine, UsageError, VirtualClock
from orchestrator.ext import ServerCapacity


def cache_config(block: int, blocks: int) -> str:
    """vLLM 0.x's `/metrics` on a CPU: the load gauges and its CacheConfig's info gauge."""
    return (
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{block}",cache_dtype="auto",'
        f'enable_prefix_caching="True",engine="0",num_cpu_blocks="None",'
        f'num_gpu_blocks="{blocks}",num_gpu_blocks_override="None"}} 1.0\n'
    )


SAYS = cache_config(128, 512)  # 65,536 tokens in blocks of 128
SILENT = 'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'  # no info gauge


class Metrics:
    """A server that answers `/metrics` with `body` and counts how often it is asked."""

    def __init__(self, body: str) -> None:
        self.body = body
        self.asked = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.asked += 1
        return web.Response(text=self.body)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app


@asynccontextmanager
async def serving(*servers: Metrics) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        urls = []
        for server in servers:
            test = TestServer(server.app(), host="127.0.0.1")
            await test.start_server()
            stack.push_async_callback(test.close)
            urls.append(str(test.make_url("/v1")))
        yield urls


def down_url() -> str:
    """An API root where nothing listens: a port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def vllm(url: str, **options: object) -> OpenAIBackend:
    return OpenAIBackend(url, dialect="vllm", **options)  # type: ignore[arg-type]


Sized = tuple[int, int | None, ServerCapacity]


async def entered(members: Mapping[str, OpenAIBackend], **options: object) -> Sized:
    """The router's block and per-replica cache once entered, and what it says of them all."""
    router = Router(members, health_interval_s=None, **options)  # type: ignore[arg-type]
    async with router:
        return router.block_tokens, router.policy.blocks_per_replica, await router.capacity()


def test_a_router_reads_its_block_and_cache_from_the_replica_that_says_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    says, silent = Metrics(SAYS), Metrics(SILENT)

    async def main() -> Sized:
        async with serving(says, silent) as (a, b):
            return await entered({"a": vllm(a), "b": vllm(b)})

    with caplog.at_level(logging.WARNING, logger="plait.router"):
        block, blocks, together = asyncio.run(main())
    # b says nothing: it is taken to be like a (replicas of one model are alike).
    assert (block, blocks) == (128, 512)
    assert "b did not say its KV cache" in caplog.text and "512 blocks" in caplog.text
    # Together: no total while one cache is unknown, the block the one that says it says.
    assert (together.kv_tokens, together.block_tokens) == (None, 128)
    assert says.asked == 1 and silent.asked == 1  # capacity() answers from what was said


def test_a_replica_that_does_not_say_its_cache_counts_with_its_kv_cache_tokens() -> None:
    async def main() -> Sized:
        async with serving(Metrics(SAYS), Metrics(SILENT)) as (a, b):
            return await entered({"a": vllm(a), "b": vllm(b, kv_cache_tokens=32_768)})

    block, blocks, together = asyncio.run(main())
    assert (block, blocks) == (128, 256)  # the smaller cache, b's 32,768 tokens, in 128s
    assert (together.kv_tokens, together.block_tokens) == (65_536 + 32_768, 128)
    assert together.kv_from_config  # b's part came from the configuration


def test_a_replica_down_as_the_router_starts_does_not_stop_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> Sized:
        async with serving(Metrics(SAYS)) as (a,):
            return await entered({"a": vllm(a), "down": vllm(down_url(), probe_timeout_s=2.0)})

    with caplog.at_level(logging.WARNING, logger="plait.router"):
        block, blocks, together = asyncio.run(main())
    assert (block, blocks) == (128, 512)
    assert "down did not say its KV cache" in caplog.text
    assert together.kv_tokens is None and together.block_tokens == 128


def test_given_sizes_win_over_what_the_replicas_say() -> None:
    async def main() -> tuple[Sized, Sized]:
        async with serving(Metrics(SAYS), Metrics(SAYS)) as (a, b):
            block_given = await entered({"a": vllm(a), "b": vllm(b)}, block_tokens=16)
            cache_given = await entered({"a": vllm(a), "b": vllm(b)}, cache_blocks=100)
            return block_given, cache_given

    (block, blocks, together), (block2, blocks2, _) = asyncio.run(main())
    assert (block, blocks) == (16, 4096)  # the servers' 65,536 tokens in the given block
    assert together.kv_tokens == 131_072 and together.block_tokens == 128  # what they said
    assert (block2, blocks2) == (16, 100)  # a given cache counts blocks of 16 tokens
    with pytest.raises(UsageError, match="block_tokens=0"):
        Router({"a": vllm("http://gpu1:8000/v1")}, block_tokens=0)


def test_replicas_whose_blocks_differ_are_routed_in_blocks_of_16_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> Sized:
        async with serving(Metrics(cache_config(16, 4096)), Metrics(SAYS)) as (a, b):
            return await entered({"a": vllm(a), "b": vllm(b)})

    with caplog.at_level(logging.WARNING, logger="plait.router"):
        block, blocks, together = asyncio.run(main())
    assert (block, blocks) == (16, 4096)  # each holds 65,536 tokens
    assert "KV blocks differ (a 16, b 128 tokens)" in caplog.text
    assert (together.kv_tokens, together.block_tokens) == (131_072, None)


def test_a_configured_router_and_its_grouper_read_the_servers_and_the_engine_sees_them() -> None:
    async def main() -> tuple[int, int, int | None, ServerCapacity]:
        async with serving(Metrics(SAYS), Metrics(SILENT)) as (a, b):
            config = {
                "router": {
                    "kind": "router",
                    "dialect": "vllm",
                    "health_interval_s": 0,
                    "group_prefixes": True,
                    "endpoints": [{"url": a}, {"url": b, "kv_cache_tokens": 65_536}],
                }
            }
            [grouper] = backends_from_config({"backends": config}).values()
            assert isinstance(grouper, PrefixGrouper) and isinstance(grouper.backend, Router)
            async with grouper, Engine(backends={"router": grouper}) as engine:
                router = grouper.backend
                return (
                    grouper.block_tokens,
                    router.block_tokens,
                    router.policy.blocks_per_replica,
                    engine.capacities["router"],
                )

    grouped, block, blocks, seen = asyncio.run(main())
    assert (grouped, block, blocks) == (128, 128, 512)
    assert (seen.kv_tokens, seen.block_tokens, seen.keeps_kv) == (131_072, 128, False)


def test_simulated_replicas_say_their_profile_as_vllm_says_its_cache() -> None:
    clock = VirtualClock()

    async def main() -> tuple[int, int | None, ServerCapacity]:
        sims = {f"s{i}": SimServer("cpu-tiny", seed=i) for i in range(2)}
        async with Router(sims, health_interval_s=None) as router:
            return router.block_tokens, router.policy.blocks_per_replica, await router.capacity()

    block, blocks, together = clock.run(main())
    profile = SimServer("cpu-tiny").profile
    assert (block, blocks) == (profile.block_size, profile.num_blocks)
    assert together.kv_tokens == 2 * profile.kv_tokens and together.keeps_kv


def test_a_router_the_engine_is_given_unentered_is_sized_as_the_engine_starts() -> None:
    clock = VirtualClock()

    async def main() -> tuple[int, int | None, int | None]:
        async with SimServer("cpu-tiny") as a, SimServer("cpu-tiny", seed=1) as b:
            router = Router({"a": a, "b": b}, health_interval_s=None)
            unsized = router.policy.blocks_per_replica
            async with Engine(backends={"default": router}):
                return router.block_tokens, unsized, router.policy.blocks_per_replica

    block, before, after = clock.run(main())
    profile = SimServer("cpu-tiny").profile
    assert (block, before, after) == (profile.block_size, None, profile.num_blocks)


def test_paced_prefill_finer_than_the_replicas_block_is_refused_as_the_router_starts() -> None:
    async def main() -> None:
        sims = {"a": SimServer("cpu-tiny"), "b": SimServer("cpu-tiny", seed=1)}
        async with Router(sims, health_interval_s=None, lanes=LaneTuning(prefill_tokens=64)):
            pass

    with pytest.raises(UsageError, match=r"prefill_tokens=64\) is less than .* \(128 tokens"):
        VirtualClock().run(main())


# --- the decision, without servers -------------------------------------------------------------


def test_sizing_takes_the_agreed_block_at_least_16_and_the_smallest_cache() -> None:
    sglang = ServerCapacity(kv_tokens=20_480, block_tokens=1)
    bigger = ServerCapacity(kv_tokens=40_960, block_tokens=1)
    size = size_router({"a": sglang, "b": bigger})
    assert (size.block_tokens, size.cache_blocks, size.warnings) == (16, 1280, ())
    # Nothing said: the fallback block, no cache model, nothing to warn of.
    assert size_router({"a": None, "b": ServerCapacity()}) == size_router({})
    assert (size_router({}).block_tokens, size_router({}).cache_blocks) == (16, None)
    # A given block with a cache said; a given cache with no block given: blocks of 16.
    assert size_router({"a": sglang}, block_tokens=64).cache_blocks == 320
    given = size_router({"a": ServerCapacity(block_tokens=128)}, cache_blocks_given=7)
    assert (given.block_tokens, given.cache_blocks) == (16, 7)
