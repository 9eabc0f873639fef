"""A benchmark's figures kept as bench/results/<bench>[-<variant>].json with their provenance.

Every benchmark prints its figures as the last line of stdout; run from the command line it
also hands them to `save`, which writes one JSON record: the figures, the command line that
made them, the git commit (and whether the tree had other changes), the machine and the UTC
date. `bench/report.py` renders docs/benchmarks.md from these records.

The file name is the bench's name and the options that differ from their defaults, in
alphabetical order (`deadlines-part1-seed3.json`, `jct-quick.json`, `batch-no-vllm.json`), so
quick and full runs, parts and seeds keep files of their own. A bench's main called from
Python (a test) writes nothing unless given `--results DIR`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
ENV = "PLAIT_BENCH_RESULTS"
"""Where command-line runs write when `--results` is not given (bench/compare.py sets it)."""

_NOT_IN_NAME = frozenset({"results", "no_save"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark takes for its result file. The commit is read here, as
    the run starts, so a checkout that moves during a long run does not change it."""
    parser.set_defaults(results_commit=git_commit())
    parser.add_argument(
        "--results",
        type=Path,
        metavar="DIR",
        help=f"write the result record under DIR (default bench/results, or ${ENV})",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="print the figures only; write no result file"
    )


def variant(
    parser: argparse.ArgumentParser, args: argparse.Namespace, ignore: Iterable[str] = ()
) -> str:
    """The options of `args` that differ from the parser's defaults, as a file-name part in
    the options' alphabetical order: `--seed 3 --part 1` gives "part1-seed3", `--no-vllm`
    "no-vllm", a repeated `--lane` one part each, nothing "". Options in `ignore` (where
    output goes, not what is measured) are left out."""
    skip = _NOT_IN_NAME | set(ignore)
    named: list[tuple[str, list[str]]] = []
    for action in parser._actions:  # argparse keeps no public list of its options
        value = getattr(args, action.dest, None)
        if action.dest in skip or not action.option_strings or action.dest == "help":
            continue
        if value == action.default or value in (None, [], False):
            continue
        flag = action.option_strings[-1].lstrip("-")
        if value is True:
            named.append((flag, [flag]))
        else:
            items = value if isinstance(value, list) else [value]
            named.append((flag, [flag + _slug(str(item)) for item in items]))
    return "-".join(part for _, parts in sorted(named) for part in parts)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def file_name(bench: str, variant_: str) -> str:
    return f"{bench}-{variant_}.json" if variant_ else f"{bench}.json"


def command(bench: str, argv: Sequence[str]) -> str:
    """The command line as a user types it in the repository root."""
    return shlex.join(["python", f"bench/{bench}.py", *argv])


def git_commit(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """HEAD's commit and whether the tree differs from it (results files aside), or Nones
    outside a git checkout."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        changes = _git(root, "status", "--porcelain", "--", ".", ":(exclude)bench/results")
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return head, bool(changes)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def machine() -> dict[str, Any]:
    """What the figures were measured on; the load averages say how busy the machine was
    (taken as the run ends, the 1-minute one is mostly the run itself)."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "gpu": _gpus(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gpus() -> list[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] or None


def record(
    bench: str,
    variant_: str,
    figures: Mapping[str, Any],
    argv: Sequence[str],
    *,
    commit: tuple[str | None, bool | None] | None = None,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The result record of one run: provenance first, then the figures as printed.
    `commit` is (commit, dirty) as the run started; read now when not given."""
    head, dirty = commit or git_commit()
    when = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    return {
        "bench": bench,
        "variant": variant_,
        "source": "run",
        "command": command(bench, argv),
        "commit": head,
        "dirty": dirty,
        "machine": machine(),
        "date": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "figures": dict(figures),
    }


def write(directory: Path, rec: Mapping[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / file_name(rec["bench"], rec["variant"])
    path.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    return path


def save(
    bench: str,
    figures: Mapping[str, Any],
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    *,
    ignore: Iterable[str] = (),
    label: str = "",
) -> Path | None:
    """Write the run's record where `--results` (or the default) says, and name the file on
    stderr; nothing with `--no-save`, or when main was called from Python (`argv` given)
    without `--results`. `label` is a part of the file name that no option gives. Call it
    after the figures' line: it prints nothing to stdout."""
    if args.no_save:
        return None
    directory: Path | None = args.results
    if directory is None and argv is None:
        directory = Path(os.environ.get(ENV) or RESULTS)
    if directory is None:
        return None
    given = sys.argv[1:] if argv is None else list(argv)
    name = "-".join(part for part in (label, variant(parser, args, ignore)) if part)
    started = getattr(args, "results_commit", None)
    path = write(directory, record(bench, name, figures, given, commit=started))
    print(f"results: {_shown(path)}", file=sys.stderr)
    return path


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
