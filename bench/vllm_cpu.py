"""plait against the naive baseline on real vLLM servers on this CPU (tiny random model).

Starts two vLLM servers (bench/vllm/serve.sh) with KV caches smaller than the workloads'
working set, then runs scaled-down multi-turn agents and batch analytics on the system
clock, with one server and with two:

- naive: every call sent as soon as it is ready, in the input's order, no hints,
  round-robin over the servers (`run_naive`);
- plait: the same programs through plait's engine (`plait_runner`): program-first
  priorities sent as vLLM's `priority`, prefix routing over the servers, and (vLLM has no
  keep-alive control) hold-back of new programs while paused ones fill the KV caches;
- ablations (full run): plait with priorities only, then with routing, hold-back or
  prefix grouping alone.

Fairness: every mode starts on an empty prefix cache (the servers run with
VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache), the order of the modes alternates from
one configuration to the next, and the naive client sends calls in the input's order.
Computed prompt tokens (not served from the prefix cache) are read from the servers'
/metrics (`vllm:prompt_tokens_by_source_total{source="local_compute"}`) as a delta over
each mode.

    python bench/vllm_cpu.py --quick      # a few minutes, plus the servers' start-up
    python bench/vllm_cpu.py              # bigger workloads, two repeats, ablations

Rows go to stderr; the last line of stdout is one JSON object: agents_mean_jct_ratio and
agents_p95_jct_ratio (naive over plait: bigger is better), agents_computed_tokens_ratio,
batch_speedup (naive wall time over plait's) and batch_computed_tokens_ratio (plait over
naive: smaller is better), on two servers; the same with a `one_server_` prefix for one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
import httpx  # noqa: E402
from _harness import Outcome, percentile, plait_runner, run_naive  # noqa: E402
from _vllm_server import (  # noqa: E402
    VLLMServer,
    computed_prompt_tokens,
    metrics,
    reset_prefix_cache,
    running,
)

from executors import OpenAIBackend  # noqa: E402
from orchestrator import SystemClock  # noqa: E402
from workloads import Program, agent_programs, batch_programs  # noqa: E402

MODEL = "tiny"
ROUTE_BLOCK_TOKENS = 32
"""Prefix hashing for routing and grouping: blocks of 32 four-character tokens. The tiny
model's tokenizer makes about 2.6 characters a token of the filler text, so one hashing
block is about 50 real tokens, finer than vLLM's 128-token KV blocks."""


AnyRunner = Callable[..., Awaitable[list[Outcome]]]
"""`run_naive` or a `plait_runner(...)`: (programs, backends, clock) -> outcomes."""


class StartedClock(SystemClock):
    """Wall time from the moment it was made: programs' arrivals are offsets from it."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def monotonic(self) -> float:
        return time.monotonic() - self._t0


@dataclass(frozen=True)
class Sizes:
    agents: int
    agent_rate: float
    turns: tuple[int, int]
    documents: int
    questions: int


# Agents arrive faster than the servers serve them, so queues form and the contexts of
# the agents in flight (about 2-3k tokens each) outgrow the 64-block caches.
QUICK = Sizes(agents=16, agent_rate=8.0, turns=(4, 6), documents=9, questions=6)
FULL = Sizes(agents=24, agent_rate=8.0, turns=(5, 8), documents=15, questions=6)


def agents(sizes: Sizes, seed: int) -> list[Program]:
    """Prompts stay under the servers' 4,096 tokens: the filler's nominal tokens are about
    1.5 real ones, so contexts reach about 3,600 tokens by the eighth turn."""
    return agent_programs(
        sizes.agents,
        rate=sizes.agent_rate,
        seed=seed,
        min_turns=sizes.turns[0],
        max_turns=sizes.turns[1],
        system_tokens=(400, 600),
        task_tokens=(60, 120),
        reply_tokens=(16, 48),
        result_tokens=(80, 180),
        max_pause=5.0,
    )


def batch(sizes: Sizes, seed: int) -> list[Program]:
    """Each prompt: about 600 tokens of instructions, 750-1,200 of document, a question."""
    return batch_programs(
        sizes.documents,
        sizes.questions,
        seed=seed,
        doc_tokens=(500, 800),
        answer_tokens=24,
        instruction_tokens=400,
        question_tokens=(20, 40),
    )


@dataclass(frozen=True)
class Row:
    workload: str
    servers: int
    mode: str
    mean_jct: float
    p95_jct: float
    makespan: float
    prompt_tokens: float
    computed_tokens: float
    preemptions: float

    def figures(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "servers": self.servers,
            "mode": self.mode,
            "mean_jct_s": round(self.mean_jct, 2),
            "p95_jct_s": round(self.p95_jct, 2),
            "wall_s": round(self.makespan, 2),
            "prompt_tokens": round(self.prompt_tokens),
            "computed_prompt_tokens": round(self.computed_tokens),
        }

    def text(self) -> str:
        hit = 1 - self.computed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return (
            f"{self.workload:7s} {self.servers} server(s) {self.mode:24s} "
            f"mean JCT {self.mean_jct:7.2f} s  p95 {self.p95_jct:7.2f} s  "
            f"wall {self.makespan:7.2f} s  prompt tokens {self.prompt_tokens:8.0f}  "
            f"computed {self.computed_tokens:8.0f} ({hit:5.1%} from cache)  "
            f"preemptions {self.preemptions:.0f}"
        )


def kv_tokens_of(kv_gib: float) -> int:
    """The tiny model's KV cache in tokens: 16 KiB a token (bench/vllm/serve.sh)."""
    return int(kv_gib * 2**30 / (16 * 1024))


def modes(servers: int, ablations: bool, kv_tokens: int) -> dict[str, Callable[[], AnyRunner]]:
    """Runner factories by mode name; every plait mode keeps program-first priorities.
    vLLM has no keep-alive control, so plait holds new agents back instead while paused
    ones' contexts fill the servers' caches (`kv_tokens` each)."""

    def plait(route: bool, group: bool, hold_back: bool) -> Callable[[], AnyRunner]:
        return lambda: plait_runner(
            route=route,
            group=group,
            keep_alive=False,
            hold_back=hold_back,
            kv_tokens=kv_tokens * servers,
            block_tokens=ROUTE_BLOCK_TOKENS,
        )

    out: dict[str, Callable[[], AnyRunner]] = {
        "naive": lambda: run_naive,
        "plait": plait(True, False, True),
    }
    if ablations:
        out["plait: priorities only"] = plait(False, False, False)
        if servers > 1:
            out["plait: +routing"] = plait(True, False, False)
        out["plait: +hold-back"] = plait(False, False, True)
        out["plait: +grouping"] = plait(False, True, False)
    return out


async def run_mode(
    workload: str, mode: str, runner: AnyRunner, programs: Sequence[Program], urls: Sequence[str]
) -> Row:
    servers = [VLLMServer(url, 0.0, []) for url in urls]
    dialect = "openai" if mode == "naive" else "vllm"  # the baseline sends no hints
    async with contextlib.AsyncExitStack() as stack, httpx.AsyncClient(timeout=60) as http:
        backends = [
            await stack.enter_async_context(
                OpenAIBackend(f"{s.url}/v1", dialect=dialect, model=MODEL, name=s.url)
            )
            for s in servers
        ]
        for s in servers:
            await reset_prefix_cache(http, s)  # every mode starts cold
        before = [await metrics(http, s) for s in servers]
        clock = StartedClock()
        outcomes: list[Outcome] = await runner(programs, backends, clock)
        after = [await metrics(http, s) for s in servers]

    def delta(f: Callable[[dict[str, float]], float]) -> float:
        return sum(f(a) - f(b) for a, b in zip(after, before, strict=True))

    jcts = [o.jct for o in outcomes]
    return Row(
        workload=workload,
        servers=len(servers),
        mode=mode,
        mean_jct=statistics.fmean(jcts),
        p95_jct=percentile(jcts, 0.95),
        makespan=max(o.finished for o in outcomes) - min(o.arrival for o in outcomes),
        prompt_tokens=delta(lambda m: m.get("vllm:prompt_tokens_total", 0.0)),
        computed_tokens=delta(computed_prompt_tokens),
        preemptions=delta(lambda m: m.get("vllm:num_preemptions_total", 0.0)),
    )


def mean_rows(rows: Sequence[Row]) -> Row:
    first = rows[0]
    return Row(
        first.workload,
        first.servers,
        first.mode,
        statistics.fmean(r.mean_jct for r in rows),
        statistics.fmean(r.p95_jct for r in rows),
        statistics.fmean(r.makespan for r in rows),
        statistics.fmean(r.prompt_tokens for r in rows),
        statistics.fmean(r.computed_tokens for r in rows),
        statistics.fmean(r.preemptions for r in rows),
    )


async def measure(
    urls: Sequence[str],
    sizes: Sizes,
    seed: int,
    repeats: int,
    ablations: bool,
    only: str | None = None,
    kv_tokens: int = kv_tokens_of(0.125),
) -> dict[tuple[str, int, str], Row]:
    workloads = {"agents": agents(sizes, seed), "batch": batch(sizes, seed)}
    if only:
        workloads = {only: workloads[only]}
    results: dict[tuple[str, int, str], list[Row]] = {}
    flip = False
    for repeat in range(repeats):
        for n in (1, 2):
            for name, programs in workloads.items():
                order = list(modes(n, ablations, kv_tokens).items())
                if flip:  # alternate which mode goes first, so none always runs warm
                    order.reverse()
                flip = not flip
                for mode, factory in order:
                    row = await run_mode(name, mode, factory(), programs, urls[:n])
                    print(f"[vllm-cpu] run {repeat + 1}: {row.text()}", file=sys.stderr)
                    results.setdefault((name, n, mode), []).append(row)
    return {key: mean_rows(rows) for key, rows in results.items()}


def figures(rows: dict[tuple[str, int, str], Row], servers: int) -> dict[str, float]:
    a_naive, a_plait = rows["agents", servers, "naive"], rows["agents", servers, "plait"]
    b_naive, b_plait = rows["batch", servers, "naive"], rows["batch", servers, "plait"]
    return {
        "agents_mean_jct_ratio": round(a_naive.mean_jct / a_plait.mean_jct, 3),
        "agents_p95_jct_ratio": round(a_naive.p95_jct / a_plait.p95_jct, 3),
        "agents_computed_tokens_ratio": round(a_plait.computed_tokens / a_naive.computed_tokens, 3),
        "batch_speedup": round(b_naive.makespan / b_plait.makespan, 3),
        "batch_computed_tokens_ratio": round(b_plait.computed_tokens / b_naive.computed_tokens, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small workloads, one repeat")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, help="runs of every mode (default 1 quick, 2)")
    parser.add_argument(
        "--kv-gib", type=float, default=0.125, help="KV cache of each server (0.125: 64 blocks)"
    )
    parser.add_argument(
        "--urls",
        help="two base URLs of vLLM servers already running (with VLLM_SERVER_DEV_MODE=1), "
        "comma-separated, instead of starting them",
    )
    parser.add_argument("--agents", type=int, help="number of agents (overrides the size)")
    parser.add_argument("--agent-rate", type=float, help="agents arriving a second")
    parser.add_argument("--documents", type=int, help="documents of the batch job")
    parser.add_argument("--only", choices=["agents", "batch"], help="run one workload")
    parser.add_argument(
        "--ablations", action="store_true", help="with --quick: the ablation rows too"
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = Sizes(
        agents=args.agents or sizes.agents,
        agent_rate=args.agent_rate or sizes.agent_rate,
        turns=sizes.turns,
        documents=args.documents or sizes.documents,
        questions=sizes.questions,
    )
    repeats = args.repeats or (1 if args.quick else 2)
    started = time.monotonic()

    def go(urls: Sequence[str]) -> dict[tuple[str, int, str], Row]:
        print(f"[vllm-cpu] servers {', '.join(urls)}", file=sys.stderr)
        ablations = args.ablations or not args.quick
        return asyncio.run(
            measure(
                urls,
                sizes,
                args.seed,
                repeats,
                ablations,
                only=args.only,
                kv_tokens=kv_tokens_of(args.kv_gib),
            )
        )

    if args.urls:
        rows = go(args.urls.split(","))
    else:
        print(f"[vllm-cpu] starting two vLLM servers (KV {args.kv_gib} GiB each)", file=sys.stderr)
        with running([args.kv_gib, args.kv_gib], env={"VLLM_SERVER_DEV_MODE": "1"}) as servers:
            print(f"[vllm-cpu] up after {time.monotonic() - started:.0f} s", file=sys.stderr)
            rows = go([s.url for s in servers])
    print("[vllm-cpu] means over the runs:", file=sys.stderr)
    for row in rows.values():
        print(f"[vllm-cpu] {row.text()}", file=sys.stderr)
    out: dict[str, Any] = {}
    if not args.only:
        out |= figures(rows, 2)
        out |= {f"one_server_{k}": v for k, v in figures(rows, 1).items()}
    out |= {"quick": int(args.quick), "repeats": repeats, "kv_gib": args.kv_gib}
    out["wall_s"] = round(time.monotonic() - started, 1)
    out["modes"] = [row.figures() for row in rows.values()]
    print(json.dumps(out))
    _results.save("vllm_cpu", out, parser, args, argv, ignore=("urls",))
    return 0


if __name__ == "__main__":
    sys.exit(main())
