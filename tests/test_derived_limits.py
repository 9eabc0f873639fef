"""Limits the servers tell: a backend that says its server's size (`CapacityReporting`) sets
the engine's hold-back budget and calls in flight where the limits given leave them open."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from queue import Queue

import pytest
from aiohttp import web

from agents import Agent
from executors import PROFILES, FunctionLLM, SimHTTP, SimServer
from orchestrator import (
    Engine,
    Hints,
    KeepAlive,
    Limits,
    LLMRequest,
    LLMResponse,
    SystemClock,
    TaskContext,
    Usage,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.cli._cli import main
from orchestrator.engine._capacity import HOLD_BACK_SHARE, derived_limits
from orchestrator.ext import BackendUnavailableError, ServerCapacity

VLLM = ServerCapacity(kv_tokens=10_000, block_tokens=16, source="GET /metrics")
SGLANG = ServerCapacity(kv_tokens=10_000, block_tokens=1, max_seqs=48, keeps_kv=True)
LLAMACPP = ServerCapacity(kv_tokens=8192, max_seqs=4)


@pytest.mark.parametrize(
    ("given", "said", "expected"),
    [
        (None, VLLM, Limits(kv_tokens=8000)),  # hold-back at 80% of the cache
        (None, SGLANG, Limits(max_in_flight=48)),  # it keeps KV itself: no hold-back
        (None, LLAMACPP, Limits(max_in_flight=4, kv_tokens=6553)),
        (Limits(8), LLAMACPP, Limits(8, kv_tokens=6553)),  # given: its max_in_flight stays
        (Limits(8, kv_tokens=500), LLAMACPP, None),  # all given: nothing changes
        (Limits(8), SGLANG, None),
        (None, ServerCapacity(), None),  # said nothing
        (None, ServerCapacity(kv_tokens=1), Limits(kv_tokens=1)),  # never below one token
        (Limits(hold_back=False), VLLM, None),  # hold-back off, whatever the server says
        (Limits(8, hold_back=False), LLAMACPP, None),
    ],
)
def test_what_a_server_says_fills_the_limits_left_open(
    given: Limits | None, said: ServerCapacity, expected: Limits | None
) -> None:
    assert HOLD_BACK_SHARE == 0.8
    assert derived_limits(given, said) == expected


class Sized(FunctionLLM):
    """A fake backend that says its server's size, and counts its calls in flight."""

    def __init__(self, said: ServerCapacity | Exception, clock: VirtualClock) -> None:
        super().__init__(reply, latency=1.0, clock=clock)
        self.said = said
        self.asked = 0
        self.flying = 0
        self.most = 0

    async def capacity(self) -> ServerCapacity:
        self.asked += 1
        if isinstance(self.said, Exception):
            raise self.said
        return self.said

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self.flying += 1
        self.most = max(self.most, self.flying)
        try:
            return await super().complete(request, hints)
        finally:
            self.flying -= 1


def reply(request: LLMRequest, hints: Hints) -> LLMResponse:
    return LLMResponse("ok", Usage(prompt_tokens=1000, completion_tokens=10))


def agent(name: str) -> Workflow:
    """think -> a 5 s tool -> think (last)."""
    bot = Agent(name, "You fix bugs.")

    async def tool(ctx: TaskContext) -> None:
        await ctx.clock.sleep(5.0)

    wf = Workflow(name)
    wf.add("think0", bot.ask("look"))
    wf.add("tool", tool, after=["think0"], resource="tools")
    wf.add("think1", bot.ask("fix"), after=["tool"])
    return wf


def late_start(
    said: ServerCapacity, limits: dict[str, Limits] | None = None, admission: str = "deadlines"
) -> float:
    """a and b start at t=0 and pause (a 5 s tool, kept 10 s) holding about 1,010 tokens
    each; c comes at t=2: when does it first call?"""
    clock = VirtualClock()
    llm = Sized(said, clock)

    async def main() -> None:
        async with Engine(
            backends={"default": llm},
            admission=admission,  # type: ignore[arg-type]
            clock=clock,
            limits=limits,
            keep_alive=KeepAlive(initial_s=10.0),
        ) as engine:
            assert engine.capacities == {"default": said}
            handles = [engine.submit(agent(name)) for name in "ab"]
            await clock.sleep(2.0)
            handles.append(engine.submit(agent("c")))
            for handle in handles:
                assert (await handle).ok

    clock.run(main())
    assert llm.asked == 1
    return min(call.at for call in llm.calls if call.hints.program_id.startswith("c"))


def test_a_server_that_says_its_cache_holds_new_programs_back() -> None:
    # 1,875 tokens of KV: 1,500 of budget, which a and b fill; c waits for a's end at t=7.
    assert late_start(ServerCapacity(kv_tokens=1875)) == pytest.approx(7.0)
    # Its configured fallback does the same.
    assert late_start(ServerCapacity(kv_tokens=1875, kv_from_config=True)) == pytest.approx(7.0)
    # Room for all three: no wait; and none where the server keeps paused programs' KV.
    assert late_start(ServerCapacity(kv_tokens=10_000)) == pytest.approx(2.0)
    assert late_start(ServerCapacity(kv_tokens=1875, keeps_kv=True)) == pytest.approx(2.0)
    # A budget given is the budget, whatever the server says; and hold-back off is off.
    given = {"default": Limits(16, kv_tokens=10_000)}
    assert late_start(ServerCapacity(kv_tokens=1875), given) == pytest.approx(2.0)
    off = {"default": Limits(16, hold_back=False)}
    assert late_start(ServerCapacity(kv_tokens=1875), off) == pytest.approx(2.0)


def test_admission_off_derives_no_hold_back_but_keeps_a_budget_given() -> None:
    """`admission="off"` adds nothing to the limits given: no budget from the server's KV
    cache (c starts at once), while one given is still the budget (c waits for a's end);
    `throughput` keeps the hold-back."""
    small = ServerCapacity(kv_tokens=1875)
    assert late_start(small, admission="off") == pytest.approx(2.0)
    assert late_start(small, admission="throughput") == pytest.approx(7.0)
    given = {"default": Limits(16, kv_tokens=1500)}
    assert late_start(small, given, admission="off") == pytest.approx(7.0)


def test_a_budget_with_hold_back_off_is_refused() -> None:
    with pytest.raises(UsageError, match="give one or the other"):
        Limits(kv_tokens=1000, hold_back=False)


def one_call(name: str) -> Workflow:
    wf = Workflow(name)
    wf.add("ask", Agent(name, "You answer.").ask("hi"))
    return wf


def most_in_flight(
    said: ServerCapacity | Exception, limits: dict[str, Limits] | None = None
) -> tuple[int, int]:
    clock = VirtualClock()
    llm = Sized(said, clock)
    seen: list[int] = []

    async def main() -> None:
        async with Engine(backends={"default": llm}, clock=clock, limits=limits) as engine:
            handles = [engine.submit(one_call(f"p{i}")) for i in range(10)]
            for handle in handles:
                assert (await handle).ok
            [stats] = [s for s in engine.admission.stats() if s.name == "default"]
            seen.append(stats.max_in_flight)

    clock.run(main())
    return llm.most, seen[0]


def test_a_server_that_says_its_sequence_limit_gets_no_more_calls_at_once() -> None:
    assert most_in_flight(ServerCapacity(max_seqs=3)) == (3, 3)
    # Limits given: theirs, not the server's.
    assert most_in_flight(ServerCapacity(max_seqs=3), {"default": Limits(8)}) == (8, 8)
    # A backend that fails to say: the defaults.
    assert most_in_flight(BackendUnavailableError("down")) == (10, 32)


@contextmanager
def simulator_serving(profile: str) -> Iterator[str]:
    """A simulated vLLM-like server on a free port, in a thread with its own loop (a run on
    the system clock talks to it as to a remote server); yields its API root."""
    started: Queue[tuple[str, Callable[[], None]] | BaseException] = Queue()

    async def serve() -> None:
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        async with SimServer(profile, clock=SystemClock()) as sim:
            runner = SimHTTP(sim).runner()
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            port = runner.addresses[0][1]
            started.put(
                (f"http://127.0.0.1:{port}/v1", lambda: loop.call_soon_threadsafe(done.set))
            )
            try:
                await done.wait()
            finally:
                await runner.cleanup()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # the test hears it rather than a silent thread
            started.put(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    got = started.get(timeout=30)
    if isinstance(got, BaseException):
        raise got
    url, stop = got
    try:
        yield url
    finally:
        stop()
        thread.join(timeout=30)


def test_plait_run_reads_the_servers_size_and_says_so(tmp_path: Path) -> None:
    flow = tmp_path / "flow.py"
    flow.write_text(
        "from agents import Agent\n"
        "from orchestrator import Workflow\n"
        "def workflows():\n"
        "    wf = Workflow('w')\n"
        "    wf.add('a', Agent('a', 'sys').ask('hi', max_tokens=4))\n"
        "    return wf\n"
    )
    profile = PROFILES["cpu-tiny"]
    with simulator_serving(profile.name) as url:
        config = tmp_path / "p.toml"
        config.write_text(
            f'[backends.default]\nkind = "openai"\nurl = "{url}"\ndialect = "vllm"\n'
            f'model = "{profile.model}"\n'
        )
        out = io.StringIO()
        assert main(["run", str(flow), "--config", str(config)], out=out) == 0, out.getvalue()
    root = url.removesuffix("/v1")
    assert (
        f"backend 'default': KV cache {profile.kv_tokens:,} tokens, blocks of "
        f"{profile.block_size}, sequences unknown; read from GET {root}/metrics"
    ) in out.getvalue()
