"""Batch jobs over REST: `POST /v1/batches` runs rows as `plait batch run` does, on the
service's engine, and `GET /v1/batches/{id}` follows them.

A batch is a folder under the service's `batch_dir`: `input.jsonl` (the rows as they were
sent, written before the 202), `output.jsonl` (the OpenAI batch output, a line per finished
row, written as rows finish) and `batch.json` (owner, state, and the summary once done).
The rows themselves are workflows of the batch's tenant in the store, labelled with the
batch's id and looked up only under that tenant: a service killed mid-batch finds the
folder at its next start and runs the job again, which skips the rows already in the
output, writes those the store finished, and adopts those the engine resumed
(docs/batch.md, "Resume"). A damaged folder is reported and shown failed, or left
alone; the others start. A finished batch's folder is removed once it is as old as the
engine's retention keeps finished runs (a week without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ..batch import BatchJob, BatchProgress, BatchSummary, read_rows, sink_for
from ..batch._job import job_runs
from ..durability._retention import Retention
from ..durability._store import Store
from ..engine._engine import Engine
from ..model._clock import Clock
from ..model._errors import PlaitError, error_text
from ._spec import BatchState, BatchView, ProgressView

_log = logging.getLogger("plait.serve")

META = "batch.json"
INPUT = "input.jsonl"
OUTPUT = "output.jsonl"


async def batch_runs(store: Store, directory: Path) -> set[str]:
    """Ids of the unfinished runs of every batch folder in `directory`: the service's start
    resumes every other unfinished run; a batch left running resumes its own, and those of
    a cancelled or failed batch, or of a folder that cannot be loaded, are not run again."""
    found: set[str] = set()
    for name in _batch_folders(directory):  # a batch's runs are labelled with its folder's name
        owner = _owner(directory / name)
        if owner is None:  # no tenant to read: every run labelled with it (only plait labels so)
            found |= await _unfinished(store, name, None, untenanted=False)
        else:
            found |= await _unfinished(store, name, owner[0], untenanted=not owner[1])
    return found


def _batch_folders(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(f.name for f in directory.iterdir() if (f / META).is_file())


def _owner(folder: Path) -> tuple[str, bool] | None:
    """A batch folder's tenant and whether its rows are stored under it, read quietly (the
    service's start reports a damaged folder); None when they cannot be read."""
    try:
        raw = json.loads((folder / META).read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("id") != folder.name:
        return None
    tenant = raw.get("tenant")
    return (tenant, raw.get("tenant_rows") is True) if isinstance(tenant, str) else None


async def _unfinished(
    store: Store, batch_id: str, tenant: str | None, *, untenanted: bool
) -> set[str]:
    found: set[str] = set()
    for status in ("pending", "running"):
        runs = await job_runs(store, batch_id, tenant=tenant, untenanted=untenanted, status=status)
        found.update(row.id for row in runs)
    return found


class BatchError(Exception):
    """A batch request the service refuses: `status` and a message for the caller."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass
class _Batch:
    id: str
    tenant: str
    created: float
    total: int
    folder: Path
    state: BatchState = "running"
    job: BatchJob | None = None
    task: asyncio.Task[None] | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    finished: float | None = None
    """Epoch seconds when it stopped running (its folder is removed after retention)."""
    tenant_rows: bool = True
    """Its rows are stored under its tenant (False: a batch begun before they were, whose
    earlier rows have no tenant: they are adopted too)."""

    def meta(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "created": self.created,
            "total": self.total,
            "state": self.state,
            "summary": self.summary,
            "error": self.error,
            "finished": self.finished,
            "tenant_rows": self.tenant_rows,
        }


class Batches:
    """The service's batch jobs, each a task on `engine` writing into its folder."""

    def __init__(self, engine: Engine, directory: Path, *, max_rows: int, clock: Clock) -> None:
        self.engine = engine
        self.directory = directory
        self.max_rows = max_rows
        self.clock = clock
        # Kept as long as the engine keeps finished runs: a batch's folder is the record
        # of rows whose runs retention deletes.
        retention = engine.retention or Retention()
        self.keep_s: float | None = retention.delete_after
        """Seconds a finished batch's folder is kept (None: for ever)."""
        self.sweep_every_s = retention.every
        self._batches: dict[str, _Batch] = {}
        self._sweeper: asyncio.Task[None] | None = None

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> int:
        """Load every batch folder; run again those a stopped service left running; start
        removing finished batches' folders past retention. A folder that cannot be loaded
        is reported (and shown failed where its id and tenant can be read); the others
        start. Returns how many were started again."""
        again = 0
        for meta in _metas(self.directory):
            batch = _Batch(
                id=meta.id,
                tenant=meta.tenant,
                created=meta.created,
                total=meta.total,
                folder=self.directory / meta.id,
                state=meta.state,
                summary=meta.summary,
                error=meta.error,
                finished=meta.finished,
                tenant_rows=meta.tenant_rows,
            )
            self._batches[batch.id] = batch
            if batch.state != "running":
                continue
            try:
                job = self._job(batch, read_rows(str(batch.folder / INPUT), fmt="jsonl"))
            except Exception as exc:  # its input is gone or damaged: said on it
                _log.error("batch folder %s cannot go on: %s", batch.folder, error_text(exc))
                batch.state, batch.error = "failed", f"its input cannot be read: {exc}"
                batch.finished = self.clock.now()
                with contextlib.suppress(OSError):
                    _write_meta(batch)
                continue
            self._launch(batch, job)
            again += 1
        if self.keep_s is not None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_every())
        return again

    async def close(self) -> None:
        """Stop the jobs' tasks (their rows stay in the store, running; the folder says
        running, so the next start goes on with them)."""
        tasks = [b.task for b in self._batches.values() if b.task is not None and not b.task.done()]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
            self._sweeper = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- requests ---------------------------------------------------------------------------

    async def create(
        self, tenant: str, rows: Sequence[Mapping[str, Any]], *, max_batches: int = 4
    ) -> BatchView:
        running = sum(
            1 for b in self._batches.values() if b.tenant == tenant and b.state == "running"
        )
        if running >= max_batches:
            raise BatchError(
                429,
                f"{running} batch jobs of this tenant are running, its limit; wait for one to "
                "finish (GET /v1/batches?state=running)",
                {"Retry-After": "30"},
            )
        if not rows:
            raise BatchError(400, "rows: a batch needs at least one row")
        if len(rows) > self.max_rows:
            raise BatchError(
                422, f"rows: {len(rows)} rows is more than the limit of {self.max_rows}"
            )
        batch_id = f"batch-{secrets.token_hex(8)}"
        batch = _Batch(batch_id, tenant, self.clock.now(), len(rows), self.directory / batch_id)
        # Writing, reading back and planning a large batch take seconds: not on the loop.
        job = await asyncio.to_thread(self._prepare, batch, rows)
        self._batches[batch_id] = batch
        self._launch(batch, job)
        return self.view(batch)

    def get(self, tenant: str, batch_id: str) -> _Batch:
        batch = self._batches.get(batch_id)
        if batch is None or batch.tenant != tenant:  # another tenant's: as if absent
            raise BatchError(404, f"no batch {batch_id!r}")
        return batch

    def list(self, tenant: str, state: str | None, limit: int, offset: int) -> list[BatchView]:
        mine = [
            b
            for b in self._batches.values()
            if b.tenant == tenant and (state is None or b.state == state)
        ]
        mine.sort(key=lambda b: b.created, reverse=True)
        return [self.view(b) for b in mine[offset : offset + limit]]

    async def cancel(self, tenant: str, batch_id: str) -> BatchView:
        """Stop the job and every row of it running in the engine (those it had resumed but
        not yet waited for too); rows not started are never run, here or after a restart."""
        batch = self.get(tenant, batch_id)
        if batch.state == "running":
            batch.state = "cancelled"
            batch.finished = self.clock.now()
            _write_meta(batch)
            if batch.task is not None:
                batch.task.cancel()
            running = set(batch.job.running_runs()) if batch.job is not None else set()
            if self.engine.store is not None:
                running |= await _unfinished(
                    self.engine.store, batch.id, batch.tenant, untenanted=not batch.tenant_rows
                )
            for run_id in running:
                if self.engine.handle(run_id) is not None:
                    with contextlib.suppress(PlaitError):
                        self.engine.cancel(run_id, "the batch was cancelled")
        return self.view(batch)

    def output(self, tenant: str, batch_id: str) -> Path:
        return self.get(tenant, batch_id).folder / OUTPUT

    def view(self, batch: _Batch) -> BatchView:
        progress = batch.job.progress() if batch.job is not None else None
        return BatchView(
            id=batch.id,
            state=batch.state,
            created=batch.created,
            total=batch.total,
            progress=_progress(progress, batch.total, batch.summary),
            summary=batch.summary,
            error=batch.error,
        )

    def rows_running(self, tenant: str) -> int:
        """How many rows of `tenant`'s batches the engine is running now: a tenant's running
        limit counts its workflows, not its batch rows (`max_batches` bounds those)."""
        return sum(
            batch.job.in_engine()
            for batch in self._batches.values()
            if batch.tenant == tenant and batch.job is not None
        )

    def running(self) -> Iterator[BatchProgress]:
        """Progress of each running batch (for /metrics: no ids leave this module)."""
        for batch in self._batches.values():
            if batch.state == "running" and batch.job is not None:
                yield batch.job.progress()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for batch in self._batches.values():
            out[batch.state] = out.get(batch.state, 0) + 1
        return out

    # --- retention --------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Remove the folders of batches finished `keep_s` or more ago; returns how many.
        A folder that cannot be removed is reported, and tried again at the next sweep."""
        if self.keep_s is None:
            return 0
        cutoff = self.clock.now() - self.keep_s
        due = [
            batch
            for batch in self._batches.values()
            if batch.state != "running" and (batch.finished or batch.created) <= cutoff
        ]
        if not due:
            return 0
        # Removing files takes the disk's time: not on the loop; the map is changed here.
        gone = await asyncio.to_thread(_remove_folders, [batch.folder for batch in due])
        for batch, removed in zip(due, gone, strict=True):
            if removed:
                self._batches.pop(batch.id, None)
        _log.info("removed %d finished batch folder(s) past retention", sum(gone))
        return sum(gone)

    async def _sweep_every(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # a sweep's failure is said; the next one tries again
                _log.exception("sweeping batch folders failed")
            await self.clock.sleep(self.sweep_every_s)

    # --- running ----------------------------------------------------------------------------

    def _prepare(self, batch: _Batch, rows: Sequence[Mapping[str, Any]]) -> BatchJob:
        """The batch's folder, input and state on disk, and its job; nothing is left on a
        refusal."""
        folder = batch.folder
        folder.mkdir(parents=True, exist_ok=False)
        try:
            text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
            _write_atomic(folder / INPUT, text)
            try:
                parsed = read_rows(str(folder / INPUT), fmt="jsonl")
            except PlaitError as exc:
                message = str(exc).replace(str(folder / INPUT), "rows")
                message = message.split("; a row without --workflow")[0]  # the CLI's advice
                raise BatchError(400, message) from exc
            batch.total = len(parsed)
            job = self._job(batch, parsed)
            _write_meta(batch)  # from here on, a restarted service goes on with it
        except BaseException:
            _remove(folder)
            raise
        return job

    def _job(self, batch: _Batch, rows: Sequence[Any]) -> BatchJob:
        return BatchJob(
            rows,
            sink_for(str(batch.folder / OUTPUT)),
            job_id=batch.id,
            tenant=batch.tenant,
            untenanted=not batch.tenant_rows,
        )

    def _launch(self, batch: _Batch, job: BatchJob) -> None:
        batch.job = job
        batch.task = asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: _Batch) -> None:
        assert batch.job is not None
        job = batch.job
        try:
            job.open_sink()
            summary: BatchSummary = await job.run(self.engine)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the job's own failure: said on the batch, not raised
            _log.exception("batch %s failed", batch.id)
            batch.state = "failed"
            batch.error = f"{type(exc).__name__}: {exc}"
        else:
            batch.state = "completed"
            batch.summary = summary.as_json()
        finally:
            job.sink.close()
            if batch.state != "running":
                batch.finished = self.clock.now()
                _write_meta(batch)
                batch.job = None  # its rows and records: the summary says what it did


def _progress(
    progress: BatchProgress | None, total: int, summary: Mapping[str, Any] | None
) -> ProgressView:
    if progress is None:
        done = failed = 0
        if summary:  # this run's rows and those an earlier run of the batch had written
            with contextlib.suppress(TypeError, ValueError):  # a damaged summary: no figures
                earlier_failed = int(summary.get("skipped_failed", 0))
                done = int(summary.get("ok", 0)) + int(summary.get("skipped", 0)) - earlier_failed
                failed = int(summary.get("failed", 0)) + earlier_failed
        return ProgressView(total=total, done=done, failed=failed, running=0, pending=0)
    finished = progress.finished
    return ProgressView(
        total=total,
        done=progress.done + progress.skipped - progress.skipped_failed,
        failed=progress.failed + progress.skipped_failed,
        running=progress.running,
        pending=max(0, total - finished - progress.running),
        prompt_tokens=progress.prompt_tokens,
        completion_tokens=progress.completion_tokens,
        cached_tokens=progress.cached_tokens,
        tokens_per_s=round(progress.tokens_per_s, 3),
        cache_hit_share=round(progress.cache_hit_share, 4),
        eta_s=None if progress.eta_s is None else round(progress.eta_s, 3),
    )


class _Meta(BaseModel):
    """A `batch.json` as read back: what a folder must hold to be loaded."""

    model_config = ConfigDict(extra="ignore")

    id: str
    tenant: str
    created: float
    total: int
    state: BatchState
    summary: dict[str, Any] | None = None
    error: str | None = None
    finished: float | None = None
    tenant_rows: bool = False
    """Absent in a batch begun before its rows were stored under its tenant."""


def _metas(directory: Path) -> list[_Meta]:
    """Every batch folder's state in `directory`, oldest folder name first: a damaged
    `batch.json` is reported, and read as a failed batch where its id and tenant can be."""
    if not directory.is_dir():
        return []
    metas = (_read_meta(folder) for folder in sorted(directory.iterdir()))
    return [meta for meta in metas if meta is not None]


def _read_meta(folder: Path) -> _Meta | None:
    path = folder / META
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:
        _log.error("batch folder %s: unreadable %s (%s): left alone", folder, META, exc)
        return None
    try:
        meta = _Meta.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'the file'}: {e['msg']}" for e in exc.errors()
        )
        return _damaged(folder, raw, problems)
    if meta.id != folder.name:
        _log.error("batch folder %s: %s names another batch: left alone", folder, META)
        return None
    if meta.finished is None and meta.state != "running":
        # Written without the time it finished: its last write is when it did.
        meta.finished = path.stat().st_mtime
    return meta


def _damaged(folder: Path, raw: Any, problems: str) -> _Meta | None:
    """A `batch.json` that does not hold a batch: shown failed to its tenant when the id and
    tenant can be read (its rows are not run again), else left alone; said either way."""
    ident = raw if isinstance(raw, dict) else {}
    tenant = ident.get("tenant")
    if ident.get("id") != folder.name or not isinstance(tenant, str):
        _log.error("batch folder %s: damaged %s (%s): left alone", folder, META, problems)
        return None
    _log.error("batch folder %s: damaged %s (%s): shown failed", folder, META, problems)
    created = ident.get("created")
    if not isinstance(created, int | float) or isinstance(created, bool):
        created = folder.stat().st_mtime
    total = ident.get("total")
    return _Meta(
        id=folder.name,
        tenant=tenant,
        created=float(created),
        total=total if isinstance(total, int) and not isinstance(total, bool) else 0,
        state="failed",
        error=f"its state file {META} is damaged ({problems})",
        finished=(folder / META).stat().st_mtime,
    )


def _write_meta(batch: _Batch) -> None:
    _write_atomic(batch.folder / META, json.dumps(batch.meta(), indent=1) + "\n")


def _write_atomic(path: Path, text: str) -> None:
    """Write beside, flush to disk, rename over: a crash leaves the old file or the new."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    with temporary.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(path)


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _remove_folders(folders: Sequence[Path]) -> list[bool]:
    """Remove each folder whole; False for one that could not be (said in the log)."""
    removed = []
    for folder in folders:
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log.error("batch folder %s: cannot remove it: %s", folder, exc)
            removed.append(False)
            continue
        removed.append(True)
    return removed
