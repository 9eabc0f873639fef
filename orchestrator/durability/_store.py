"""The store protocols: the event log the engine needs, and one ABC per optional feature.

A store keeps four things: one row per workflow (its current status, for listing and for
finding what to resume), the workflow's events in order (`seq` counts from 1 without gaps
within each workflow), content-addressed payloads (large event fields, stored once under the
sha256 of their bytes) and recorded LLM call results (so a resumed run does not pay twice).
`Store` is that log: enough to record runs, read them back and resume them.

A feature beyond the log is an ABC of its own that a store subclasses to declare it, found
with `isinstance` once, where the feature is asked for (`LeaseStore.require(store, by)`):
`RetainingStore` compacts and deletes finished runs (`Engine(retention=...)`);
`LeaseStore` leases runs to engines and `CancelStore` carries cancel requests to the engine
holding a run (both for `Engine(cluster=...)`); `KeyStore` keeps idempotency keys every
engine sees (the service over a cluster).

Retention shrinks finished workflows only: `compact` drops the events a finished run's
rebuild can do without, so a compacted log has gaps in its `seq` (its events keep their
numbers); `retain` and `delete` drop whole workflows. A workflow that is still pending or
running keeps every event, without gaps, and appends continue it.

`memory` implements them all with SQLAlchemy (SQLite, PostgreSQL); the engine only sees the
protocols. Every write goes through `append`, one transaction per batch, so a batch is all
there or not there at all: the journal (`_journal.py`) groups many events into one batch.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import ClassVar, NamedTuple, Self

from ..model._errors import RunError, UsageError
from ..model._events import WorkflowStatus

FINISHED_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
"""A workflow in one of these is done; `pending` and `running` ones are what resume looks for."""


class StoreError(RunError):
    """The store could not be opened, read or written; the message names it and the fix.

    `transient`: the failure may pass by itself (the database cannot be reached, the disk
    is full); the journal waits for it to pass for a while before it gives up."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class StoreVersionError(StoreError):
    """The store's schema is newer than this plait knows: it was written by a newer release."""

    def __init__(self, where: str, found: int, known: int) -> None:
        super().__init__(
            f"store {where} has schema version {found}, but this plait knows versions up to "
            f"{known}; upgrade plait to the release that wrote it, or open another store "
            "(plait never migrates a store backwards)"
        )
        self.found = found
        self.known = known


class LeaseLostError(StoreError):
    """An engine wrote to workflows whose lease another engine holds now (it took them over
    after this engine's lease ran out): nothing of the batch was written. `workflows` names
    them; the engine lets them go, the rest of its work goes on."""

    def __init__(self, owner: str, workflows: Sequence[str]) -> None:
        shown = ", ".join(list(workflows)[:5]) + (" ..." if len(workflows) > 5 else "")
        super().__init__(
            f"engine {owner!r} no longer holds the lease of {len(workflows)} workflow(s) "
            f"({shown}): another engine took them over after this one's lease ran out"
        )
        self.owner = owner
        self.workflows = tuple(workflows)


class BatchRefusedError(StoreError):
    """The store refused a batch for what it says of some workflows: nothing of it was
    written. `workflows` names them; the rest of the batch may be written without them."""

    def __init__(self, message: str, workflows: Sequence[str]) -> None:
        super().__init__(message)
        self.workflows = tuple(workflows)


class TextNotStorableError(BatchRefusedError):
    """A batch held text no store can keep (a NUL character, or a lone surrogate that no
    encoding can write): refused whole at append, so no later read ever meets it."""


class WorkflowExistsError(BatchRefusedError):
    """A batch began a new workflow (its first event) under an id the store holds already:
    the stored workflow is left as it was, never merged with the new one."""

    def __init__(self, workflows: Sequence[str]) -> None:
        shown = ", ".join(list(workflows)[:5]) + (" ..." if len(workflows) > 5 else "")
        super().__init__(
            f"{len(workflows)} new workflow(s) have ids the store holds already ({shown}): "
            "nothing of them was written; start them again under new ids",
            workflows,
        )


def unstorable(text: str) -> str | None:
    """Why a store cannot keep `text` (a NUL character: PostgreSQL's text and JSON cannot;
    a lone surrogate: no encoding can), or None when it can."""
    nul = text.find("\x00")
    if nul >= 0:
        return f"a NUL character at position {nul}"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            return f"a lone surrogate ({text[exc.start]!r}) at position {exc.start}"
    return None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A workflow an engine claimed (`LeaseStore.claim`): `previous` is the engine whose lease
    ran out, None for a workflow nobody held."""

    workflow: str
    previous: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowRow:
    """A workflow's current summary. Times are wall-clock epoch seconds."""

    id: str
    name: str
    status: WorkflowStatus
    priority: str = "batch"
    deadline: float | None = None
    created: float
    updated: float
    finished: float | None = None
    tenant: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    compacted: bool = False
    """Set by `RetainingStore.compact` and read back; an appended row never changes it."""
    owner: str | None = None
    """The engine holding the run's lease, with several engines on the store (read back;
    an appended row never changes it: `StoreBatch.owner` does)."""
    lease_until: float | None = None
    """Until when the owner's lease holds (epoch seconds on the store's clock; read back)."""


class _NoRefs(Mapping[str, str]):
    """The empty `refs` of an event with no field in the payloads table: one instance, shared
    by every such record, so it cannot change (and it pickles and copies as itself)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> str:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"

    def __reduce__(self) -> str:
        return "NO_REFS"


NO_REFS: Mapping[str, str] = _NoRefs()


class EventRecord(NamedTuple):
    """One event as stored. `data` is the event's JSON text, in which each field moved to the
    payloads table reads `{"$ref": digest}`; `refs` maps those fields to their digests and is
    what readers trust (a field of the event's own that looks like a reference stays data).

    A named tuple, not a dataclass: the journal makes one per event, and a frozen dataclass
    costs several times more to build (a measurable share of a durable task's cost)."""

    workflow: str
    seq: int
    kind: str
    at: float
    data: str
    refs: Mapping[str, str] = NO_REFS


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """An LLM call's stored result: `digest` names its payload. `workflow`, when set, is the
    workflow whose deletion drops the record too."""

    program: str
    request_hash: str
    digest: str
    workflow: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreBatch:
    """Everything one transaction writes. Events must continue their workflow's `seq` without
    gaps; workflow rows replace the stored row with the same id (its `created` is kept);
    payloads are inserted if absent (the digest is the sha256 hex of the bytes).

    A workflow whose first event (seq 1) is in the batch is new: if the store holds its id
    already, the batch is refused (`WorkflowExistsError`) and the stored one left as it was.
    Text no store can keep (`unstorable`) refuses the batch too (`TextNotStorableError`)."""

    events: Sequence[EventRecord] = ()
    workflows: Sequence[WorkflowRow] = ()
    payloads: Mapping[str, bytes] = field(default_factory=dict)
    calls: Sequence[CallRecord] = ()
    owner: str | None = None
    """With several engines on the store: the engine writing. The batch is written only if
    every workflow it touches is new or leased to `owner` (else `LeaseLostError`, nothing
    written); new workflows are leased to it for `lease_s` seconds."""
    lease_s: float = 0.0

    def __len__(self) -> int:
        return len(self.events) + len(self.workflows) + len(self.payloads) + len(self.calls)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSize:
    """Rows per table and the bytes of stored event data and payloads."""

    workflows: int
    events: int
    payloads: int
    calls: int
    event_bytes: int
    payload_bytes: int


class Store(ABC):
    """A durable event log: what the engine needs to record runs, read them back and resume
    them. Open it with `async with store:` (or `open()`/`close()`).

    Implementations serialise their own writes: any number of tasks may call `append`
    concurrently, and it never fails because another writer holds a lock (it waits).
    Failures are `StoreError`s naming the store and what to do. What a store can do beyond
    the log it declares by subclassing a feature's ABC too (`RetainingStore`, `LeaseStore`,
    `CancelStore`, `KeyStore`); whoever needs a feature asks for it with `require`.
    """

    _does: ClassVar[str] = "keeps an event log"
    """What a store of this class can do, as the error for a store that cannot says."""

    @classmethod
    def require(cls, store: Store, by: str) -> Self:
        """`store` as a store of this class (it declares the feature by subclassing it),
        else a `UsageError` saying that `by` needs the feature, which methods it takes and
        the fix. Called once, where the feature is asked for, never per call."""
        if isinstance(store, cls):
            return store
        name = type(store).__name__
        methods = ", ".join(
            method
            for method, value in vars(cls).items()
            if getattr(value, "__isabstractmethod__", False)
        )
        raise UsageError(
            f"{by} needs a store that {cls._does} ({name} does not): use memory.SQLStore, or "
            f"declare the feature on {name} by subclassing orchestrator.ext.{cls.__name__} "
            f"(a Store itself) and implementing {methods}"
        )

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def open(self) -> None:
        """Connect, check the schema version and migrate an older schema forward."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections; the store can be opened again."""

    # --- writes ------------------------------------------------------------------------------

    @abstractmethod
    async def append(self, batch: StoreBatch) -> None:
        """Write the whole batch in one transaction: all of it is durable when this returns,
        or none of it when it raises (`BatchRefusedError` names the workflows it was refused
        for: the rest may be written without them)."""

    async def record_call(
        self, program: str, request_hash: str, result: bytes, *, workflow: str | None = None
    ) -> str:
        """Store an LLM call's result (its own transaction) and return the payload digest."""
        digest = payload_digest(result)
        call = CallRecord(
            program=program, request_hash=request_hash, digest=digest, workflow=workflow
        )
        await self.append(StoreBatch(payloads={digest: result}, calls=(call,)))
        return digest

    # --- reads -------------------------------------------------------------------------------

    @abstractmethod
    async def events(
        self, workflow: str, after_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        """The workflow's events with `seq > after_seq`, in `seq` order (the first `limit`)."""

    @abstractmethod
    async def last_seq(self, workflow: str) -> int:
        """The workflow's highest `seq`, 0 when it has no events."""

    @abstractmethod
    async def payloads(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The payloads with these digests (one query); absent ones are left out."""

    @abstractmethod
    async def workflow(self, workflow: str) -> WorkflowRow | None:
        """The workflow's row, or None."""

    @abstractmethod
    async def workflows(
        self,
        *,
        status: WorkflowStatus | None = None,
        tenant: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[WorkflowRow]:
        """Workflows, newest first, filtered by status, tenant and labels (each given
        label must have the given value), in one query."""

    @abstractmethod
    async def unfinished(self) -> list[str]:
        """Ids of the workflows still pending or running, oldest first."""

    @abstractmethod
    async def find_call(self, program: str, request_hash: str) -> bytes | None:
        """The recorded result of this call in this program, or None."""


class RetainingStore(Store):
    """A store that shrinks: it compacts finished workflows, deletes them, and says how much
    it holds. Needed by `Engine(retention=...)`."""

    _does = "compacts and deletes finished runs"

    @abstractmethod
    async def delete(self, workflows: Sequence[str]) -> int:
        """Delete these workflows with their events and call records; return how many rows of
        workflows were deleted. Their payloads stay until `collect_garbage()`."""

    @abstractmethod
    async def retain(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        """Delete finished workflows that finished before `finished_before` (epoch seconds),
        and all but the `keep_last` most recently finished; return how many were deleted.
        Unfinished workflows are never touched."""

    @abstractmethod
    async def compact(
        self,
        workflows: Sequence[str] | None = None,
        *,
        finished_before: float | None = None,
        limit: int | None = None,
    ) -> int:
        """Compact finished workflows that are not compacted yet: those named (all when None)
        that finished before `finished_before` (epoch seconds), at most `limit` of them, the
        earliest finished first; return how many were compacted.

        A compacted workflow keeps the events that rebuild it (`orchestrator.ext.compactable`
        says which go: the transitional task_ready, task_started, task_retrying and
        call_retrying that later events overwrite), so `rebuild()` of its log gives the same
        tasks, states, attempts, results, errors and edges; its `seq` has gaps from then on.
        Its LLM call records go too (only an unfinished run is resumed), and it is marked
        `compacted`. Unfinished workflows are never touched. Payloads that nothing
        references any more stay until `collect_garbage()`."""

    @abstractmethod
    async def collect_garbage(self) -> int:
        """Delete payloads that no event and no call record references; return how many."""

    @abstractmethod
    async def size(self) -> StoreSize:
        """Row counts and stored bytes."""


class LeaseStore(Store):
    """A store that leases its runs to engines, so that several engines share it: each
    unfinished workflow is held by one engine at a time (`WorkflowRow.owner`), and a batch
    written with `StoreBatch.owner` is fenced by the lease. Needed by `Engine(cluster=...)`."""

    _does = "leases its runs to engines"

    @abstractmethod
    async def claim(self, owner: str, lease_s: float, limit: int) -> list[Claimed]:
        """Lease to `owner`, for `lease_s` seconds, up to `limit` unfinished workflows that
        nobody holds or whose lease has run out, oldest first; rows another engine is
        claiming at the same moment are skipped, not waited for. Returns what it took."""

    @abstractmethod
    async def renew(
        self, owner: str, lease_s: float, workflows: Sequence[str] | None = None
    ) -> int:
        """Extend the leases of the unfinished workflows `owner` holds (those named, or all)
        to `lease_s` seconds from now; return how many."""

    @abstractmethod
    async def release(self, owner: str, workflows: Sequence[str] | None = None) -> int:
        """Give up `owner`'s leases (of these workflows, or all): another engine may claim
        them at once instead of waiting for them to run out. Returns how many."""


class CancelStore(Store):
    """A store that carries a cancel request for a run to the engine that holds it (or
    claims it next), so that any engine's API can cancel any run. Needed by
    `Engine(cluster=...)`."""

    _does = "carries cancel requests to the engine holding a run"

    @abstractmethod
    async def ask_cancel(self, workflow: str, reason: str) -> bool:
        """Mark unfinished `workflow` to be cancelled by the engine that holds it, or claims
        it next (`cancels`); False if it is not unfinished."""

    @abstractmethod
    async def cancels(self, owner: str) -> list[tuple[str, str]]:
        """The unfinished workflows `owner` holds that were marked by `ask_cancel`, each with
        the reason given."""


class KeyStore(Store):
    """A store that keeps idempotency keys every engine on it sees, so that a request sent
    again to another engine finds the workflow the first one started. Needed by the
    service over `Engine(cluster=...)`."""

    _does = "keeps idempotency keys that every engine sees"

    @abstractmethod
    async def reserve_key(
        self, tenant: str, key: str, digest: str, *, stale_s: float
    ) -> tuple[bool, str, str | None]:
        """Take an idempotency key for a request whose body hashes to `digest`: (True,
        digest, None) if this caller has it now (a new key, or one taken `stale_s` ago by a
        request that never named its workflow); else (False, the first request's digest, its
        workflow id, None while that request is still starting it)."""

    @abstractmethod
    async def name_key(self, tenant: str, key: str, workflow: str | None) -> None:
        """The workflow a reserved key's request started; None: it started none (refused),
        and the key is free again."""


def payload_digest(data: bytes) -> str:
    """The content address of a payload: the sha256 of its bytes, in hex."""
    return hashlib.sha256(data).hexdigest()
