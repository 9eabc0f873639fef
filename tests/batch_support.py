"""Backends and workflow factories that `plait batch run` loads in tests (by file path)."""

from __future__ import annotations

import os
from typing import Any

from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMRequest, TaskContext, Workflow
from orchestrator.ext import BackendRequestError


def _answer(request: LLMRequest, hints: Hints) -> str:
    prompt = request.messages[-1].content
    log = os.environ.get("BATCH_CALL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as out:  # one line per call sent
            out.write(prompt + "\n")
            out.flush()
    if prompt in os.environ.get("BATCH_REFUSE", "").split(","):  # for good: a 400
        raise BackendRequestError("the server refuses this prompt", status=400)
    return f"answer to {prompt}"


def backends(clock: Clock) -> dict[str, Any]:
    """Calls take `BATCH_LATENCY` seconds (default 0.02) and are logged to $BATCH_CALL_LOG;
    the prompts listed in $BATCH_REFUSE (comma-separated) are refused with a 400."""
    latency = float(os.environ.get("BATCH_LATENCY", "0.02"))
    return {"default": FunctionLLM(_answer, latency=latency, clock=clock)}


def upper(ctx: TaskContext) -> str:
    return str(ctx.inputs["ask"]).upper()


def per_row(row: dict[str, Any]) -> Workflow:
    """Two tasks per row: an LLM call on the row's question, then a function of its answer."""
    if row.get("question") == "boom":
        raise ValueError("this row cannot be planned")
    from agents import Agent

    wf = Workflow(f"row-{row['id']}")
    wf.add("ask", Agent("analyst", "You answer.").ask(f"Q: {row['question']}"))
    wf.add("shout", upper, after=["ask"])
    return wf
