"""A batch job: every row of an input run as a workflow on an engine, output as rows finish.

    job = BatchJob(read_rows("in.jsonl"), sink_for("out.jsonl"))
    async with Engine(backends=..., store=store) as engine:
        job.open_sink()                       # refuses an output it must not write
        summary = await job.run(engine)      # job.progress() meanwhile, from any task

Each row is one workflow run, labelled with the job's id and the row's index, so that a
job run again with the same store and output finds what it had done: a row already in the
output is skipped; one finished in the store but missing from the output is written from
the store; one that was running is resumed by the engine (its recorded LLM calls are not
paid again); the rest run, in the plan's order, at most `max_running` at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import TypeAdapter

from ..durability._journal import read_log
from ..durability._registry import Registry
from ..durability._replay import rebuild
from ..durability._store import Store, WorkflowRow
from ..engine._context import TaskContext
from ..engine._engine import Engine, RunHandle
from ..model._errors import PlaitError, UsageError, error_text
from ..model._events import ActionSpec, TaskFailed, TaskSucceeded, WorkflowStatus
from ..model._llm import DEFAULT_BACKEND, LLMRequest, Usage
from ..model._workflow import Workflow
from ._output import Record, Sink
from ._plan import BatchPlan, plan
from ._rows import Row

_log = logging.getLogger("plait.batch")

JOB_LABEL = "plait.batch"
ROW_LABEL = "plait.batch.row"
ROW_ACTION = "plait.batch:row"
CALL_TASK = "call"

Factory = Callable[[dict[str, Any]], Workflow]
_REQUEST: TypeAdapter[LLMRequest] = TypeAdapter(LLMRequest)


# --- a row that is one LLM call -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowCall:
    """The action of a row that is one LLM call; its result is the reply as data."""

    request: LLMRequest
    backend: str = DEFAULT_BACKEND

    @property
    def resource(self) -> str:
        return self.backend

    @property
    def label(self) -> str:
        return "batch row"

    @property
    def spec(self) -> ActionSpec:
        return ActionSpec(
            "llm",
            ROW_ACTION,
            {"request": _REQUEST.dump_python(self.request, mode="json"), "backend": self.backend},
        )

    async def run(self, ctx: TaskContext) -> dict[str, Any]:
        reply = await ctx.complete(
            self.request,
            backend=self.backend,
            expected_output_tokens=self.request.max_tokens,
            last_call=True,
        )
        return {"content": reply.text, "finish_reason": reply.finish_reason, "model": reply.model}


class RowCalls:
    """Rebuilds `RowCall`s from a stored run (register it to resume a batch)."""

    @property
    def rebuilds(self) -> tuple[str, str]:
        return ("llm", ROW_ACTION)

    def rebuild(self, spec: ActionSpec, registry: Registry) -> RowCall:
        request = _REQUEST.validate_python(spec.args["request"])
        return RowCall(request, spec.args.get("backend", DEFAULT_BACKEND))


# --- progress and summary -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """A snapshot of a running job (cheap: take one as often as a display redraws)."""

    total: int
    done: int
    """Rows finished in this run and written, succeeded (`failed` counts the others)."""
    failed: int
    running: int
    skipped: int
    """Rows already in the output when the job started (`skipped_failed` of them failed)."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    elapsed_s: float
    skipped_failed: int = 0
    waiting: Mapping[str, float] = field(default_factory=dict)
    """Backends that are down (their circuit open), by name: seconds since they began
    failing. Calls to them wait (up to the engine's `Breaker.wait_s`), not fail."""

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.skipped

    @property
    def tokens_per_s(self) -> float:
        tokens = self.prompt_tokens + self.completion_tokens
        return tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def cache_hit_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before the first row finishes."""
        new = self.done + self.failed
        if new == 0 or self.elapsed_s <= 0:
            return None
        return (self.total - self.finished) * self.elapsed_s / new


@dataclass(frozen=True, slots=True)
class BatchSummary:
    """What a job did: rows, errors by kind, tokens, deduplication, time."""

    rows: int
    ok: int
    failed: int
    skipped: int
    """Rows already in the output when the job started; `skipped_failed` of them failed."""
    skipped_failed: int
    from_store: int
    """Rows finished before a restart, written from the store without running again."""
    resumed: int
    """Rows that were running at a restart, resumed by the engine."""
    errors: Mapping[str, int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    deduplicated: int
    """Rows answered by an identical row's call (no call of their own)."""
    mean_row_s: float
    wall_s: float
    plan: Mapping[str, int] = field(default_factory=dict)
    retried: int = 0
    """Rows an earlier run wrote as failed, run again (`retry_failed`)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "ok": self.ok,
            "failed": self.failed,
            "skipped": self.skipped,
            "skipped_failed": self.skipped_failed,
            "from_store": self.from_store,
            "resumed": self.resumed,
            "errors": dict(self.errors),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "deduplicated": self.deduplicated,
            "mean_row_s": round(self.mean_row_s, 4),
            "wall_s": round(self.wall_s, 3),
            "plan": dict(self.plan),
            "retried": self.retried,
        }

    @property
    def all_ok(self) -> bool:
        """Every row of the output succeeded, this run's and the earlier ones'."""
        return self.failed == 0 and self.skipped_failed == 0

    def text(self) -> str:
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        lines = [
            f"rows: {self.rows} ({self.ok} ok, {self.failed} failed, {self.skipped} already in "
            f"the output ({self.skipped_failed} of them failed), {self.from_store} written from "
            f"the store, {self.resumed} resumed"
            + (f", {self.retried} failed before and run again)" if self.retried else ")"),
            f"tokens: {self.prompt_tokens:,} prompt ({self.cached_tokens:,} from cache, "
            f"{hit:.0%}), {self.completion_tokens:,} completion",
            f"deduplicated: {self.deduplicated} row(s) answered by an identical row's call",
            f"plan: {self.plan.get('groups', 0)} group(s) sharing a prefix, "
            f"{self.plan.get('shared_prefix_tokens', 0):,} prompt tokens shared",
            f"time: {self.mean_row_s:.3f} s per row, {self.wall_s:.2f} s wall",
        ]
        for error, count in sorted(self.errors.items(), key=lambda e: -e[1]):
            lines.append(f"  {count} x {error}")
        return "\n".join(lines)


# --- the job --------------------------------------------------------------------------------


def job_id_for(output: str, fingerprint: str = "") -> str:
    """The id a job's runs are labelled with: the same output and the same input (its
    `fingerprint`) get the same id; a changed input is another job."""
    return hashlib.sha256(f"{output}\0{fingerprint}".encode()).hexdigest()[:16]


def fingerprint(rows: Sequence[Row], factory: Factory | None) -> str:
    """What identifies a job's input: every row's id and content, and the factory."""
    digest = hashlib.sha256()
    if factory is not None:
        name = f"{getattr(factory, '__module__', '')}:{getattr(factory, '__qualname__', '')}"
        digest.update(name.encode())
    for row in rows:
        content = json.dumps(row.data, sort_keys=True, default=str)
        digest.update(f"\0{row.custom_id}\0{content}".encode())
    return digest.hexdigest()


class BatchJob:
    """Runs `rows` on an engine and writes each finished row to `sink` (opened by the
    caller, which reads what an earlier run wrote). `factory(row) -> Workflow` makes each
    row's workflow; without one, a row is one LLM call on `backend`. `retry_failed`: the
    rows an earlier run wrote as failed (or left failed in the store) run again; those
    that succeeded are kept as they are. `tenant`: each row runs as that tenant's (its
    calls carry the tenant's cache salt, its run is stored under it), and only that
    tenant's runs are looked up when the job is run again; `untenanted` also adopts this
    job's runs stored without a tenant (rows of a job begun before it had one)."""

    def __init__(
        self,
        rows: Sequence[Row],
        sink: Sink,
        *,
        factory: Factory | None = None,
        backend: str = DEFAULT_BACKEND,
        job_id: str | None = None,
        max_running: int = 512,
        registry: Registry | None = None,
        dedup: bool = True,
        retry_failed: bool = False,
        tenant: str | None = None,
        untenanted: bool = False,
    ) -> None:
        if max_running < 1:
            raise PlaitError(f"BatchJob(max_running={max_running}) must be at least 1")
        # Rows are found by position: a subset of a file's rows is numbered again.
        self.rows = [r if r.index == i else replace(r, index=i) for i, r in enumerate(rows)]
        self.sink = sink
        self.factory = factory
        self.backend = backend
        self.job_id = job_id or job_id_for(
            str(sink.path.resolve()), fingerprint(self.rows, factory)
        )
        self.max_running = max_running
        self.retry_failed = retry_failed
        self.tenant = tenant
        self.untenanted = untenanted
        self.registry = (registry or Registry()).add(RowCalls())
        self.plan: BatchPlan = plan(self.rows, dedup=dedup)
        self._skipped_failed = 0
        self._leading = set(self.plan.leaders.values())
        self._records: dict[int, Record] = {}
        self._written: dict[int, asyncio.Event] = {}
        self._durations: list[float] = []
        self._errors: Counter[str] = Counter()
        self._usage = Usage(0, 0, 0)
        self._ok = self._failed = self._running = self._skipped = 0
        self._from_store = self._resumed = self._deduplicated = self._retried = 0
        self._dropped: set[str] = set()
        self._clock_start: float | None = None
        self._engine: Engine | None = None
        self._handles: dict[str, RunHandle] = {}
        self._live: set[str] = set()
        """Runs under `tenant` this job put in the engine (submitted or resumed), until
        it has seen them end: what `in_engine` counts."""
        self._changed = asyncio.Event()

    async def written(self, count: int) -> None:
        """Return once `count` rows have been written by this run (succeeded or failed)."""
        while self._ok + self._failed < count:
            self._changed.clear()
            await self._changed.wait()

    @property
    def engine(self) -> Engine | None:
        """The engine the job runs on (None before `run`)."""
        return self._engine

    def running_runs(self) -> list[str]:
        """Ids of the rows' runs running now (to cancel a job)."""
        return list(self._handles)

    def in_engine(self) -> int:
        """How many of this job's runs under its `tenant` the engine is running now (a
        service leaves them out of the tenant's running limit)."""
        engine = self._engine
        if engine is None:
            return 0
        ended = {run_id for run_id in self._live if engine.handle(run_id) is None}
        self._live -= ended  # resumed runs that ended before the job awaited them
        return len(self._live)

    def progress(self) -> BatchProgress:
        now = self._engine.clock.monotonic() if self._engine is not None else 0.0
        start = self._clock_start if self._clock_start is not None else now
        return BatchProgress(
            total=len(self.rows),
            done=self._ok,
            failed=self._failed,
            running=self._running,
            skipped=self._skipped,
            prompt_tokens=self._usage.prompt_tokens,
            completion_tokens=self._usage.completion_tokens,
            cached_tokens=self._usage.cached_prompt_tokens or 0,
            elapsed_s=now - start,
            skipped_failed=self._skipped_failed,
            waiting=self._waiting(now),
        )

    def _waiting(self, now: float) -> dict[str, float]:
        engine = self._engine
        if engine is None:
            return {}
        down: dict[str, float] = {}
        for name in engine.backends:
            circuit = engine.circuit(name)
            seconds = circuit.down_for(now) if circuit is not None else None
            if seconds is not None:
                down[name] = seconds
        return down

    async def run(self, engine: Engine) -> BatchSummary:
        """Run every row not yet in the output on `engine` (running, entered by the
        caller); returns when each has been written."""
        self._engine = engine
        self._clock_start = engine.clock.monotonic()
        done = self.sink.done  # opened by `open_sink`, which checked it is this job's
        todo = [i for i in self.plan.order if self.rows[i].custom_id not in done]
        self._skipped = len(self.rows) - len(todo)
        mine = {row.custom_id for row in self.rows}
        self._skipped_failed = sum(
            1 for key, record in done.items() if key in mine and record.get("error")
        )
        self._retried = len(self._dropped & mine)
        stored = await self._stored(engine)
        window = asyncio.Semaphore(self.max_running)
        async with asyncio.TaskGroup() as tg:
            resumable = [
                stored[i].id for i in todo if i in stored and stored[i].status in _UNFINISHED
            ]
            handles: dict[str, RunHandle] = {}
            if resumable:
                report = await engine.resume(self.registry, workflows=resumable)
                handles = {h.id: h for h in report.runs}
                mine = {row.id for row in stored.values() if row.tenant == self.tenant}
                self._live |= set(handles) & mine  # an untenanted run is not the tenant's
                lost = [plan for plan in report.plans if plan.error is not None]
                if lost:  # said, not silent: these rows start again and pay their calls again
                    _log.warning(
                        "%d row(s) of an earlier run could not be resumed and run again from "
                        "the start; the first: %s: %s",
                        len(lost),
                        lost[0].workflow,
                        lost[0].error,
                    )
            for i in todo:
                row = self.rows[i]
                if row.error is not None:
                    self._write(row, _error_record(row, row.error_code, row.error), Usage(), 0.0)
                    continue
                if i in self.plan.leaders:
                    tg.create_task(self._copy(row, self.plan.leaders[i]))
                    continue
                found = stored.get(i)
                run_id, status = (found.id, found.status) if found is not None else ("", "")
                if status == "succeeded" or (
                    status in ("failed", "cancelled") and not self.retry_failed
                ):
                    if await self._from_log(engine, row, run_id):
                        continue
                    run_id = ""  # its stored run cannot be read: the row runs again
                await window.acquire()
                handle = handles.get(run_id)
                if handle is not None:
                    self._resumed += 1
                else:
                    try:
                        handle = self._submit(engine, row)
                    except _RowFailed as exc:
                        window.release()
                        self._write(row, _error_record(row, exc.code, exc.message), Usage(), 0.0)
                        continue
                    self._live.add(handle.id)
                self._running += 1
                tg.create_task(self._finish(row, handle, window))
        return self.summary(engine.clock.monotonic() - self._clock_start)

    async def _stored(self, engine: Engine) -> dict[int, WorkflowRow]:
        """Row index -> this job's run of it in the engine's store (the newest run of a
        row wins)."""
        if engine.store is None:
            return {}
        found: dict[int, WorkflowRow] = {}
        for stored in await job_runs(
            engine.store, self.job_id, tenant=self.tenant, untenanted=self.untenanted
        ):
            index = stored.labels.get(ROW_LABEL, "")
            if index.isdigit() and int(index) < len(self.rows):
                found.setdefault(int(index), stored)
        return found

    def open_sink(self) -> None:
        """Open the output (refusing one that cannot be written, or that holds another
        job's rows) before any work starts; with `retry_failed`, the records of its failed
        rows are removed from it, to be written again as those rows run again."""
        self.sink.open(check=self._check_output, drop_failed=self.retry_failed)
        self._dropped |= set(self.sink.dropped)  # opened twice (checked, then run): once

    def _check_output(self, done: Mapping[str, Record]) -> None:
        """Refuse an output that holds another job's rows (another input, workflow or
        output path): its lines would be taken for this input's answers."""
        prefix = f"batch_req_{self.job_id}_"
        mine = {row.custom_id for row in self.rows}
        for key, record in done.items():
            other = isinstance(record.get("id"), str) and not record["id"].startswith(prefix)
            if other or key not in mine:
                raise UsageError(
                    f"output {str(self.sink.path)!r} holds rows of another batch (row "
                    f"{key!r}: another input, workflow or output name); write to a new file, "
                    "or remove this one to start again"
                )

    def summary(self, wall_s: float) -> BatchSummary:
        durations = self._durations
        return BatchSummary(
            rows=len(self.rows),
            ok=self._ok,
            failed=self._failed,
            skipped=self._skipped,
            skipped_failed=self._skipped_failed,
            from_store=self._from_store,
            resumed=self._resumed,
            errors=dict(self._errors),
            prompt_tokens=self._usage.prompt_tokens,
            completion_tokens=self._usage.completion_tokens,
            cached_tokens=self._usage.cached_prompt_tokens or 0,
            deduplicated=self._deduplicated,
            mean_row_s=sum(durations) / len(durations) if durations else 0.0,
            wall_s=wall_s,
            plan=self.plan.figures(),
            retried=self._retried,
        )

    # --- one row --------------------------------------------------------------------------

    def _workflow(self, row: Row) -> Workflow:
        if self.factory is None:
            assert row.request is not None
            wf = Workflow(f"row-{row.index}")
            wf.add(CALL_TASK, RowCall(row.request, self.backend))
            return wf
        try:
            wf = self.factory(dict(row.data))
        except Exception as exc:  # the user's factory: its failure is this row's
            message = f"the factory raised {error_text(exc)}"
            raise _RowFailed("workflow_factory_error", message) from exc
        if not isinstance(wf, Workflow):
            raise _RowFailed(
                "workflow_factory_error",
                f"the factory returned {type(wf).__name__}, not an orchestrator.Workflow",
            )
        return wf

    def _submit(self, engine: Engine, row: Row) -> RunHandle:
        wf = self._workflow(row)
        labels = {JOB_LABEL: self.job_id, ROW_LABEL: str(row.index)}
        try:
            return engine.submit(wf, tenant=self.tenant, labels=labels)
        except PlaitError as exc:
            raise _RowFailed("workflow_invalid", str(exc)) from exc

    async def _finish(self, row: Row, handle: RunHandle, window: asyncio.Semaphore) -> None:
        self._handles[handle.id] = handle
        try:
            result = await handle
        finally:
            self._handles.pop(handle.id, None)
            self._live.discard(handle.id)
            self._running -= 1
            window.release()
        outputs = _outputs(handle.workflow, result.results)
        record = self._record(row, handle.id, result.status, outputs, result.failures, result.usage)
        self._write(row, record, result.usage, result.duration)

    async def _from_log(self, engine: Engine, row: Row, run_id: str) -> bool:
        """Write the row from its finished run in the store; False (said in the log) if
        that run cannot be read back (a damaged log): the row then runs again."""
        assert engine.store is not None
        try:
            events, _ = await read_log(engine.store, run_id)
            image = rebuild(events)
            usage = Usage(0, 0, 0)
            failures: dict[str, str] = {}
            for event in events:
                if isinstance(event, TaskSucceeded) and event.usage is not None:
                    usage = usage + event.usage
                elif isinstance(event, TaskFailed):
                    failures[event.task] = event.error
            status = image.status or "failed"
            results = image.results()
            tasks = image.tasks
            sinks = {t for t in tasks} - {dep for t in tasks.values() for dep in t.after}
            outputs = {t: results[t] for t in sorted(sinks) if t in results}
        except Exception as exc:  # one damaged run costs its row a new run, not the batch
            _log.warning(
                "row %s: its finished run %s cannot be read back from the store (%s); the "
                "row runs again",
                row.custom_id,
                run_id,
                error_text(exc),
            )
            return False
        self._from_store += 1
        self._write(row, self._record(row, run_id, status, outputs, failures, usage), usage, 0.0)
        return True

    async def _copy(self, row: Row, leader: int) -> None:
        """A duplicate row: the answer of its leader's identical call."""
        first = self.rows[leader]
        record = self.sink.done.get(first.custom_id)
        if record is None:
            await self._written.setdefault(leader, asyncio.Event()).wait()
            record = self._records[leader]
        copy = {**record, "custom_id": row.custom_id, "id": _request_id(self.job_id, row)}
        response = copy.get("response")
        usage = Usage()
        if response is not None:
            body = dict(response["body"])
            given = body.get("usage") or {}
            usage = Usage(
                given.get("prompt_tokens", 0),
                given.get("completion_tokens", 0),
                given.get("prompt_tokens", 0),
            )
            body["usage"] = _usage_json(usage)
            copy["response"] = {**response, "body": body}
        self._deduplicated += 1
        self._write(row, copy, usage, 0.0)

    def _record(
        self,
        row: Row,
        run_id: str,
        status: str,
        outputs: Mapping[str, Any],
        failures: Mapping[str, str],
        usage: Usage,
    ) -> Record:
        if status != "succeeded":
            if failures:
                message = "; ".join(f"task {t!r}: {m}" for t, m in failures.items())
            else:
                message = f"the row's workflow ended {status}"
            code = "llm_error" if self.factory is None else "workflow_failed"
            if self.factory is None and failures:
                message = next(iter(failures.values()))
            return _error_record(row, code, message, self.job_id)
        return {
            "id": _request_id(self.job_id, row),
            "custom_id": row.custom_id,
            "response": {
                "status_code": 200,
                "request_id": run_id,
                "body": self._body(row, run_id, outputs, usage),
            },
            "error": None,
        }

    def _body(
        self, row: Row, run_id: str, outputs: Mapping[str, Any], usage: Usage
    ) -> dict[str, Any]:
        created = int(self._engine.clock.now()) if self._engine is not None else 0
        if self.factory is not None:
            return {
                "id": run_id,
                "object": "plait.workflow.result",
                "created": created,
                "outputs": dict(outputs),
                "usage": _usage_json(usage),
            }
        reply = outputs.get(CALL_TASK) or {}
        assert row.request is not None
        model = reply.get("model") or row.request.model
        finish = reply.get("finish_reason") or "stop"
        content = reply.get("content", "")
        if row.kind == "completion":
            choice: dict[str, Any] = {"index": 0, "text": content, "finish_reason": finish}
            kind = "text_completion"
        else:
            message = {"role": "assistant", "content": content}
            choice = {"index": 0, "message": message, "finish_reason": finish}
            kind = "chat.completion"
        return {
            "id": f"chatcmpl-{run_id}",
            "object": kind,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage_json(usage),
        }

    def _write(self, row: Row, record: Record, usage: Usage, duration: float) -> None:
        if record.get("id") is None:
            record["id"] = _request_id(self.job_id, row)
        self.sink.write(record)
        if row.index in self._leading:  # kept only where a duplicate will copy it
            self._records[row.index] = record
        self._written.setdefault(row.index, asyncio.Event()).set()
        self._changed.set()
        self._usage = self._usage + Usage(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_prompt_tokens or 0
        )
        if record.get("error"):
            self._failed += 1
            error = record["error"]
            self._errors[f"{error['code']}: {_first_words(error['message'])}"] += 1
        else:
            self._ok += 1
            self._durations.append(duration)


_UNFINISHED = ("pending", "running")


async def job_runs(
    store: Store,
    job_id: str,
    *,
    tenant: str | None = None,
    untenanted: bool = False,
    status: WorkflowStatus | None = None,
) -> list[WorkflowRow]:
    """The runs of job `job_id` in `store` (with `status`, those in it), newest first: with
    `tenant`, only that tenant's, and with `untenanted` those stored without a tenant too
    (rows of a job begun before its rows had one)."""
    found: list[WorkflowRow] = []
    offset, page_size = 0, 1000
    labels = {JOB_LABEL: job_id}
    # Untenanted runs cannot be asked for by the store's tenant filter: the job's runs are
    # read and those of another tenant left out here (only the service's own batches,
    # begun before it stored their rows under a tenant, are looked up so).
    by_store = None if untenanted else tenant
    while True:
        page = await store.workflows(
            status=status, tenant=by_store, labels=labels, limit=page_size, offset=offset
        )
        found += [r for r in page if not untenanted or r.tenant in (tenant, None)]
        if len(page) < page_size:
            return found
        offset += page_size


class _RowFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _error_record(row: Row, code: str, message: str, job_id: str = "") -> Record:
    return {
        "id": _request_id(job_id, row) if job_id else None,
        "custom_id": row.custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _request_id(job_id: str, row: Row) -> str:
    return f"batch_req_{job_id}_{row.index}"


def _usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens or 0},
    }


def _outputs(wf: Workflow, results: Mapping[str, Any]) -> dict[str, Any]:
    """The results of the workflow's final tasks (those nothing depends on)."""
    graph = wf.graph
    return {t: results[t] for t in sorted(graph) if graph.out_degree(t) == 0 and t in results}


def _first_words(message: str, limit: int = 80) -> str:
    """Errors grouped in the summary by their first words (ids and numbers vary)."""
    return message if len(message) <= limit else message[: limit - 3] + "..."
