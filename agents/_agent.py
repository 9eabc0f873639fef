"""Agents: a role with a system prompt and a model; `agent.ask(...)` makes an LLM task."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator import (
    DEFAULT_BACKEND,
    ActionSpec,
    LLMCall,
    LLMRequest,
    Message,
    Registry,
    Sampling,
    TaskContext,
    UsageError,
    registered_name,
)

Prompt = str | Callable[[TaskContext], str]


@dataclass(frozen=True, slots=True)
class Agent:
    """A role. Its system prompt opens every request it makes: a natural shared prefix."""

    name: str
    system_prompt: str
    model: str = "default"
    backend: str = DEFAULT_BACKEND
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("an Agent needs a name")

    @property
    def rebuilds(self) -> tuple[str, str]:
        """Resume finds this agent's LLM calls by its name (see `Registry`)."""
        return ("llm", self.name)

    def rebuild(self, spec: ActionSpec, registry: Registry) -> LLMCall:
        """The call `ask` made, from its recorded `ActionSpec`."""
        args = spec.args
        prompt: Prompt
        if "prompt" in args:
            prompt = args["prompt"]
        else:
            prompt = registry.function(args.get("prompt_from", "?"), "prompt builder")
        return self.ask(
            prompt, max_tokens=args.get("max_tokens"), extra_body=args.get("extra_body")
        )

    def request(
        self,
        prompt: str,
        *,
        history: Sequence[Message] = (),
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> LLMRequest:
        """The request this agent sends for `prompt` after `history`. `extra_body`: server-
        specific fields sent as they are (see `LLMRequest.extra_body`)."""
        messages = (Message("system", self.system_prompt), *history, Message("user", prompt))
        return LLMRequest(
            messages=messages,
            model=self.model,
            sampling=self.sampling,
            max_tokens=max_tokens if max_tokens is not None else self.max_tokens,
            extra_body=dict(extra_body or {}),
        )

    def ask(
        self,
        prompt: Prompt,
        *,
        max_tokens: int | None = None,
        expected_output_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> LLMCall:
        """An LLM task action. `prompt` is text, or a function of the task's context that
        builds the text from the task's inputs. The task's result is the reply text."""
        if not (isinstance(prompt, str) or callable(prompt)):
            raise UsageError(
                f"agent {self.name!r}: ask() takes a str or a function of the TaskContext, "
                f"got {type(prompt).__name__}"
            )

        extra = dict(extra_body or {})
        self.request("", extra_body=extra)  # a bad field fails here, at ask(), not in the run

        def build(ctx: TaskContext) -> LLMRequest:
            text = prompt if isinstance(prompt, str) else prompt(ctx)
            return self.request(text, max_tokens=max_tokens, extra_body=extra)

        args: dict[str, Any] = {"model": self.model, "backend": self.backend}
        if isinstance(prompt, str):
            args["prompt"] = prompt
        else:
            args["prompt_from"] = registered_name(prompt)
        if max_tokens is not None:
            args["max_tokens"] = max_tokens
        if extra:
            args["extra_body"] = extra
        return LLMCall(
            build=build,
            backend=self.backend,
            label=f"{self.name} asks {self.model}",
            expected_output_tokens=expected_output_tokens or max_tokens or self.max_tokens,
            description=ActionSpec("llm", self.name, args),
        )
