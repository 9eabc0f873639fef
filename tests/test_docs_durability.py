"""docs/durability.md's examples run as written, from a directory with the examples in it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "durability.md"


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **env},
    )


def test_the_durability_examples_run_as_written(tmp_path: Path) -> None:
    record, resume = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)[:2]
    shutil.copytree(ROOT / "examples", tmp_path / "examples")

    recorded = python(record, tmp_path)
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout.startswith("succeeded hello-")

    crash = (
        "from orchestrator.cli._cli import main; "
        "main(['run', 'examples/durable_pipeline.py', '--store', 'runs.db'])"
    )
    killed = python(crash, tmp_path, CRASH="1")
    assert killed.returncode == 137, killed.stderr
    resumed = python(resume, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    lines = resumed.stdout.splitlines()
    assert lines[0].endswith("runs again: ('checkpoint',) keeps 7"), lines
    assert lines[1].endswith(" succeeded"), lines
