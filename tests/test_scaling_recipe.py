"""docs/scaling.md's recipe runs as written: two simulated model servers, a Ray head node and
two engines on the local PostgreSQL; a job submitted to the first engine, which is killed
with SIGKILL while its Ray tasks run, finishes on the second.

The block runs in a copy of examples/ with these changes only: every port it names (the model
servers', the engines', Ray's) is replaced by a free one, in the block and the config alike;
the store's schema is made unique (other runs of the suite share the database; dropped
afterwards), and its user the one the local PostgreSQL lets in. Its home holds a Ray token of
its own in ~/.ray/auth_token, as one left by an earlier `ray.init()`: with it Ray 2.60 turns
token authentication on for the head node alone unless the recipe sets it up for every process,
and the block must work with authentication on and refuse a client without the token."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest
from conftest import PG_HOST, run

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"


def recipe() -> str:
    found = re.search(r"<!-- recipe -->\n```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    assert found, "docs/scaling.md has no recipe block"
    return found.group(1)


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (held open together, so all differ)."""
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]


def run_block(script: str, cwd: Path, env: dict[str, str]) -> tuple[int | str, str, str]:
    """Run the block in its own process group; past 600 s, stop all it started (a SIGTERM
    lets `ray start --block` stop its processes) and answer why."""
    process = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=600)
        return process.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        return "not finished after 600 s", stdout, stderr


@pytest.mark.slow
def test_the_scaling_recipe_runs_as_written(tmp_path: Path, pg_user: str) -> None:
    block = recipe()
    named = sorted({int(p) for p in re.findall(r"(?:--port |:)(\d{4,5})\b", block)})
    assert len(named) == 5, named  # two model servers, Ray, two engines
    ports = dict(zip(named, free_ports(len(named)), strict=True))

    def moved(text: str) -> str:
        return re.sub(r"\b\d{4,5}\b", lambda m: str(ports.get(int(m[0]), m[0])), text)

    schema = f"plait_recipe_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    config = tmp_path / "examples" / "cluster.toml"
    text = moved(config.read_text()).replace("schema=plait_cluster", f"schema={schema}")
    config.write_text(text.replace("//postgres@", f"//{pg_user}@"))
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(uuid.uuid4().hex)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    # After the block, in its shell: Ray answers a client with the recipe's settings and
    # refuses one without its token.
    head = re.search(r"ray start --head --port (\d+)", block)
    assert head, "the recipe starts no Ray head node"
    gcs = f"127.0.0.1:{ports[int(head[1])]}"
    probe = (
        f"\ntimeout 60 ray status --address {gcs} > /dev/null\n"
        "if RAY_AUTH_TOKEN= RAY_AUTH_MODE=disabled HOME=/nonexistent timeout 60 "
        f"ray status --address {gcs} > /dev/null 2>&1; then\n"
        "  echo 'Ray let in a client without the token' >&2; exit 3\nfi\n"
    )
    try:
        returncode, stdout, stderr = run_block(moved(block) + probe, tmp_path, env)
        logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
        assert returncode == 0, (stderr[-3000:], logs)
        result = json.loads(stdout.strip().splitlines()[-1])
        assert result["status"] == "succeeded", result
        assert result["results"]["sum"] == 148933
        assert result["results"]["report"]
        # The second engine finished it: the first was killed before the job was done.
        first = re.search(r"engine (\S+);", logs["engine1.log"])
        second = re.search(r"engine (\S+);", logs["engine2.log"])
        assert first and second

        async def owner() -> str:
            conn = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
            try:
                got = await conn.fetchval(
                    f'SELECT owner FROM "{schema}".plait_workflows WHERE id = $1', result["id"]
                )
                return str(got)
            finally:
                await conn.close()

        assert run(owner()) == second.group(1) != first.group(1)
    finally:

        async def drop() -> None:
            conn = await asyncpg.connect(f"postgresql://{pg_user}@{PG_HOST}/test")
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()

        run(drop())
