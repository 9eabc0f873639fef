"""examples/doc_analytics.py as `make batch-demo` runs it (a few rows, a fake backend with no
latency): every document answered and checked once, and the dataset generator's bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli._cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "doc_analytics.py"
BACKEND = f"{Path(__file__).resolve().parent / 'batch_support.py'}:backends"


def generate(*args: str) -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_analytics_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    code: int = module.main(list(args))
    return code


def test_every_document_is_answered_and_checked(tmp_path: Path) -> None:
    documents, answers = tmp_path / "documents.jsonl", tmp_path / "answers.jsonl"
    assert generate("generate", str(documents), "--rows", "6", "--questions", "3") == 0
    log = tmp_path / "calls.log"
    os.environ.update(BATCH_LATENCY="0", BATCH_CALL_LOG=str(log))
    try:
        code = main(
            ["batch", "run", "--input", str(documents), "--output", str(answers),
             "--workflow", f"{EXAMPLE}:analyse", "--backend", BACKEND, "--progress", "none"]
        )  # fmt: skip
    finally:
        del os.environ["BATCH_LATENCY"], os.environ["BATCH_CALL_LOG"]
    assert code == 0
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == [f"doc-{n:05d}" for n in range(6)]
    for line in lines:
        outputs = line["response"]["body"]["outputs"]
        assert sorted(outputs) == ["check0", "check1", "check2"]
        # the verifier was given the extractor's answer through the Template
        assert all(text.startswith("answer to Question: ") for text in outputs.values())
    sent = log.read_text()
    # 6 x 3 extractor calls and 6 x 3 verifier calls, each given its answer by the Template
    assert sent.count("\n\nQuestion: ") == 18 and sent.count("Answer: answer to Document:") == 18


def test_the_generator_refuses_bad_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        generate("generate", str(tmp_path / "d.jsonl"), "--rows", "0")
    assert exit_info.value.code == 2
    assert "--rows must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "d.jsonl").exists()
