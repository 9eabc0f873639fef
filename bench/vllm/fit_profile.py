"""Measure a running vLLM server and fit the simulator's cost profile to it.

The simulated engine (executors/_simprofile.py) charges one continuous-batching step
    step_overhead_s + prefill_s_per_token * prompt tokens computed in the step
                    + decode_s_per_seq * sequences decoding
                    + decode_s_per_context_token * context tokens those sequences attend to.

This script, against a server started with bench/vllm/serve.sh, measures:
  (a) prefill: latency of max_tokens=1 requests for several prompt lengths, one at a time
      -> least squares  latency = request_overhead + step_overhead * steps + a * tokens
         (steps = ceil(tokens / max_num_batched_tokens), chunked prefill);
  (b) decode: B concurrent streaming requests (max_tokens fixed, ignore_eos) for several
      B and two prompt lengths; the time per decode step is
      (time of last token - time of first token) / (completion_tokens - 1), while all B
      sequences decode together -> least squares
         step = step_overhead + decode_s_per_seq * B + decode_s_per_context_token * B * ctx;
  (c) prefix caching: vllm:prefix_cache_{queries,hits}_total from /metrics around sending
      the same long prompt twice (counters are in tokens; only whole blocks are hit).
Every prompt starts with a run nonce and is random text, so the prefix cache does not
help except in (c). Token counts are the server's usage.prompt_tokens.

block_size and num_blocks come from /metrics (vllm:cache_config_info); max_num_seqs and
max_num_batched_tokens from the server log if given (--server-log; "non-default args" or
the debug "Defaulting ..." lines), else vLLM 0.32's defaults for its CPU API server
(128 and 2048, vllm/engine/arg_utils.py get_batch_defaults).

Prints a table and, last, ONE line of JSON: the Profile fields plus the raw measurements.
Needs only aiohttp (in .venv-vllm and the repo's .venv):

    .venv-vllm/bin/python bench/vllm/fit_profile.py --port 8311 [--server-log LOG] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

# vLLM 0.32.0, CPU platform, OpenAI API server (engine/arg_utils.py get_batch_defaults)
CPU_DEFAULT_MAX_NUM_SEQS = 128
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


# ---------------------------------------------------------------------------- helpers


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Ordinary least squares by the normal equations (tiny systems, no numpy needed)."""
    n = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(n)]
    # Gaussian elimination with partial pivoting
    m = [ata[i] + [aty[i]] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-300:
            raise ValueError("singular least-squares system")
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def r_squared(rows: list[list[float]], ys: list[float], coef: list[float]) -> float:
    pred = [sum(c * x for c, x in zip(coef, r, strict=True)) for r in rows]
    mean = statistics.fmean(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_res = sum((y - p) ** 2 for y, p in zip(ys, pred, strict=True))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


class Words:
    """Random pseudo-words; each prompt is fresh random text after a run nonce."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = [
            "".join(self.rng.choice(letters) for _ in range(self.rng.randint(2, 9)))
            for _ in range(5000)
        ]

    def text(self, n_words: int) -> str:
        return " ".join(self.rng.choice(self.words) for _ in range(n_words))


class Client:
    def __init__(self, base: str, model: str, session: aiohttp.ClientSession) -> None:
        self.base = base.rstrip("/")
        self.model = model
        self.s = session

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.s.post(self.base + path, json=body) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"POST {path} -> {r.status}: {text[:500]}")
            return json.loads(text)

    async def metrics(self) -> str:
        async with self.s.get(self.base + "/metrics") as r:
            return await r.text()

    async def tokens(self, text: str) -> list[int]:
        return (await self.post("/tokenize", {"model": self.model, "prompt": text}))["tokens"]

    async def detokenize(self, ids: list[int]) -> str:
        return (await self.post("/detokenize", {"model": self.model, "tokens": ids}))["prompt"]

    async def complete(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """Non-streaming completion; returns latency and usage."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        t0 = time.perf_counter()
        out = await self.post("/v1/completions", body)
        lat = time.perf_counter() - t0
        u = out["usage"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return {
            "latency": lat,
            "prompt_tokens": u["prompt_tokens"],
            "completion_tokens": u["completion_tokens"],
            "cached_tokens": cached,
        }

    async def stream(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """Streaming completion; times the first and the last token."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        t_first = t_last = None
        stamps: list[float] = []
        usage = None
        async with self.s.post(self.base + "/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"stream -> {r.status}: {(await r.text())[:500]}")
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                ev = json.loads(data)
                if ev.get("choices"):
                    if t_first is None:
                        t_first = now
                    t_last = now
                    stamps.append(now)
                if ev.get("usage"):
                    usage = ev["usage"]
        t_end = time.perf_counter()
        if t_first is None or usage is None:
            raise RuntimeError("stream returned no tokens or no usage")
        return {
            "ttft": t_first - t0,
            "t_first": t_first,
            "t_last": t_last,
            "t0": t0,
            "stamps": stamps,
            "latency": t_end - t0,
            "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
        }


def metric(text: str, name: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    if not found:
        raise KeyError(name)
    return total


def cpu_busy(seconds: float) -> float:
    """Fraction of all CPUs busy over `seconds` (Linux /proc/stat; 0.0 elsewhere)."""

    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return sum(v), idle

    try:
        t0, i0 = snap()
        time.sleep(seconds)
        t1, i1 = snap()
    except OSError:
        return 0.0
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def median_by(items: list[dict], key: Any, value: str) -> list[tuple[Any, float]]:
    groups: dict[Any, list[float]] = {}
    for it in items:
        groups.setdefault(key(it), []).append(it[value])
    return [(k, statistics.median(v)) for k, v in groups.items()]


def cache_config(text: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line))
    return {}


def sched_limits(log_path: Path | None) -> tuple[int, int, str]:
    seqs, batched, src = (
        CPU_DEFAULT_MAX_NUM_SEQS,
        CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "vLLM CPU defaults",
    )
    if log_path is None or not log_path.exists():
        return seqs, batched, src
    text = log_path.read_text(errors="replace")
    src = f"vLLM CPU defaults (not overridden in {log_path.name})"
    for pat, kind in (
        (r"Defaulting max_num_batched_tokens to (\d+)", "b"),
        (r"Defaulting max_num_seqs to (\d+)", "s"),
        (r"'max_num_batched_tokens': (\d+)", "b"),
        (r"'max_num_seqs': (\d+)", "s"),
    ):
        m = re.search(pat, text)
        if m:
            if kind == "b":
                batched = int(m.group(1))
            else:
                seqs = int(m.group(1))
            src = f"server log {log_path.name}"
    return seqs, batched, src


# ---------------------------------------------------------------------------- measuring


class Prompts:
    """Prompts of an exact token length (per the server's tokenizer), each unique."""

    def __init__(self, client: Client, seed: int) -> None:
        self.c = client
        self.words = Words(seed)
        self.nonce = secrets.token_hex(6)  # differs per run: no hits from earlier runs
        self.count = 0
        self.ratio = 1.6  # tokens per word, refined as we go

    async def make(self, n_tokens: int) -> str:
        self.count += 1
        head = f"[{self.nonce}-{self.count}] "
        n_words = int(n_tokens / self.ratio * 1.15) + 8
        text = head + self.words.text(n_words)
        ids = await self.c.tokens(text)
        self.ratio = len(ids) / n_words
        while len(ids) < n_tokens:  # rare: top up
            text += " " + self.words.text(n_words // 4 + 8)
            ids = await self.c.tokens(text)
        return await self.c.detokenize(ids[:n_tokens])


async def measure_prefill(c: Client, prompts: Prompts, lengths: list[int], reps: int) -> list[dict]:
    out = []
    for n in lengths:
        for _ in range(reps):
            p = await prompts.make(n)
            r = await c.complete(p, max_tokens=1)
            r["target"] = n
            out.append(r)
            print(
                f"  prefill  target {n:5d}  prompt_tokens {r['prompt_tokens']:5d}  "
                f"cached {r['cached_tokens']:4d}  latency {r['latency'] * 1000:8.1f} ms",
                flush=True,
            )
    return out


async def measure_decode(
    c: Client, prompts: Prompts, batch: int, prompt_len: int, max_tokens: int
) -> dict:
    """Per-step time while `batch` sequences of context ~prompt_len decode together.

    The prompts are first sent once each (max_tokens=1) so that their KV is in the prefix
    cache; the concurrent batch then needs to prefill only each prompt's last partial
    block, all sequences start decoding within a step or two of each other, and the
    decode steps are not mixed with long prefill chunks. Decode attends to the whole
    context whether its KV was cached or computed, so this does not change the step cost.
    """
    ps = [await prompts.make(prompt_len) for _ in range(batch)]
    for p in ps:
        await c.complete(p, max_tokens=1)
    rs = await asyncio.gather(*(c.stream(p, max_tokens) for p in ps))
    # the window in which all `batch` sequences decode together: from the last first
    # token to the first last token; per stream, the mean gap between its tokens in it
    start = max(r["t_first"] for r in rs)
    end = min(r["t_last"] for r in rs)
    per_req = []
    for r in rs:
        inside = [t for t in r["stamps"] if start <= t <= end]
        if len(inside) >= 8:
            per_req.append((inside[-1] - inside[0]) / (len(inside) - 1))
    window = bool(per_req)
    if not per_req:  # no common window: fall back to each stream's whole decode span
        per_req = [(r["t_last"] - r["t_first"]) / (r["completion_tokens"] - 1) for r in rs]
    steps = statistics.median([r["completion_tokens"] for r in rs]) - 1
    stagger = start - min(r["t_first"] for r in rs)
    step_s = statistics.median(per_req)
    prompt_tokens = statistics.fmean(r["prompt_tokens"] for r in rs)
    return {
        "batch": batch,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "step_s": step_s,
        "step_s_min": min(per_req),
        "step_s_max": max(per_req),
        "start_stagger_s": stagger,
        "common_window": window,
        "ttft_s": statistics.fmean(r["ttft"] for r in rs),
        "latency_s": statistics.fmean(r["latency"] for r in rs),
        # mean context a decoding sequence attends to while decoding
        "ctx_per_seq": prompt_tokens + steps / 2,
        "steps": steps,
    }


async def measure_cache(c: Client, prompts: Prompts, n_tokens: int, block_size: int) -> dict:
    p = await prompts.make(n_tokens)
    m0 = await c.metrics()
    r1 = await c.complete(p, max_tokens=1)
    m1 = await c.metrics()
    r2 = await c.complete(p, max_tokens=1)
    m2 = await c.metrics()
    q = "vllm:prefix_cache_queries_total"
    h = "vllm:prefix_cache_hits_total"
    res = {
        "prompt_tokens": r1["prompt_tokens"],
        "cold_latency_s": r1["latency"],
        "warm_latency_s": r2["latency"],
        "cold_cached_tokens": r1["cached_tokens"],
        "warm_cached_tokens": r2["cached_tokens"],
        "queries_delta_1": metric(m1, q) - metric(m0, q),
        "hits_delta_1": metric(m1, h) - metric(m0, h),
        "queries_delta_2": metric(m2, q) - metric(m1, q),
        "hits_delta_2": metric(m2, h) - metric(m1, h),
        "expected_hit_tokens": (r1["prompt_tokens"] - 1) // block_size * block_size,
    }
    res["counters_in_tokens"] = (
        res["queries_delta_1"] == r1["prompt_tokens"]
        and res["queries_delta_2"] == r2["prompt_tokens"]
        and res["hits_delta_2"] == res["warm_cached_tokens"]
    )
    return res


# ---------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> dict:
    base = f"http://{args.host}:{args.port}"
    timeout = aiohttp.ClientTimeout(total=600)
    conn = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as s:
        c = Client(base, args.model, s)
        t_start = time.perf_counter()
        busy_before = cpu_busy(1.0)
        if busy_before > 0.15:
            print(
                f"WARNING: the CPU is {busy_before:.0%} busy before measuring (the server "
                "should be idle): something else is running, timings will be inflated",
                flush=True,
            )
        mtext = await c.metrics()
        cc = cache_config(mtext)
        block_size = int(cc.get("block_size", 0) or 0)
        num_blocks = int(cc.get("num_gpu_blocks", 0) or 0)
        if not block_size or not num_blocks:
            raise SystemExit(
                "could not read block_size/num_gpu_blocks from /metrics cache_config_info"
            )
        max_num_seqs, max_batched, limits_src = sched_limits(args.server_log)
        async with s.get(base + "/v1/models") as r:
            models = await r.json()
        max_model_len = int(models["data"][0].get("max_model_len") or 0)

        prompts = Prompts(c, args.seed)
        print(
            f"server {base}: block_size {block_size}, num_blocks {num_blocks} "
            f"({num_blocks * block_size} KV tokens, {cc.get('kv_cache_memory_bytes')} bytes), "
            f"max_model_len {max_model_len}, max_num_seqs {max_num_seqs}, "
            f"max_num_batched_tokens {max_batched} ({limits_src})",
            flush=True,
        )

        # warm-up: a few shapes, not measured
        print("warm-up ...", flush=True)
        for n in (64, 600, 2100):
            await c.complete(await prompts.make(n), max_tokens=4)
        await measure_decode(c, prompts, 4, 128, 8)

        quick = args.quick
        lengths = [128, 512, 1024, 2048, 3072] if not quick else [128, 1024, 3072]
        print("(a) prefill, max_tokens=1, one request at a time", flush=True)
        pre = await measure_prefill(c, prompts, lengths, args.reps)

        print(
            "(b) decode, concurrent streaming requests (prompts pre-cached), "
            f"max_tokens={args.decode_tokens}",
            flush=True,
        )
        dec = []
        plan = [(b, args.short_prompt) for b in ([1, 2, 4, 8, 16] if not quick else [1, 4, 16])]
        plan += [(b, args.long_prompt) for b in ([1, 4, 8, 16] if not quick else [1, 8])]
        for b, plen in plan:
            for _ in range(args.decode_reps):
                d = await measure_decode(c, prompts, b, plen, args.decode_tokens)
                dec.append(d)
                print(
                    f"  decode  batch {b:3d}  prompt {d['prompt_tokens']:7.1f}  "
                    f"step {d['step_s'] * 1000:7.2f} ms  (min {d['step_s_min'] * 1000:6.2f}, "
                    f"max {d['step_s_max'] * 1000:6.2f})  ttft {d['ttft_s'] * 1000:7.1f} ms  "
                    f"latency {d['latency_s'] * 1000:7.1f} ms",
                    flush=True,
                )

        print("(c) prefix cache", flush=True)
        cache = await measure_cache(c, prompts, args.cache_prompt, block_size)
        print("  " + json.dumps(cache), flush=True)
        elapsed = time.perf_counter() - t_start

    # ---- fits
    # decode: step = o + b*B + c*B*ctx
    # least squares of the relative error (rows and targets divided by the measured
    # time), so that small batches, which are most steps in practice, fit as well as big
    # one point per (batch, context): the median of its repetitions (noise here is mostly
    # other work on the 2 cores, i.e. one-sided)
    dpts = median_by(dec, lambda d: (d["batch"], d["ctx_per_seq"]), "step_s")
    drows = [[1.0, b, b * ctx] for (b, ctx), _ in dpts]
    dys = [y for _, y in dpts]
    o_dec, b_seq, c_ctx = lstsq(
        [[x / y for x in r] for r, y in zip(drows, dys, strict=True)], [1.0] * len(dys)
    )
    r2_dec = r_squared(drows, dys, [o_dec, b_seq, c_ctx])
    dec_rel = [
        (o_dec + b_seq * r[1] + c_ctx * r[2]) / y - 1 for r, y in zip(drows, dys, strict=True)
    ]
    clamp_notes = []
    if o_dec <= 0:
        clamp_notes.append(f"decode intercept {o_dec:.6f} <= 0, clamped to 1e-3")
        o_dec = 1e-3
    if b_seq <= 0:
        clamp_notes.append(f"decode_s_per_seq {b_seq:.3e} <= 0, clamped to 1e-6")
        b_seq = 1e-6
    if c_ctx < 0:
        clamp_notes.append(f"decode_s_per_context_token {c_ctx:.3e} < 0, clamped to 0")
        c_ctx = 0.0
    # prefill. CPU attention makes prefill superlinear in the prompt, which the simulator
    # (linear per token, no per-request intercept) cannot express, so:
    #  - plain least squares  latency - o*steps = r + a*P  (reported; r comes out < 0),
    #  - the profile's value: a through the origin, least squares of the RELATIVE error
    #    of  latency ~ o*steps + a*P  over the measured lengths (128..3072 tokens),
    #  - a quadratic  latency = i + a1*P + a2*P^2  (reported, for a future profile field).
    ppts = median_by(pre, lambda p: p["prompt_tokens"], "latency")  # median per length
    Ps = [float(P) for P, _ in ppts]
    lats = [lat for _, lat in ppts]
    steps_of = [math.ceil(P / max_batched) for P in Ps]
    pys = [lat - o_dec * k for lat, k in zip(lats, steps_of, strict=True)]
    prows = [[1.0, P] for P in Ps]
    req_over, a_ols = lstsq(prows, pys)
    r2_pre = r_squared(prows, pys, [req_over, a_ols])
    a_tok = sum(P / y for P, y in zip(Ps, pys, strict=True)) / sum(
        (P / y) ** 2 for P, y in zip(Ps, pys, strict=True)
    )
    rel_err = [
        (o_dec * k + a_tok * P) / lat - 1 for lat, k, P in zip(lats, steps_of, Ps, strict=True)
    ]
    qrows = [[1.0, P, P * P] for P in Ps]
    q_coef = lstsq(qrows, lats)

    # ---- table
    print()
    print(f"{'prefill':<10}{'tokens':>8}{'median ms':>11}{'profile ms':>12}{'quad ms':>9}  reps ms")
    for lat, k, P in zip(lats, steps_of, Ps, strict=True):
        fit = o_dec * k + a_tok * P
        quad = q_coef[0] + q_coef[1] * P + q_coef[2] * P * P
        reps = " ".join(f"{p['latency'] * 1000:.0f}" for p in pre if p["prompt_tokens"] == P)
        print(
            f"{'':<10}{int(P):>8}{lat * 1000:>11.1f}{fit * 1000:>12.1f}{quad * 1000:>9.1f}  {reps}"
        )
    print(f"{'decode':<10}{'batch':>8}{'ctx/seq':>9}{'median ms':>11}{'fit ms':>8}  reps ms")
    for (b, ctx), y in dpts:
        fit = o_dec + b_seq * b + c_ctx * b * ctx
        reps = " ".join(
            f"{d['step_s'] * 1000:.1f}" for d in dec if (d["batch"], d["ctx_per_seq"]) == (b, ctx)
        )
        print(f"{'':<10}{b:>8}{ctx:>9.0f}{y * 1000:>11.2f}{fit * 1000:>8.2f}  {reps}")
    print(
        f"prefill fit: profile {a_tok * 1e6:.1f} us/token (+ step overhead per "
        f"{max_batched}-token chunk; relative error {min(rel_err):+.0%}..{max(rel_err):+.0%}); "
        f"OLS {a_ols * 1e6:.1f} us/token {req_over * 1000:+.1f} ms (R^2 {r2_pre:.4f}); "
        f"quadratic {q_coef[0] * 1000:.1f} ms + {q_coef[1] * 1e6:.1f} us/token + "
        f"{q_coef[2] * 1e9:.2f} ns/token^2"
    )
    print(
        f"decode fit:  step {o_dec * 1000:.2f} ms + {b_seq * 1000:.3f} ms/seq + "
        f"{c_ctx * 1e9:.2f} ns/context token, R^2 {r2_dec:.4f}, relative error "
        f"{min(dec_rel):+.0%}..{max(dec_rel):+.0%}"
    )
    print(
        f"prefix cache: {cache['prompt_tokens']}-token prompt cold "
        f"{cache['cold_latency_s'] * 1000:.0f} ms, warm {cache['warm_latency_s'] * 1000:.0f} ms; "
        f"hits +{cache['hits_delta_2']:.0f} of queries +{cache['queries_delta_2']:.0f} tokens "
        f"(counters in tokens: {cache['counters_in_tokens']})"
    )
    for n in clamp_notes:
        print("note:", n)
    print(f"measured in {elapsed:.0f} s")

    return {
        "step_overhead_s": round(o_dec, 6),
        "prefill_s_per_token": round(a_tok, 9),
        "decode_s_per_seq": round(b_seq, 7),
        "decode_s_per_context_token": round(c_ctx, 12),
        "num_blocks": num_blocks,
        "block_size": block_size,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_batched,
        "max_model_len": max_model_len,
        "raw": {
            "kv_cache_memory_bytes": int(cc.get("kv_cache_memory_bytes") or 0),
            "limits_source": limits_src,
            "prefill_ols_fit": {
                "intercept_s": round(req_over, 6),
                "s_per_token": round(a_ols, 9),
                "r2": round(r2_pre, 5),
                "note": "latency - step_overhead*chunks",
            },
            "prefill_profile_relative_error": [round(e, 4) for e in rel_err],
            "prefill_quadratic_fit": {
                "intercept_s": round(q_coef[0], 6),
                "s_per_token": round(q_coef[1], 9),
                "s_per_token2": q_coef[2],
            },
            "decode_r2": round(r2_dec, 5),
            "decode_relative_error": [round(e, 4) for e in dec_rel],
            "cpu_busy_before": round(busy_before, 3),
            "prefill": [
                {
                    "prompt_tokens": p["prompt_tokens"],
                    "latency_s": round(p["latency"], 5),
                    "cached_tokens": p["cached_tokens"],
                }
                for p in pre
            ],
            "decode": [
                {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()} for d in dec
            ],
            "prefix_cache": cache,
            "clamped": clamp_notes,
            "elapsed_s": round(elapsed, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fit the simulator profile to a running vLLM server.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8311)
    ap.add_argument("--model", default="tiny", help="served model name")
    ap.add_argument(
        "--server-log",
        type=Path,
        default=None,
        help="the server's log, to read max_num_seqs / max_num_batched_tokens from",
    )
    ap.add_argument("--reps", type=int, default=3, help="repetitions per prefill length")
    ap.add_argument("--decode-reps", type=int, default=3, help="repetitions per decode point")
    ap.add_argument("--decode-tokens", type=int, default=64, help="max_tokens of decode requests")
    ap.add_argument("--short-prompt", type=int, default=256)
    ap.add_argument("--long-prompt", type=int, default=2048)
    ap.add_argument("--cache-prompt", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="fewer points (about a minute)")
    args = ap.parse_args(argv)
    try:
        result = asyncio.run(run(args))
    except aiohttp.ClientConnectorError as e:
        print(f"fit_profile: cannot reach the server: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
