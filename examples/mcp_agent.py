"""An agent whose tools come from an MCP server: it searches and reads team documents served
by examples/mcp_docs_server.py (a real MCP server, started over stdio), then answers.

    pip install 'plait[mcp]'
    plait run examples/mcp_agent.py

`mcp_tools("docs", command=[...])` names the server; among the agent's tools it makes each
loop list the server's tools once per run (task `mcp docs`, kept in the run's log, so a
resumed run offers the model the same tools) and run every call the model makes as a task
with a timeout and a retry. Arguments that do not fit a tool's schema, and what the server
answers as an error, go back to the model; a server that is down fails the task, naming the
server and the tool.

MCP servers answer in real time, so this example runs on the system clock, with the
simulated H100 as its model by default: the simulated model calls one offered tool with
arguments that fit its schema, then answers with noise. `fake_backends()` is a scripted model
that searches, reads and answers (the tests use it); `--config my.toml` points it at a real
server.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from agents import Agent, LoopLimits, mcp_tools
from executors import FunctionLLM, SimServer
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, LLMResponse, ToolCall, Workflow

CLOCK = "system"

docs = mcp_tools(
    "docs",
    command=[sys.executable, str(Path(__file__).with_name("mcp_docs_server.py"))],
    timeout_s=30,
)

librarian = Agent(
    "librarian",
    "You answer questions about the team's practices from its documents. Search, read what "
    "you found, and answer in one sentence, citing the document.",
    model="llama-3.1-8b",
    tools=(docs,),
    max_tokens=120,
)

QUESTIONS = ["When do deploys run?", "How fast must on-call answer a page?"]


def workflows() -> list[Workflow]:
    out = []
    for i, question in enumerate(QUESTIONS):
        wf = Workflow(f"ask-{i}")
        librarian.solve(wf, "answer", question, limits=LoopLimits(max_turns=4))
        out.append(wf)
    return out


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    """Open the server once for the whole run, and stop it after."""
    async with docs:
        yield


def backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": SimServer("h100-llama3-8b", clock=clock)}


# --- a scripted model for tests and readable output ----------------------------------------

KEYWORD = {"deploys": "deploy", "on-call": "page"}


def fake_reply(request: LLMRequest, hints: Hints) -> str | LLMResponse:
    """Reads like a careful model: searches by the question's key word, reads the first
    title found, then answers from it."""
    question = next(m.content for m in request.messages if m.role == "user")
    said = [m.content for m in request.messages if m.role == "tool"]
    if not said:
        word = "deploy" if "deploy" in question else "page"
        return _call("search", {"query": word})
    if len(said) == 1:
        titles = json.loads(said[0])
        return _call("read", {"title": titles[0]})
    return f"{said[1]} (from the team's documents)"


def _call(name: str, args: dict[str, str]) -> LLMResponse:
    return LLMResponse(
        "",
        finish_reason="tool_calls",
        tool_calls=(ToolCall(f"call-{name}", name, json.dumps(args)),),
    )


def fake_backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=0.05, clock=clock)}
