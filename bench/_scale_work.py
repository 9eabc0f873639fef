"""The workflows of bench/scale.py, in a module of their own so that an engine that takes a
run over finds its functions by name (`_scale_work:noop`, not `__main__:noop`)."""

from __future__ import annotations

import asyncio

from orchestrator import TaskContext, Workflow

TOOL_S = 0.05
"""What one tool call of the tool-heavy workflows waits (an API, a database)."""
SLOW_S = 1.0
"""Each step of the take-over workflows."""


def noop() -> None:
    return None


async def tool(ctx: TaskContext) -> int:
    await asyncio.sleep(TOOL_S)
    return len(ctx.inputs)


async def slow(ctx: TaskContext) -> int:
    await asyncio.sleep(SLOW_S)
    return len(ctx.inputs)


def build(kind: str, name: str) -> Workflow:
    """noop: a chain of 4 no-op steps (what the engine and the store cost); tools: a fan of
    4 tool calls and a join (each call waits TOOL_S, on the engine's "tools" limit);
    slow: 3 steps of SLOW_S (runs left half done by a kill)."""
    wf = Workflow(name)
    if kind == "noop":
        for i in range(4):
            wf.add(f"s{i}", noop, after=[f"s{i - 1}"] if i else [])
    elif kind == "tools":
        for i in range(4):
            wf.add(f"t{i}", tool, resource="tools")
        wf.add("join", noop, after=[f"t{i}" for i in range(4)])
    elif kind == "slow":
        for i in range(3):
            wf.add(f"s{i}", slow, after=[f"s{i - 1}"] if i else [])
    else:
        raise ValueError(f"unknown workflow kind {kind!r}")
    return wf
