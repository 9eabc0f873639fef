"""Workflow definition and its validation, without an engine."""

from __future__ import annotations

import re

import pytest

from orchestrator import (
    CycleError,
    DuplicateTaskError,
    TaskContext,
    UnknownTaskError,
    UsageError,
    Workflow,
)


async def noop(ctx: TaskContext) -> None:
    return None


def diamond() -> Workflow:
    wf = Workflow("diamond")
    wf.add("a", noop)
    wf.add("b", noop, after=["a"])
    wf.add("c", noop, after=["a"])
    wf.add("d", noop, after=["b", "c"])
    return wf


def test_add_builds_the_graph_with_dependencies() -> None:
    wf = diamond()
    assert len(wf) == 4
    assert sorted(wf.dependencies("d")) == ["b", "c"]
    assert sorted(wf.dependents("a")) == ["b", "c"]
    assert "a" in wf and "z" not in wf


def test_duplicate_task_id_is_refused_by_name() -> None:
    wf = diamond()
    with pytest.raises(DuplicateTaskError, match="'b'"):
        wf.add("b", noop)


def test_dependency_on_an_unknown_task_is_refused_and_changes_nothing() -> None:
    wf = diamond()
    with pytest.raises(UnknownTaskError, match="'nope'.*dependency of 'e'"):
        wf.add("e", noop, after=["a", "nope"])
    assert "e" not in wf
    assert len(wf.graph) == 4


def test_edge_that_closes_a_cycle_names_the_cycle() -> None:
    wf = diamond()
    with pytest.raises(CycleError) as info:
        wf.add_edge("d", "a")
    assert info.value.cycle == ("d", "a", "b", "d") or info.value.cycle == ("d", "a", "c", "d")
    assert "d -> a ->" in str(info.value)
    assert not wf.graph.has_edge("d", "a")


def test_self_edge_is_a_cycle() -> None:
    wf = diamond()
    with pytest.raises(CycleError) as info:
        wf.add_edge("b", "b")
    assert info.value.cycle == ("b", "b")


def test_new_task_between_two_tasks_that_would_loop_is_refused() -> None:
    wf = diamond()
    # "x" after d and before a: a -> ... -> d -> x -> a
    with pytest.raises(CycleError) as info:
        wf.add("x", noop, after=["d"], before=["a"])
    assert info.value.cycle[0] == "d" and info.value.cycle[1] == "x"
    assert "x" not in wf


def test_edge_to_unknown_task_is_refused() -> None:
    wf = diamond()
    with pytest.raises(UnknownTaskError, match="'ghost'.*edge target"):
        wf.add_edge("a", "ghost")


def test_remove_drops_the_task_and_its_edges() -> None:
    wf = diamond()
    wf.remove("b")
    assert "b" not in wf
    assert wf.dependencies("d") == ["c"]


def test_replace_keeps_edges_and_swaps_the_action() -> None:
    wf = diamond()

    async def other(ctx: TaskContext) -> int:
        return 1

    wf.replace("b", other, timeout=5)
    assert wf.dependencies("b") == ["a"]
    assert wf.task("b").timeout == 5
    assert "other" in wf.task("b").action.label


def test_remove_edge_that_does_not_exist_is_refused() -> None:
    wf = diamond()
    with pytest.raises(UsageError, match="no edge 'a' -> 'd'"):
        wf.remove_edge("a", "d")


def test_step_decorator_uses_the_function_name() -> None:
    wf = Workflow("deco")

    @wf.step()
    async def first(ctx: TaskContext) -> int:
        return 1

    @wf.step(after=["first"])
    def second(ctx: TaskContext) -> int:
        return 2

    assert wf.dependencies("second") == ["first"]


def test_task_function_with_two_required_arguments_is_refused() -> None:
    wf = Workflow("bad")

    def two(a: int, b: int) -> int:
        return a + b

    with pytest.raises(UsageError, match="2 required arguments"):
        wf.add("t", two)


def test_invalid_settings_are_refused() -> None:
    wf = Workflow("bad")
    with pytest.raises(UsageError, match="timeout must be finite and more than zero"):
        wf.add("t", noop, timeout=0)
    with pytest.raises(UsageError, match="attempts"):
        wf.add("u", noop, retry=0)
    with pytest.raises(UsageError, match="non-empty"):
        wf.add("", noop)
    with pytest.raises(UsageError, match="callable"):
        wf.add("v", 42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"retry": "3"}, "retry must be a number of attempts"),
        ({"retry": 2.5}, "retry must be a number of attempts"),
        ({"timeout": "5"}, "timeout must be a number of seconds, got str '5'"),
        ({"timeout": float("nan")}, "timeout must be finite"),
        ({"timeout": 0}, "timeout must be finite and more than zero"),
        ({"estimate": "1"}, "estimate must be a number of seconds"),
        ({"resource": 3}, "resource must be a non-empty string"),
        ({"when": True}, "when must be a function"),
        ({"trigger": "any"}, "trigger must be 'all_success' or 'all_done', got 'any'"),
        ({"after": "a"}, "after must be a list of task ids, got str 'a'; write after=['a']"),
        ({"after": [1]}, "after must hold task ids"),
    ],
)
def test_add_refuses_a_badly_typed_option_naming_the_task_and_parameter(
    options: dict[str, object], named: str
) -> None:
    wf = Workflow("typed")
    wf.add("a", lambda: 1)
    with pytest.raises(UsageError, match=re.escape(named)) as info:
        wf.add("b", lambda: 2, **options)  # type: ignore[arg-type]
    assert "task 'b'" in str(info.value)
    assert "b" not in wf  # nothing half-added
