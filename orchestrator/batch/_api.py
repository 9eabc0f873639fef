"""`run_batch`: a job on an engine of its own (the CLI's and a script's way in).

Inside a service that already runs an engine, make a `BatchJob` and `await job.run(engine)`
instead: the engine's backends are used as they are (wrap them in `Coalescing` when the
engine is built to compute identical calls once across per-row workflows).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any

from ..admission._mode import AdmissionTuning, Mode
from ..admission._queue import Limits
from ..durability._store import Store
from ..engine._engine import Engine
from ..engine._open import open_backends
from ..engine._resilience import DEFAULT_BREAKER, DEFAULT_CALL_RETRY, Breaker
from ..model._clock import Clock
from ..model._llm import LLMBackend
from ._dedup import Coalescing
from ._job import BatchJob, BatchSummary

Watch = Callable[[BatchJob], Coroutine[Any, Any, None]]

BACKEND_WAIT_S = 300.0
"""How long a batch's calls wait for a backend that went down before its rows fail."""

BATCH_BREAKER = Breaker(
    # At most a call's attempts: a call alone on a backend that went down opens the
    # circuit with its last attempt, and waits, rather than failing first.
    failures=min(DEFAULT_BREAKER.failures, DEFAULT_CALL_RETRY.attempts),
    cooldown_s=DEFAULT_BREAKER.cooldown_s,
    wait_s=BACKEND_WAIT_S,
)
"""A batch's circuit breaker: rows wait for a backend that is down, up to `wait_s`."""


async def run_batch(
    job: BatchJob,
    *,
    backends: Mapping[str, LLMBackend],
    store: Store | None = None,
    clock: Clock | None = None,
    limits: Mapping[str, Limits] | None = None,
    admission: Mode | AdmissionTuning = "deadlines",
    coalesce: bool = True,
    watch: Watch | None = None,
    breaker: Breaker | None = BATCH_BREAKER,
) -> BatchSummary:
    """Open `job.sink` (refusing an output it cannot write before anything runs), enter
    the backends and an engine (durable with `store`, an opened store), run the job, close
    the sink. `coalesce`: identical calls are computed once (`Coalescing` over each backend).
    `watch(job)` runs beside the job (a progress display) and is cancelled when it ends.
    `admission`: the engine's admission mode (`Engine(admission=...)`; under "deadlines",
    rows whose workflows carry a deadline start in deadline order). `breaker`: the
    engine's circuit breaker; the default makes rows wait up to `BACKEND_WAIT_S` for a
    backend that is down (its `wait_s`), the wait shown in `job.progress().waiting`."""
    job.open_sink()
    try:
        async with contextlib.AsyncExitStack() as stack:
            used: dict[str, LLMBackend] = {
                name: Coalescing(backend) if coalesce else backend
                for name, backend in backends.items()
            }
            await open_backends(stack, used)
            engine = Engine(
                backends=used,
                clock=clock,
                limits=limits,
                admission=admission,
                store=store,
                breaker=breaker,
            )
            async with engine, asyncio.TaskGroup() as tg:
                watcher = tg.create_task(watch(job)) if watch is not None else None
                try:
                    summary = await job.run(engine)
                finally:
                    if watcher is not None:
                        watcher.cancel()
            dedup = sum(b.stats().coalesced for b in used.values() if isinstance(b, Coalescing))
            return _with_coalesced(summary, dedup)
    finally:
        job.sink.close()


def _with_coalesced(summary: BatchSummary, coalesced: int) -> BatchSummary:
    return replace(summary, deduplicated=summary.deduplicated + coalesced)
