"""Prompt templates filled from a task's inputs: text that stays data.

A prompt written as a Python function cannot cross a process boundary or be submitted over
HTTP; a `Template` can. `${id}` is replaced by the result of dependency `id` (text as it
is, anything else as JSON); `$${` is a literal `${`; any other `$` is just a dollar sign.

    agent.ask(Template("Summarise what the search found:\\n${search}"))
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydantic

from ._errors import UsageError

if TYPE_CHECKING:
    from ._context import TaskContext

_PART = re.compile(r"\$\$\{|\$\{([^{}]*)\}|\$\{")
"""An escaped `${`, a reference, or a `${` that never closes (an error)."""


@dataclass(frozen=True, slots=True)
class Template:
    """Prompt text with `${name}` references to the task's inputs (see the module)."""

    text: str
    names: tuple[str, ...] = field(init=False, compare=False)
    """The names referred to, each once, in order of first use."""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise UsageError(f"a Template takes text, got {type(self.text).__name__}")
        names: dict[str, None] = {}
        for match in _PART.finditer(self.text):
            token = match.group(0)
            if token == "$${":
                continue
            name = match.group(1)
            if name is None:
                raise UsageError(
                    f"template {self.text[:60]!r}: '${{' at character {match.start()} is not "
                    "closed by '}'; write $${ for a literal '${'"
                )
            if not name.strip():
                raise UsageError(
                    f"template {self.text[:60]!r}: '${{}}' at character {match.start()} names "
                    "nothing; write ${task_id}"
                )
            names.setdefault(name, None)
        object.__setattr__(self, "names", tuple(names))

    def __call__(self, ctx: TaskContext) -> str:
        """The prompt for this task: its inputs filled in (a `Prompt` builder)."""
        return self.render(ctx.inputs, what=f"task {ctx.task_id!r}")

    def render(self, values: Mapping[str, Any], *, what: str = "the template") -> str:
        """The text with every reference replaced; a name without a value is an error."""
        missing = [name for name in self.names if name not in values]
        if missing:
            have = ", ".join(sorted(map(repr, values))) or "none"
            raise UsageError(
                f"{what}: its prompt refers to ${{{missing[0]}}}, which is not among its "
                f"inputs ({have}); each ${{name}} must be a task it runs after"
            )
        return self._fill(values, escape=False)

    def fill(self, values: Mapping[str, Any]) -> Template:
        """A template with the references named in `values` replaced now and the others
        left for later (the text filled in is escaped, so it adds no references)."""
        return Template(self._fill(values, escape=True))

    def _fill(self, values: Mapping[str, Any], *, escape: bool) -> str:
        def replace(match: re.Match[str]) -> str:
            token = match.group(0)
            name = match.group(1)
            if name is None or name not in values:
                return token if escape or token != "$${" else "${"
            text = as_text(values[name])
            return text.replace("${", "$${") if escape else text

        return _PART.sub(replace, self.text)


def as_text(value: Any) -> str:
    """How a value reads inside a prompt: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, pydantic.BaseModel):  # a structured answer
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
