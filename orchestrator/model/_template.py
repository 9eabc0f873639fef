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

from ._errors import RunError, UsageError

if TYPE_CHECKING:
    from ..engine._context import TaskContext

_PART = re.compile(r"\$\$\{|\$\{([^{}]*)\}|\$\{")
"""An escaped `${`, a reference, or a `${` that never closes (an error)."""

MAX_PROMPT_CHARS = 1 << 20
"""The longest prompt a template may fill to (characters): a reference repeated many times
multiplies its value, so the size is checked before the text is built."""


class PromptTooLargeError(RunError):
    """A template's filled text would be longer than its limit; nothing was built."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what}: its prompt filled with its inputs would be {size} characters, over the "
            f"limit of {limit}; refer to large inputs fewer times, or shorten them"
        )
        self.size = size
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Template:
    """Prompt text with `${name}` references to the task's inputs (see the module)."""

    text: str
    names: tuple[str, ...] = field(init=False, compare=False)
    """The names referred to, each once, in order of first use."""
    _uses: tuple[int, ...] = field(init=False, compare=False, repr=False)
    """How many times each of `names` is referred to."""
    _escapes: int = field(init=False, compare=False, repr=False)
    """How many `$${` the text holds."""
    _plain: int = field(init=False, compare=False, repr=False)
    """Characters of the text outside references and escapes."""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise UsageError(f"a Template takes text, got {type(self.text).__name__}")
        names: dict[str, int] = {}
        escapes = parts = 0
        for match in _PART.finditer(self.text):
            token = match.group(0)
            parts += len(token)
            if token == "$${":
                escapes += 1
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
            names[name] = names.get(name, 0) + 1
        object.__setattr__(self, "names", tuple(names))
        object.__setattr__(self, "_uses", tuple(names.values()))
        object.__setattr__(self, "_escapes", escapes)
        object.__setattr__(self, "_plain", len(self.text) - parts)

    def __call__(self, ctx: TaskContext) -> str:
        """The prompt for this task: its inputs filled in (a `Prompt` builder)."""
        return self.render(ctx.inputs, what=f"task {ctx.task_id!r}")

    def render(
        self,
        values: Mapping[str, Any],
        *,
        what: str = "the template",
        limit: int = MAX_PROMPT_CHARS,
    ) -> str:
        """The text with every reference replaced; a name without a value is an error, and
        so is a text that would be longer than `limit` (`PromptTooLargeError`, checked
        before the text is built)."""
        missing = [name for name in self.names if name not in values]
        if missing:
            have = ", ".join(sorted(map(repr, values))) or "none"
            raise UsageError(
                f"{what}: its prompt refers to ${{{missing[0]}}}, which is not among its "
                f"inputs ({have}); each ${{name}} must be a task it runs after"
            )
        texts = self._texts(values)
        size = self._size(texts, escape=False)
        if size > limit:
            raise PromptTooLargeError(what, size, limit)
        return self._fill(texts, escape=False)

    def fill(self, values: Mapping[str, Any]) -> Template:
        """A template with the references named in `values` replaced now and the others
        left for later (the text filled in is escaped, so it adds no references)."""
        return Template(self._fill(self._texts(values), escape=True))

    def size(self, values: Mapping[str, Any], *, escape: bool = False) -> int:
        """The length of the text `render` (or, with `escape`, `fill`) would make from
        `values`, computed without making it: a reference without a value counts as
        itself. Each value is turned to text once, however often it is referred to."""
        return self._size(self._texts(values), escape=escape)

    def _texts(self, values: Mapping[str, Any]) -> dict[str, str]:
        return {name: as_text(values[name]) for name in self.names if name in values}

    def _size(self, texts: Mapping[str, str], *, escape: bool) -> int:
        size = self._plain + self._escapes * (3 if escape else 2)
        for name, uses in zip(self.names, self._uses, strict=True):
            text = texts.get(name)
            if text is None:
                size += uses * (len(name) + 3)
            else:
                size += uses * (len(text) + (text.count("${") if escape else 0))
        return size

    def _fill(self, texts: Mapping[str, str], *, escape: bool) -> str:
        if escape:
            texts = {name: text.replace("${", "$${") for name, text in texts.items()}

        def replace(match: re.Match[str]) -> str:
            token = match.group(0)
            name = match.group(1)
            if name is None or name not in texts:
                return token if escape or token != "$${" else "${"
            return texts[name]

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
