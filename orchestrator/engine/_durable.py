"""The engine's durable side: what a store adds to running workflows.

One `Durability` per engine with a store. It owns the journal (every event appended in
order, grouped commits, an outage ridden out), the call memo (LLM and keyed task results
recorded, and reused by resumed runs) and the retention sweeper, and it says when the engine
must wait for the store: before a run's result is handed back, before a task whose inputs
cost something outside starts, and when the store falls too far behind. The engine's loop
calls it; it never calls the engine back, except through `wake`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence

from ..durability._journal import Journal
from ..durability._resume import StoredCalls
from ..durability._retention import Sweeper
from ..durability._store import LeaseLostError, Store, StoreError, WorkflowRow
from ..model._clock import Clock
from ..model._events import EVENT_ADAPTER, Event, WorkflowFinished, WorkflowStatus
from ..model._task import TaskRun
from ..model._text import scrubbed, storable
from ._run import Run, RunResult

_log = logging.getLogger("plait.store")

JOURNAL_MAX_PENDING = 2_000_000
"""Records the journal may hold uncommitted: a 100,000-task workflow is added in one go."""
JOURNAL_HIGH_WATER = 50_000
"""Past this many uncommitted records the loop waits for the store before going on."""
STORE_PATIENCE_S = 60.0
"""How long runs pause while a store that failed in a way that may pass (a database away,
a full disk) is tried again, before they stop to be resumed: a database's restart or
fail-over, not an outage someone has to fix."""

_ROW_EVENTS = frozenset({"workflow_started", "workflow_resumed", "workflow_finished"})


class Durability:
    """Records the engine's runs in `store`; see the module docstring."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        runs: Mapping[str, Run],
        wake: Callable[[], None],
        *,
        patience_s: float,
        sweeper: Sweeper | None = None,
        owner: str | None = None,
        lease_s: float = 0.0,
        on_lost: Callable[[Sequence[str]], None] | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.journal = Journal(
            store,
            max_pending=JOURNAL_MAX_PENDING,
            patience_s=patience_s,
            owner=owner,
            lease_s=lease_s,
            on_lost=on_lost,
            on_refused=self._refused,
        )
        self.memo = StoredCalls(store, self.journal)
        self.sweeper = sweeper
        """Applies the engine's retention, if it has one (started and stopped here)."""
        self.error: StoreError | None = None
        """The store failed for good: every run must stop, and nothing more is accepted."""
        self.suspended = False
        """The engine is closing: its runs go on in a later process, nothing more is told."""
        self._clock = clock
        self._costly: set[str] = set()
        """Runs with a costly result (`ended`): only their tasks check their inputs' marks."""
        self._runs = runs
        self._wake = wake

    def start(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self.journal.run(), name="plait-journal")
        if self.sweeper is not None:
            tg.create_task(self.sweeper.run(), name="plait-retention")

    def suspend(self) -> None:
        """The engine closes with runs going on: what was committed stays, unfinished, for a
        resume; the cancellations the closing makes are this process's, not the runs'."""
        self.suspended = True
        if self.sweeper is not None:
            self.sweeper.stop()

    async def close(self) -> None:
        try:
            await self.journal.close()
        except StoreError as exc:
            self.error = self.error or exc

    # --- what the loop asks --------------------------------------------------------------------

    def behind(self) -> bool:
        return self.journal.stats.pending >= JOURNAL_HIGH_WATER

    async def catch_up(self) -> None:
        """Let the store commit what it holds before the loop goes on."""
        try:
            await self.journal.durable()
        except StoreError as exc:
            self.error = self.error or exc

    def record(self, run_id: str, event: Event) -> None:
        """Every event goes to the journal as it is emitted, in order (the bus's recorder)."""
        if self.error is not None or self.suspended:
            return  # stopping: nothing more is recorded (the log stays as the run left it)
        journal = self.journal
        try:
            if event.kind == "workflow_started":
                # A new run's log begins at 1, so the store tells it from one it holds.
                journal.start_at(run_id, 0)
            try:
                journal.append_event(run_id, event)
            except (ValueError, TypeError, RecursionError) as exc:  # pydantic's are ValueErrors
                # Results and messages are made storable before their events are built, so
                # this is a gap in those checks: the record is kept, escaped, and the engine
                # goes on (an encoding error here would stop every run).
                self._escaped(run_id, event, storable(str(exc)))
            if event.kind in _ROW_EVENTS:
                journal.upsert(self._row(run_id, event))
        except StoreError as exc:
            self.error = exc
            self._wake()

    def _escaped(self, run_id: str, event: Event, why: str) -> None:
        """Record `event` scrubbed (`scrubbed`), as the log reader will read it back; an event
        that cannot be read back even so is left out (its run is then resumed from before it)
        rather than making the whole log unreadable."""
        data = scrubbed(event)
        try:
            EVENT_ADAPTER.validate_json(json.dumps(data))
        except ValueError as exc:
            _log.error(
                "%s of %s could not be encoded (%s) nor escaped (%s); not stored",
                event.kind,
                run_id,
                why,
                storable(str(exc))[:500],
            )
            return
        _log.error("%s of %s could not be encoded (%s); stored escaped", event.kind, run_id, why)
        self.journal.append(run_id, event.kind, event.at, data)

    def ended(self, run: Run, record: TaskRun, llm_calls: int) -> None:
        """A task succeeded. A result that cost something outside (an LLM call, a side
        effect) is committed before anything uses it: its dependents wait for this mark."""
        task = record.task
        if llm_calls or not task.idempotent or task.idempotency_key is not None:
            record.mark = self.journal.appended
            self._costly.add(run.id)

    def forget(self, run: Run) -> None:
        """The run has finished."""
        self._costly.discard(run.id)
        self.memo.forget(run.id)

    async def inputs_ready(self, run: Run, record: TaskRun) -> None:
        """Wait until the task's costly inputs are committed (a StoreError: the run is
        being stopped anyway)."""
        if run.id not in self._costly:
            return  # nothing of it cost anything outside: no input to wait for
        mark = run.inputs_mark(record)
        if mark > self.journal.committed:
            await self.journal.durable(mark)

    async def hand_back(self, run: Run, result: RunResult) -> None:
        """Give the run's awaiters its result once its last event is committed (or the
        error saying another engine runs it now)."""
        try:
            await self.journal.durable()
        except StoreError as exc:
            fail(run.done, exc)
        else:
            if self.journal.lost(run.id):
                refusal = self.journal.refusal(run.id)
                lost = LeaseLostError(self.owner or "this engine", [run.id])
                fail(run.done, refusal or lost)
            else:
                run.done.set_result(result)

    # --- inside ----------------------------------------------------------------------------------

    def _refused(self, workflows: Sequence[str], error: StoreError) -> None:
        """The store refused these runs' records (a new run's id is taken, or text it
        cannot keep): they stop here, and nothing more of them is written."""
        for workflow in workflows:
            run = self._runs.get(workflow)
            if run is not None:
                run.cancel(f"the store refused it: {error}")
        self._wake()

    def _row(self, run_id: str, event: Event) -> WorkflowRow:
        run = self._runs.get(run_id)
        clock = self._clock
        now, mono = clock.now(), clock.monotonic()
        deadline = None
        if run is not None and run.deadline is not None:
            deadline = now + (run.deadline - mono)  # rows keep wall-clock times
        status: WorkflowStatus = event.status if isinstance(event, WorkflowFinished) else "running"
        started = now - (mono - run.started_at) if run is not None else now
        return WorkflowRow(
            id=run_id,
            name=run.workflow.name if run is not None else run_id,
            status=status,
            priority=run.priority_class if run is not None else "batch",
            deadline=deadline,
            created=started,
            updated=now,
            finished=now if status != "running" else None,
            tenant=run.tenant if run is not None else None,
            labels=run.labels if run is not None else {},
        )


def fail(done: asyncio.Future[RunResult], error: BaseException) -> None:
    """Hand `error` to whoever awaits the run; nobody may (a run submitted and left), and
    that must not log "exception was never retrieved": the error is the engine's to tell."""
    done.set_exception(error)
    done.exception()  # marks it retrieved; awaiting it still raises it
