"""Multi-stage text-to-SQL pipelines in the style of CHESS (Talaei et al., 2024).

Each program answers one question against one of a few databases, in 4 stages:
1. keyword extraction (1 call);
2. schema selection: one column-filtering call per table chunk (6-8, in parallel), then one
   table-selection call;
3. candidate generation: 5-7 SQL candidates in parallel;
4. revision of 2 candidates, then one final selection.
That is 16-20 calls and 30-70k prompt tokens a query. Calls of one stage share a long
prefix (instructions + the database schema), and queries on the same database share it too.
Every query has a deadline (interactive analytics), which is what `slack` scheduling is for.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from orchestrator import Message

from ._program import Build, LLMStep, Program, Step, filler, poisson_arrivals

DATABASES = 8


def sql_programs(
    n: int,
    *,
    rate: float,
    seed: int = 0,
    deadline: tuple[float, float] = (12.0, 24.0),
) -> list[Program]:
    rng = random.Random(seed)
    schemas = [filler(random.Random(2000 + d), 1800, f"schema-db{d}") for d in range(DATABASES)]
    instructions = {
        stage: filler(random.Random(3000 + k), size, f"instructions-{stage}")
        for k, (stage, size) in enumerate(
            [("keywords", 600), ("columns", 500), ("tables", 500), ("generate", 900),
             ("revise", 700), ("select", 500)]
        )
    }  # fmt: skip
    programs = []
    for i, arrival in enumerate(poisson_arrivals(rng, rate, n)):
        db = rng.randrange(DATABASES)
        schema = schemas[db]
        question = filler(rng, rng.randint(40, 120), f"question-{seed}-{i}")
        chunks = [filler(rng, rng.randint(300, 500), f"db{db}-table{t}") for t in range(8)]
        steps: list[Step] = [
            LLMStep("keywords", _fixed(instructions["keywords"], question), 80),
        ]
        n_columns = rng.randint(6, 8)
        for c in range(n_columns):
            steps.append(
                LLMStep(
                    f"columns{c}",
                    _fixed(instructions["columns"] + schema, chunks[c] + question),
                    40,
                    after=("keywords",),
                )
            )
        columns = tuple(f"columns{c}" for c in range(n_columns))
        steps.append(
            LLMStep(
                "tables",
                _with(instructions["tables"] + schema, question, columns),
                100,
                after=columns,
            )
        )
        n_candidates = rng.randint(5, 7)
        for c in range(n_candidates):
            steps.append(
                LLMStep(
                    f"candidate{c}",
                    _with(instructions["generate"] + schema, question + f" #{c}", ("tables",)),
                    rng.randint(120, 250),
                    after=("tables",),
                )
            )
        revisions = []
        for r in range(2):
            source = (f"candidate{r}",)
            steps.append(
                LLMStep(
                    f"revise{r}",
                    _with(instructions["revise"] + schema, question, ("tables", *source)),
                    rng.randint(120, 250),
                    after=source,
                )
            )
            revisions.append(f"revise{r}")
        finals = (*(f"candidate{c}" for c in range(2, n_candidates)), *revisions)
        steps.append(
            LLMStep(
                "select",
                _with(instructions["select"], question, finals),
                40,
                after=finals,
                last=True,
            )
        )
        limit = rng.uniform(*deadline)
        programs.append(Program(f"sql{i}", "sql", arrival, tuple(steps), deadline=limit))
    return programs


def _fixed(prefix: str, suffix: str) -> Build:
    def build(replies: Mapping[str, str]) -> list[Message]:
        return [Message("system", prefix), Message("user", suffix)]

    return build


def _with(prefix: str, question: str, inputs: tuple[str, ...]) -> Build:
    def build(replies: Mapping[str, str]) -> list[Message]:
        context = "\n".join(replies[k] for k in inputs)
        return [Message("system", prefix), Message("user", f"{question}\n{context}")]

    return build
