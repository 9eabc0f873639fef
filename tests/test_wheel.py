"""What gets installed. A wheel built from the repository runs on its own: installed in a fresh
virtual environment with the repository off its path, `plait serve` starts, the typed client
talks to it, and a workflow (a function, a tool and an agent on the simulator, in a SQLite
store) succeeds. `make demo` installs plait without extras.

The fresh environment gets the wheel's dependencies from this interpreter's site-packages
through a `.pth` line naming that directory: a plain path, so the `.pth` files inside it (the
editable install of this checkout among them) are not run, and only the wheel provides plait."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Top-level entries of the checkout the build does not need (and some large ones).
NOT_COPIED = {".git", ".venv", ".venv-vllm", "build", "dist", "out", "bench", "tests"}
TOKEN = "wheel-token"
PACKAGES = ("orchestrator", "executors", "agents", "memory")

REGISTRY = '''
from agents import Agent, tool
from orchestrator import Registry, TaskContext

writer = Agent("writer", "You write one short line.", max_tokens=8)


@tool
def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: the text to count.
    """
    return len(text.split())


def total(ctx: TaskContext) -> int:
    return sum(int(v) for v in ctx.inputs.values())


registry = Registry(writer, word_count, total)
'''

CONFIG = f"""
[service]
host = "127.0.0.1"
port = 0
store = "serve.db"
registry = ["registry.py"]
drain_s = 1

[[tenants]]
name = "wheel"
token_sha256 = "{hashlib.sha256(TOKEN.encode()).hexdigest()}"

[engine]
clock = "system"

[backends.default]
kind = "sim"
profile = "h100-llama3-8b"
seed = 0
"""

CLIENT = """
import asyncio, json, sys

import agents, executors, memory, orchestrator, orchestrator.service
from orchestrator.client import Client

SPEC = {
    "name": "wheel",
    "tasks": [
        {"id": "a", "tool": "word_count", "args": {"text": "one two three"}},
        {"id": "b", "tool": "word_count", "args": {"text": "four five"}},
        {"id": "sum", "function": "total", "after": ["a", "b"]},
        {"id": "line", "agent": "writer", "prompt": "There are ${sum} words.", "after": ["sum"]},
    ],
}


async def main() -> None:
    async with Client(sys.argv[1], token=sys.argv[2]) as plait:
        accepted = await plait.submit(SPEC)
        result = await plait.result(accepted.id, wait=60)
    files = [m.__file__ for m in (agents, executors, memory, orchestrator, orchestrator.service)]
    print(json.dumps({"status": result.status, "results": result.results, "files": files}))


asyncio.run(main())
"""


def _copy_ignored(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == ROOT
    return {
        n
        for n in names
        if (top and n in NOT_COPIED) or n == "__pycache__" or n.endswith((".egg-info", "_cache"))
    }


@pytest.mark.slow
def test_a_wheel_installed_alone_serves_and_runs_a_workflow(tmp_path: Path) -> None:
    # Built from a copy: a build in the checkout would leave build/ and *.egg-info there.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_copy_ignored)
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w", str(wheels)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("plait-*.whl")
    # Every file of the packages is in it (code, migrations, py.typed, the page).
    packaged = set(zipfile.ZipFile(wheel).namelist())
    files = {
        str(f.relative_to(source))
        for root in PACKAGES
        for f in (source / root).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }
    assert files - packaged == set()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python, plait = venv / "bin" / "python", venv / "bin" / "plait"
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"

    def in_venv(*args: str | Path, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in args], cwd=work, env=env, capture_output=True, text=True, **kw
        )

    site = Path(in_venv(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                .stdout.strip())  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    before = in_venv(python, "-c", "import orchestrator")
    assert "No module named 'orchestrator'" in before.stderr, "the checkout is importable"

    installed = in_venv(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    helped = in_venv(plait, "serve", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--config" in helped.stdout

    (work / "registry.py").write_text(REGISTRY)
    (work / "serve.toml").write_text(CONFIG)
    (work / "client.py").write_text(CLIENT)
    server = subprocess.Popen(
        [str(plait), "serve", "--config", "serve.toml"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        seen: list[str] = []
        while "listening on" not in (seen[-1] if seen else ""):
            line = server.stdout.readline()
            assert line, f"plait serve exited before listening: {''.join(seen)}"
            seen.append(line)
        url = next(w for w in seen[-1].split() if w.startswith("http://"))
        ran = in_venv(python, "client.py", url, TOKEN, timeout=120)
        assert ran.returncode == 0, ran.stderr[-3000:]
    finally:
        server.terminate()
        server.communicate(timeout=60)
    answer = json.loads(ran.stdout.strip().splitlines()[-1])
    assert answer["status"] == "succeeded", answer
    assert answer["results"]["sum"] == 5
    assert answer["results"]["line"]
    assert all(Path(f).is_relative_to(site) for f in answer["files"]), answer["files"]


def test_make_demo_installs_plait_alone(tmp_path: Path) -> None:
    # The commands make would run for a fresh environment, shown and not run.
    shown = subprocess.run(
        ["make", "-n", "demo", "batch-demo", f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installs = [
        line.split(" pip install ")[1] for line in shown.splitlines() if " pip install " in line
    ]
    assert installs == ["-q --upgrade pip", "-q -e ."], shown


def test_the_readme_says_how_to_install_each_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install") :]
    for name in extras:
        assert re.search(rf"pip install[^\n]*\.\[[a-z,]*\b{name}\b", install), name
