"""Agents: a role with a system prompt, a model, tools and capabilities.

`agent.ask(...)` makes one LLM task (structured with `output=`); `agent.solve(...)` adds a
tool-using loop to a workflow, unrolled into tasks (see `_loop`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pydantic

from orchestrator import Hints, LLMBackend, LLMRequest, Message, Registry, TaskContext, UsageError
from orchestrator.ext import (
    DEFAULT_BACKEND,
    ActionSpec,
    LLMCall,
    OutputSchema,
    Sampling,
    WorkflowEditor,
    registered_name,
)

from ._board_model import tags
from ._loop import (
    Answer,
    ConversationLog,
    Loop,
    LoopLimits,
    Prompt,
    Turn,
    prompt_args,
    prompt_from_args,
    prompt_text,
    rebuild_step,
    structured,
)
from ._mcp import Listing, MCPTools
from ._tools import Tool

Bid = Callable[[Any], Any]
"""An agent's bid for a blackboard post (a function of the `Post`, sync or async): a number,
higher wins; None declines. Rule-based, or asked of a model (`llm_bid`)."""


@dataclass(frozen=True, slots=True)
class Agent:
    """A role. Its system prompt opens every request it makes: a natural shared prefix.

    `tools`: what it may call in `solve` loops: `Tool`s, and MCP servers (`mcp_tools(...)`),
    whose tools each run lists once (they are kept apart in `toolsets`). `capabilities`:
    tags the blackboard matches posts against; `bid`: an optional function of a post
    returning its bid (higher wins, None declines). `memory`: where its conversations are
    kept across tasks and runs.
    """

    name: str
    system_prompt: str
    model: str = "default"
    backend: str = DEFAULT_BACKEND
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None
    tools: tuple[Tool | MCPTools, ...] = ()
    toolsets: tuple[MCPTools, ...] = ()
    capabilities: frozenset[str] = frozenset()
    bid: Bid | None = field(default=None, compare=False)
    memory: ConversationLog | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("an Agent needs a name")
        given: tuple[Any, ...] = tuple(self.tools)
        toolsets = (*self.toolsets, *(t for t in given if isinstance(t, MCPTools)))
        tools = tuple(t for t in given if not isinstance(t, MCPTools))
        for t in tools:
            if not isinstance(t, Tool):
                raise UsageError(
                    f"agent {self.name!r}: tools must be Tool objects (make one with "
                    f"agents.tool(fn)) or MCP servers (agents.mcp_tools(...)), got "
                    f"{type(t).__name__}"
                )
        servers = [s.name for s in toolsets]
        if len(set(servers)) != len(servers):
            raise UsageError(f"agent {self.name!r}: two MCP servers share a name in {servers}")
        object.__setattr__(self, "toolsets", toolsets)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise UsageError(f"agent {self.name!r}: two tools share a name in {names}")
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "capabilities", tags(self.capabilities, f"agent {self.name!r}"))

    @property
    def rebuilds(self) -> tuple[str, str]:
        """Resume finds this agent's LLM calls by its name (see `Registry`)."""
        return ("llm", self.name)

    async def serve(self, post: Any, ctx: TaskContext | None) -> str:
        """Answer a blackboard post this agent was awarded (`agents.Board`): one LLM call
        with the post's content as the prompt (text as it is, data as JSON), made as the
        claim's task in the poster's workflow, so it shares that program's priority."""
        if ctx is None:
            raise UsageError(
                f"agent {self.name!r} answers posts with its model, which it reaches only as a "
                "task of a workflow: post from inside a task (board.post(..., ctx=ctx)), or "
                "put a Helper on the board for posts made outside workflows"
            )
        content = post.content
        prompt = content if isinstance(content, str) else json.dumps(content, default=str)
        response = await ctx.complete(self.request(prompt), backend=self.backend)
        return response.text

    def parts(self) -> tuple[Tool | MCPTools, ...]:
        """Registering the agent registers its tools and MCP servers (a resumed loop
        rebuilds their calls)."""
        return (*self.tools, *self.toolsets)

    def rebuild(self, spec: ActionSpec, registry: Registry) -> Any:
        """The task `ask` or `solve` made, from its recorded `ActionSpec`."""
        args = spec.args
        step = args.get("step")
        if step in ("turn", "answer"):
            return rebuild_step(self, spec, registry.function)
        if step == "ask":
            output: Any = registry.function(args["output"], "output model")
            return self.ask(
                prompt_from_args(args, registry.function),
                output=output,
                max_tokens=args.get("max_tokens"),
                retries=args.get("retries", 2),
                extra_body=args.get("extra_body"),
            )
        return self.ask(
            prompt_from_args(args, registry.function),
            max_tokens=args.get("max_tokens"),
            extra_body=args.get("extra_body"),
        )

    def request_for(
        self,
        messages: Sequence[Message],
        *,
        tools: Iterable[Tool] = (),
        output: OutputSchema | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> LLMRequest:
        """The request for a conversation so far (everything after the system prompt)."""
        return LLMRequest(
            messages=(Message("system", self.system_prompt), *messages),
            model=self.model,
            sampling=self.sampling,
            max_tokens=max_tokens if max_tokens is not None else self.max_tokens,
            tools=tuple(t.spec() for t in tools),
            output=output,
            extra_body=dict(extra_body or {}),
        )

    def solve(
        self,
        workflow: WorkflowEditor,
        task_id: str,
        prompt: Prompt,
        *,
        after: Iterable[str] = (),
        output: type[pydantic.BaseModel] | None = None,
        limits: LoopLimits | None = None,
    ) -> str:
        """Add this agent's tool loop to `workflow` (before or during its run), answering
        `prompt`. Task `task_id` gets the answer (text, or an `output` object); its turns
        are `task_id.turnN` and its tool calls `task_id.turnN.I.TOOL`. Returns `task_id`."""
        _check_output(self.name, output)
        after = list(after)
        loop = Loop(self, task_id, prompt, output, limits or LoopLimits())
        for server in self.toolsets:  # listed once per run, for every loop that offers it
            if server.listing_task not in workflow:
                workflow.add(
                    server.listing_task,
                    Listing(server),
                    retry=server.attempts,
                    timeout=2 * server.connect_timeout_s,  # connecting, then listing
                    resource=server.resource,
                )
            else:
                _same_server(workflow, server)
            after.append(server.listing_task)
        workflow.add(f"{task_id}.turn1", Turn(loop), after=after)
        workflow.add(task_id, Answer(loop), after=[f"{task_id}.turn1"])
        return task_id

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
        output: type[pydantic.BaseModel] | None = None,
        retries: int = 2,
    ) -> Any:
        """An LLM task action. `prompt` is text, or a function of the task's context that
        builds the text from the task's inputs. The task's result is the reply text, or with
        `output` (a pydantic model) a validated object: the schema is sent for the server
        to enforce, and an answer that does not fit is asked again up to `retries` times
        with the error. (A result read back from the log after a resume is its dict.)"""
        if output is not None:
            _check_output(self.name, output)
            return StructuredAsk(self, prompt, output, retries, max_tokens, dict(extra_body or {}))
        if not (isinstance(prompt, str) or callable(prompt)):
            raise UsageError(
                f"agent {self.name!r}: ask() takes a str or a function of the TaskContext, "
                f"got {type(prompt).__name__}"
            )

        extra = dict(extra_body or {})
        self.request("", extra_body=extra)  # a bad field fails here, at ask(), not in the run

        def build(ctx: TaskContext) -> LLMRequest:
            return self.request(prompt_text(prompt, ctx), max_tokens=max_tokens, extra_body=extra)

        args: dict[str, Any] = {"model": self.model, "backend": self.backend}
        args.update(prompt_args(prompt))
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


def _same_server(workflow: WorkflowEditor, server: MCPTools) -> None:
    """The workflow's listing task of `server.name` lists `server` itself, not another
    server of the same name (whose tools the loop would be offered instead)."""
    task = getattr(workflow, "task", None)
    action = task(server.listing_task).action if callable(task) else None
    if isinstance(action, Listing) and action.server is not server:
        raise UsageError(
            f"two MCP servers are named {server.name!r} in workflow {workflow.name!r} "
            f"({action.server!r} and {server!r}); give them different names"
        )


def _check_output(agent: str, output: object) -> None:
    if output is not None and not (
        isinstance(output, type) and issubclass(output, pydantic.BaseModel)
    ):
        raise UsageError(f"agent {agent!r}: output must be a pydantic model class, got {output!r}")


@dataclass(frozen=True, slots=True)
class StructuredAsk:
    """`Agent.ask(..., output=Model)`: one question, answered as a validated `Model`."""

    agent: Agent
    prompt: Prompt
    output: type[pydantic.BaseModel]
    retries: int = 2
    max_tokens: int | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def resource(self) -> str:
        return self.agent.backend

    @property
    def label(self) -> str:
        return f"{self.agent.name} asks {self.agent.model} for {self.output.__name__}"

    @property
    def spec(self) -> ActionSpec:
        args: dict[str, Any] = {
            "step": "ask",
            "output": registered_name(self.output),
            "retries": self.retries,
            **prompt_args(self.prompt),
        }
        if self.max_tokens is not None:
            args["max_tokens"] = self.max_tokens
        if self.extra_body:
            args["extra_body"] = dict(self.extra_body)
        return ActionSpec("llm", self.agent.name, args)

    async def run(self, ctx: TaskContext) -> Any:
        value, _ = await structured(
            ctx,
            self.agent,
            self.output,
            [Message("user", prompt_text(self.prompt, ctx))],
            None,
            self.retries,
            max_tokens=self.max_tokens,
            extra_body=self.extra_body,
        )
        return value


def llm_bid(agent: Agent, backend: LLMBackend, *, max_tokens: int = 4) -> Bid:
    """A bid asked of a model: `agent`'s system prompt, then "how well can you serve this,
    0 to 10?"; the number in the reply is the bid, a reply without one declines. The call
    goes straight to `backend` (bidding happens on the board, outside any workflow)."""

    async def bid(post: Any) -> float | None:
        content = post.content if isinstance(post.content, str) else json.dumps(post.content)
        request = agent.request(
            "On a scale of 0 to 10, how well can you serve this request? Answer with the "
            f"number only.\n\n{content}",
            max_tokens=max_tokens,
        )
        reply = await backend.complete(request, Hints(f"bid:{post.id}:{agent.name}"))
        found = re.search(r"\d+(?:\.\d+)?", reply.text)
        return float(found.group()) if found else None

    return bid
