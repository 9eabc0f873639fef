"""Replay of the Mooncake FAST'25 traces (bench/traces/mooncake/, Apache-2.0).

Each line is one request: arrival (ms), prompt and output lengths, and one id per
512-token block of the prompt (equal ids mean equal prefixes; id i already encodes blocks
0..i-1). Requests carry no session id, so each is a one-call program. The simulator takes
them as token counts and block hashes (`TraceStep`), no text.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._program import Program, TraceStep

TRACE_BLOCK_TOKENS = 512
TRACES = Path(__file__).resolve().parents[1] / "traces" / "mooncake"


def mooncake_programs(
    name: str, *, limit: int | None = None, time_scale: float = 1.0, path: Path | None = None
) -> list[Program]:
    """Programs of `conversation` or `synthetic` trace; `time_scale` < 1 compresses time."""
    file = path or TRACES / f"{name}_trace.jsonl"
    if not file.is_file():
        raise FileNotFoundError(
            f"no Mooncake trace at {file}; the repository keeps them in bench/traces/mooncake "
            "(name `conversation` or `synthetic`, or pass path=)"
        )
    programs = []
    with file.open() as lines:
        for i, line in enumerate(lines):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            step = TraceStep(
                "call",
                prompt_tokens=int(row["input_length"]),
                output_tokens=max(1, int(row["output_length"])),
                block_ids=tuple(int(h) for h in row["hash_ids"]),
                block_tokens=TRACE_BLOCK_TOKENS,
            )
            arrival = float(row["timestamp"]) / 1000 * time_scale
            programs.append(Program(f"{name}{i}", "mooncake", arrival, (step,)))
    return programs
