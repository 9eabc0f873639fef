"""Before and after: the same benchmarks on a base commit and on the working tree, one machine.

    python bench/compare.py                       # base: the merge-base with main (or HEAD~1)
    python bench/compare.py --base HEAD --only jct,batch
    python bench/compare.py --quick               # the quick sizes only: a smoke test

The base is checked out into a temporary git worktree. Each benchmark runs at the base, then
at the working tree, pair by pair, so a machine that gets busier slows both sides of a pair
alike. Each run's last stdout line is its JSON figures; the figures below are compared with
their tolerances and printed with PASS or FAIL, and the whole is written to
bench/results/compare.json. The exit status is 0 when every figure is within its tolerance,
1 when one is not, 2 when a run failed.

The set (`--only` takes these names, or `deadlines`, `jct`, `batch`, `overhead` for a group):

- deadlines-part1-seed0 .. seed4: `deadlines.py --part 1 --seed S` (a few minutes each)
- deadlines-quick: `deadlines.py --quick`; deadlines-part2: `deadlines.py --part 2`
- jct-quick: `jct.py --quick`; batch: `batch.py --no-vllm`
- overhead-quick: `overhead.py --quick --only plait,asyncio`

Tolerances: deadline attainment, batch throughput share and cache-hit shares within 0.01
(absolute); JCT, makespan and prompt-token ratios within 2%; engine overhead (plait's
microseconds per task, build time, bytes per pending task) within 5%. asyncio's microseconds
per task are shown without a tolerance: how much the machine itself drifted between runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import _results

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Bench:
    name: str
    group: str
    args: tuple[str, ...]
    full: bool = True
    """In the default set."""
    smoke: bool = False
    """In the `--quick` set."""


PART1 = ("deadlines.py", "--part", "1", "--seed")
SET = (
    *(Bench(f"deadlines-part1-seed{s}", "deadlines", (*PART1, f"{s}")) for s in range(5)),
    Bench("deadlines-quick", "deadlines", ("deadlines.py", "--quick"), smoke=True),
    Bench("deadlines-part2", "deadlines", ("deadlines.py", "--part", "2")),
    Bench("jct-quick", "jct", ("jct.py", "--quick"), smoke=True),
    Bench("batch", "batch", ("batch.py", "--no-vllm")),
    Bench("batch-quick", "batch", ("batch.py", "--quick", "--no-vllm"), full=False, smoke=True),
    Bench("overhead-quick", "overhead", ("overhead.py", "--quick", "--only", "plait,asyncio"),
          smoke=True),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Tolerance:
    kind: Literal["abs", "rel", "info"]
    bound: float

    def allows(self, base: float, head: float) -> bool:
        if self.kind == "info":
            return True
        if self.kind == "abs":
            return abs(head - base) <= self.bound + 1e-12
        if base == 0:
            return head == 0
        return abs(head - base) / abs(base) <= self.bound + 1e-12

    def text(self) -> str:
        if self.kind == "info":
            return "(machine drift)"
        return f"±{self.bound:g}" if self.kind == "abs" else f"±{self.bound:.0%}"


ATTAINMENT = Tolerance("abs", 0.01)
RATIO = Tolerance("rel", 0.02)
OVERHEAD = Tolerance("rel", 0.05)
# Which figures are compared, by the bench's JSON keys (dotted for nested ones); first match.
RULES: tuple[tuple[str, re.Pattern[str], Tolerance], ...] = (
    ("deadlines", re.compile(r"(interactive_attainment|sql_attainment)\w*"), ATTAINMENT),
    ("deadlines", re.compile(r"batch_throughput_share\w*|lane_sweep\..*"), ATTAINMENT),
    ("jct", re.compile(r"\w*jct_ratio|batch_throughput_ratio|batch_prompt_tokens_vs_bound"), RATIO),
    ("jct", re.compile(r"sql_deadline_attainment_\w+"), ATTAINMENT),
    ("jct", re.compile(r"(agents|batch)_cache_hit_(naive|plait)"), ATTAINMENT),
    ("batch", re.compile(r"sim_(grouped_)?speedup|sim_\w*prompt_tokens_vs_bound"), RATIO),
    ("batch", re.compile(r"sim_\w+_cache_hit"), ATTAINMENT),
    ("overhead", re.compile(r"plait_(build_)?us_per_task"), OVERHEAD),
    ("overhead", re.compile(r"bytes_per_pending_task|dag100k_s"), OVERHEAD),
    ("overhead", re.compile(r"asyncio_us_per_task"), Tolerance("info", 0.0)),
)  # fmt: skip


def compared(group: str, figures: dict[str, Any]) -> Iterator[tuple[str, float, Tolerance]]:
    """The figures of one run that have a tolerance, in the JSON's order."""
    for key, value in _leaves(figures):
        for rule_group, pattern, tolerance in RULES:
            if rule_group == group and pattern.fullmatch(key):
                yield key, value, tolerance
                break


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{prefix}.{i}")
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        yield prefix, float(value)


def compare(group: str, base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per compared figure: both values, the change, the tolerance, the verdict. A
    figure on one side only fails (the bench's JSON changed shape)."""
    before = {k: (v, t) for k, v, t in compared(group, base)}
    after = {k: (v, t) for k, v, t in compared(group, head)}
    rows = []
    for key in [*before, *(k for k in after if k not in before)]:
        b, a = before.get(key), after.get(key)
        tolerance = (b or a)[1]  # type: ignore[index]
        if b is None or a is None:
            rows.append(
                {
                    "figure": key,
                    "base": b and b[0],
                    "head": a and a[0],
                    "tolerance": tolerance.text(),
                    "ok": False,
                }
            )
            continue
        rows.append(
            {
                "figure": key,
                "base": b[0],
                "head": a[0],
                "tolerance": tolerance.text(),
                "ok": tolerance.allows(b[0], a[0]),
                "info": tolerance.kind == "info",
            }
        )
    return rows


class RunFailed(Exception):
    pass


def run_bench(tree: Path, bench: Bench, python: str, log: Path, results: Path) -> dict[str, Any]:
    """Run one bench in `tree` (its own code first on the path) and parse its last line."""
    env = dict(os.environ, PYTHONPATH=str(tree), **{_results.ENV: str(results)})
    command = [python, str(tree / "bench" / bench.args[0]), *bench.args[1:]]
    started = time.perf_counter()
    with log.open("w") as err:
        done = subprocess.run(
            command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=err, text=True
        )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        tail = log.read_text().splitlines()[-15:]
        raise RunFailed(f"{bench.name} in {tree} exited {done.returncode}:\n" + "\n".join(tail))
    try:
        figures: dict[str, Any] = json.loads(lines[-1])
    except ValueError as exc:
        raise RunFailed(f"{bench.name} in {tree}: the last line is not JSON ({exc})") from None
    figures.setdefault("_wall_s", round(time.perf_counter() - started, 1))
    return figures


def default_base() -> str:
    for ref in ("main", "origin/main"):
        done = subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", ref], capture_output=True, text=True
        )
        head = _git("rev-parse", "HEAD")
        if done.returncode == 0 and done.stdout.strip() and done.stdout.strip() != head:
            return done.stdout.strip()
    return _git("rev-parse", "HEAD~1")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def selected(only: str | None, quick: bool) -> list[Bench]:
    """The set's benches to run: all of the default (or `--quick`) set, or those `only` names,
    a group's name standing for its benches in that set."""
    in_set = [b for b in SET if (b.smoke if quick else b.full)]
    if only is None:
        return in_set
    names = {n.strip() for n in only.split(",") if n.strip()}
    known = {b.name for b in SET} | {b.group for b in SET}
    if unknown := sorted(names - known):
        raise SystemExit(
            f"compare.py: error: --only {', '.join(unknown)}: not in the set; give names from "
            f"{', '.join(sorted(known))}"
        )
    groups = names & {b.group for b in SET}  # "batch" is a group before it is a name
    return [b for b in SET if (b.group in groups and b in in_set) or b.name in names - groups]


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = (
        f"{'bench':<22} {'figure':<44} {'base':>10} {'head':>10} {'change':>9} {'tolerance':>15}  "
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        b, h = r["base"], r["head"]
        change = "" if b is None or h is None else f"{h - b:+.4g}"
        verdict = "" if r.get("info") else ("PASS" if r["ok"] else "FAIL")
        lines.append(
            f"{r['bench']:<22} {r['figure'][:44]:<44} {_v(b):>10} {_v(h):>10} {change:>9} "
            f"{r['tolerance']:>15}  {verdict}"
        )
    return "\n".join(lines)


def _v(value: float | None) -> str:
    return "missing" if value is None else f"{value:.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="the commit to compare with (default: merge-base with main)")
    parser.add_argument("--only", help="comma-separated names or groups of the set")
    parser.add_argument("--quick", action="store_true", help="the quick sizes only (a smoke test)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run them with")
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    benches = selected(args.only, args.quick)
    base = _git("rev-parse", args.base or default_base())
    head, dirty = _results.git_commit()
    print(
        f"base {base[:10]} against the working tree ({(head or '?')[:10]}"
        f"{', with uncommitted changes' if dirty else ''}): {', '.join(b.name for b in benches)}",
        file=sys.stderr,
    )
    rows: list[dict[str, Any]] = []
    walls: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="plait-compare-") as tmp:
        work = Path(tmp)
        tree = work / "base"
        _git("worktree", "add", "--detach", str(tree), base)
        try:
            for bench in benches:
                side: dict[str, dict[str, Any]] = {}
                for label, root in (("base", tree), ("head", ROOT)):
                    print(f"{bench.name} at {label}...", file=sys.stderr, flush=True)
                    log = work / f"{bench.name}-{label}.log"
                    try:
                        side[label] = run_bench(root, bench, args.python, log, work / label)
                    except RunFailed as exc:
                        print(f"compare.py: {exc}", file=sys.stderr)
                        return 2
                walls[bench.name] = {k: v.get("_wall_s", 0.0) for k, v in side.items()}
                for row in compare(bench.group, side["base"], side["head"]):
                    rows.append({"bench": bench.name, **row})
        finally:
            _git("worktree", "remove", "--force", str(tree))
    print(table(rows))
    failed = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} figures within tolerance")
    for r in failed:
        print(f"FAIL: {r['bench']} {r['figure']}: {_v(r['base'])} -> {_v(r['head'])}")
    figures = {
        "base": base,
        "benches": [b.name for b in benches],
        "passed": not failed,
        "rows": rows,
        "wall_s": walls,
    }
    ignore = ("base", "only", "quick", "python")  # one compare.json, the latest
    _results.save("compare", figures, parser, args, argv, ignore=ignore)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
