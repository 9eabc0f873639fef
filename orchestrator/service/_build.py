"""From a checked spec to tasks: names looked up in the registry, prompts and arguments filled
from the inputs, the graph checked whole before anything is added.

Every task is built as the action its `ActionSpec` describes (`Registry.action`), the same
path a resumed run takes, so what the service accepts is exactly what it can resume.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx

from ..durability._registry import Registry
from ..model._errors import UsageError
from ..model._events import ActionSpec
from ..model._task import Action, registered_name
from ..model._template import MAX_PROMPT_CHARS, Template, as_text
from ..model._workflow import Workflow
from ._spec import TaskSpec

INPUTS = "inputs."
"""Prompt references to the submission's inputs: `${inputs.NAME}`."""


class SpecError(UsageError):
    """A spec that names something the service does not have, or a graph it cannot run."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class TooLargeError(SpecError):
    """A spec that would build more prompt text than the service takes."""


def args_sizes(tasks: Sequence[TaskSpec], inputs: Mapping[str, Any]) -> list[int]:
    """How much each task's tool arguments grow once each `{"$input": NAME}` in them is
    filled: the input's length as JSON per reference (every reference is recorded, and
    passed on, as a copy), computed without filling any; each input is measured once."""
    lengths: dict[str, int] = {}

    def grown(value: Any) -> int:
        stack, total = [value], 0
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                name = item.get("$input") if len(item) == 1 else None
                if isinstance(name, str) and name in inputs:
                    if name not in lengths:
                        lengths[name] = len(json.dumps(inputs[name], ensure_ascii=False))
                    total += lengths[name]
                else:
                    stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return total

    return [0 if task.args is None else grown(task.args) for task in tasks]


def prompt_sizes(tasks: Sequence[TaskSpec], inputs: Mapping[str, Any]) -> list[int]:
    """Each task's prompt length once filled with `inputs` (0 without a prompt; a reference
    to a dependency counts as itself), computed without filling any: each input is turned
    to text once for the whole request. A prompt that is not a valid template counts as its
    own length (building it reports the mistake)."""
    texts: dict[str, str] = {}
    sizes: list[int] = []
    for task in tasks:
        if task.prompt is None:
            sizes.append(0)
            continue
        try:
            template = Template(task.prompt)
        except UsageError:
            sizes.append(len(task.prompt))
            continue
        values: dict[str, str] = {}
        for name in template.names:
            key = name[len(INPUTS) :]
            if name.startswith(INPUTS) and key in inputs:
                if key not in texts:
                    texts[key] = as_text(inputs[key])
                values[name] = texts[key]
        sizes.append(template.size(values, escape=True))
    return sizes


def check_prompt_sizes(
    tasks: Sequence[TaskSpec],
    inputs: Mapping[str, Any],
    *,
    per_task: int = MAX_PROMPT_CHARS,
    per_request: int = 8 * MAX_PROMPT_CHARS,
) -> None:
    """Refuse (`TooLargeError`) a request whose prompts, filled with its inputs, would be
    longer than `per_task` characters for one task, or whose prompts and tool arguments
    filled with its inputs would be longer than `per_request` for all: checked from the
    sizes alone, before anything is built."""
    total = sum(args_sizes(tasks, inputs))
    for i, size in enumerate(prompt_sizes(tasks, inputs)):
        if size > per_task:
            raise TooLargeError(
                f"tasks[{i}].prompt",
                f"filled with its inputs it would be {size} characters; at most {per_task} "
                "per task (refer to large inputs fewer times, or shorten them)",
            )
        total += size
    if total > per_request:
        raise TooLargeError(
            "tasks",
            f"the prompts and tool arguments filled with their inputs would be {total} "
            f"characters; at most {per_request} per request (send fewer tasks, refer to large "
            "inputs fewer times, or send smaller inputs)",
        )


def build(
    name: str, tasks: Sequence[TaskSpec], inputs: Mapping[str, Any], registry: Registry
) -> Workflow:
    """A new workflow of `tasks` (checked whole first)."""
    workflow = Workflow(name)
    add_tasks(workflow, tasks, inputs, registry)
    return workflow


def add_tasks(
    workflow: Workflow,
    tasks: Sequence[TaskSpec],
    inputs: Mapping[str, Any],
    registry: Registry,
    *,
    existing: Sequence[str] = (),
) -> list[str]:
    """Add `tasks` to `workflow` (whose tasks are `existing`), all or none: every action is
    built and the graph checked before the first is added. Returns the ids in the order
    added (dependencies first)."""
    have = set(existing)
    index: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task.id in have or task.id in index:
            raise SpecError(f"tasks[{i}].id", f"task {task.id!r} is there already")
        index[task.id] = i
    children: dict[str, dict[str, None]] = {task_id: {} for task_id in index}
    for i, task in enumerate(tasks):
        for dep in task.after:
            if dep in index:
                children[dep][task.id] = None
            elif dep not in have:
                raise SpecError(f"tasks[{i}].after", f"no task {dep!r} in this workflow")
    order = _topological(children)
    if len(order) < len(index):
        raise SpecError("tasks", f"the dependencies form a cycle: {_cycle(children)}")
    actions = {task.id: _action(i, task, inputs, registry) for i, task in enumerate(tasks)}
    for task_id in order:
        task = tasks[index[task_id]]
        workflow.add(
            task_id,
            actions[task_id],
            after=task.after,
            retry=task.retry,
            timeout=task.timeout_s,
            idempotent=task.idempotent,
        )
    return order


def _topological(children: Mapping[str, Mapping[str, None]]) -> list[str]:
    """The tasks with each after its dependencies, in `nx.topological_sort`'s order (ready
    tasks in the order given, generation by generation); those on or behind a cycle are
    left out. Written out because building a networkx graph cost more than the rest of a
    small submission."""
    waiting: dict[str, int] = {}
    for kids in children.values():
        for child in kids:
            waiting[child] = waiting.get(child, 0) + 1
    ready = [task_id for task_id in children if task_id not in waiting]
    order: list[str] = []
    while ready:
        order.extend(ready)
        generation, ready = ready, []
        for task_id in generation:
            for child in children[task_id]:
                waiting[child] -= 1
                if not waiting[child]:
                    ready.append(child)
    return order


def _cycle(children: Mapping[str, Mapping[str, None]]) -> str:
    """A cycle among the tasks, `a -> b -> a`, as networkx finds it."""
    graph: nx.DiGraph[str] = nx.DiGraph()
    graph.add_nodes_from(children)
    graph.add_edges_from((task_id, kid) for task_id, kids in children.items() for kid in kids)
    cycle = nx.find_cycle(graph)
    return " -> ".join([*(edge[0] for edge in cycle), cycle[0][0]])


def _action(i: int, task: TaskSpec, inputs: Mapping[str, Any], registry: Registry) -> Action:
    where = f"tasks[{i}]"
    if task.agent is not None:
        if not registry.has("llm", task.agent):
            raise SpecError(f"{where}.agent", _unknown("agent", task.agent, registry))
        assert task.prompt is not None
        try:
            template = Template(task.prompt)
        except UsageError as exc:
            raise SpecError(f"{where}.prompt", str(exc)) from None
        wanted = {n[len(INPUTS) :] for n in template.names if n.startswith(INPUTS)}
        missing = sorted(wanted - set(inputs))
        if missing:
            raise SpecError(f"{where}.prompt", f"no input {missing[0]!r} was given")
        values = {INPUTS + k: inputs[k] for k in wanted}
        size = template.size(values, escape=True)
        if size > MAX_PROMPT_CHARS:  # whoever called did not check the sizes first
            raise TooLargeError(
                f"{where}.prompt",
                f"filled with its inputs it would be {size} characters; at most "
                f"{MAX_PROMPT_CHARS} per task",
            )
        template = template.fill(values)
        strays = [n for n in template.names if n not in task.after]
        if strays:
            raise SpecError(
                f"{where}.prompt",
                f"${{{strays[0]}}} is not a task this one runs after; add it to after",
            )
        spec = ActionSpec("llm", task.agent, {"template": template.text})
        return _built(registry, spec, f"{where}.prompt")
    if task.tool is not None:
        if not registry.has("tool", task.tool):
            raise SpecError(f"{where}.tool", _unknown("tool", task.tool, registry))
        args = _with_inputs(task.args or {}, inputs, f"{where}.args")
        return _built(registry, ActionSpec("tool", task.tool, {"args": args}), f"{where}.args")
    assert task.function is not None
    try:
        if any(p.startswith("_") for p in re.split(r"[:.]", task.function)):
            raise UsageError("private")  # a `_name` is the module's own, never a request's
        fn = registry.function(task.function)
    except UsageError:
        raise SpecError(
            f"{where}.function", _unknown("function", task.function, registry)
        ) from None
    return _built(registry, ActionSpec("function", registered_name(fn)), where)


def _built(registry: Registry, spec: ActionSpec, field: str) -> Action:
    try:
        return registry.action(spec)
    except UsageError as exc:
        raise SpecError(field, str(exc)) from None


def _with_inputs(value: Any, inputs: Mapping[str, Any], field: str) -> Any:
    """`value` with each `{"$input": NAME}` replaced by the input NAME."""
    if isinstance(value, dict):
        if set(value) == {"$input"}:
            name = value["$input"]
            if not isinstance(name, str) or name not in inputs:
                raise SpecError(field, f"no input {name!r} was given")
            return inputs[name]
        return {k: _with_inputs(v, inputs, field) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_inputs(v, inputs, field) for v in value]
    return value


def _unknown(kind: str, name: str, registry: Registry) -> str:
    have = registry.names()[f"{kind}s"]
    if kind == "function":
        have = [n.partition(":")[2] or n for n in have]
        have = [n for n in have if not any(p.startswith("_") for p in n.split("."))]
    listed = ", ".join(have[:20]) + (" ..." if len(have) > 20 else "") if have else "none"
    return f"no {kind} {name!r} is registered with this service; it has: {listed}"
