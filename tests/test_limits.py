"""Prompt templates cannot amplify a request: the filled size is computed from the parts and
checked per task and per request before anything is built (422 over HTTP), and a prompt
filled at run time past the ceiling fails its task, not the engine."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from conftest import StoreFactory
from test_service import GATED, Api, on_stores

from orchestrator import Template
from orchestrator.model._template import MAX_PROMPT_CHARS, PromptTooLargeError
from orchestrator.service import TaskSpec
from orchestrator.service._build import TooLargeError, check_prompt_sizes, prompt_sizes
from orchestrator.service._config import ServiceSettings

BIG = "x" * 100_000
AMPLIFIED = {
    "name": "amplified",
    "inputs": {"x": BIG},
    "tasks": [{"id": "a", "agent": "writer", "prompt": "${inputs.x}" * 1000}],
}
"""A 113 KB body whose one prompt fills to 100 MB."""


def test_an_amplifying_body_gets_422_before_anything_is_built(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        tracemalloc.start()
        try:
            status, error, _ = await api.call("POST", "/v1/workflows", AMPLIFIED)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 422, error
        (problem,) = error["problems"]
        assert problem["field"] == "tasks[0].prompt"
        assert "100000000 characters" in problem["message"]
        assert f"at most {MAX_PROMPT_CHARS} per task" in problem["message"]
        assert peak < 20 * 2**20  # the filled text (100 MB) was never made
        assert await api.engine.store.workflows() == []  # type: ignore[union-attr]
        # The same prompt referring to the input once is taken, and runs.
        fine = {**AMPLIFIED, "tasks": [{"id": "a", "agent": "writer", "prompt": "${inputs.x}"}]}
        status, accepted, _ = await api.call("POST", "/v1/workflows", fine)
        assert status == 202, accepted

    on_stores(make_store, body)


def test_the_prompts_of_a_request_are_held_to_a_total(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        tasks = [
            {"id": f"t{i}", "agent": "writer", "prompt": "${inputs.x} ${inputs.x}"}
            for i in range(4)
        ]
        spec = {"name": "many", "inputs": {"x": "y" * 200}, "tasks": tasks}
        status, error, _ = await api.call("POST", "/v1/workflows", spec)
        assert status == 422, error
        assert error["problems"] == [
            {
                "field": "tasks",
                "message": "the prompts and tool arguments filled with their inputs would be "
                "1604 characters; at most 1500 per request (send fewer tasks, refer to large "
                "inputs fewer times, or send smaller inputs)",
            }
        ]
        # Added tasks are held to the same limits.
        _, accepted, _ = await api.call("POST", "/v1/workflows", GATED)
        more = {"inputs": {"x": "y" * 600}, "tasks": tasks[:1]}
        status, error, _ = await api.call("POST", f"/v1/workflows/{accepted['id']}/tasks", more)
        assert status == 422 and error["problems"][0]["field"] == "tasks[0].prompt", error
        assert "1201 characters; at most 1000 per task" in error["problems"][0]["message"]

    settings = ServiceSettings(max_prompt_chars=1000, max_request_prompt_chars=1500)
    on_stores(make_store, body, settings=settings)


def test_tool_arguments_filled_from_inputs_count_toward_the_request_total(
    make_store: StoreFactory,
) -> None:
    """A 900 KB input given to 300 tools would record (and pass on) 300 copies: 422 first."""

    def spec(n: int) -> dict[str, Any]:
        tasks = [
            {"id": f"t{i}", "tool": "shout", "args": {"text": {"$input": "x"}}} for i in range(n)
        ]
        return {"name": "copies", "inputs": {"x": "y" * 900_000}, "tasks": tasks}

    async def body(api: Api) -> None:
        tracemalloc.start()
        try:
            status, error, _ = await api.call("POST", "/v1/workflows", spec(300))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert status == 422, error
        (problem,) = error["problems"]
        assert problem["field"] == "tasks"
        message = problem["message"]
        assert "tool arguments filled with their inputs would be 270000600 characters" in message
        assert f"at most {8 * MAX_PROMPT_CHARS} per request" in message
        assert peak < 40 * 2**20  # no copy was made
        assert await api.engine.store.workflows() == []  # type: ignore[union-attr]
        status, accepted, _ = await api.call("POST", "/v1/workflows", spec(2))
        assert status == 202, accepted

    on_stores(make_store, body)


def test_a_prompt_filled_past_the_ceiling_at_run_time_fails_its_task(
    make_store: StoreFactory,
) -> None:
    async def body(api: Api) -> None:
        spec = {
            "name": "grows",
            "inputs": {"x": "x" * 60_000},
            "tasks": [
                {"id": "loud", "tool": "shout", "args": {"text": {"$input": "x"}}},
                {"id": "big", "agent": "writer", "prompt": "${loud}" * 20, "after": ["loud"]},
                {"id": "small", "agent": "writer", "prompt": "hi ${inputs.x}"},
            ],
        }
        status, accepted, _ = await api.call("POST", "/v1/workflows", spec)
        assert status == 202, accepted
        run_id = accepted["id"]
        status, result, _ = await api.call("GET", f"/v1/workflows/{run_id}/result?wait=30")
        assert status == 200 and result["status"] == "failed", result
        failure = result["failures"]["big"]
        assert "would be 1200000 characters, over the limit of 1048576" in failure
        assert result["results"]["small"] == "hi " + "x" * 60_000
        status, ready, _ = await api.call("GET", "/readyz")
        assert status == 200, ready

    on_stores(make_store, body)


def test_sizes_are_computed_without_filling() -> None:
    tasks = [
        TaskSpec.model_validate(t)
        for t in [
            {"id": "a", "agent": "w", "prompt": "${inputs.x}" * 1000},
            {"id": "b", "agent": "w", "prompt": "$${ ${a} ${inputs.n} ${inputs.t}", "after": ["a"]},
            {"id": "c", "tool": "t", "args": {}},
            {"id": "d", "agent": "w", "prompt": "${"},  # not a template: build says so
        ]
    ]
    inputs = {"x": BIG, "n": [1, 2], "t": "has ${ in it"}
    tracemalloc.start()
    try:
        sizes = prompt_sizes(tasks, inputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    # What `fill` makes: b keeps `$${` and ${a}, and escapes the input's `${`.
    filled = Template(tasks[1].prompt or "").fill({"inputs.n": [1, 2], "inputs.t": "has ${ in it"})
    assert sizes == [100_000_000, len(filled.text), 0, 2]
    with pytest.raises(TooLargeError) as caught:
        check_prompt_sizes(tasks, inputs)
    assert caught.value.field == "tasks[0].prompt"
    check_prompt_sizes(tasks[1:], inputs)


def test_render_checks_the_size_before_it_builds() -> None:
    template = Template("${a}" * 3 + " $${")
    assert template.size({"a": "xy"}) == len(template.render({"a": "xy"})) == 9
    with pytest.raises(PromptTooLargeError, match="would be 9 characters, over the limit of 8"):
        template.render({"a": "xy"}, what="task 't'", limit=8)
