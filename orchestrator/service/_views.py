"""What `GET /v1/workflows/{id}` shows, kept: each workflow's image is built from its log
once and then brought up to date from the events after the last one it has."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field

from ..durability._journal import read_records, restore
from ..durability._replay import RunImage, rebuild
from ..durability._store import EventRecord, Store
from ..model._events import EVENT_ADAPTER, Event

MAX_KEPT_TASKS = 200_000
"""Tasks in all the images kept at once (the least recently read are dropped first)..."""
MAX_KEPT = 1_000
"""... and images."""
THREAD_BYTES = 256 * 1024
"""Stored bytes past which events are decoded, and a view encoded, in a worker thread."""


@dataclass(slots=True)
class _Kept:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    image: RunImage | None = None
    seq: int = 0
    size: int = 0
    results: int = 0
    """Bytes of the stored `task_succeeded` events (their results) folded in."""
    shown: tuple[int, dict[str, int], str] | None = None
    """The view's counts and tasks (JSON) at `seq`."""
    parts: dict[str, str] = field(default_factory=dict)
    """Each task's JSON, as last rendered..."""
    stale: set[str] | None = None
    """... and the tasks whose events came since (None: all of them)."""


class Images:
    """Workflows' images by id, least recently read first. A finished workflow's log does
    not change, so its image is read once; a running one's reads the events it lacks."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._tasks = 0

    async def image(self, run_id: str) -> RunImage:
        kept = self._kept.get(run_id)
        if kept is None:
            kept = self._kept[run_id] = _Kept()
        self._kept.move_to_end(run_id)
        async with kept.lock:  # one reader at a time: the others find it up to date
            if kept.image is None or kept.image.status is None:
                records, payloads = await read_records(self.store, run_id, kept.seq)
                if kept.seq and records and records[0].seq != kept.seq + 1:
                    # compacted meanwhile (a gap): fold the log as it is now, whole
                    kept.image, kept.seq, kept.stale = None, 0, None
                    kept.results = 0
                    records, payloads = await read_records(self.store, run_id, 0)
                size = sum(len(r.data) for r in records) + sum(map(len, payloads.values()))
                if size > THREAD_BYTES:  # large results: decoded off the loop
                    events = await asyncio.to_thread(_decode, records, payloads)
                else:
                    events = _decode(records, payloads)
                if events or kept.image is None:
                    try:
                        kept.image = rebuild(events, kept.image)
                    except BaseException:
                        kept.image, kept.seq = None, 0  # maybe folded in part: read it anew
                        kept.stale, kept.results = None, 0
                        raise
                    kept.seq = records[-1].seq if records else kept.seq
                    kept.results += sum(
                        len(r.data) + sum(len(payloads.get(d, b"")) for d in r.refs.values())
                        for r in records
                        if r.kind == "task_succeeded"
                    )
                    for event in events:
                        touched = _touched(event)
                        if touched is None or kept.stale is None:
                            kept.stale = None
                            break
                        kept.stale.add(touched)
            image = kept.image
            if self._kept.get(run_id) is kept:
                self._tasks += len(image.tasks) - kept.size
                kept.size = len(image.tasks)
        self._trim()
        return image

    async def tasks(self, run_id: str) -> tuple[RunImage, dict[str, int], str]:
        """The image, its tasks' counts by state and its tasks as the view's JSON array:
        rendered once per new event (at 10,000 tasks, rendering them is most of a GET)."""
        image = await self.image(run_id)
        kept = self._kept.get(run_id)
        shown = None if kept is None or kept.image is not image else kept.shown
        if kept is not None and shown is not None and shown[0] == kept.seq:
            return image, shown[1], shown[2]
        if kept is None or kept.image is not image:
            return (image, *render(image, {}, None))
        counts, text = render(image, kept.parts, kept.stale)
        kept.shown, kept.stale = (kept.seq, counts, text), set()
        return image, counts, text

    def result_bytes(self, run_id: str) -> int:
        """Bytes of the results stored for the workflow, as of its image last read (0 when
        none is kept)."""
        kept = self._kept.get(run_id)
        return 0 if kept is None else kept.results

    def forget(self, run_id: str) -> None:
        """The workflow is gone from the store (retention deleted it)."""
        kept = self._kept.pop(run_id, None)
        if kept is not None:
            self._tasks -= kept.size

    def _trim(self) -> None:
        while len(self._kept) > 1 and (self._tasks > MAX_KEPT_TASKS or len(self._kept) > MAX_KEPT):
            _, dropped = self._kept.popitem(last=False)
            self._tasks -= dropped.size


def _decode(records: list[EventRecord], payloads: dict[str, bytes]) -> list[Event]:
    return [
        EVENT_ADAPTER.validate_python(restore(r, payloads))
        if r.refs
        else EVENT_ADAPTER.validate_json(r.data)
        for r in records
    ]


def render(
    image: RunImage, parts: dict[str, str], stale: set[str] | None
) -> tuple[dict[str, int], str]:
    """The tasks' counts by state, and the tasks as `TaskView`s in JSON: each task's from
    `parts` unless it is `stale` (None: all are), which is rendered and kept there."""
    counts: dict[str, int] = {}
    if stale is None:
        parts.clear()
    for task_id in stale or ():
        parts.pop(task_id, None)
    shown = []
    for task in image.tasks.values():
        counts[task.state] = counts.get(task.state, 0) + 1
        part = parts.get(task.id)
        if part is None:
            part = parts[task.id] = json.dumps(
                {
                    "id": task.id,
                    "kind": task.action.kind,
                    "name": task.action.name,
                    "after": sorted(task.after),
                    "state": task.state,
                    "attempts": task.attempts,
                    "error": task.error or task.reason,
                },
                separators=(",", ":"),
            )
        shown.append(part)
    return counts, "[" + ",".join(shown) + "]"


def _touched(event: Event) -> str | None:
    """The one task whose view the event changes, or None when it may change several."""
    if event.kind in ("edge_added", "edge_removed"):
        return event.target
    if event.kind == "task_removed":
        return None  # the others' `after` lose it
    task = getattr(event, "task", None)
    return task if isinstance(task, str) else None
