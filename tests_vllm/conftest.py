"""Fixtures that start a real vLLM (CPU build) on the generated tiny model.

These tests run in `.venv-vllm` (`make test-vllm`), not in the main suite: they need vLLM,
minutes of start-up and most of this machine's two cores.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class VLLMServer:
    url: str
    kv_gib: float
    log: list[str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kv_gib: float) -> tuple[subprocess.Popen[str], threading.Thread, VLLMServer]:
    port = free_port()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "bench" / "vllm" / "serve.sh"), str(port), str(kv_gib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[str | None] = queue.Queue()
    log: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    # Wait for the server to say it is up (an event in its log), not for a wall-clock guess.
    while True:
        try:
            line = lines.get(timeout=STARTUP_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            message = "vLLM did not start within 15 minutes:\n" + "".join(log[-40:])
            raise RuntimeError(message) from None
        if line is None:
            raise RuntimeError("vLLM exited during start-up:\n" + "".join(log[-40:]))
        if "Application startup complete" in line:
            wait_until_listening(port, proc)
            return proc, reader, VLLMServer(f"http://127.0.0.1:{port}", kv_gib, log)


def wait_until_listening(port: int, proc: subprocess.Popen[str]) -> None:
    """uvicorn logs "startup complete" before it listens, and vLLM prints nothing after:
    try to connect a bounded number of times. (Another process's listen() cannot be
    awaited as an event; this is the one wait on wall time in the tests, and it is only
    reached after the server said it is ready.)"""
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError("vLLM exited right after start-up")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"vLLM said it started but port {port} never accepted a connection")


@pytest.fixture(scope="session")
def vllm_small_cache() -> Iterator[VLLMServer]:
    """vLLM with a KV cache of 64 blocks of 128 tokens (0.125 GiB): eviction is real."""
    proc, reader, server = start(0.125)
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=60)  # it ends at the pipe's end of file
        if proc.stdout is not None:
            proc.stdout.close()
