"""What bench/report.py renders with: the result records of a directory, and the tables' formats."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class ReportError(Exception):
    """The records cannot render the page; the message names the fix."""


class Results:
    """The result records of one directory, read once each by file name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._read: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str, command: str) -> dict[str, Any]:
        """The record `name` (the file name without .json); `command` makes it."""
        if name not in self._read:
            path = self.directory / f"{name}.json"
            try:
                record = json.loads(path.read_text())
            except FileNotFoundError:
                raise ReportError(f"{path} is missing: run `{command}`") from None
            except ValueError as exc:
                raise ReportError(f"{path} is not JSON ({exc}): run `{command}` again") from None
            if "figures_from" in record:  # a raw result file kept elsewhere in the tree
                raw = ROOT / record["figures_from"]
                try:
                    record["figures"] = json.loads(raw.read_text())
                except (OSError, ValueError) as exc:
                    raise ReportError(f"{path} takes its figures from {raw}: {exc}") from None
            self._read[name] = record
        return self._read[name]


# --- formatting --------------------------------------------------------------------------------


def num(value: Any, spec: str = ",.1f", unit: str = "") -> str:
    """A figure as the tables show it; a missing one as a dash."""
    if value is None:
        return "—"
    return f"{format(value, spec)}{unit}"


def x(value: Any, spec: str = ".2f") -> str:
    return num(value, spec, "x")


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str = "") -> str:
    """A markdown table; `align` has one letter per column, l or r (default: the first
    column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(str(c) for c in line) + " |" for line in lines)


def provenance(*records: dict[str, Any], wall_time: bool = True) -> str:
    """Where the figures above come from: one line per distinct commit and machine. With
    `wall_time`, a run on a machine busier than its cores says its times are slow."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        key = (record.get("source", "run"), str(record.get("commit")), _machine(record))
        groups.setdefault(key, []).append(record)
    return "\n\n".join(f"*{_provenance(group, wall_time)}*" for group in groups.values())


def busy(record: dict[str, Any]) -> bool:
    """The run's machine had more runnable work than cores as it ended."""
    machine = record.get("machine") or {}
    load, cores = machine.get("load_avg"), machine.get("cores")
    return bool(load and cores and load[0] > cores)


def _provenance(group: list[dict[str, Any]], wall_time: bool) -> str:
    first = group[0]
    commands = _commands([r["command"] for r in group])
    dates = sorted({str(r["date"])[:10] for r in group})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    commit = first.get("commit")
    at = f"commit `{commit[:7]}`" if commit else "an unrecorded commit"
    if first.get("dirty"):
        at += " with uncommitted changes"
    load = _load(group)
    machine = _machine(first) + (f", load average {load}" if load else "")
    source = first.get("source", "run")
    if source == "run":
        line = f"Measured by {commands} at {at} on {machine}, {when}."
    else:
        line = f"{source[0].upper()}{source[1:]}: {commands} at {at} on {machine}, {when}."
    notes = [r["note"] for r in group if r.get("note")]
    if wall_time and any(busy(r) for r in group):
        notes.append(
            "The machine was busier than its cores (other work was running): its times are "
            "slower, and its ratios noisier, than on a quiet machine; a target they miss is "
            "not judged."
        )
    return " ".join([line, *dict.fromkeys(notes)])


def _commands(commands: list[str]) -> str:
    """The commands, quoted; several that differ in one argument as one with a letter for
    it (`--seed S` for S = 0, 1, 2)."""
    split = [shlex.split(c) for c in commands]
    if len(split) > 2 and len({len(words) for words in split}) == 1:
        differ = [i for i in range(len(split[0])) if len({words[i] for words in split}) > 1]
        if len(differ) == 1:
            i = differ[0]
            letter = split[0][i - 1].lstrip("-")[:1].upper() if i else "X"
            shown = shlex.join([*split[0][:i], letter, *split[0][i + 1 :]])
            values = ", ".join(words[i] for words in split)
            return f"`{shown}` for {letter} = {values}"
    return "; ".join(f"`{c}`" for c in commands)


def _machine(record: dict[str, Any]) -> str:
    m = record.get("machine") or {}
    if "description" in m:
        return str(m["description"])
    parts = [f"{m.get('cpu', 'an unnamed CPU')} ({m.get('cores', '?')} cores"]
    if m.get("memory_gib"):
        parts.append(f", {m['memory_gib']:g} GiB")
    parts.append(", " + ", ".join(m["gpu"]) if m.get("gpu") else ", no GPU")
    parts.append(f"), Python {m.get('python', '?')}")
    return "".join(parts)


def _load(group: list[dict[str, Any]]) -> str:
    loads = [r["machine"]["load_avg"][0] for r in group if (r.get("machine") or {}).get("load_avg")]
    if not loads:
        return ""
    lo, hi = min(loads), max(loads)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}"
