"""The rooms of `orchestrator` stand in layers: each imports only the rooms below it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "orchestrator"

LAYERS = ["cli", "service", "batch", "engine", "cluster", "durability", "admission", "model"]
"""Top to bottom, as docs/architecture.md draws them: a room may import those after it."""


def _imports_at_run_time(path: Path) -> set[str]:
    """The `orchestrator` modules `path` imports when it runs (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or id(node) in typing_only:
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            found.add(".".join(base + ([node.module] if node.module else [])))
        elif node.module and node.module.startswith("orchestrator."):
            found.add(node.module)
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and (PACKAGE / parts[1]).is_dir() else None


def test_every_module_lives_in_a_room() -> None:
    """Beside the rooms, only the package's faces stand at its top: the user API, the
    extension API and the REST client."""
    top = {path.name for path in PACKAGE.glob("*.py")}
    assert top == {"__init__.py", "ext.py", "client.py"}
    assert {
        path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"
    } == set(LAYERS)


def test_each_room_imports_only_the_rooms_below_it() -> None:
    upward: list[str] = []
    for room in LAYERS:
        allowed = {room, *LAYERS[LAYERS.index(room) + 1 :]}
        for path in sorted((PACKAGE / room).rglob("*.py")):
            for module in _imports_at_run_time(path):
                target = _room(module)
                if target is not None and target not in allowed:
                    upward.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert upward == [], "imports up the layers:\n" + "\n".join(upward)


def test_the_check_reads_relative_imports_as_rooms() -> None:
    """The walk reads relative imports as the modules they reach (so the test above can
    see an import that climbs)."""
    workflow = PACKAGE / "model" / "_workflow.py"
    assert "orchestrator.model._errors" in _imports_at_run_time(workflow)
    engine = PACKAGE / "engine" / "_engine.py"
    assert "orchestrator.admission._controller" in _imports_at_run_time(engine)
    assert _room("orchestrator.engine._engine") == "engine"
    assert _room("orchestrator.ext") is None
