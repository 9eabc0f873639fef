"""Batch analytics: every document asked every question, as one offline job.

Each call's prompt is a shared instruction prefix, then the document (a second shared
prefix: every question about it repeats it), then the question. Each document is one
program (its questions are independent calls); all arrive at once. `input_order` is the
order rows sit in the job's input: question-major, as a table of questions x documents is
usually laid out, which is the order a naive client sends them in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from orchestrator import Message

from ._program import Build, LLMStep, Program, filler


def batch_programs(
    documents: int,
    questions: int,
    *,
    seed: int = 0,
    doc_tokens: tuple[int, int] = (1500, 4000),
    answer_tokens: int = 60,
    instruction_tokens: int = 800,
    question_tokens: tuple[int, int] = (20, 60),
) -> list[Program]:
    """Sizes are in the filler's nominal tokens (4 characters each); the defaults are the
    full-size job."""
    rng = random.Random(seed)
    instructions = filler(random.Random(4000), instruction_tokens, "analyst-instructions")
    asked = [filler(rng, rng.randint(*question_tokens), f"question-{q}") for q in range(questions)]
    programs = []
    for d in range(documents):
        document = filler(rng, rng.randint(*doc_tokens), f"document-{seed}-{d}")
        steps = tuple(
            LLMStep(
                f"q{q}",
                _ask(instructions, document, asked[q]),
                answer_tokens,
                order=q * documents + d,
                last=q == questions - 1,
            )
            for q in range(questions)
        )
        programs.append(Program(f"doc{d}", "batch", 0.0, steps))
    return programs


def _ask(instructions: str, document: str, question: str) -> Build:
    def build(replies: Mapping[str, str]) -> list[Message]:
        return [Message("system", instructions), Message("user", f"{document}\n\n{question}")]

    return build


def batch_rows(
    documents: int,
    *,
    questions: tuple[int, int] = (5, 15),
    pool: int = 30,
    duplicates: float = 0.01,
    seed: int = 0,
    doc_tokens: tuple[int, int] = (1500, 4000),
    answer_tokens: int = 60,
    instruction_tokens: int = 800,
    question_tokens: tuple[int, int] = (20, 60),
) -> list[dict[str, object]]:
    """A document-analytics job as input rows for `plait batch run` (system, prompt,
    max_tokens, custom_id): each document asked a random `questions` of a `pool` of
    questions, under one instruction prefix; a `duplicates` share of rows repeated exactly.
    Rows are question-major, as such a table is usually laid out. Document counts vary, so
    round-robin over replicas does not pin a document to one replica by accident."""
    rng = random.Random(seed)
    instructions = filler(random.Random(4000), instruction_tokens, "analyst-instructions")
    asked = [filler(rng, rng.randint(*question_tokens), f"question-{q}") for q in range(pool)]
    cells: list[tuple[int, int, str]] = []
    for d in range(documents):
        document = filler(rng, rng.randint(*doc_tokens), f"document-{seed}-{d}")
        for q in sorted(rng.sample(range(pool), rng.randint(*questions))):
            cells.append((q, d, f"{document}\n\n{asked[q]}"))
    cells.sort()
    rows: list[dict[str, object]] = []
    for q, d, prompt in cells:
        row = {"custom_id": f"d{d}-q{q}", "system": instructions, "prompt": prompt}
        rows.append({**row, "max_tokens": answer_tokens})
        if rng.random() < duplicates:
            rows.append({**row, "custom_id": f"d{d}-q{q}-again", "max_tokens": answer_tokens})
    return rows
