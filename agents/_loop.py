"""The agent loop, unrolled into the DAG: LLM turn -> tool tasks -> LLM turn -> ... -> answer.

`Agent.solve(wf, "answer", prompt)` adds two tasks: the first turn (`answer.turn1`) and the
answer (`answer`), which waits for the last turn. A turn whose reply calls tools adds one
task per call (they run in parallel), the next turn after them, and hands its place before
the answer to that next turn. So every pause of the loop is a tool task the scheduler sees:
the keep-alive predictor learns each tool's pause, the agent's calls share one program
priority, and the event log holds each step (a resumed loop continues from its last step).

A turn records only what it adds to the conversation (its result: the prompt or the tool
replies it sent, then the model's reply); the next turn rebuilds the whole conversation from
its predecessors' results (`ctx.upstream`), so the log grows with the turns, not their square.

What the model gets wrong goes back to it as the tool's answer: arguments that do not fit a
tool's schema, a tool it does not have, a tool that raised. What it cannot fix stops the
loop with `AgentStopped` and the reason: too many turns, too many tokens, an answer that
never fits the output schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pydantic
from pydantic_core import PydanticSerializationError, to_json

from orchestrator import (
    LLMRequest,
    LLMResponse,
    Message,
    RunError,
    TaskContext,
    Template,
    ToolCall,
    UsageError,
)
from orchestrator.ext import DEFAULT_FUNCTION_RESOURCE, ActionSpec, OutputSchema, registered_name

from ._mcp import MCPTools
from ._tools import TOOL_ERROR, Tool, ToolArgumentsError, problems

Prompt = str | Callable[[TaskContext], str]


class AgentStopped(RunError):
    """An agent loop ended without an answer it could give: `reason` says why."""

    def __init__(self, agent: str, reason: str) -> None:
        super().__init__(f"agent {agent!r} stopped: {reason}")
        self.agent = agent
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """Bounds on one agent loop. `max_turns`: LLM turns (each reply that calls tools is one);
    `max_tokens`: prompt plus completion tokens over all its calls (None: unbounded);
    `output_retries`: how often an answer that does not fit the output schema is asked
    again, with the validation error."""

    max_turns: int = 8
    max_tokens: int | None = None
    output_retries: int = 2

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.output_retries < 0:
            raise UsageError(
                f"LoopLimits(max_turns={self.max_turns}, output_retries={self.output_retries}): "
                "max_turns must be at least 1 and output_retries not negative"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"LoopLimits(max_tokens={self.max_tokens}) must be at least 1 or None")


@runtime_checkable
class ConversationLog(Protocol):
    """Where an agent keeps its conversations (`memory.Memory` is one): turns per agent and
    workflow name, in order. A loop reads the history before its first turn and appends the
    prompt and the final answer after its last."""

    async def append_turn(self, agent: str, workflow: str, role: str, content: str) -> Any: ...

    async def conversation(self, agent: str, workflow: str) -> Sequence[Any]:
        """Turns with `.role` and `.content` (or mappings with those keys), oldest first."""
        ...


class LoopAgent(Protocol):
    """What a loop needs of its agent (`Agent` is the one)."""

    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def tools(self) -> tuple[Tool | MCPTools, ...]: ...
    @property
    def toolsets(self) -> tuple[MCPTools, ...]: ...
    @property
    def memory(self) -> ConversationLog | None: ...

    def request_for(
        self,
        messages: Sequence[Message],
        *,
        tools: Iterable[Tool] = (),
        output: OutputSchema | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> LLMRequest: ...


# --- turn state as data (what the event log records, and resume rebuilds from) -------------


def message_data(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_call_id:
        data["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        data["tool_calls"] = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    return data


def message_from(data: Mapping[str, Any]) -> Message:
    return Message(
        data["role"],
        data["content"],
        tool_call_id=data.get("tool_call_id"),
        tool_calls=tuple(ToolCall(*c) for c in data.get("tool_calls", ())),
    )


@dataclass(frozen=True, slots=True)
class Pending:
    """A tool call of the previous turn: answered by task `task`, or already by `reply`."""

    call_id: str
    name: str
    task: str | None = None
    reply: str | None = None


@dataclass(frozen=True, slots=True)
class Loop:
    """What every step of one loop shares."""

    agent: LoopAgent
    answer: str
    """The task that carries the loop's answer."""
    prompt: Prompt | None
    """None in a later turn rebuilt from the log: the first turn's result holds the prompt."""
    output: type[pydantic.BaseModel] | None = None
    limits: LoopLimits = field(default_factory=LoopLimits)

    def args(self, *, prompt: bool = True) -> dict[str, Any]:
        args: dict[str, Any] = {"answer": self.answer}
        if prompt and self.prompt is not None:
            args.update(prompt_args(self.prompt))
        if self.output is not None:
            args["output"] = registered_name(self.output)
        limits = self.limits
        args["limits"] = [limits.max_turns, limits.max_tokens, limits.output_retries]
        return args


def prompt_args(prompt: Prompt) -> dict[str, Any]:
    """How a step records its prompt: the text, or the registered name of its builder."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, Template):
        return {"template": prompt.text}
    return {"prompt_from": registered_name(prompt)}


def prompt_from_args(args: Mapping[str, Any], function: Callable[..., Any]) -> Prompt:
    """The prompt `prompt_args` recorded (`function` finds a builder by its name)."""
    if "prompt" in args:
        prompt: Prompt = args["prompt"]
        return prompt
    if "template" in args:
        return Template(args["template"])
    return function(args.get("prompt_from", "?"), "prompt builder")  # type: ignore[no-any-return]


def loop_from(agent: LoopAgent, args: Mapping[str, Any], function: Callable[..., Any]) -> Loop:
    """The `Loop` a step recorded (`function` finds prompt builders and output models)."""
    recorded = any(key in args for key in ("prompt", "template", "prompt_from"))
    prompt = prompt_from_args(args, function) if recorded else None  # a later turn's
    output = function(args["output"], "output model") if "output" in args else None
    max_turns, max_tokens, retries = args["limits"]
    return Loop(agent, args["answer"], prompt, output, LoopLimits(max_turns, max_tokens, retries))


# --- the steps -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One LLM turn of a loop. A turn that calls tools returns `{"messages": [...]}`: what it
    added to the conversation (turn 1: the remembered turns and the prompt; a later turn: the
    replies to the previous turn's tool calls), its reply last. The last turn returns the
    answer."""

    loop: Loop
    number: int = 1
    pending: tuple[Pending, ...] = ()
    tokens: int = 0

    @property
    def resource(self) -> str:
        return self.loop.agent.backend

    @property
    def label(self) -> str:
        return f"{self.loop.agent.name} turn"

    @property
    def spec(self) -> ActionSpec:
        args = self.loop.args(prompt=self.number == 1)
        args.update(
            step="turn",
            turn=self.number,
            pending=[[p.call_id, p.name, p.task, p.reply] for p in self.pending],
            tokens=self.tokens,
        )
        return ActionSpec("llm", self.loop.agent.name, args)

    async def run(self, ctx: TaskContext) -> Any:
        loop, agent = self.loop, self.loop.agent
        history = self._earlier(ctx)
        if self.number == 1:
            if loop.prompt is None:
                raise UsageError(
                    f"the first turn {ctx.task_id!r} of agent {agent.name!r} has no prompt"
                )
            added = [
                *await _remembered(agent, ctx),
                Message("user", prompt_text(loop.prompt, ctx)),
            ]
        else:
            added = [
                Message("tool", _tool_reply(p, ctx), tool_call_id=p.call_id) for p in self.pending
            ]
        history += added
        _check_budget(loop, self.tokens)
        tools = self._tools(ctx)
        # With tools offered the model must be free to call them (a JSON grammar would rule
        # out the tool-call syntax), so the schema is enforced on its final answer instead.
        output = _schema(loop.output) if loop.output is not None and not tools else None
        request = agent.request_for(history, tools=tools, output=output)
        response = await ctx.complete(
            request,
            backend=agent.backend,
            expected_output_tokens=agent.max_tokens,
        )
        tokens = self.tokens + response.usage.total_tokens
        if response.tool_calls:
            return self._call_tools(ctx, added, response, tokens, tools)
        return await _finish(ctx, loop, history, response, tokens)

    def _tools(self, ctx: TaskContext) -> tuple[Tool, ...]:
        """The agent's own tools, and its MCP servers' as listed for this run."""
        tools = tuple(t for t in self.loop.agent.tools if isinstance(t, Tool))
        upstream = ctx.upstream if self.loop.agent.toolsets else {}
        for server in self.loop.agent.toolsets:
            listing = upstream.get(server.listing_task)
            if not isinstance(listing, list):
                raise UsageError(
                    f"turn {ctx.task_id!r} of agent {self.loop.agent.name!r} has no list of "
                    f"MCP server {server.name!r}'s tools: task {server.listing_task!r} did not "
                    "run before it (add the loop with Agent.solve)"
                )
            tools += server.tools(listing)
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UsageError(
                f"agent {self.loop.agent.name!r} offers tools named {twice} twice (its own and "
                "an MCP server's, or two servers'); give the MCP servers a prefix "
                "(mcp_tools(..., prefix='files_'))"
            )
        return tools

    def _earlier(self, ctx: TaskContext) -> list[Message]:
        """The conversation before this turn: what each earlier turn added, in order."""
        history: list[Message] = []
        upstream = ctx.upstream if self.number > 1 else {}
        for number in range(1, self.number):
            task = f"{self.loop.answer}.turn{number}"
            result = upstream.get(task)
            if not isinstance(result, Mapping) or "messages" not in result:
                raise UsageError(
                    f"turn {ctx.task_id!r} of agent {self.loop.agent.name!r} cannot rebuild "
                    f"its conversation: {task!r} left no messages (a loop recorded by an "
                    "earlier plait, or a turn edited out of the workflow); run the loop again"
                )
            history.extend(message_from(m) for m in result["messages"])
        return history

    def _call_tools(
        self,
        ctx: TaskContext,
        added: list[Message],
        response: LLMResponse,
        tokens: int,
        tools: tuple[Tool, ...],
    ) -> dict[str, Any]:
        loop, agent = self.loop, self.loop.agent
        if self.number >= loop.limits.max_turns:
            raise AgentStopped(
                agent.name,
                f"still calling tools after {self.number} turns (LoopLimits.max_turns="
                f"{loop.limits.max_turns}); raise max_turns or ask for fewer steps",
            )
        _check_budget(loop, tokens)
        by_name = {t.name: t for t in tools}
        pending: list[Pending] = []
        steps: list[tuple[str, Tool, dict[str, Any]]] = []
        for i, call in enumerate(response.tool_calls):
            tool = by_name.get(call.name)
            if tool is None:
                known = ", ".join(sorted(by_name)) or "none"
                reply = f"there is no tool {call.name!r}; the tools are: {known}"
                pending.append(Pending(call.id, call.name, reply=reply))
                continue
            try:
                tool.validate(call.arguments)
            except ToolArgumentsError as exc:
                pending.append(Pending(call.id, call.name, reply=str(exc)))
                continue
            args = json.loads(call.arguments or "{}")
            task = f"{loop.answer}.turn{self.number}.{i}.{call.name}"
            steps.append((task, tool, args))
            pending.append(Pending(call.id, call.name, task=task))
        said = Message("assistant", response.text, tool_calls=response.tool_calls)
        follow = Turn(loop, self.number + 1, tuple(pending), tokens)
        wf = ctx.workflow
        for task, tool, args in steps:
            wf.add(task, tool.use(args), after=[ctx.task_id], **tool.task_options())
        after = [task for task, _, _ in steps] or [ctx.task_id]
        wf.add(
            f"{loop.answer}.turn{self.number + 1}",
            follow,
            after=after,
            before=[loop.answer],
            trigger="all_done",  # a tool that failed is said to the model, not skipped
        )
        wf.remove_edge(ctx.task_id, loop.answer)
        return {"messages": [message_data(m) for m in (*added, said)]}


@dataclass(frozen=True, slots=True)
class Answer:
    """The loop's answer: the last turn's result (as the output model, when there is one)."""

    loop: Loop

    @property
    def resource(self) -> str:
        return DEFAULT_FUNCTION_RESOURCE

    @property
    def label(self) -> str:
        return f"{self.loop.agent.name} answer"

    @property
    def spec(self) -> ActionSpec:
        args = self.loop.args()
        args["step"] = "answer"
        return ActionSpec("llm", self.loop.agent.name, args)

    async def run(self, ctx: TaskContext) -> Any:
        if len(ctx.inputs) != 1:
            raise UsageError(
                f"the answer task {ctx.task_id!r} of agent {self.loop.agent.name!r} must have "
                f"exactly one input, its loop's last turn; it has {sorted(ctx.inputs)}"
            )
        (value,) = ctx.inputs.values()
        output = self.loop.output
        if output is not None and not isinstance(value, output):
            return output.model_validate(value)  # a result read back from the log
        return value


# --- structured output -------------------------------------------------------------------


def _schema(model: type[pydantic.BaseModel]) -> OutputSchema:
    return OutputSchema(model.__name__, model.model_json_schema())


def parse(model: type[pydantic.BaseModel], text: str) -> pydantic.BaseModel:
    """`text` as `model`; a fenced ```json block is unwrapped first, as models often write."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    return model.model_validate_json(body)


async def structured(
    ctx: TaskContext,
    agent: LoopAgent,
    model: type[pydantic.BaseModel],
    messages: list[Message],
    response: LLMResponse | None,
    retries: int,
    *,
    budget: Callable[[int], None] = lambda tokens: None,
    tokens: int = 0,
    max_tokens: int | None = None,
    extra_body: Mapping[str, Any] | None = None,
) -> tuple[pydantic.BaseModel, int]:
    """Ask until the reply fits `model`: the first reply (`response`, or a new call), then
    up to `retries` more, each told what was wrong. Returns the object and tokens used."""
    schema = _schema(model)
    error = ""
    for attempt in range(retries + 1):
        if response is None:
            budget(tokens)
            request = agent.request_for(
                messages, output=schema, max_tokens=max_tokens, extra_body=extra_body
            )
            response = await ctx.complete(
                request, backend=agent.backend, expected_output_tokens=agent.max_tokens
            )
            tokens += response.usage.total_tokens
        try:
            return parse(model, response.text), tokens
        except pydantic.ValidationError as exc:
            error = problems(exc, "the answer", limit=5)
        if attempt == retries:
            break
        messages = [
            *messages,
            Message("assistant", response.text),
            Message(
                "user",
                f"That answer does not fit the schema {model.__name__}: {error}. Answer again "
                "with JSON that fits the schema, and nothing else.",
            ),
        ]
        response = None
    raise AgentStopped(
        agent.name,
        f"its answer did not fit {model.__name__} after {retries + 1} tries (last error: "
        f"{error}); raise output_retries, simplify the schema, or use a server that "
        "enforces it",
    )


# --- helpers -------------------------------------------------------------------------------


async def _finish(
    ctx: TaskContext, loop: Loop, history: list[Message], response: LLMResponse, tokens: int
) -> Any:
    agent = loop.agent
    value: Any = response.text
    if loop.output is not None:

        def budget(used: int) -> None:
            _check_budget(loop, used)

        value, tokens = await structured(
            ctx,
            agent,
            loop.output,
            [*history],
            response,
            loop.limits.output_retries,
            budget=budget,
            tokens=tokens,
        )
    if agent.memory is not None:
        # The last user message is this loop's prompt (those before it were remembered).
        prompt = next((m.content for m in reversed(history) if m.role == "user"), "")
        text = value.model_dump_json() if isinstance(value, pydantic.BaseModel) else str(value)
        name = ctx.workflow.name
        await agent.memory.append_turn(agent.name, name, "user", prompt)
        await agent.memory.append_turn(agent.name, name, "assistant", text)
    return value


async def _remembered(agent: LoopAgent, ctx: TaskContext) -> list[Message]:
    if agent.memory is None:
        return []
    turns = await agent.memory.conversation(agent.name, ctx.workflow.name)
    out = []
    for turn in turns:
        role, content = (
            (turn["role"], turn["content"])
            if isinstance(turn, Mapping)
            else (turn.role, turn.content)
        )
        if role in ("user", "assistant"):
            out.append(Message(role, str(content)))
    return out


def prompt_text(prompt: Prompt, ctx: TaskContext) -> str:
    text = prompt if isinstance(prompt, str) else prompt(ctx)
    if not isinstance(text, str):
        raise UsageError(
            f"the prompt builder of task {ctx.task_id!r} returned {type(text).__name__}; "
            "it must return the prompt text"
        )
    return text


def _tool_reply(pending: Pending, ctx: TaskContext) -> str:
    if pending.reply is not None:
        return pending.reply
    if pending.task is None or pending.task not in ctx.inputs:
        return f"tool {pending.name!r} failed (task {pending.task!r}); no result"
    value = ctx.inputs[pending.task]
    if isinstance(value, dict) and TOOL_ERROR in value:
        return str(value[TOOL_ERROR])
    if isinstance(value, str):
        return value
    # As the log stores it: the same text whether the result is the tool's own object or
    # read back after a resume (a model and its dict, a tuple and its list), so a resumed
    # turn sends what it sent before and its recorded call answers it.
    try:
        return to_json(value).decode()
    except (PydanticSerializationError, TypeError, ValueError):
        return repr(value)


def _check_budget(loop: Loop, tokens: int) -> None:
    cap = loop.limits.max_tokens
    if cap is not None and tokens >= cap:
        raise AgentStopped(
            loop.agent.name,
            f"used {tokens} tokens, the loop's budget is {cap} (LoopLimits.max_tokens); raise it "
            "or ask for less",
        )


def rebuild_step(agent: LoopAgent, spec: ActionSpec, function: Callable[..., Any]) -> Any:
    """A loop step (turn, answer) or a structured ask, from its recorded spec."""
    args = spec.args
    loop = loop_from(agent, args, function)
    if args["step"] == "answer":
        return Answer(loop)
    if "history" in args:
        raise UsageError(
            f"agent {agent.name!r}: a turn of loop {args['answer']!r} was recorded by an "
            "earlier plait (each turn kept the whole history); finish it with that version "
            "or run the loop again"
        )
    pending = tuple(Pending(*p) for p in args.get("pending", ()))
    return Turn(loop, args["turn"], pending, args.get("tokens", 0))
