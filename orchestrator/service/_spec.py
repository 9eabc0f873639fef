"""What the REST API accepts and answers, as pydantic models: the trust boundary.

A workflow spec names what the service has registered (agents, tools, functions), never
code. Every string, list and mapping has a bound, so a request is refused with the field
and the limit before anything is built; the OpenAPI document is generated from these models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from ..engine._config import key_path

MAX_TASKS = 10_000
"""Tasks in one request."""
MAX_AFTER = 1_000
"""Dependencies of one task."""
MAX_EDGES = 100_000
"""Dependencies in one request, all tasks together."""
MAX_TEXT = 200_000
"""Characters of a prompt."""
MAX_LABELS = 32
MAX_DEPTH = 32
"""Nesting of JSON values (tool arguments, inputs)."""
MAX_INPUTS = 256

Name = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@/-]+$")
]
"""The names of registered agents, tools and functions."""
WorkflowName = Annotated[
    str, StringConstraints(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")
]
"""A workflow's name: its id is the name and a random suffix, used as it is in URLs."""
TaskId = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^{}$\s\x85\uFEFF]+$")
]
"""A task id: no white space, braces or `$`, so that a prompt can refer to it as ${id}.
White space is named twice over: U+0085 is white space to the validator's regexes (Rust)
only, U+FEFF to the document's (ECMA 262) only."""
LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
LabelValue = Annotated[str, StringConstraints(max_length=200)]
Priority = Literal["interactive", "batch"]
RESERVED_LABELS = "plait."
"""Label keys that start with this are the service's own (its idempotency record)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _one_action_schema(schema: dict[str, Any]) -> None:
    """The document states what `_Action._one_action` checks, so that what it calls valid
    is: exactly one action, `prompt` with `agent` only, `args` with `tool` only."""
    text, absent = {"type": "string"}, {"type": "null"}
    schema["oneOf"] = [
        {
            "required": ["agent", "prompt"],
            "properties": {"agent": text, "prompt": text, "tool": absent, "args": absent,
                           "function": absent},
        },
        {
            "required": ["tool"],
            "properties": {"tool": text, "agent": absent, "prompt": absent, "function": absent},
        },
        {
            "required": ["function"],
            "properties": {"function": text, "agent": absent, "prompt": absent, "tool": absent,
                           "args": absent},
        },
    ]  # fmt: skip


class _Action(_Request):
    """What one task runs: exactly one of `agent` (with `prompt`), `tool` (with `args`),
    `function`; and how it is retried."""

    model_config = ConfigDict(json_schema_extra=_one_action_schema)

    agent: Name | None = None
    """A registered agent that answers `prompt`."""
    prompt: str | None = Field(default=None, max_length=MAX_TEXT)
    """The agent's prompt: `${task}` is that dependency's result, `${inputs.NAME}` the
    workflow's input NAME; `$${` is a literal `${`."""
    tool: Name | None = None
    """A registered tool, called with `args` (checked against its schema)."""
    args: dict[str, Any] | None = Field(default=None, max_length=MAX_INPUTS)
    """The tool's arguments; a value `{"$input": "NAME"}` is the workflow's input NAME."""
    function: Name | None = None
    """A registered Python function of the task's context (its inputs)."""
    retry: int = Field(default=1, ge=1, le=20)
    """Attempts before the task fails."""
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86_400)
    idempotent: bool = True
    """False: running it twice does harm; after a crash it waits for a decision."""

    @model_validator(mode="after")
    def _one_action(self) -> _Action:
        chosen = [k for k in ("agent", "tool", "function") if getattr(self, k) is not None]
        if len(chosen) != 1:
            said = "none" if not chosen else " and ".join(chosen)
            raise ValueError(f"a task runs exactly one of agent, tool or function; got {said}")
        if (self.agent is None) != (self.prompt is None):
            raise ValueError("prompt goes with agent, and an agent task needs a prompt")
        if self.args is not None and self.tool is None:
            raise ValueError("args go with tool")
        return self


class TaskSpec(_Action):
    """One task of a workflow."""

    id: TaskId
    after: list[TaskId] = Field(default_factory=list, max_length=MAX_AFTER)
    """Tasks of the same workflow this one runs after; their results are its inputs."""

    @model_validator(mode="after")
    def _not_after_itself(self) -> TaskSpec:
        if self.id in self.after:
            raise ValueError(f"task {self.id!r} cannot run after itself")
        return self


class _Run(_Request):
    priority: Priority = "batch"
    """`interactive` runs before `batch` when both wait (program-first scheduling)."""
    deadline_s: float | None = Field(default=None, gt=0, le=30 * 86_400)
    """Seconds from submission: urgency for the scheduler, met or missed in the result."""
    late: Literal["finish", "cancel"] = "finish"
    """With a deadline, "cancel" gives the run up when its deadline passes, or at once when
    most recent runs of the same name took longer than its deadline (docs/admission.md)."""
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)
    """Free key/value pairs to filter the list by."""
    inputs: dict[Name, Any] = Field(default_factory=dict, max_length=MAX_INPUTS)
    """Values the tasks refer to: `${inputs.NAME}` in prompts, `{"$input": NAME}` in args."""

    @field_validator("labels")
    @classmethod
    def _own_labels(cls, value: dict[str, str]) -> dict[str, str]:
        if any(key.startswith(RESERVED_LABELS) for key in value):
            raise ValueError(f"label keys starting {RESERVED_LABELS!r} are the service's own")
        return value


class WorkflowSpec(_Run):
    """`POST /v1/workflows`: a workflow to run."""

    name: WorkflowName
    tasks: list[TaskSpec] = Field(min_length=1, max_length=MAX_TASKS)

    @model_validator(mode="after")
    def _bounded_edges(self) -> WorkflowSpec:
        edges = sum(len(t.after) for t in self.tasks)
        if edges > MAX_EDGES:
            raise ValueError(f"{edges} dependencies in all; at most {MAX_EDGES}")
        return self


class SingleTask(_Run, _Action):
    """`POST /v1/tasks`: one task, run as a workflow of that one task (its id: `task`)."""

    name: WorkflowName = "task"

    def as_workflow(self) -> WorkflowSpec:
        task = TaskSpec(id="task", **self.model_dump(include=set(_Action.model_fields)))
        return WorkflowSpec(
            name=self.name,
            tasks=[task],
            priority=self.priority,
            deadline_s=self.deadline_s,
            late=self.late,
            labels=self.labels,
            inputs=self.inputs,
        )


class AddTasks(_Request):
    """`POST /v1/workflows/{id}/tasks`: tasks added to a running workflow; `after` may
    name its existing tasks. `inputs` as in a submission (this request's own)."""

    tasks: list[TaskSpec] = Field(min_length=1, max_length=MAX_TASKS)
    inputs: dict[Name, Any] = Field(default_factory=dict, max_length=MAX_INPUTS)


# --- answers ---------------------------------------------------------------------------------

WorkflowState = Literal["pending", "running", "succeeded", "failed", "cancelled"]


class Accepted(BaseModel):
    """The answer to a submission: the workflow's id, and where to follow it."""

    id: str
    status: WorkflowState
    links: dict[str, str]


class Added(BaseModel):
    """`POST /v1/workflows/{id}/tasks`: the ids added, in the order given to the engine
    (dependencies first)."""

    id: str
    added: list[str]


class TaskView(BaseModel):
    id: str
    kind: str
    name: str
    after: list[str]
    state: str
    attempts: int
    error: str | None = None


class WorkflowView(BaseModel):
    """`GET /v1/workflows/{id}`."""

    id: str
    name: str
    status: WorkflowState
    priority: str
    labels: dict[str, str]
    created: float
    updated: float
    finished: float | None
    deadline: float | None
    """Epoch seconds."""
    counts: dict[str, int] | None = None
    """Tasks by state (left out of lists: a list is one query, not one per workflow)."""
    tasks: list[TaskView] | None = None
    """Left out of lists."""
    waiting_for_decision: list[str] | None = None
    """Tasks declared not idempotent that were running when the service stopped: the
    workflow stays `running` without running until `POST /v1/workflows/{id}/decision` says
    whether they run again or fail. Left out of lists, and null when none waits."""


class WorkflowList(BaseModel):
    """`GET /v1/workflows`: newest first; `next` is the query for the page after, if any."""

    workflows: list[WorkflowView]
    next: str | None


class ResultView(BaseModel):
    """`GET /v1/workflows/{id}/result`: `results` and `failures` by task once it has
    finished; `status` says whether it has."""

    id: str
    status: WorkflowState
    finished: bool
    results: dict[str, Any]
    failures: dict[str, str]


# --- decisions --------------------------------------------------------------------------------

Choice = Literal["rerun", "fail"]


def _one_decision_schema(schema: dict[str, Any]) -> None:
    """The document states what `DecisionSpec._one_form` checks: `decision` or `tasks`."""
    schema["oneOf"] = [
        {"required": ["decision"],
         "properties": {"decision": {"enum": ["rerun", "fail"]}, "tasks": {"maxProperties": 0}}},
        {"properties": {"decision": {"type": "null"}, "tasks": {"minProperties": 1}},
         "required": ["tasks"]},
    ]  # fmt: skip


class DecisionSpec(_Request):
    """`POST /v1/workflows/{id}/decision`: for the tasks that wait for a decision (the
    view's `waiting_for_decision`), run them again ("rerun") or fail them ("fail"; their
    dependents are skipped, as after any failure). `decision` says it for every waiting
    task; `tasks` for each by id, and must name every one of them."""

    model_config = ConfigDict(json_schema_extra=_one_decision_schema)

    decision: Choice | None = None
    tasks: dict[TaskId, Choice] = Field(default_factory=dict, max_length=MAX_TASKS)

    @model_validator(mode="after")
    def _one_form(self) -> DecisionSpec:
        if (self.decision is None) == (not self.tasks):
            raise ValueError(
                'give exactly one of decision ("rerun" or "fail", for every waiting task) '
                "and tasks (a decision per task id)"
            )
        return self


class Decided(BaseModel):
    """The decision taken, per task, and the workflow's status (`running` once it goes on).
    The same request again answers the same."""

    id: str
    status: WorkflowState
    decisions: dict[str, Choice]


class Problem(BaseModel):
    field: str
    message: str


def problems_of(exc: ValidationError) -> list[Problem]:
    """A request that does not fit its model, as the fields at fault (`tasks[2].agent`)."""
    return [
        Problem(
            field=key_path(e["loc"]) or "(body)", message=e["msg"].removeprefix("Value error, ")
        )
        for e in exc.errors(include_url=False)
    ]


class ErrorBody(BaseModel):
    """Every 4xx and 5xx: what went wrong, and for a bad request each field at fault."""

    error: str
    problems: list[Problem] = Field(default_factory=list)


# --- batches ------------------------------------------------------------------------------------

MAX_BATCH_ROWS = 50_000
"""Rows in one `POST /v1/batches` (the service's `max_batch_rows` may lower it)."""
BatchState = Literal["running", "completed", "failed", "cancelled"]


class BatchSpec(_Request):
    """`POST /v1/batches`: rows as `plait batch run` reads a JSONL file (docs/batch.md):
    all OpenAI Batch API request lines (`custom_id`, `method`, `url`, `body`) when the first
    is one, else all plain rows (`prompt` or `messages`, optional `system`, `max_tokens`,
    `custom_id`). Each row is one LLM call; a malformed row fails alone, in the output."""

    rows: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_BATCH_ROWS)


class ProgressView(BaseModel):
    total: int
    done: int
    """Rows written with a response (including those an earlier run of the batch wrote)."""
    failed: int
    running: int
    pending: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tokens_per_s: float = 0.0
    cache_hit_share: float = 0.0
    eta_s: float | None = None
    """Seconds left at the pace so far; null before the first row finishes."""


class BatchView(BaseModel):
    """`POST /v1/batches` (202) and `GET /v1/batches/{id}`: the output so far is at
    `GET /v1/batches/{id}/output`; `summary` once the batch has completed."""

    id: str
    state: BatchState
    created: float
    """Epoch seconds."""
    total: int
    progress: ProgressView
    summary: dict[str, Any] | None = None
    error: str | None = None


class BatchList(BaseModel):
    """`GET /v1/batches`: newest first."""

    batches: list[BatchView]
    next: str | None
