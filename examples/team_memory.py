"""A planner-worker-critic team that remembers: run it twice, and the second run reuses the
work the critic approved in the first instead of paying for it again.

    plait run examples/team_memory.py     # plans, works, reviews, remembers
    plait run examples/team_memory.py     # the same goal: approved steps come from memory

The planner splits the goal into steps (a validated `Plan`); for each step the team first
looks in memory (`memory.Memory`, a SQLite file, `team-memory.db` in the current directory
or `$PLAIT_MEMORY`); a step not found there goes to the worker, then to the critic (a
validated `Review`); an approved result is remembered as a fact, with the run as its source.
Facts are versioned: writing a step again adds a version, never destroys the old one, and
nothing but this code writes them (no model rewrites memory).

It runs on the simulated H100 in real time (a few seconds): memory is a real database, and
its I/O happens outside what a virtual clock can see, so this example uses the system
clock. The simulated texts are noise but deterministic, so the second run plans the same
steps and finds them; `fake_backends()` answers readably for the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pydantic

from agents import Agent
from executors import FunctionLLM, SimServer
from memory import Memory, SQLStore
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

CLOCK = "system"  # memory does real I/O: see the docstring
GOAL = "Write a short guide to choosing a KV-cache eviction policy for agent workloads."
NAMESPACE = "team-memory/steps"


class Plan(pydantic.BaseModel):
    steps: list[str] = pydantic.Field(min_length=1, max_length=5)


class Review(pydantic.BaseModel):
    approved: bool
    notes: str


planner = Agent("planner", "You split a goal into 2-5 short, independent steps.",
                model="llama-3.1-8b", max_tokens=120)  # fmt: skip
worker = Agent("worker", "You carry out one step of a plan and report the result briefly.",
               model="llama-3.1-8b", max_tokens=120)  # fmt: skip
critic = Agent("critic", "You review a step's result; approve it only if it does the step.",
               model="llama-3.1-8b", max_tokens=80)  # fmt: skip

MEMORY: dict[str, Memory] = {}


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    """`plait run` opens the team's memory around the run and closes it after."""
    store = SQLStore(os.environ.get("PLAIT_MEMORY", "team-memory.db"))
    await store.open()
    try:
        MEMORY["memory"] = Memory(store)
        yield
    finally:
        MEMORY.clear()
        await store.close()


def step_key(step: str) -> str:
    return " ".join(step.lower().split())[:200] or "-"


async def dispatch(ctx: TaskContext) -> dict[str, str]:
    """For each planned step: from memory if an approved result is there, else work+review."""
    memory = MEMORY["memory"]
    plan: Plan = ctx.input("plan")
    how: dict[str, str] = {}
    for i, step in enumerate(plan.steps):
        known = await memory.fact(NAMESPACE, step_key(step))
        if known is not None:
            ctx.workflow.add(f"recall{i}", _recalled(known.value), before=["report"])
            how[step] = "memory"
            continue
        ctx.workflow.add(f"work{i}", worker.ask(f"Step: {step}\nGoal: {GOAL}"))
        ctx.workflow.add(
            f"review{i}",
            critic.ask(_review_prompt(step, f"work{i}"), output=Review),
            after=[f"work{i}"],
        )
        ctx.workflow.add(
            f"keep{i}", _keeper(step, f"work{i}", f"review{i}"), after=[f"work{i}", f"review{i}"]
        )
        ctx.workflow.add_edge(f"keep{i}", "report")
        how[step] = "worked"
    return how


def _recalled(value: Any) -> Any:
    def recall() -> Any:
        return value

    return recall


def _review_prompt(step: str, work: str) -> Any:
    def prompt(ctx: TaskContext) -> str:
        return f"Step: {step}\nResult: {ctx.input(work)}\nApprove it?"

    return prompt


def _keeper(step: str, work: str, review: str) -> Any:
    async def keep(ctx: TaskContext) -> str:
        verdict = ctx.input(review)
        approved = verdict.approved if isinstance(verdict, Review) else verdict["approved"]
        if approved:
            await MEMORY["memory"].remember(
                NAMESPACE, step_key(step), ctx.input(work), source=ctx.workflow.id
            )
        return str(ctx.input(work))

    return keep


def report(ctx: TaskContext) -> str:
    parts = [str(v) for k, v in sorted(ctx.inputs.items()) if k != "dispatch"]
    return "\n".join(f"- {p}" for p in parts)


def workflows() -> Workflow:
    wf = Workflow("team-memory")
    wf.add("plan", planner.ask(f"Goal: {GOAL}\nAnswer with the steps.", output=Plan))
    wf.add("dispatch", dispatch, after=["plan"])
    wf.add("report", report, after=["dispatch"], trigger="all_done")
    return wf


# --- a readable model for the tests ----------------------------------------------------------


def fake_reply(request: LLMRequest, hints: Hints) -> str:
    system, prompt = request.messages[0].content, request.messages[-1].content
    if system.startswith("You split"):
        return json.dumps({"steps": ["list the policies", "compare them", "recommend one"]})
    if system.startswith("You carry out"):
        step = prompt.splitlines()[0].removeprefix("Step: ")
        return f"Done: {step}."
    approved = "compare" not in prompt  # the critic sends one step back
    return json.dumps({"approved": approved, "notes": "ok" if approved else "too thin"})


def backends(clock: Clock) -> dict[str, LLMBackend]:
    """The simulated H100 serving Llama-3.1-8B (as plait.toml configures it)."""
    # Its verdicts are noise: with seed 2 the simulated critic approves this plan's step.
    return {"default": SimServer("h100-llama3-8b", clock=clock, seed=2)}


def fake_backends(clock: Clock, latency: float = 0.5) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=latency, clock=clock)}
