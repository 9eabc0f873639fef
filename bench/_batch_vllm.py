"""The batch job on real vLLM servers (CPU build, the tiny random model): `bench/batch.py`'s
second half.

One input file in the OpenAI Batch API format (what vLLM's `run-batch` reads too), laid out
question-major as a table of documents x questions usually is, is run three ways:

- **naive**: every row sent at once in the file's order, no hints, round-robin over the
  servers (what a user's asyncio script does);
- **plait**: `plait batch run --input F --output O --config C` as a user runs it, C naming
  the same servers behind plait's router with vLLM's dialect;
- **run-batch** (one server only): vLLM's own `python -m vllm.entrypoints.openai.run_batch`
  on the same file, with the same engine flags as the servers. It starts an engine of its
  own, so its wall time is given whole and without the start-up (the time from its process
  start to its first request's log line is start-up).

Every mode starts on an empty prefix cache (servers run with `VLLM_SERVER_DEV_MODE=1` and are
reset through `/reset_prefix_cache`); computed prompt tokens are read from the servers'
`/metrics` as a delta over each mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from _vllm_server import (
    ROOT,
    VLLMServer,
    computed_prompt_tokens,
    metrics,
    reset_prefix_cache,
    running,
)

from workloads import LLMStep, batch_programs

MODEL = "tiny"
VLLM_VENV = ROOT / ".venv-vllm"
MODEL_DIR = ROOT / ".cache" / "tiny-llama"
KV_GIB = 0.125
"""Each server's KV cache: 64 blocks of 128 tokens, smaller than the job's documents (the
router reads its size and block from the servers' `/metrics`)."""


@dataclass(frozen=True)
class VLLMRow:
    mode: str
    servers: int
    wall_s: float
    computed_tokens: float
    prompt_tokens: float
    ok: int
    note: str = ""
    startup_s: float = 0.0
    """Of a process that starts its own engine (run-batch): the start-up part of `wall_s`."""

    def text(self) -> str:
        hit = 1 - self.computed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return (
            f"vllm {self.servers} server(s) {self.mode:10s} wall {self.wall_s:7.2f} s  "
            f"prompt tokens {self.prompt_tokens:8.0f}  computed {self.computed_tokens:8.0f} "
            f"({hit:5.1%} from cache)  rows ok {self.ok}  {self.note}"
        )


def openai_rows(documents: int, questions: int, seed: int) -> list[dict[str, Any]]:
    """The job as OpenAI Batch API request lines, question-major (the input's own order).
    Sizes keep every prompt under the servers' 4,096 tokens (see bench/vllm_cpu.py)."""
    programs = batch_programs(
        documents,
        questions,
        seed=seed,
        doc_tokens=(500, 800),
        answer_tokens=24,
        instruction_tokens=400,
        question_tokens=(20, 40),
    )
    steps = sorted(
        ((step, program.id) for program in programs for step in program.steps),
        key=lambda pair: pair[0].order if isinstance(pair[0], LLMStep) else 0,
    )
    rows = []
    for step, program in steps:
        assert isinstance(step, LLMStep)
        messages = [{"role": m.role, "content": m.content} for m in step.build({})]
        rows.append(
            {
                "custom_id": f"{program}-{step.id}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": messages,
                    "max_tokens": step.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        )
    return rows


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def count_ok(path: Path) -> int:
    ok = 0
    if not path.exists():
        return 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        response = row.get("response") or {}
        if not row.get("error") and response.get("status_code") == 200:
            ok += 1
    return ok


async def _naive(servers: Sequence[VLLMServer], rows: Sequence[dict[str, Any]]) -> int:
    limits = httpx.Limits(max_connections=len(rows) + 8, max_keepalive_connections=len(rows))
    async with httpx.AsyncClient(timeout=3_600, limits=limits) as http:

        async def one(i: int, row: dict[str, Any]) -> bool:
            server = servers[i % len(servers)]
            response = await http.post(f"{server.url}/v1/chat/completions", json=row["body"])
            return response.status_code == 200

        done = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
    return sum(done)


def plait_config(path: Path, servers: Sequence[VLLMServer]) -> Path:
    urls = ", ".join(json.dumps(f"{s.url}/v1") for s in servers)
    path.write_text(
        f"""\
# bench/batch.py: the servers it started, behind plait's router, in vLLM's dialect.
[engine]
clock = "system"

[backends.default]
kind = "router"
urls = [{urls}]
dialect = "vllm"
model = "{MODEL}"
timeout_s = 3600

[backends.default.limits]
max_in_flight = {64 * len(servers)}
"""
    )
    return path


def _plait(workdir: Path, servers: Sequence[VLLMServer], input_path: Path) -> tuple[float, int]:
    output = workdir / f"plait-{len(servers)}.jsonl"
    config = plait_config(workdir / f"plait-{len(servers)}.toml", servers)
    for stale in workdir.glob(f"plait-{len(servers)}.jsonl*"):
        stale.unlink()
    command = [
        str(Path(sys.executable).parent / "plait"),  # the command as a user runs it
        "batch",
        "run",
        "--input",
        str(input_path),
        "--output",
        str(output),
        "--config",
        str(config),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"plait batch run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    ok = count_ok(output)
    if ok == 0:
        raise RuntimeError(f"plait batch run wrote no answered row:\n{done.stderr[-3000:]}")
    return wall, ok


async def _measured(
    mode: str,
    servers: Sequence[VLLMServer],
    run: Any,
) -> VLLMRow:
    async with httpx.AsyncClient(timeout=60) as http:
        for server in servers:
            await reset_prefix_cache(http, server)
        before = [await metrics(http, s) for s in servers]
        started = time.perf_counter()
        ok = await run()
        wall = time.perf_counter() - started
        after = [await metrics(http, s) for s in servers]
    if isinstance(ok, tuple):  # plait reports its own wall time (the CLI's, start-up included)
        wall, ok = ok

    def delta(key: str) -> float:
        return sum(a.get(key, 0.0) - b.get(key, 0.0) for a, b in zip(after, before, strict=True))

    computed = sum(
        computed_prompt_tokens(a) - computed_prompt_tokens(b)
        for a, b in zip(after, before, strict=True)
    )
    return VLLMRow(mode, len(servers), wall, computed, delta("vllm:prompt_tokens_total"), ok)


def run_batch(workdir: Path, input_path: Path) -> VLLMRow:
    """vLLM's own run-batch on the same file, with the servers' engine flags."""
    output = workdir / "run-batch.jsonl"
    output.unlink(missing_ok=True)
    env = {
        **os.environ,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": str(ROOT / ".cache" / "vllm"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    command = [
        str(VLLM_VENV / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(input_path),
        "-o",
        str(output),
        "--model",
        str(MODEL_DIR),
        "--served-model-name",
        MODEL,
        "--max-model-len",
        "4096",
        "--enable-prefix-caching",
        "--kv-cache-memory-bytes",
        str(int(KV_GIB * 2**30)),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    first_request: float | None = None
    log: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        if first_request is None and _starts_requests(line):
            first_request = time.perf_counter()
    code = proc.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"vLLM run-batch failed ({code}):\n" + "".join(log[-40:]))
    ok = count_ok(output)
    startup = (first_request - started) if first_request is not None else float("nan")
    note = f"(whole process; start-up {startup:.1f} s by its log)"
    return VLLMRow("run-batch", 1, wall, float("nan"), float("nan"), ok, note, startup)


def _starts_requests(line: str) -> bool:
    """run-batch logs "Reading batch from FILE..." once its engine is up, before it submits
    the file's requests (vllm/entrypoints/launchers/run_batch.py, vLLM 0.32)."""
    return "Reading batch from" in line


@contextlib.contextmanager
def servers_started(count: int) -> Iterator[list[VLLMServer]]:
    binds = [{"VLLM_CPU_OMP_THREADS_BIND": str(i)} for i in range(count)]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if count == 1:
        with running([KV_GIB], env=env) as started:
            yield started
        return
    # bind each server to a core of its own (DESIGN.md section 5)
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(running([KV_GIB], env={**env, **bind}))[0] for bind in binds]
        yield started


def cpu_flags() -> str:
    """What decides CPU vLLM's speed here (DESIGN.md section 5): AVX-512 or not."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "avx2")
    return ", ".join(f for f in wanted if f" {f}" in flags) or "none of avx2/avx512"


def ensure_vllm() -> None:
    """The vLLM environment and model (bench/vllm/setup.sh is idempotent: cheap when done)."""
    if (VLLM_VENV / "bin" / "python").exists() and (MODEL_DIR / "config.json").exists():
        return
    print("[batch] setting up vLLM (bench/vllm/setup.sh, several minutes)", file=sys.stderr)
    subprocess.run(["bash", str(ROOT / "bench" / "vllm" / "setup.sh")], check=True)


def measure_vllm(workdir: Path, documents: int, questions: int, seed: int) -> dict[str, float]:
    """Naive and plait on two servers, then plait and run-batch on one; the figures."""
    ensure_vllm()
    rows = openai_rows(documents, questions, seed)
    input_path = workdir / "vllm-input.jsonl"
    write_jsonl(input_path, rows)
    print(f"[batch] vLLM: {len(rows)} rows in {input_path}", file=sys.stderr)
    results: dict[tuple[str, int], VLLMRow] = {}
    with servers_started(2) as two:
        for mode in ("naive", "plait"):
            if mode == "naive":
                row = asyncio.run(_measured("naive", two, lambda: _naive(two, rows)))
            else:

                async def plait_two() -> tuple[float, int]:
                    return await asyncio.to_thread(_plait, workdir, two, input_path)

                row = asyncio.run(_measured("plait", two, plait_two))
            print(f"[batch] {row.text()}", file=sys.stderr)
            results[mode, 2] = row
        one = two[:1]

        async def plait_one() -> tuple[float, int]:
            return await asyncio.to_thread(_plait, workdir, one, input_path)

        row = asyncio.run(_measured("plait", one, plait_one))
        print(f"[batch] {row.text()}", file=sys.stderr)
        results["plait", 1] = row
    row = run_batch(workdir, input_path)  # alone: the servers are stopped
    print(f"[batch] {row.text()}", file=sys.stderr)
    results["run-batch", 1] = row
    naive, plait2, plait1 = results["naive", 2], results["plait", 2], results["plait", 1]
    return {
        "vllm_rows": len(rows),
        "vllm_naive_s": round(naive.wall_s, 2),
        "vllm_plait_s": round(plait2.wall_s, 2),
        "vllm_speedup": round(naive.wall_s / plait2.wall_s, 3),
        "vllm_computed_tokens_ratio": round(plait2.computed_tokens / naive.computed_tokens, 3),
        "vllm_plait_one_server_s": round(plait1.wall_s, 2),
        "vllm_run_batch_s": round(results["run-batch", 1].wall_s, 2),
        "vllm_run_batch_ratio": round(results["run-batch", 1].wall_s / plait1.wall_s, 3),
        # run-batch's time after its engine started (plait's servers were started before)
        "vllm_run_batch_ratio_after_startup": round(
            (results["run-batch", 1].wall_s - results["run-batch", 1].startup_s) / plait1.wall_s,
            3,
        ),
        "vllm_rows_ok_naive": naive.ok,
        "vllm_rows_ok_plait": plait2.ok,
        "vllm_rows_ok_run_batch": results["run-batch", 1].ok,
    }
