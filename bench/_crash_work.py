"""The crash harness's workflows (bench/crash.py): agent turns, tool calls, an agent loop in a
function, and a planner that adds tasks and edges while the run goes on; each one small (8
to 11 tasks, 4 to 8 LLM calls) and deterministic given its name, so that `expected(name)`
says every task's result without running anything.

Everything a resumed run names is defined here at the top level (`REGISTRY`), so a new
process finds it by import as `_crash_work:...`. Replies come from the recording server's
`answer()`; a prompt quotes an earlier reply upper-cased (`_quote`), so a reply's lower-case
pattern appears in the store only where the reply itself was stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import zlib
from typing import Any

from _recording_llm import answer

from agents import Agent, Tool
from orchestrator import Message, TaskContext, Workflow

RESEARCHER = Agent("researcher", "You research one topic and answer briefly.")
WRITER = Agent("writer", "You write one section at a time.")


def _quote(reply: str) -> str:
    return reply.upper()


def _reply(agent: Agent, prompt: str, history: tuple[tuple[str, str], ...] = ()) -> str:
    return answer((("system", agent.system_prompt), *history, ("user", prompt)))


# --- tools -----------------------------------------------------------------------------------


def notes(topic: str, count: int) -> list[str]:
    """A sync tool (it runs in a worker thread)."""
    return [f"{topic}: note {i}" for i in range(count)]


async def score(text: str) -> int:
    """An async tool."""
    await asyncio.sleep(0)
    return int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) % 1000


NOTES = Tool("notes", notes, "Notes on a topic.")
SCORE = Tool("score", score, "Scores a text.")


# --- prompts, as text from values (used by the tasks and by `expected`) -----------------------


def _brief_prompt(name: str) -> str:
    return f"Brief me on topic {name}."


def _draft_prompt(brief: str, facts: list[str]) -> str:
    return f"Draft from {_quote(brief)} with {'; '.join(facts)}."


def _section_prompt(task_id: str, draft: str) -> str:
    return f"Write {task_id} of {_quote(draft)}."


def _outline_prompt(draft: str) -> str:
    return f"Outline {_quote(draft)}."


def _question(turn: int, brief: str) -> str:
    return f"Question {turn} on {_quote(brief)}?"


def _sections(draft: str) -> int:
    return 1 + int(draft[-1], 16) % 3


def _has_loop(name: str) -> bool:
    return zlib.crc32(name.encode()) % 2 == 0


# --- task functions --------------------------------------------------------------------------


def draft_prompt(ctx: TaskContext) -> str:
    return _draft_prompt(ctx.input("brief"), ctx.input("notes"))


def section_prompt(ctx: TaskContext) -> str:
    return _section_prompt(ctx.task_id, ctx.input("draft"))


async def plan(ctx: TaskContext) -> dict[str, Any]:
    """Adds one LLM section per part (1 to 3) while the run goes on, asks for an outline, then
    adds a polish step: the sections feed `final` through `before=`, the polish step through
    `add_edge`. A kill during the outline call leaves sections in the log that the planner,
    run again, adds again."""
    draft = ctx.input("draft")
    count = _sections(draft)
    for i in range(count):
        ctx.workflow.add(
            f"section {i}", WRITER.ask(section_prompt), after=["draft"], before=["final"]
        )
    outline = await ctx.complete(WRITER.request(_outline_prompt(draft)))
    ctx.workflow.add("polish", polish, after=["section 0"])
    ctx.workflow.add_edge("polish", "final")
    return {"sections": count, "outline": outline.text}


def polish(ctx: TaskContext) -> str:
    return f"polished {_quote(ctx.input('section 0'))}"


async def loop(ctx: TaskContext) -> list[str]:
    """An agent loop inside a function: two turns through `ctx.complete`, the second with the
    first in its history. A kill between the two is what the store's call records are for:
    the task runs again, and its first call must be answered from the store."""
    brief = ctx.input("brief")
    first = _question(1, brief)
    reply = await ctx.complete(RESEARCHER.request(first))
    history = (Message("user", first), Message("assistant", _quote(reply.text)))
    second = await ctx.complete(RESEARCHER.request(_question(2, brief), history=history))
    return [reply.text, second.text]


def final(ctx: TaskContext) -> dict[str, Any]:
    """A sync function joining everything (replies quoted, see the module docstring)."""
    count = ctx.input("plan")["sections"]
    return {
        "sections": [_quote(ctx.input(f"section {i}")) for i in range(count)],
        "polish": ctx.input("polish"),
        "loop": [_quote(reply) for reply in ctx.inputs.get("loop", ())],
    }


def score_args(ctx: TaskContext) -> dict[str, Any]:
    return {"text": json.dumps(ctx.input("final"), sort_keys=True)}


REGISTRY_ENTRIES = (
    RESEARCHER,
    WRITER,
    NOTES,
    SCORE,
    draft_prompt,
    section_prompt,
    plan,
    polish,
    loop,
    final,
    score_args,
)
"""What a resumed run names: pass to `Registry(*REGISTRY_ENTRIES)`."""


# --- the workflows and what they must produce ------------------------------------------------


def build(name: str) -> Workflow:
    wf = Workflow(name)
    wf.add("notes", NOTES.call({"topic": name, "count": 2 + zlib.crc32(name.encode()) % 3}))
    wf.add("brief", RESEARCHER.ask(_brief_prompt(name)))
    wf.add("draft", WRITER.ask(draft_prompt), after=["brief", "notes"])
    wf.add("plan", plan, after=["draft"])
    after_final = ["plan"]
    if _has_loop(name):
        wf.add("loop", loop, after=["brief"])
        after_final.append("loop")
    wf.add("final", final, after=after_final)
    wf.add("score", SCORE.call(score_args), after=["final"])
    return wf


def expected(name: str) -> dict[str, Any]:
    """Every task's result in a successful run of `build(name)`, computed without running it."""
    facts = notes(name, 2 + zlib.crc32(name.encode()) % 3)
    brief = _reply(RESEARCHER, _brief_prompt(name))
    draft = _reply(WRITER, _draft_prompt(brief, facts))
    count = _sections(draft)
    outline = _reply(WRITER, _outline_prompt(draft))
    results: dict[str, Any] = {"notes": facts, "brief": brief, "draft": draft}
    results["plan"] = {"sections": count, "outline": outline}
    for i in range(count):
        results[f"section {i}"] = _reply(WRITER, _section_prompt(f"section {i}", draft))
    results["polish"] = f"polished {_quote(results['section 0'])}"
    if _has_loop(name):
        first = _question(1, brief)
        reply = _reply(RESEARCHER, first)
        history = (("user", first), ("assistant", _quote(reply)))
        results["loop"] = [reply, _reply(RESEARCHER, _question(2, brief), history)]
    results["final"] = final_value = {
        "sections": [_quote(results[f"section {i}"]) for i in range(count)],
        "polish": results["polish"],
        "loop": [_quote(reply) for reply in results.get("loop", ())],
    }
    text = json.dumps(final_value, sort_keys=True)
    results["score"] = int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) % 1000
    return results


def llm_calls(name: str) -> int:
    """How many distinct LLM calls a run of `build(name)` makes."""
    sections = expected(name)["plan"]["sections"]
    return 3 + sections + (2 if _has_loop(name) else 0)  # brief, draft, outline, sections, loop
