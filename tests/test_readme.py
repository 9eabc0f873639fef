"""The README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_example_runs(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    result = namespace["result"]
    assert result.status == "succeeded"  # type: ignore[attr-defined]
    assert result.duration == 1.0  # type: ignore[attr-defined]  # both topics at once
    assert "Topic: kv cache" in result["write"]  # type: ignore[index]
