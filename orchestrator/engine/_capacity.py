"""Limits derived from what the servers say of their size (`CapacityReporting`), asked once
when the engine starts: a server's KV cache sets its hold-back budget, its sequence limit
its calls in flight, wherever the limits given leave them open."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace

from ..admission._queue import Limits
from ..model._errors import BackendError
from ..model._llm import CapacityReporting, LLMBackend, ServerCapacity

HOLD_BACK_SHARE = 0.8
"""The share of a server's KV cache that programs may fill before new ones wait (hold-back):
running contexts grow past what they held when the next program was let in."""


def derived_limits(given: Limits | None, capacity: ServerCapacity) -> Limits | None:
    """The limits of a backend whose server says `capacity`, or None where they stay as
    they are. `given`: the limits set for the backend, None where none were.

    - `kv_tokens` (hold-back), unless given or hold-back is off (`hold_back=False`):
      `HOLD_BACK_SHARE` of the server's KV cache, for a server that does not keep a paused
      program's KV when asked (upstream vLLM, llama.cpp, Dynamo: `keeps_kv` false). One
      that does needs no hold-back.
    - `max_in_flight`, where no limits were given: the sequences the server runs at once
      (SGLang's running-request cap, llama.cpp's slots): more would wait in the server's
      queue, in its order rather than the scheduler's.
    """
    base = given or Limits()
    kv = base.kv_tokens
    if kv is None and base.hold_back and capacity.kv_tokens is not None and not capacity.keeps_kv:
        kv = max(1, int(capacity.kv_tokens * HOLD_BACK_SHARE))
    in_flight = base.max_in_flight
    if given is None and capacity.max_seqs is not None:
        in_flight = capacity.max_seqs
    if kv == base.kv_tokens and in_flight == base.max_in_flight:
        return None
    return replace(base, kv_tokens=kv, max_in_flight=in_flight)


async def read_capacities(backends: Mapping[str, LLMBackend]) -> dict[str, ServerCapacity]:
    """What each backend that reports its capacity says, all asked at once (each answers
    within its own probe timeout)."""
    reporting = {name: b for name, b in backends.items() if isinstance(b, CapacityReporting)}
    if not reporting:
        return {}
    async with asyncio.TaskGroup() as tg:
        asks = {name: tg.create_task(_ask(backend)) for name, backend in reporting.items()}
    return {name: ask.result() for name, ask in asks.items()}


async def _ask(backend: CapacityReporting) -> ServerCapacity:
    try:
        return await backend.capacity()
    except BackendError:  # the protocol says it does not raise; one that does said nothing
        return ServerCapacity()
