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
import random
from typing import Any

from orchestrator import LLMRequest, ToolCall

from ._simtext import generate

_MAX_DEPTH = 6


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
    schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int = 0
) -> Any:
    """A small value that fits the JSON schema `schema` (`root` holds its `$defs`)."""
    if depth > _MAX_DEPTH:
        return None
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return instance(root.get("$defs", {}).get(name, {}), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return instance(options[0], rng, root, depth + 1)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: instance(sub, rng, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        items = schema.get("items", {})
        count = max(schema.get("minItems", 1), 1)
        return [instance(items, rng, root, depth + 1) for _ in range(min(count, 3))]
    if kind == "string":
        low = max(schema.get("minLength", 0), 1)
        text = generate(rng.randrange(1 << 30), 0, rng.randint(1, 3)).strip() or "text"
        return (text * low)[: max(low, len(text))]
    if kind == "integer":
        return int(schema.get("minimum", 0)) + rng.randrange(10)
    if kind == "number":
        return float(schema.get("minimum", 0)) + rng.random()
    if kind == "boolean":
        return rng.random() < 0.5
    return None
