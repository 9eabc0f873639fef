"""Resume: read every unfinished run back from the store and rebuild what it was running.

`plan_resume` reads; it changes nothing (what `plait resume --dry-run` prints). The engine
then starts each plan's workflow from its `RunImage` (`Engine.resume`): finished tasks keep
their results, the others run, and LLM calls recorded before the crash are answered from the
store (`StoredCalls`), so no call is paid twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import to_json

from ..model._errors import PlaitError, UsageError
from ..model._workflow import Workflow
from ._journal import Journal, read_log
from ._registry import Registry
from ._replay import RunImage, rebuild
from ._store import Store, StoreError, WorkflowRow

Decision = Literal["rerun", "fail"]
"""For a task that is not idempotent and was running at the crash: run it again, or fail it."""

_RUNNING = ("running", "waiting")


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """One unfinished run as the store has it, and what resuming it would do."""

    workflow: str
    name: str
    rerun: tuple[str, ...] = ()
    """Tasks that had started and had not finished: they run again."""
    pending: tuple[str, ...] = ()
    """Tasks that had not started: they run for the first time."""
    kept: int = 0
    """Tasks whose final state (and result) the run keeps."""
    llm_tasks: int = 0
    """LLM tasks among those to run: at most this many calls are paid (fewer where a call's
    result was recorded before the crash)."""
    estimate_s: float | None = None
    """The tasks' own estimates, summed, where every task to run has one."""
    needs_decision: tuple[str, ...] = ()
    """Tasks declared not idempotent that were running at the crash (see `Decision`)."""
    error: str | None = None
    """Why the run cannot be rebuilt in this process (nothing of it is changed)."""
    image: RunImage | None = field(default=None, repr=False, compare=False)
    row: WorkflowRow | None = field(default=None, repr=False, compare=False)
    last_seq: int = 0
    workflow_object: Workflow | None = field(default=None, repr=False, compare=False)

    @property
    def resumable(self) -> bool:
        return self.error is None and self.workflow_object is not None


async def plan_resume(
    store: Store,
    registry: Registry,
    *,
    decisions: Mapping[str, Decision] | None = None,
    workflows: Sequence[str] | None = None,
) -> list[ResumePlan]:
    """A plan for every unfinished run in `store` (or those named in `workflows`)."""
    ids = list(workflows) if workflows is not None else await store.unfinished()
    plans = []
    for wid in ids:
        try:
            plans.append(await _plan(store, registry, wid, decisions or {}))
        except (ValueError, KeyError, TypeError) as exc:  # a damaged row: the rest go on
            error = f"its stored row or log cannot be read: {type(exc).__name__}: {exc}"
            plans.append(ResumePlan(wid, wid, error=error))
    return plans


async def _plan(
    store: Store, registry: Registry, workflow: str, decisions: Mapping[str, Decision]
) -> ResumePlan:
    row = await store.workflow(workflow)
    if row is None:
        return ResumePlan(workflow, workflow, error="the store has no such workflow")
    if row.status not in ("pending", "running"):
        return ResumePlan(workflow, row.name, error=f"it has finished ({row.status})")
    try:
        events, last_seq = await read_log(store, workflow)
        if not events:
            return ResumePlan(workflow, row.name, row=row, error="its log has no events")
        image = rebuild(events)
    except (UsageError, ValidationError, StoreError) as exc:
        return ResumePlan(workflow, row.name, row=row, error=f"its log cannot be read: {exc}")
    try:
        built = _workflow(row.name, image, registry)
    except PlaitError as exc:
        return ResumePlan(workflow, row.name, row=row, image=image, error=str(exc))
    to_run = [t for t in image.tasks.values() if not t.final]
    undecided = tuple(
        t for t in waiting_for_decision(image) if decision_for(decisions, workflow, t) is None
    )
    estimates = [t.options.estimate for t in to_run]
    return ResumePlan(
        workflow,
        row.name,
        rerun=tuple(t.id for t in to_run if t.state in _RUNNING),
        pending=tuple(t.id for t in to_run if t.state not in _RUNNING),
        kept=len(image.tasks) - len(to_run),
        # An agent loop's answer task is "llm" by kind but sends nothing.
        llm_tasks=sum(
            1 for t in to_run if t.action.kind == "llm" and t.action.args.get("step") != "answer"
        ),
        estimate_s=None if None in estimates else sum(e for e in estimates if e is not None),
        needs_decision=undecided,
        image=image,
        row=row,
        last_seq=last_seq,
        workflow_object=built,
    )


def _workflow(name: str, image: RunImage, registry: Registry) -> Workflow:
    """The workflow as its log last told it: every task (those added while it ran too),
    rebuilt through `registry`, with its edges."""
    tasks = [registry.task(t.id, t.action, t.options) for t in image.tasks.values()]
    edges = [(dep, t.id) for t in image.tasks.values() for dep in sorted(t.after)]
    workflow = Workflow._rebuilt(name, tasks, edges)
    workflow.id = image.workflow
    return workflow


def waiting_for_decision(image: RunImage) -> tuple[str, ...]:
    """The run's tasks declared not idempotent (and without an idempotency key) that were
    running when its process stopped: resuming it waits for a `Decision` on each."""
    return tuple(
        t.id
        for t in image.tasks.values()
        if not t.final
        and t.state in _RUNNING
        and not t.options.idempotent
        and t.options.idempotency_key is None
        and t.options.idempotency_key_from is None
    )


def decision_for(decisions: Mapping[str, Decision], workflow: str, task: str) -> Decision | None:
    return decisions.get(f"{workflow}/{task}", decisions.get(workflow))


class StoredCalls:
    """The engine's `CallMemo`: results are recorded through the journal (committed with
    the run's events) and looked up in the store for runs that were resumed; a run started
    in this process has nothing recorded before it, so it is not looked up."""

    def __init__(self, store: Store, journal: Journal) -> None:
        self._store = store
        self._journal = journal
        self._resumed: set[str] = set()

    def resumed(self, program: str) -> None:
        self._resumed.add(program)

    def forget(self, program: str) -> None:
        self._resumed.discard(program)

    async def recall(self, program: str, key: str) -> bytes | None:
        if program not in self._resumed:
            return None
        return await self._store.find_call(program, key)

    def remember(self, program: str, key: str, result: bytes) -> None:
        self._journal.record_call(program, key, result, workflow=program)

    async def recall_result(self, program: str, key: str) -> tuple[bool, Any]:
        """A task's result recorded under its idempotency key: (found, result)."""
        data = await self.recall(program, "task:" + key)
        return (False, None) if data is None else (True, json.loads(data))

    def remember_result(self, program: str, key: str, result: Any) -> None:
        self.remember(program, "task:" + key, to_json(result))
