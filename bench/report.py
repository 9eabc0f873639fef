"""Render docs/benchmarks.md from bench/report_template.md and the records in bench/results/.

    python bench/report.py            # write docs/benchmarks.md
    python bench/report.py --check    # exit 1, with a diff, if the page is not what they render

The template holds the prose; each `{{ name }}` line in it is replaced by the table that
`TABLES[name]` renders from the result records (bench/_results.py), with the line that says
where its figures come from. No figure is written by hand: a table whose record is missing
stops the rendering and names the command that makes it.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

from _report import ReportError, Results
from _report_tables import TABLES

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TEMPLATE = BENCH / "report_template.md"
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = BENCH / "results"
_MARK = re.compile(r"^\{\{ *([a-z0-9_]+) *\}\}$")


# --- rendering -----------------------------------------------------------------------------------


def render(template: str, results: Results) -> str:
    out: list[str] = []
    used: set[str] = set()
    for line in template.splitlines():
        mark = _MARK.match(line.strip())
        if mark is None:
            out.append(line)
            continue
        name = mark.group(1)
        if name not in TABLES:
            raise ReportError(f"{TEMPLATE.name}: no table named {name!r} in _report_tables.py")
        used.add(name)
        try:
            out.append(TABLES[name](results))
        except KeyError as exc:  # a record from another version of its bench
            raise ReportError(
                f"the table {name} needs the figure {exc} that its record lacks: run the "
                "command in the record again"
            ) from None
    unused = sorted(set(TABLES) - used)
    if unused:
        raise ReportError(f"{TEMPLATE.name} does not place the tables {', '.join(unused)}")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the page; write nothing")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the records (bench/results)")
    parser.add_argument("--template", type=Path, default=TEMPLATE, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=PAGE, help="the page (docs/benchmarks.md)")
    args = parser.parse_args(argv)
    try:
        text = render(args.template.read_text(), Results(args.results))
    except ReportError as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        args.out.write_text(text)
        return 0
    on_disk = args.out.read_text() if args.out.exists() else ""
    if on_disk == text:
        return 0
    diff = difflib.unified_diff(
        on_disk.splitlines(keepends=True),
        text.splitlines(keepends=True),
        f"{args.out} (on disk)",
        f"{args.out} (rendered from {args.results})",
    )
    sys.stderr.writelines(diff)
    print(
        f"report.py: {args.out} is not what the results render; run `python bench/report.py`",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
