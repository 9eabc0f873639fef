"""A backend that waits on a socket cannot run on a virtual clock: the engine says so at start."""

from __future__ import annotations

import pytest

from executors import FunctionLLM, echo
from orchestrator import (
    Engine,
    Hints,
    LLMRequest,
    LLMResponse,
    SystemClock,
    UsageError,
    VirtualClock,
)
from orchestrator.ext import WallClockBackend


class RemoteLLM:
    """A small stand-in for an HTTP backend: answers at once, but declares the wall clock."""

    def __init__(self, remote: bool = True) -> None:
        self.remote = remote
        self.calls = 0

    def needs_wall_clock(self) -> bool:
        return self.remote

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self.calls += 1
        return LLMResponse(text="ok")


def test_the_fake_declares_the_capability() -> None:
    assert isinstance(RemoteLLM(), WallClockBackend)
    assert not isinstance(FunctionLLM(echo), WallClockBackend)


def test_an_engine_on_a_virtual_clock_refuses_a_wall_clock_backend() -> None:
    async def main() -> None:
        async with Engine(backends={"gpus": RemoteLLM()}, clock=clock):
            pass

    clock = VirtualClock()
    with pytest.raises(UsageError, match=r"backend 'gpus' .*system clock"):
        clock.run(main())


def test_wrappers_that_wrap_nothing_remote_run_on_a_virtual_clock() -> None:
    async def main() -> int:
        async with Engine(
            backends={"local": RemoteLLM(remote=False), "fake": FunctionLLM(echo)}, clock=clock
        ):
            return 1

    clock = VirtualClock()
    assert clock.run(main()) == 1


def test_the_system_clock_takes_a_wall_clock_backend() -> None:
    import asyncio

    async def main() -> int:
        async with Engine(backends={"gpus": RemoteLLM()}, clock=SystemClock()):
            return 1

    assert asyncio.run(main()) == 1


def test_http_backends_and_wrappers_over_them_declare_the_wall_clock() -> None:
    from executors import OpenAIBackend, PrefixGrouper, Router, SimServer

    remote = OpenAIBackend("http://127.0.0.1:9/v1", dialect="vllm")
    assert isinstance(remote, WallClockBackend) and remote.needs_wall_clock()
    over_http = Router({"a": OpenAIBackend("http://127.0.0.1:9/v1"), "b": FunctionLLM(echo)})
    assert over_http.needs_wall_clock()
    assert PrefixGrouper(over_http).needs_wall_clock()
    clock = VirtualClock()
    local = Router({"a": SimServer("h100-llama3-8b", clock=clock), "b": FunctionLLM(echo)})
    assert not local.needs_wall_clock()
    assert not PrefixGrouper(local).needs_wall_clock()
    assert not isinstance(SimServer("h100-llama3-8b", clock=clock), WallClockBackend)


def test_an_engine_refuses_a_router_over_http_on_a_virtual_clock() -> None:
    from executors import OpenAIBackend, Router

    async def main() -> None:
        router = Router({"a": OpenAIBackend("http://127.0.0.1:9/v1")})
        async with Engine(backends={"default": router}, clock=clock):
            pass

    clock = VirtualClock()
    with pytest.raises(UsageError, match="backend 'default' \\(Router\\)"):
        clock.run(main())
