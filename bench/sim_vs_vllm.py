"""The simulator against a real vLLM on the CPU: the same requests, the same block size and
cache size; prints the prefix-cache hits of both and the ratio of their mean latencies, then
one JSON line with those figures.

    make bench-sim-vllm            # starts one vLLM (CPU build) itself; about 3 minutes
    python bench/sim_vs_vllm.py    # in .venv-vllm; PLAIT_VLLM_URLS=URL uses a running one

Prompts are token ids (the completions API takes them), so both sides see exactly the same
tokens and the same 128-token blocks. The hits must agree exactly (tests_vllm checks that);
the latency is a measurement, not a test: a busy machine makes CPU vLLM many times slower,
so the ratio is only meaningful on a quiet machine, and the CPU's flags are printed with it
(without AVX-512 vLLM falls back to slow kernels).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import _results
import aiohttp
from _vllm_server import VLLMServer, running

from executors import SimServer, get_profile
from orchestrator import VirtualClock

CONVERSATIONS = 6
TURNS = 5
NEW_TOKENS = 400  # each turn appends this much to its conversation: contexts reach 2,000
OUTPUT_TOKENS = 8
VOCAB = 8000


@dataclass(frozen=True)
class Measured:
    latencies: list[float]
    hits: int
    queries: int

    @property
    def mean_latency(self) -> float:
        return statistics.fmean(self.latencies)


def conversations(seed: int) -> list[list[int]]:
    """Turns of several conversations, interleaved: with a small cache, LRU must choose."""
    rng = random.Random(seed)
    contexts: list[list[int]] = [[] for _ in range(CONVERSATIONS)]
    prompts = []
    for _ in range(TURNS):
        for c in range(CONVERSATIONS):
            contexts[c] = contexts[c] + [rng.randrange(100, VOCAB) for _ in range(NEW_TOKENS)]
            prompts.append(list(contexts[c]))
    return prompts


def chained_block_hashes(ids: list[int], size: int) -> list[int]:
    out, prev = [], 0
    for i in range(0, len(ids) - size + 1, size):
        prev = hash((prev, tuple(ids[i : i + size])))
        out.append(prev)
    return out


async def cache_config(url: str) -> dict[str, str]:
    """vLLM's own account of its cache: the labels of `vllm:cache_config_info`."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = line[line.index("{") + 1 : line.rindex("}")]
            return dict(
                (k, v.strip('"')) for k, v in (pair.split("=", 1) for pair in labels.split(","))
            )
    raise AssertionError("vLLM reported no vllm:cache_config_info")


async def metrics(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_") and not line.startswith("#"):
            name = line.split("{")[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


async def on_vllm(server: VLLMServer, prompts: list[list[int]]) -> Measured:
    async with aiohttp.ClientSession() as http:

        async def complete(ids: list[int]) -> float:
            body = {
                "model": "tiny",
                "prompt": ids,
                "max_tokens": OUTPUT_TOKENS,
                "ignore_eos": True,
                "temperature": 0,
            }
            started = time.perf_counter()
            async with http.post(f"{server.url}/v1/completions", json=body) as response:
                data = await response.json()
                assert response.status == 200, data
            assert data["usage"]["prompt_tokens"] == len(ids)
            return time.perf_counter() - started

        warm = random.Random(99)
        await complete([warm.randrange(100, VOCAB) for _ in range(300)])  # not measured
        before = await metrics(http, server.url)
        latencies = [await complete(ids) for ids in prompts]
        after = await metrics(http, server.url)
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    return Measured(latencies, int(hits), int(queries))


def on_simulator(prompts: list[list[int]], num_blocks: int) -> Measured:
    profile = get_profile("cpu-tiny").replace(num_blocks=num_blocks)
    clock = VirtualClock()

    async def main() -> Measured:
        latencies = []
        async with SimServer(profile, clock=clock) as sim:
            for ids in prompts:
                request = sim.make_request(
                    prompt_tokens=len(ids),
                    output_tokens=OUTPUT_TOKENS,
                    hashes=chained_block_hashes(ids, profile.block_size),
                    hints=None,
                )
                started = clock.monotonic()
                await sim.submit(request)
                latencies.append(clock.monotonic() - started)
            stats = sim.stats()
        return Measured(latencies, stats.prefix_cache_hits, stats.prefix_cache_queries)

    return clock.run(main())


SMALL_KV_GIB = 0.125
"""64 blocks of 128 tokens: eviction is real."""


def compare(server: VLLMServer, seed: int = 7) -> tuple[int, Measured, Measured]:
    """(usable blocks, vLLM's figures, the simulator's) for the same conversations."""
    prompts = conversations(seed=seed)
    config = asyncio.run(cache_config(server.url))
    if int(config["block_size"]) != get_profile("cpu-tiny").block_size:
        raise RuntimeError(f"vLLM's block size is {config['block_size']}, the profile's is not")
    # vLLM keeps one of its blocks as the "null block", never handed to a request.
    blocks = int(config["num_gpu_blocks"]) - 1
    return blocks, asyncio.run(on_vllm(server, prompts)), on_simulator(prompts, blocks)


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu flags unknown"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return "avx512f: " + ("yes" if " avx512f" in flags else "no (vLLM uses slow kernels)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    given = os.environ.get("PLAIT_VLLM_URLS")
    if given:
        server = VLLMServer(given.split(",")[0].rstrip("/"), SMALL_KV_GIB, [])
        blocks, real, sim = compare(server)
    else:
        print("[sim-vs-vllm] starting one vLLM server (CPU build)", file=sys.stderr)
        with running([SMALL_KV_GIB]) as servers:
            blocks, real, sim = compare(servers[0])
    print(f"{blocks} usable blocks of 128 tokens; {cpu_flags()}")
    print(f"prompt tokens queried: vLLM {real.queries}, simulator {sim.queries}")
    print(f"served from cache:     vLLM {real.hits}, simulator {sim.hits}")
    print(
        f"mean latency:          vLLM {real.mean_latency:.3f} s, simulator "
        f"{sim.mean_latency:.3f} s; sim_over_vllm_latency "
        f"{sim.mean_latency / real.mean_latency:.2f}"
    )
    figures = {
        "blocks": blocks,
        "avx512f": cpu_flags().startswith("avx512f: yes"),
        "prompt_tokens_vllm": real.queries,
        "prompt_tokens_sim": sim.queries,
        "cached_tokens_vllm": real.hits,
        "cached_tokens_sim": sim.hits,
        "mean_latency_vllm_s": round(real.mean_latency, 3),
        "mean_latency_sim_s": round(sim.mean_latency, 3),
        "sim_over_vllm_latency": round(sim.mean_latency / real.mean_latency, 3),
    }
    print(json.dumps(figures))
    _results.save("sim_vs_vllm", figures, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
