"""A data-discovery team on a blackboard: a coordinator posts questions about a small
generated data lake; the agents that own a partition of the lake volunteer when they hold
relevant tables (their bid: how well their tables' names and columns match the
question's words), a search agent volunteers for the rest with a low bid; the board awards each
question to the best bid, ties to the least loaded. Each claim runs as a task of the
coordinator's workflow, where the winner reads its tables and asks its model for a summary.

    plait run examples/data_discovery.py

In the style of the blackboard architecture for data discovery (agents that each know part
of a lake, coordinated by requests on a shared board instead of a fixed call graph). The
board keeps its posts, awards and answers in the process by default; with a store
(`Board(SQLBoardStore(store))`, see docs/agents.md) they are durable and shared between
processes. It runs on the simulated H100 (plait.toml); `fake_backends()` answers readably.
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Board, Helper, Post
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow
from orchestrator.ext import running_clock

CLOCK = "virtual"
CONFIG = "plait.toml"

# --- a generated data lake, split into partitions ------------------------------------------

DOMAINS = {
    "sales": ["orders", "customers", "invoices", "refunds"],
    "logistics": ["shipments", "warehouses", "carriers", "routes"],
    "people": ["employees", "payroll", "teams", "offices"],
}
COLUMNS = ["id", "region", "amount", "date", "status", "name", "cost", "city"]


def lake(seed: int = 3) -> dict[str, dict[str, list[str]]]:
    """partition -> table -> columns."""
    rng = random.Random(seed)
    return {
        domain: {table: ["id", *rng.sample(COLUMNS[1:], 3)] for table in tables}
        for domain, tables in DOMAINS.items()
    }


LAKE = lake()
QUESTIONS = [
    "Which orders were refunded, by region?",
    "What does shipping cost per carrier and route?",
    "How is payroll split across teams and offices?",
    "Which suppliers had late deliveries last winter?",  # no partition holds suppliers
]


def words(text: str) -> set[str]:
    return {w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower())}


def relevance(partition: str, question: str) -> dict[str, float]:
    """The partition's tables that share a word with the question: 2 for the table's name,
    0.5 for a column's."""
    wanted = words(question)
    scores = {}
    for table, columns in LAKE[partition].items():
        score = 2.0 * bool(wanted & words(table)) + 0.5 * len(wanted & words(" ".join(columns)))
        if score:
            scores[table] = score
    return scores


def matches(partition: str, question: str) -> list[str]:
    return sorted(relevance(partition, question))


# --- the team ----------------------------------------------------------------------------------

writer = Agent(
    "discovery",
    "You are a data-discovery assistant. Given a question and the tables that may answer "
    "it, say in two sentences which tables to join and on what.",
    model="llama-3.1-8b",
    max_tokens=80,
)


def partition_agent(partition: str) -> Helper:
    def bid(post: Post) -> float | None:
        found = relevance(partition, post.content["question"])
        return sum(found.values()) if found else None  # decline: nothing relevant here

    async def work(post: Post, ctx: TaskContext | None) -> dict[str, Any]:
        assert ctx is not None  # posted from a task: the claim runs as one
        tables = matches(partition, post.content["question"])
        listing = "\n".join(f"- {t}({', '.join(LAKE[partition][t])})" for t in tables)
        reply = await ctx.complete(
            writer.request(f"Question: {post.content['question']}\nTables:\n{listing}")
        )
        return {"by": partition, "tables": tables, "summary": reply.text}

    return Helper(partition, frozenset({"discover"}), work, bid=bid)


def search_agent() -> Helper:
    async def work(post: Post, ctx: TaskContext | None) -> dict[str, Any]:
        return {"by": "search", "tables": [], "summary": "no partition holds this; search wider"}

    return Helper("search", frozenset({"discover"}), work, bid=lambda post: 0.1)


BOARD: dict[str, Board] = {}


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    """`plait run` opens the board around the run (on the run's clock)."""
    async with Board(clock=running_clock(), lease=120) as board:
        for partition in LAKE:
            board.join(partition_agent(partition))
        board.join(search_agent())
        BOARD["board"] = board
        try:
            yield
        finally:
            BOARD.clear()


async def coordinate(ctx: TaskContext) -> dict[str, Any]:
    board = BOARD["board"]
    posts = [
        await board.post({"question": q}, capabilities={"discover"}, poster="coordinator", ctx=ctx)
        for q in QUESTIONS
    ]
    return {q: await board.answer_of(p) for q, p in zip(QUESTIONS, posts, strict=True)}


def workflows() -> Workflow:
    wf = Workflow("data-discovery")
    wf.add("coordinate", coordinate)
    return wf


# --- a readable model for tests ------------------------------------------------------------------


def fake_reply(request: LLMRequest, hints: Hints) -> str:
    tables = re.findall(r"- (\w+)\(", request.messages[-1].content)
    return f"Join {' and '.join(tables)} on id."


def fake_backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=0.5, clock=clock)}
