"""Batch mode: run every row of a dataset as an LLM call or a workflow (docs/batch.md).

    rows = read_rows("questions.jsonl")
    job = BatchJob(rows, sink_for("answers.jsonl"))
    summary = await run_batch(job, backends={"default": llm}, store=store)

or, on an engine already running (a service): `await job.run(engine)` after
`job.open_sink()`, and `job.progress()` for a snapshot while it runs.
"""

from ._api import BACKEND_WAIT_S, BATCH_BREAKER, run_batch
from ._dedup import Coalescing, CoalescingStats
from ._job import JOB_LABEL, BatchJob, BatchProgress, BatchSummary, RowCall, RowCalls, job_id_for
from ._output import JsonlSink, ParquetSink, Sink, sink_for
from ._plan import BatchPlan, call_key, plan
from ._rows import Row, read_rows

__all__ = [
    "BACKEND_WAIT_S",
    "BATCH_BREAKER",
    "JOB_LABEL",
    "BatchJob",
    "BatchPlan",
    "BatchProgress",
    "BatchSummary",
    "Coalescing",
    "CoalescingStats",
    "JsonlSink",
    "ParquetSink",
    "Row",
    "RowCall",
    "RowCalls",
    "Sink",
    "call_key",
    "job_id_for",
    "plan",
    "read_rows",
    "run_batch",
    "sink_for",
]
