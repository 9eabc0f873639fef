"""docs/scaling.md's recipe runs as written: two simulated model servers, a Ray head node and
two engines on the local PostgreSQL; a job submitted to the first engine, which is killed
with SIGKILL while its Ray tasks run, finishes on the second.

The block runs in a copy of examples/ with one change: the store's schema is made unique
(other runs of the suite share the database; dropped afterwards), and its user the one the
local PostgreSQL lets in."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
from conftest import PG_HOST, run

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"


def recipe() -> str:
    found = re.search(r"<!-- recipe -->\n```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    assert found, "docs/scaling.md has no recipe block"
    return found.group(1)


def test_the_scaling_recipe_runs_as_written(tmp_path: Path, pg_user: str) -> None:
    for port in (8101, 8102, 8471, 8472, 6390):
        probe = subprocess.run(
            ["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True, check=False
        )
        assert probe.returncode != 0, f"port {port}, which the recipe uses, is taken"
    schema = f"plait_recipe_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    config = tmp_path / "examples" / "cluster.toml"
    text = config.read_text().replace("schema=plait_cluster", f"schema={schema}")
    config.write_text(text.replace("//postgres@", f"//{pg_user}@"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    try:
        done = subprocess.run(
            ["bash", "-c", recipe()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        logs = {p.name: p.read_text()[-2000:] for p in tmp_path.glob("*.log")}
        assert done.returncode == 0, (done.stderr[-3000:], logs)
        result = json.loads(done.stdout.strip().splitlines()[-1])
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
