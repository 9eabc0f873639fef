"""Fixtures that start real vLLM servers (CPU build) on the generated tiny model.

These tests run in `.venv-vllm` (`make test-vllm`), not in the main suite: they need vLLM,
minutes of start-up and most of this machine's two cores. The two servers start once per
session, side by side, whichever test asks first. To run them against servers already up
(started with bench/vllm/serve.sh PORT 0.125), set PLAIT_VLLM_URLS to their two base URLs,
comma-separated.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from _vllm_server import VLLMServer, running

SMALL_KV_GIB = 0.125
"""64 blocks of 128 tokens: eviction is real."""


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[list[VLLMServer]]:
    """Two vLLM servers, each with a small KV cache (0.125 GiB, 64 blocks of 128 tokens)."""
    given = os.environ.get("PLAIT_VLLM_URLS")
    if given:
        yield [VLLMServer(url.rstrip("/"), SMALL_KV_GIB, []) for url in given.split(",")]
        return
    with running([SMALL_KV_GIB, SMALL_KV_GIB]) as servers:
        yield servers


@pytest.fixture(scope="session")
def vllm_small_cache(vllm_servers: list[VLLMServer]) -> VLLMServer:
    """One vLLM server with a KV cache of 64 blocks of 128 tokens: eviction is real."""
    return vllm_servers[0]


@pytest.fixture(scope="session")
def vllm_pair(vllm_servers: list[VLLMServer]) -> list[VLLMServer]:
    """Two vLLM servers of the same model, for routing over replicas."""
    return vllm_servers
