"""Document analytics as a batch job: several questions per document, each answered by an
extractor agent and checked by a verifier agent, over a generated dataset.

    make batch-demo       # generates 2,000 documents, then runs the command below

    python examples/doc_analytics.py generate out/documents.jsonl --rows 2000
    plait batch run --input out/documents.jsonl --output out/answers.jsonl \\
        --workflow examples/doc_analytics.py:analyse --config examples/batch.toml

Each input row is one document: `{"custom_id", "title", "document", "questions": [...]}`.
`analyse(row)` builds its workflow: per question, `answer<i>` (the extractor, prompted with
the shared instructions, the document and the question) and `check<i>` (the verifier, given
the question and the answer). The row's output is the checks' results (the workflow's final
tasks). Every extractor call of a document starts with the same instructions and the same
document, so `plait batch run` orders the rows by prefix, routes a document's calls to one
replica and computes each prefix once (docs/batch.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from agents import Agent
from orchestrator import Template, Workflow

INSTRUCTIONS = (
    "You are an analyst extracting facts from business documents. Answer the question from "
    "the document only, in one short sentence; say 'not stated' when the document does not "
    "say. Quote figures exactly as written, with their units and periods. "
) * 8  # about 250 tokens of shared instructions, as a real extraction prompt has

extractor = Agent("extractor", INSTRUCTIONS, max_tokens=48)
verifier = Agent(
    "verifier",
    "You check an analyst's answer against the question. Reply OK if it answers the "
    "question, or FIX and what is missing.",
    max_tokens=16,
)

QUESTIONS = (
    "What revenue does the document report, and for which period?",
    "Who is the counterparty named in the agreement?",
    "Which risks does the document list?",
    "What is the termination notice period?",
    "Which jurisdiction governs the document?",
    "What is the total contract value?",
)
WORDS = (
    "revenue", "quarter", "agreement", "supplier", "notice", "period", "liability", "region",
    "growth", "margin", "customer", "contract", "term", "renewal", "warranty", "payment",
)  # fmt: skip


def analyse(row: dict[str, Any]) -> Workflow:
    """One document's workflow: extract an answer to each question, then verify it."""
    document = str(row["document"])
    questions = row.get("questions") or []
    if not isinstance(questions, list) or not questions:
        raise ValueError("the row has no questions (a non-empty list)")
    wf = Workflow(f"doc-{row.get('custom_id', 'row')}")
    for i, question in enumerate(questions):
        wf.add(f"answer{i}", extractor.ask(f"Document:\n{document}\n\nQuestion: {question}"))
        # A Template, not a Python function: text that stays data, so a killed batch run
        # again rebuilds this task from its log (a closure could not be found by name).
        check = Template(f"Question: {_escaped(str(question))}\nAnswer: ${{answer{i}}}")
        wf.add(f"check{i}", verifier.ask(check), after=[f"answer{i}"])
    return wf


def _escaped(text: str) -> str:
    return text.replace("${", "$${")


def generate(path: Path, rows: int, *, seed: int = 0, questions: int = 4) -> None:
    """`rows` documents of 300-900 words, each asked `questions` of the QUESTIONS."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for n in range(rows):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 900)))
            asked = rng.sample(QUESTIONS, k=min(questions, len(QUESTIONS)))
            row = {
                "custom_id": f"doc-{n:05d}",
                "title": f"Document {n}",
                "document": f"Document {n}. {words}.",
                "questions": asked,
            }
            out.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the document-analytics batch example")
    verbs = parser.add_subparsers(dest="verb", required=True)
    make = verbs.add_parser("generate", help="write a dataset of documents as JSONL")
    make.add_argument("path", type=Path)
    make.add_argument("--rows", type=int, default=2000)
    make.add_argument("--questions", type=int, default=4, help="questions per document (1-6)")
    make.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rows < 1 or not 1 <= args.questions <= len(QUESTIONS):
        parser.error(f"--rows must be at least 1, --questions from 1 to {len(QUESTIONS)}")
    generate(args.path, args.rows, seed=args.seed, questions=args.questions)
    print(f"wrote {args.rows} documents to {args.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
