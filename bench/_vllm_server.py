"""Start real vLLM servers (CPU build, bench/vllm/serve.sh) and read their counters.

Used by the real-vLLM tests (tests_vllm/conftest.py) and benchmark (bench/vllm_cpu.py).
A server is ready when its log says so (an event), then once its port accepts a
connection; servers started together start up side by side.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SERVE = ROOT / "bench" / "vllm" / "serve.sh"
STARTUP_TIMEOUT_S = 900.0
BLOCK_TOKENS = 128
"""vLLM's KV block size on the CPU."""


@dataclass(frozen=True)
class VLLMServer:
    url: str
    """http://127.0.0.1:PORT (the OpenAI API is under /v1)."""
    kv_gib: float
    log: list[str]


@dataclass
class _Launched:
    proc: subprocess.Popen[str]
    port: int
    kv_gib: float
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    log: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(kv_gib: float, env: Mapping[str, str] | None = None) -> _Launched:
    """Start serve.sh in the background on a free port; its log is read by a thread."""
    port = free_port()
    proc = subprocess.Popen(
        ["bash", str(SERVE), str(port), str(kv_gib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    launched = _Launched(proc, port, kv_gib)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            launched.log.append(line)
            launched.lines.put(line)
        launched.lines.put(None)

    launched.reader = threading.Thread(target=pump, daemon=True)
    launched.reader.start()
    return launched


def wait_ready(launched: _Launched, timeout_s: float = STARTUP_TIMEOUT_S) -> VLLMServer:
    """Wait for the server to say it is up (an event in its log), not for a wall-clock guess."""
    while True:
        try:
            line = launched.lines.get(timeout=timeout_s)
        except queue.Empty:
            launched.proc.kill()
            message = f"vLLM did not start within {timeout_s:g} s:\n" + "".join(launched.log[-40:])
            raise RuntimeError(message) from None
        if line is None:
            raise RuntimeError("vLLM exited during start-up:\n" + "".join(launched.log[-40:]))
        if "Application startup complete" in line:
            wait_until_listening(launched.port, launched.proc)
            return VLLMServer(f"http://127.0.0.1:{launched.port}", launched.kv_gib, launched.log)


def wait_until_listening(port: int, proc: subprocess.Popen[str]) -> None:
    """uvicorn logs "startup complete" before it listens, and vLLM prints nothing after:
    try to connect a bounded number of times. (Another process's listen() cannot be
    awaited as an event; this is the one wait on wall time, and it is only reached after
    the server said it is ready.)"""
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("vLLM exited right after start-up")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"vLLM said it started but port {port} never accepted a connection")


def stop(launched: _Launched) -> None:
    proc = launched.proc
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if launched.reader is not None:
        launched.reader.join(timeout=60)  # it ends at the pipe's end of file
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def running(
    kv_gibs: Sequence[float], env: Mapping[str, str] | None = None
) -> Iterator[list[VLLMServer]]:
    """One server per entry of `kv_gibs`, started side by side; all stopped on exit."""
    launched: list[_Launched] = []
    try:
        for kv in kv_gibs:
            launched.append(launch(kv, env))
        yield [wait_ready(one) for one in launched]
    finally:
        for one in launched:
            stop(one)


# --- counters ----------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {name or name{source=...}: value}, summed over other labels."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, value = line.rpartition(" ")
        base = name.split("{", 1)[0]
        key = base
        if base == "vllm:prompt_tokens_by_source_total":
            source = name.split('source="', 1)[1].split('"', 1)[0]
            key = f"{base}[{source}]"
        try:
            values[key] = values.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return values


async def metrics(http: httpx.AsyncClient, server: VLLMServer) -> dict[str, float]:
    response = await http.get(f"{server.url}/metrics")
    response.raise_for_status()
    return parse_metrics(response.text)


def computed_prompt_tokens(values: Mapping[str, float]) -> float:
    """Prompt tokens the server computed rather than served from its prefix cache."""
    local = values.get("vllm:prompt_tokens_by_source_total[local_compute]")
    if local is not None:
        return local
    return values.get("vllm:prompt_tokens_total", 0.0) - values.get(
        "vllm:prefix_cache_hits_total", 0.0
    )


async def reset_prefix_cache(http: httpx.AsyncClient, server: VLLMServer) -> None:
    """Empty the server's prefix cache (needs VLLM_SERVER_DEV_MODE=1 on the server)."""
    response = await http.post(f"{server.url}/reset_prefix_cache")
    if response.status_code == 404:
        raise RuntimeError(
            f"{server.url} has no /reset_prefix_cache: start it with VLLM_SERVER_DEV_MODE=1"
        )
    response.raise_for_status()
    if not response.json().get("success", False):
        raise RuntimeError(f"{server.url} refused to reset its prefix cache (requests running?)")
