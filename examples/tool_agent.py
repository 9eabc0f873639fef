"""A tool-using analyst with a structured answer: for each question, the agent looks at a
small generated sales table through typed tools, then answers as a validated `Finding`.

    plait run examples/tool_agent.py

`analyst.solve(...)` unrolls the agent's loop into the workflow: turn 1 (an LLM call) ->
one task per tool call the model makes, in parallel -> turn 2 -> ... -> the answer. Each
tool's schema comes from its signature and docstring; arguments that do not fit, a tool the
agent does not have, or a tool that raises go back to the model as the tool's answer. The
final answer is asked for in the `Finding` schema (sent the way the server enforces it) and
asked again, with the error, if it does not fit.

By default it runs on the simulated H100 (plait.toml beside this file): the simulated model
calls one offered tool with arguments that fit its schema, then answers in the schema with
noise values. `fake_backends()` is a scripted model that uses the tools sensibly (the tests
use it); `plait run examples/tool_agent.py --config my.toml` points it at a real server.
"""

from __future__ import annotations

import json
import random

import pydantic

from agents import Agent, LoopLimits, tool
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, LLMResponse, ToolCall, Workflow

CLOCK = "virtual"
CONFIG = "plait.toml"

REGIONS = ("north", "south", "east", "west")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun")


def _sales() -> dict[str, dict[str, float]]:
    rng = random.Random(7)
    return {r: {m: round(rng.uniform(50, 150), 1) for m in MONTHS} for r in REGIONS}


SALES = _sales()


@tool
def list_regions() -> list[str]:
    """The regions the sales table covers."""
    return list(REGIONS)


@tool
def monthly_sales(region: str, months: list[str] | None = None) -> dict[str, float] | str:
    """Sales of one region per month, in thousands.

    Args:
        region: one of the regions list_regions returns
        months: which months (jan..jun); all when omitted
    """
    if region not in SALES:
        return f"no region {region!r}; the regions are {', '.join(REGIONS)}"
    wanted = months or list(MONTHS)
    return {m: SALES[region][m] for m in wanted if m in SALES[region]}


class Finding(pydantic.BaseModel):
    """The analyst's answer."""

    region: str
    total: float = pydantic.Field(description="sales over the months asked about, thousands")
    explanation: str


analyst = Agent(
    "analyst",
    "You are a sales analyst. Use the tools to read the sales table; never guess numbers. "
    "Answer with the region, the total and one sentence of explanation.",
    model="llama-3.1-8b",
    tools=(list_regions, monthly_sales),
    max_tokens=200,
)

QUESTIONS = [
    "Which region sold the most in the first quarter (jan-mar)?",
    "What did the west region sell from april to june?",
]


def workflows() -> list[Workflow]:
    out = []
    for i, question in enumerate(QUESTIONS):
        wf = Workflow(f"analysis-{i}")
        analyst.solve(wf, "finding", question, output=Finding, limits=LoopLimits(max_turns=4))
        out.append(wf)
    return out


# --- a scripted model for tests and readable output ----------------------------------------


def fake_reply(request: LLMRequest, hints: Hints) -> str | LLMResponse:
    """Reads like a careful model: lists the regions, reads each one, then answers."""
    question = next(m.content for m in request.messages if m.role == "user")
    said = [m for m in request.messages if m.role == "tool"]
    months = ["jan", "feb", "mar"] if "first quarter" in question else ["apr", "may", "jun"]
    if not said:
        return _calls([("list_regions", {})])
    if len(said) == 1:
        regions = json.loads(said[0].content)
        if "west" in question:
            regions = ["west"]
        return _calls([("monthly_sales", {"region": r, "months": months}) for r in regions])
    totals = {}
    for message in said[1:]:
        figures = json.loads(message.content)
        totals[message.tool_call_id] = sum(figures.values())
    calls = {
        c.id: json.loads(c.arguments)["region"]
        for m in request.messages
        for c in m.tool_calls
        if c.name == "monthly_sales"
    }
    best = max(totals, key=lambda k: totals[k])
    return json.dumps(
        {
            "region": calls[best],
            "total": round(totals[best], 1),
            "explanation": f"{calls[best]} sold {totals[best]:.1f}k over {', '.join(months)}.",
        }
    )


def _calls(made: list[tuple[str, dict[str, object]]]) -> LLMResponse:
    return LLMResponse(
        "",
        finish_reason="tool_calls",
        tool_calls=tuple(
            ToolCall(f"call-{i}-{name}-{args.get('region', '')}", name, json.dumps(args))
            for i, (name, args) in enumerate(made)
        ),
    )


def fake_backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=0.3, clock=clock)}
