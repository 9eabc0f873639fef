"""plait's real-backend features against real vLLM servers (CPU build, tiny random model).

The servers run with `--scheduling-policy priority --enable-prompt-tokens-details` and a KV
cache of 64 blocks of 128 tokens (bench/vllm/serve.sh, tests_vllm/conftest.py). Every
prompt starts with a fresh nonce, so what earlier tests left in a cache does not count.
"""

from __future__ import annotations

import asyncio
import random
import re
import secrets
from collections.abc import Awaitable, Callable

import httpx
from _vllm_server import BLOCK_TOKENS, VLLMServer, metrics

from executors import OpenAIBackend, PrefixGrouper, Router
from orchestrator import (
    Engine,
    Hints,
    Limits,
    LLMBackend,
    LLMRequest,
    LLMResponse,
    Message,
    TaskContext,
    Usage,
    Workflow,
)
from orchestrator.ext import OutputSchema, ServerCapacity

MODEL = "tiny"


def words(rng: random.Random, n: int) -> str:
    """`n` random words: about 4 tokens each with the tiny model's tokenizer."""
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(n))


def backend(server: VLLMServer) -> OpenAIBackend:
    return OpenAIBackend(f"{server.url}/v1", dialect="vllm", model=MODEL, name=server.url)


def one_call(name: str, messages: tuple[Message, ...], max_tokens: int) -> Workflow:
    """A workflow of one LLM task; its result is the call's usage."""
    workflow = Workflow(name)

    async def call(ctx: TaskContext) -> Usage:
        reply = await ctx.complete(LLMRequest(messages, MODEL, max_tokens=max_tokens))
        return reply.usage

    workflow.add("call", call, resource="default")
    return workflow


# --- (a) priorities ------------------------------------------------------------------------------

LOW_CALLS = 32
PROMPT_WORDS = 180  # ~700 tokens: 6 blocks a request, so about 10 run at once and the rest wait
OUTPUT_TOKENS = 32


def test_a_late_urgent_call_overtakes_queued_low_urgency_calls(
    vllm_small_cache: VLLMServer,
) -> None:
    """Low-urgency programs fill the server's queue; an interactive program submitted once
    the first of them is done must finish before most of the low-urgency calls still open.
    (First come, first served, it would finish about last: it would queue behind them.)"""
    rng = random.Random(secrets.randbits(64))
    finished: list[str] = []

    async def main() -> tuple[float, list[str], Usage]:
        # Every call goes straight to the server: the queue that must honour priorities is
        # vLLM's, not plait's admission (no hold-back, which the engine would otherwise
        # derive from the server's cache size).
        limits = {"default": Limits(256, hold_back=False)}
        async with (
            backend(vllm_small_cache) as llm,
            Engine(backends={"default": llm}, limits=limits) as engine,
            httpx.AsyncClient() as http,
        ):

            async def track(name: str, handle: Awaitable[object]) -> None:
                await handle
                finished.append(name)

            def low(i: int, max_tokens: int) -> Workflow:
                prompt = (Message("user", words(rng, PROMPT_WORDS)),)
                return one_call(f"low{i}", prompt, max_tokens)

            async with asyncio.TaskGroup() as tg:
                # The first program's call is short: its end is the event that says the
                # others have all been sent and the server is busy with them.
                first = engine.submit(low(0, 2))
                for i in range(1, LOW_CALLS + 1):
                    tg.create_task(track(f"low{i}", engine.submit(low(i, OUTPUT_TOKENS))))
                await first
                waiting = (await metrics(http, vllm_small_cache))["vllm:num_requests_waiting"]
                open_lows = [
                    f"low{i}" for i in range(1, LOW_CALLS + 1) if f"low{i}" not in finished
                ]
                urgent_prompt = (Message("user", words(rng, PROMPT_WORDS)),)
                urgent = engine.submit(
                    one_call("urgent", urgent_prompt, OUTPUT_TOKENS), priority="interactive"
                )
                tg.create_task(track("urgent", urgent))
            usage = (await urgent).results["call"]
            return waiting, open_lows, usage

    waiting, open_lows, usage = asyncio.run(main())
    assert usage.completion_tokens == OUTPUT_TOKENS
    after = finished[finished.index("urgent") + 1 :]
    report = (
        f"{waiting:g} calls waiting at the server when the urgent one came; it finished "
        f"before {len(after)} of the {len(open_lows)} low-urgency calls still open "
        f"(order: {' '.join(finished)})"
    )
    print(report)
    assert waiting >= 8, "the server's queue was not saturated: " + report
    assert len(after) >= len(open_lows) / 2, report


# --- (b) routing over two servers ----------------------------------------------------------------

GROUPS = 6
CALLS_PER_GROUP = 3
PREFIX_WORDS = 230  # ~900 tokens: 7 full blocks


class Recorded:
    """Passes calls to `backend` and notes which program each came from."""

    def __init__(self, backend: LLMBackend, calls: list[str]) -> None:
        self.backend = backend
        self.calls = calls

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self.calls.append(hints.program_id)
        return await self.backend.complete(request, hints)


def test_router_keeps_a_prefix_on_one_server_and_spreads_prefixes(
    vllm_pair: list[VLLMServer],
) -> None:
    """Calls sharing a long prefix all go to one server and hit its prefix cache; the
    groups' first calls, sent together, spread over both servers."""
    rng = random.Random(secrets.randbits(64))
    prefixes = [words(rng, PREFIX_WORDS) for _ in range(GROUPS)]
    seen: list[list[str]] = [[], []]

    def request(group: int, k: int) -> LLMRequest:
        messages = (
            Message("system", prefixes[group]),
            Message("user", f"question {k}: {words(rng, 10)}"),
        )
        return LLMRequest(messages, MODEL, max_tokens=4)

    async def main() -> tuple[list[list[LLMResponse]], list[float], list[int]]:
        async with (
            backend(vllm_pair[0]) as a,
            backend(vllm_pair[1]) as b,
            httpx.AsyncClient() as http,
        ):
            router = Router({"a": Recorded(a, seen[0]), "b": Recorded(b, seen[1])})
            async with router:
                before = [await metrics(http, s) for s in vllm_pair]
                call: Callable[[int, int], Awaitable[LLMResponse]] = lambda g, k: (  # noqa: E731
                    router.complete(request(g, k), Hints(program_id=f"group{g}"))
                )
                # The first call of each group together: load spreads new prefixes.
                replies = [[r] for r in await asyncio.gather(*(call(g, 0) for g in range(GROUPS)))]
                # Then the rest one at a time: only the prefix decides where they go.
                for k in range(1, CALLS_PER_GROUP):
                    for g in range(GROUPS):
                        replies[g].append(await call(g, k))
                after = [await metrics(http, s) for s in vllm_pair]
                hits = [
                    after[i]["vllm:prefix_cache_hits_total"]
                    - before[i]["vllm:prefix_cache_hits_total"]
                    for i in range(2)
                ]
                return replies, hits, [r.requests for r in router.stats()]

    replies, hits, requests = asyncio.run(main())
    where = {
        g: {i for i in range(2) if f"group{g}" in seen[i]} for g in range(GROUPS)
    }  # servers each group's calls went to
    report = f"groups per server {where}, requests {requests}, prefix-cache hits {hits}"
    print(report)
    assert requests == [len(seen[0]), len(seen[1])], report
    assert all(len(servers) == 1 for servers in where.values()), report
    for g in range(GROUPS):
        assert sum(f"group{g}" == p for i in range(2) for p in seen[i]) == CALLS_PER_GROUP
    assert {next(iter(s)) for s in where.values()} == {0, 1}, "all prefixes on one server"
    # Later calls of a group find its prefix where it was computed.
    min_hit = (PREFIX_WORDS * 3 // BLOCK_TOKENS) * BLOCK_TOKENS  # ≥ 3 tokens a word
    for g in range(GROUPS):
        for reply in replies[g][1:]:
            assert (reply.usage.cached_prompt_tokens or 0) >= min_hit, (g, reply.usage, report)
    for i in range(2):
        groups_here = sum(1 for s in where.values() if s == {i})
        assert hits[i] >= groups_here * (CALLS_PER_GROUP - 1) * min_hit, report


# --- (c) grouping ----------------------------------------------------------------------------


SIBLINGS = 5
SHARED_WORDS = 380  # ~1,500 tokens: 11 full blocks


def siblings(server: VLLMServer, group: bool) -> tuple[list[Usage], int]:
    """SIBLINGS parallel calls of one workflow sharing a long, uncached prefix; with
    `group`, through a PrefixGrouper. Returns their usages and how many calls were held."""
    rng = random.Random(secrets.randbits(64))
    shared = words(rng, SHARED_WORDS)
    workflow = Workflow("siblings")
    for k in range(SIBLINGS):
        messages = (Message("system", shared), Message("user", f"question {k}: {words(rng, 8)}"))

        async def ask(ctx: TaskContext, messages: tuple[Message, ...] = messages) -> Usage:
            reply = await ctx.complete(LLMRequest(messages, MODEL, max_tokens=4))
            return reply.usage

        workflow.add(f"q{k}", ask, resource="default")

    async def main() -> tuple[list[Usage], int]:
        async with backend(server) as llm:
            grouper = PrefixGrouper(llm, block_tokens=32, min_shared_blocks=8)
            used: LLMBackend = grouper if group else llm
            async with Engine(backends={"default": used}, limits={"default": Limits(64)}) as e:
                result = await e.run(workflow)
        result.raise_for_status()
        return [result.results[f"q{k}"] for k in range(SIBLINGS)], grouper.stats().held

    return asyncio.run(main())


def test_grouped_siblings_find_their_shared_prefix_cached(vllm_small_cache: VLLMServer) -> None:
    """The first sibling computes the shared prefix; the others, held until it is done,
    report it as cached tokens."""
    usages, held = siblings(vllm_small_cache, group=True)
    control, _ = siblings(vllm_small_cache, group=False)
    cached = sorted(u.cached_prompt_tokens or 0 for u in usages)
    report = (
        f"cached prompt tokens, grouped: {cached} of {[u.prompt_tokens for u in usages]} "
        f"({held} calls held); sent at once without grouping: "
        f"{sorted(u.cached_prompt_tokens or 0 for u in control)}"
    )
    print(report)
    assert all(u.cached_prompt_tokens is not None for u in usages), "no prompt_tokens_details"
    assert held == SIBLINGS - 1, report
    min_hit = (SHARED_WORDS * 3 // BLOCK_TOKENS) * BLOCK_TOKENS
    assert cached[0] < BLOCK_TOKENS, "the leader found its fresh prefix cached: " + report
    assert all(c >= min_hit for c in cached[1:]), report


# --- (e) server-specific fields pass through ---------------------------------------------------


def test_vllm_fields_pass_through_plait(vllm_small_cache: VLLMServer) -> None:
    """`ignore_eos` and `min_tokens` reach vLLM beside the vllm dialect's priority: a random
    model that would stop early at an EOS token produces exactly the asked length."""
    length = 24
    request = LLMRequest(
        (Message("user", f"{secrets.token_hex(8)} say something"),),
        MODEL,
        max_tokens=length,
        extra_body={"ignore_eos": True, "min_tokens": length},
    )

    async def main() -> LLMResponse:
        async with backend(vllm_small_cache) as llm:
            return await llm.complete(request, Hints(program_id="pass-through"))

    reply = asyncio.run(main())
    assert reply.usage.completion_tokens == length
    assert reply.finish_reason == "length"


def test_vllm_enforces_the_output_schema_plait_sends(vllm_small_cache: VLLMServer) -> None:
    """`LLMRequest.output` in the vllm dialect (`structured_outputs.json`) reaches the server
    and is enforced: even a random model writes only what the schema allows."""
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    request = LLMRequest(
        (Message("user", f"{secrets.token_hex(8)} yes or no?"),),
        MODEL,
        max_tokens=64,
        output=OutputSchema("Verdict", schema),
    )

    async def main() -> LLMResponse:
        async with backend(vllm_small_cache) as llm:
            return await llm.complete(request, Hints(program_id="structured"))

    reply = asyncio.run(main())
    # A random model fills the object with whitespace (which JSON allows) until max_tokens,
    # so the reply may stop mid-object; what it holds is the schema's, never random text.
    compact = re.sub(r"\s+", "", reply.text)
    fits = ['{"answer":"yes"}', '{"answer":"no"}']
    assert compact and any(whole.startswith(compact) for whole in fits), reply.text[:200]


class Answering:
    """Passes calls to `backend`, sets `started` as the first begins, and notes in `answered`
    the programs it answered."""

    def __init__(self, backend: LLMBackend, answered: list[str]) -> None:
        self.backend = backend
        self.answered = answered
        self.started = asyncio.Event()

    async def complete(self, request: LLMRequest, hints: Hints) -> LLMResponse:
        self.started.set()
        reply = await self.backend.complete(request, hints)
        self.answered.append(hints.program_id)
        return reply


def test_a_new_lane_is_cleared_of_batch_calls_on_the_server(vllm_pair: list[VLLMServer]) -> None:
    """Batch calls run on both servers; an urgent call comes, and the first server becomes
    its lane (`lane_clear`, the default): the router cancels the batch calls there, vLLM
    aborts them (it holds none soon after the urgent call is answered, long before they
    would have ended), and each is answered once, by the other server."""
    rng = random.Random(secrets.randbits(64))
    length = 300  # ~300 steps: far longer than an urgent call of 8 tokens

    def batch_call(i: int) -> LLMRequest:
        return LLMRequest(
            (Message("user", f"{secrets.token_hex(8)} {words(rng, 100)}"),),
            MODEL,
            max_tokens=length,
            extra_body={"ignore_eos": True, "min_tokens": length},
        )

    async def on_server(http: httpx.AsyncClient, server: VLLMServer) -> float:
        values = await metrics(http, server)
        return float(values["vllm:num_requests_running"] + values["vllm:num_requests_waiting"])

    async def main() -> tuple[list[list[str]], int, float]:
        answered: list[list[str]] = [[], []]
        async with (
            backend(vllm_pair[0]) as a,
            backend(vllm_pair[1]) as b,
            httpx.AsyncClient() as http,
        ):
            lane, other = Answering(a, answered[0]), Answering(b, answered[1])
            async with Router({"a": lane, "b": other}, block_tokens=BLOCK_TOKENS) as router:
                sent = [
                    asyncio.ensure_future(
                        router.complete(batch_call(i), Hints(f"b{i}", service="slack_rich"))
                    )
                    for i in range(12)
                ]
                await asyncio.gather(lane.started.wait(), other.started.wait())
                urgent = LLMRequest((Message("user", f"{secrets.token_hex(8)} now"),), MODEL,
                                    max_tokens=8)  # fmt: skip
                reply = await router.complete(urgent, Hints("q", service="urgent"))
                assert reply.usage.completion_tokens > 0
                # vLLM aborts a cancelled request at its next step; wait for that, but
                # not as long as the batch calls' 300 steps would take to end.
                left = await on_server(http, vllm_pair[0])
                for _ in range(20):
                    if left == 0:
                        break
                    await asyncio.sleep(0.25)
                    left = await on_server(http, vllm_pair[0])
                programs = [f"b{i}" for i in range(12)]
                replies = await asyncio.gather(*sent)
                assert all(r.usage.completion_tokens == length for r in replies)
                assert sorted(answered[0] + answered[1]) == sorted([*programs, "q"])
                return answered, router.stats()[0].moved, left

    answered, moved, left = asyncio.run(main())
    report = f"answered by the lane {answered[0]}, by the other {len(answered[1])}; moved {moved}"
    print(report)
    assert moved >= 1, report
    assert left == 0, f"the lane's server still holds {left} requests; {report}"
    assert answered[0] == ["q"], report  # every batch call that was there went elsewhere


# --- (g) the server's size, read from it ---------------------------------------------------------


def test_the_backend_reads_vllms_cache_size_from_its_metrics(
    vllm_small_cache: VLLMServer,
) -> None:
    """`vllm:cache_config_info` on a real vLLM: its KV cache (64 blocks of 128 tokens at
    0.125 GiB) and block, which the engine turns into a hold-back budget of 80% of it."""

    async def main() -> tuple[ServerCapacity, Engine]:
        async with backend(vllm_small_cache) as llm:
            said = await llm.capacity()
            async with Engine(backends={"default": llm}) as engine:
                return said, engine

    said, engine = asyncio.run(main())
    root = vllm_small_cache.url
    assert said.source == f"GET {root}/metrics", said
    assert said.block_tokens == BLOCK_TOKENS
    assert said.kv_tokens == 64 * BLOCK_TOKENS
    assert said.max_seqs is None and not said.keeps_kv and not said.kv_from_config
    # What vLLM logged at start-up, where this test started it, says the same.
    logged = [
        m
        for line in vllm_small_cache.log
        for m in re.findall(r"KV cache size: ([\d,]+) tokens", line)
    ]
    assert all(int(m.replace(",", "")) == said.kv_tokens for m in logged), logged
    assert engine.capacities == {"default": said}
    assert engine.calls.budgets["default"].tokens == int(said.kv_tokens * 0.8)
