"""What users import is small, what implementers import is apart, and examples use only those."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

import agents
import orchestrator
import orchestrator.ext

ROOT = Path(__file__).resolve().parent.parent
MAX_USER_NAMES = 70


def test_the_user_api_stays_small() -> None:
    assert len(orchestrator.__all__) <= MAX_USER_NAMES, (
        f"orchestrator exports {len(orchestrator.__all__)} names; keep what users write there "
        "and move what implementers need to orchestrator.ext"
    )
    assert len(set(orchestrator.__all__)) == len(orchestrator.__all__)
    assert len(set(orchestrator.ext.__all__)) == len(orchestrator.ext.__all__)


@pytest.mark.parametrize("module", [orchestrator, orchestrator.ext], ids=lambda m: m.__name__)
def test_every_listed_name_resolves_and_is_public(module: ModuleType) -> None:
    names: list[str] = module.__all__
    assert [n for n in names if not hasattr(module, n)] == []
    assert [n for n in names if n.startswith("_")] == []


def test_no_name_is_both_user_and_extension_api() -> None:
    assert set(orchestrator.__all__) & set(orchestrator.ext.__all__) == set()


def test_agents_loop_bounds_have_a_name_of_their_own() -> None:
    assert "Limits" not in agents.__all__
    assert "LoopLimits" in agents.__all__


def imports_in(tree: ast.AST) -> list[tuple[str, str]]:
    """(module, name) of every `from orchestrator... import name` in `tree`."""
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        if node.module.partition(".")[0] == "orchestrator"
        for alias in node.names
    ]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def orchestrator_imports(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    if path.suffix == ".py":
        return imports_in(ast.parse(text, filename=str(path)))
    found: list[tuple[str, str]] = []
    for block in python_blocks(text):
        found.extend(imports_in(ast.parse(block, filename=str(path))))
    return found


def test_the_readme_and_the_guide_are_read() -> None:
    """The scan below sees the README's example and the docs' snippets (a guard on the regex)."""
    readme = orchestrator_imports(ROOT / "README.md")
    assert ("orchestrator", "Workflow") in readme
    assert ("orchestrator", "Engine") in orchestrator_imports(ROOT / "docs" / "durability.md")


SHOWN_TO_USERS = sorted(
    [*(ROOT / "examples").glob("*.py"), ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
)


@pytest.mark.parametrize("path", SHOWN_TO_USERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_and_docs_import_only_public_names(path: Path) -> None:
    for module_name, name in orchestrator_imports(path):
        where = f"{path.relative_to(ROOT)}: from {module_name} import {name}"
        assert not any(part.startswith("_") for part in module_name.split(".")), (
            f"{where} reaches into a private module; use orchestrator or orchestrator.ext"
        )
        module = importlib.import_module(module_name)
        listed = getattr(module, "__all__", None)
        if module_name in {"orchestrator", "orchestrator.ext"}:
            assert listed is not None and name in listed, f"{where}: not in its __all__"
        assert not name.startswith("_") and hasattr(module, name), f"{where}: no such name"
