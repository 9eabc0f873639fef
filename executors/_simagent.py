"""How the simulated model behaves as an agent: tool calls and structured output.

A real server with grammar-constrained decoding returns JSON that fits the schema it was
given, and an instruction-tuned model offered tools calls one before it answers. The
simulator does the same so that agent loops and `ask(output=...)` run on it: offered tools
and not yet answered by one, it calls one tool (chosen by the prompt's hash) with arguments
that fit the tool's schema; asked for a schema, it answers with an instance of it. The
values are noise from the prompt's hash, like the simulator's text.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from orchestrator import LLMRequest, ToolCall

from ._simtext import generate

_MAX_DEPTH = 6
MAX_NODES = 10_000
"""Values one schema instance is made of at most (objects, arrays and leaves)."""
MAX_STRING = 4_096
"""The longest string made for a `minLength` (a longer one is cut to this)."""


def agent_reply(request: LLMRequest, seed: int, prompt_hash: int) -> tuple[str, ToolCall | None]:
    """(text, tool call) for a request that offers tools or asks for a schema, else ("", None)."""
    rng = random.Random(seed * 1_000_003 + prompt_hash)
    if request.tools and _awaits_tool(request):
        tool = request.tools[prompt_hash % len(request.tools)]
        args = instance(tool.parameters or {"type": "object"}, rng, tool.parameters)
        arguments = json.dumps(args if isinstance(args, dict) else {})
        return "", ToolCall(f"call-{prompt_hash % 10**12:012d}", tool.name, arguments)
    if request.output is not None:
        schema = request.output.schema
        return json.dumps(instance(schema, rng, schema)), None
    return "", None


def _awaits_tool(request: LLMRequest) -> bool:
    """No tool has answered since the last user message."""
    for message in reversed(request.messages):
        if message.role == "tool":
            return False
        if message.role == "user":
            return True
    return True


def instance(
    schema: Any, rng: random.Random, root: Any, depth: int = 0, budget: list[int] | None = None
) -> Any:
    """A small value that fits the JSON schema `schema` (`root` holds its `$defs`).

    A schema can come from a client over HTTP, so nothing in it is trusted: a part that is
    not what JSON Schema says is read as no constraint, lengths are capped, and at most
    `MAX_NODES` values are made in all (a `$ref` fanned out at every level would otherwise
    ask for exponentially many)."""
    budget = [MAX_NODES] if budget is None else budget
    if depth > _MAX_DEPTH or budget[0] <= 0 or not isinstance(schema, dict):
        return None
    budget[0] -= 1
    if "$ref" in schema:
        ref, defs = schema["$ref"], root.get("$defs") if isinstance(root, dict) else None
        name = ref.rsplit("/", 1)[-1] if isinstance(ref, str) else ""
        target = defs.get(name, {}) if isinstance(defs, dict) else {}
        return instance(target, rng, root, depth + 1, budget)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf", "allOf"):
        given = schema.get(key)
        if isinstance(given, list) and given:
            options = [s for s in given if isinstance(s, dict) and s.get("type") != "null"]
            return instance((options or given)[0], rng, root, depth + 1, budget)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {
            name: instance(sub, rng, root, depth + 1, budget) for name, sub in properties.items()
        }
    if kind == "array":
        count = max(_integer(schema.get("minItems"), 1), 1)
        items = schema.get("items", {})
        return [instance(items, rng, root, depth + 1, budget) for _ in range(min(count, 3))]
    if kind == "string":
        low = min(max(_integer(schema.get("minLength"), 0), 1), MAX_STRING)
        text = generate(rng.randrange(1 << 30), 0, rng.randint(1, 3)).strip() or "text"
        return (text * low)[: max(low, len(text))]
    if kind == "integer":
        return int(_number(schema.get("minimum"))) + rng.randrange(10)
    if kind == "number":
        return float(_number(schema.get("minimum"))) + rng.random()
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def _number(value: Any) -> int | float:
    """`value` if it is a finite JSON number, else 0."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return 0


def _integer(value: Any, default: int) -> int:
    """`value` if it is an integer (JSON's), else `default`."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default
