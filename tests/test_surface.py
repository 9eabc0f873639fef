"""What users import is small, what implementers import is apart, and examples use only those."""

from __future__ import annotations

import ast
import importlib
import inspect
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


MAX_ENGINE_ARGUMENTS = 12

# Every setting a user has over admission, read from the models that take them; a key added
# to any of them fails `test_the_admission_settings_a_user_can_set_are_pinned` until
# docs/admission.md ("What you can set") says what it does and the set below has it.
ADMISSION_SETTINGS = {
    "[engine]": {"admission", "deadline"},
    "[limits.*]": {"max_in_flight", "max_waiting", "batch_in_flight", "hold_back"},
    "per run": {"deadline", "priority", "late"},
    "router": {"lane_clear"},
}


def admission_settings() -> dict[str, set[str]]:
    from executors._config import RouterSettings
    from orchestrator.engine._config import EngineSettings, LimitsSettings

    run = set(inspect.signature(orchestrator.Engine.submit).parameters)
    return {
        "[engine]": set(EngineSettings.model_fields) - {"clock"},
        "[limits.*]": set(LimitsSettings.model_fields),
        "per run": run - {"self", "workflow", "tenant", "labels", "_subscriber"},
        "router": {k for k in RouterSettings.model_fields if "lane" in k},
    }


def test_the_engine_takes_few_arguments() -> None:
    params = [p for p in inspect.signature(orchestrator.Engine.__init__).parameters if p != "self"]
    assert len(params) <= MAX_ENGINE_ARGUMENTS, (
        f"Engine takes {len(params)} arguments ({', '.join(params)}); fold settings that "
        "belong together into one object, or make them internal tuning"
    )


def test_the_admission_settings_a_user_can_set_are_pinned() -> None:
    found = admission_settings()
    for where, keys in ADMISSION_SETTINGS.items():
        assert found[where] == keys, (
            f"the admission settings of {where} changed: {sorted(found[where] ^ keys)}; say "
            "what each does in docs/admission.md and update ADMISSION_SETTINGS"
        )
    documented = (ROOT / "docs" / "admission.md").read_text()
    missing = [k for keys in found.values() for k in keys if f"`{k}`" not in documented]
    assert missing == [], f"docs/admission.md does not name {missing}"


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
