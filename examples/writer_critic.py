"""A writer-critic loop: the writer drafts, the critic reviews; the loop adds another round
at run time until the critic approves or MAX_ROUNDS is reached.

    plait run examples/writer_critic.py
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agents import Agent
from executors import FunctionLLM
from orchestrator import Clock, Hints, LLMBackend, LLMRequest, TaskContext, Workflow

CLOCK = "virtual"
MAX_ROUNDS = 4

writer = Agent(
    "writer",
    "You write a short product description. Improve it using the "
    "critic's feedback if there is any.",
    max_tokens=120,
)
critic = Agent("critic", "You review a draft. Answer APPROVED if it is good, otherwise "
               "say what to fix.", max_tokens=60)  # fmt: skip


def fake_reply(request: LLMRequest, hints: Hints) -> str:
    prompt = request.messages[-1].content
    if request.messages[0].content.startswith("You write"):
        return f"Draft v{prompt.count('Feedback:') + 1}: a fast, friendly orchestrator."
    # This critic is satisfied by the third draft.
    return "APPROVED" if "Draft v3" in prompt else "Be more concrete about speed."


def backends(clock: Clock) -> dict[str, LLMBackend]:
    return {"default": FunctionLLM(fake_reply, latency=1.0, clock=clock)}


def writer_critic(
    brief: str, *, max_rounds: int = MAX_ROUNDS, name: str = "writer-critic"
) -> Workflow:
    wf = Workflow(name)
    feedback: list[str] = []

    def draft_prompt(ctx: TaskContext) -> str:
        return brief + "".join(f"\nFeedback: {f}" for f in feedback)

    def review_prompt(ctx: TaskContext) -> str:
        (draft,) = ctx.inputs.values()
        return f"Review this draft:\n{draft}"

    def add_round(n: int, after: list[str]) -> None:
        wf.add(f"draft{n}", writer.ask(draft_prompt), after=after)
        wf.add(f"review{n}", critic.ask(review_prompt), after=[f"draft{n}"])
        wf.add(f"decide{n}", decide(n), after=[f"review{n}", f"draft{n}"])

    def decide(n: int) -> Callable[[TaskContext], Awaitable[dict[str, object]]]:
        async def decide_round(ctx: TaskContext) -> dict[str, object]:
            review, draft = ctx.inputs[f"review{n}"], ctx.inputs[f"draft{n}"]
            approved = review.strip().startswith("APPROVED")
            if not approved and n < max_rounds:
                feedback.append(review)
                add_round(n + 1, after=[ctx.task_id])
            return {"round": n, "approved": approved, "draft": draft}

        return decide_round

    add_round(1, after=[])
    return wf


def final(results: Mapping[str, Any]) -> dict[str, Any]:
    """The last round's decision: the draft that stands and whether it was approved."""
    rounds: list[dict[str, Any]] = [v for k, v in results.items() if k.startswith("decide")]
    return max(rounds, key=lambda r: int(r["round"]))


def workflows() -> list[Workflow]:
    return [writer_critic("Describe plait in one sentence.")]
