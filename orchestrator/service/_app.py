"""The REST service: aiohttp handlers in front of one durable engine.

A submission is answered only once its workflow's first events are committed, so a 202 is
a promise that survives a crash: the next start resumes it. Reads come from the store's
log, so they tell the same story before and after a restart. A tenant sees only its own
workflows: another tenant's id is a 404, exactly as an id that does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import pydantic
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError

from ..cluster._notify import Notifier
from ..durability._registry import Registry
from ..durability._replay import RunImage
from ..durability._resume import Decision, waiting_for_decision
from ..durability._store import (
    KeyStore,
    LeaseLostError,
    Store,
    StoreError,
    WorkflowExistsError,
    WorkflowRow,
)
from ..engine._engine import Engine
from ..model._clock import Clock, SystemClock
from ..model._errors import PlaitError, UsageError
from ..model._text import join_path, storable, text_problem
from ..model._workflow import Workflow
from ._batches import BatchError, Batches
from ._build import SpecError, TooLargeError, add_tasks, build, check_prompt_sizes
from ._config import ServiceSettings, Tenant, hash_token
from ._door import Notes
from ._feeds import Feed, Feeds
from ._metrics import CONTENT_TYPE, Metrics
from ._openapi import openapi
from ._page import PAGE_HTML
from ._spec import (
    RESERVED_LABELS,
    Accepted,
    Added,
    AddTasks,
    BatchList,
    BatchSpec,
    Decided,
    DecisionSpec,
    ErrorBody,
    Problem,
    ResultView,
    SingleTask,
    TaskView,
    WorkflowList,
    WorkflowSpec,
    WorkflowView,
    problems_of,
)
from ._views import THREAD_BYTES, Images

_log = logging.getLogger("plait.serve")

IDEMPOTENCY_LABEL = RESERVED_LABELS + "idempotency_key"
REQUEST_LABEL = RESERVED_LABELS + "request_sha256"
MAX_KEY = 200
"""Characters of an `Idempotency-Key`."""
MAX_JSON_DEPTH = 40
PAGE = 50
_KEYS_PAGE = 5_000
MAX_KNOWN_KEYS = 100_000
"""Idempotency keys kept in memory (some 200 bytes each); older ones are read from the store."""
MAX_PAGE = 500
TASKS_PER_TOKEN = 1_000
BYTES_PER_TOKEN = 1_000_000
"""A result's weight in the rate limit: 1 more token per MB of results."""
"""Reading a workflow (its view or result) weighs one request more per this many tasks."""
ROWS_PER_TOKEN = 100
"""A list weighs one request more per this many rows asked for (`limit`)."""
STREAM_COST = 10
"""Opening an event stream weighs this many requests."""
_FINISHED = ("succeeded", "failed", "cancelled")
_STATUSES = ("pending", "running", *_FINISHED)
M = TypeVar("M", bound=pydantic.BaseModel)


class _Known:
    """Accepted keyed requests, the least recently used let go past `limit`; `whole` while
    none was (a key missing here is then missing from the store too)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.whole = True
        self._map: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def get(self, slot: tuple[str, str]) -> tuple[str, str] | None:
        found = self._map.get(slot)
        if found is not None:
            self._map.move_to_end(slot)
        return found

    def __getitem__(self, slot: tuple[str, str]) -> tuple[str, str]:
        return self._map[slot]

    def __setitem__(self, slot: tuple[str, str], known: tuple[str, str]) -> None:
        self._map[slot] = known
        self._map.move_to_end(slot)
        while len(self._map) > self.limit:
            self._map.popitem(last=False)
            self.whole = False

    def pop(self, slot: tuple[str, str]) -> None:
        self._map.pop(slot, None)


class ApiError(Exception):
    """An answer other than success: the status, and the body's message and problems."""

    def __init__(
        self,
        status: int,
        error: str,
        problems: list[Problem] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.problems = problems or []
        self.headers = dict(headers or {})


class _Bucket:
    """A token bucket: `rate` requests a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), now

    def take(self, now: float, cost: float = 1.0) -> float:
        """0 if a request of this cost may go now (it is taken), else the seconds until it
        may. A cost above `burst` goes once the bucket is full, and leaves it in debt."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        need = min(cost, self.burst)
        if self.tokens >= need:
            self.tokens -= cost
            return 0.0
        return (need - self.tokens) / self.rate

    def charge(self, cost: float) -> None:
        """Take what a request turned out to cost beyond what it was let in with."""
        self.tokens = max(-self.burst, self.tokens - cost)


CANCEL_CHANNEL = "plait_cancel"
"""With several engines: a workflow id whose cancel one engine's API was asked for."""
_KEY_STALE_S = 60.0
"""A key taken by a request that never named its workflow (its engine died meanwhile) is
free again after this long."""
_GONE_S = 1.0
"""How often an idle event stream looks whether its client is still there."""
_FOLLOW_S = 0.2
"""How often a `?wait=` on a workflow another engine runs reads the store."""


class Service:
    """The API over `engine` (which must have a store): see docs/rest.md."""

    def __init__(
        self,
        engine: Engine,
        registry: Registry,
        tenants: tuple[Tenant, ...],
        settings: ServiceSettings | None = None,
        *,
        clock: Clock | None = None,
        batch_dir: Path | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        """`batch_dir`: where batch jobs keep their files (default: the settings'
        `batch_dir`, relative to the working directory). `notifier`: with several engines
        on the store, how a cancel reaches the engine that runs the workflow."""
        if engine.store is None:
            raise UsageError("the service needs an engine with a store: Engine(store=...)")
        self.engine = engine
        self.store: Store = engine.store
        self._shared_keys: KeyStore | None = None
        """With several engines: the store, which keeps idempotency keys all of them see."""
        if engine.cluster is not None:
            self._shared_keys = KeyStore.require(
                engine.store, "the service over Engine(cluster=...)"
            )
        self.registry = registry
        self.settings = settings or ServiceSettings()
        self.clock = clock or SystemClock()
        self._tenants = {t.token_sha256: t for t in tenants}
        self._buckets: dict[str, _Bucket] = {}
        self._keys: dict[tuple[str, str], tuple[str, asyncio.Future[str]]] = {}
        """Idempotency keys being submitted now (a retry racing the first request)."""
        self._known = _Known(MAX_KNOWN_KEYS)
        """(tenant, key) -> (workflow id, request digest) of recent accepted keyed requests."""
        self._streams: set[asyncio.Queue[Any]] = set()
        self._waits: dict[str, int] = {}
        """Requests of each tenant waiting now (`?wait=`)."""
        self._decided: dict[str, dict[str, Decision]] = {}
        """Decisions taken through the API, by workflow: a retried request finds its own."""
        self.accepting = True
        self.batches = Batches(
            engine,
            batch_dir or Path(self.settings.batch_dir),
            max_rows=self.settings.max_batch_rows,
            clock=self.clock,
        )
        self.metrics = Metrics(engine, self.batches.running, self.batches.counts)
        self.notifier = notifier
        self.notes = Notes()
        self.feeds = Feeds(engine, self.store)
        self.images = Images(self.store)

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.settings.max_body_bytes, middlewares=[self._errors]
        )
        app.on_startup.append(self._started)
        app.on_cleanup.append(self._closed)
        app.router.add_get("/", self._page)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/openapi.json", self._openapi)
        app.router.add_post("/v1/workflows", self._submit)
        app.router.add_get("/v1/workflows", self._list)
        app.router.add_post("/v1/tasks", self._submit_task)
        app.router.add_get("/v1/workflows/{id}", self._get)
        app.router.add_delete("/v1/workflows/{id}", self._cancel)
        app.router.add_post("/v1/workflows/{id}/tasks", self._add_tasks)
        app.router.add_get("/v1/workflows/{id}/result", self._result)
        app.router.add_get("/v1/workflows/{id}/events", self._events)
        app.router.add_post("/v1/workflows/{id}/decision", self._decide)
        app.router.add_post("/v1/batches", self._create_batch)
        app.router.add_get("/v1/batches", self._list_batches)
        app.router.add_get("/v1/batches/{id}", self._get_batch)
        app.router.add_delete("/v1/batches/{id}", self._cancel_batch)
        app.router.add_get("/v1/batches/{id}/output", self._batch_output)
        return app

    async def _started(self, app: web.Application) -> None:
        if self.notifier is not None:
            await self.notifier.listen(CANCEL_CHANNEL, self._cancel_asked)
        await self._load_keys()
        again = await self.batches.start()
        if again:
            _log.info("went on with %d batch job(s) a stopped service left running", again)
        self.metrics.start()

    async def _closed(self, app: web.Application) -> None:
        if self.notifier is not None:
            self.notifier.unlisten(CANCEL_CHANNEL, self._cancel_asked)
        await self.batches.close()
        await self.metrics.close()

    def stop_accepting(self) -> None:
        """Shutting down: refuse new work (503), end the event streams."""
        self.accepting = False
        for queue in self._streams:
            queue.put_nowait(None)

    # --- middleware ------------------------------------------------------------------------

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await self._answer(request, handler)
        route = request.match_info.route.resource
        self.metrics.http.labels(
            request.method, route.canonical if route is not None else "unmatched", response.status
        ).inc()
        return response

    async def _answer(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            if request.body_exists and self._token_tenant(request) is not None:
                await self._read_body(request)  # (without a valid token: a 401, unread)
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.error, exc.problems, exc.headers)
        except BatchError as exc:
            api = _batch_error(exc)
            return _error(api.status, api.error, api.problems, exc.headers)
        except web.HTTPRequestEntityTooLarge:
            limit = self.settings.max_body_bytes
            return _error(413, f"the request body is larger than the limit of {limit} bytes")
        except web.HTTPException as exc:
            if exc.status >= 400:
                # Its headers go on (a 405's Allow); its body is ours, so its type is not.
                kept = {k: v for k, v in exc.headers.items() if k.lower() != "content-type"}
                return _error(exc.status, exc.reason, headers=kept)
            raise
        except ConnectionResetError:  # the client went away mid-request: not a failure
            self.notes.note(
                "gone",
                logging.INFO,
                "clients closed their connection before their request was answered",
            )
            return _error(400, "the connection was closed before the request was whole")
        except Exception:
            # Never a traceback to the caller, and never the request's headers in the log.
            _log.exception("%s %s failed", request.method, ascii(request.path))
            return _error(500, "the service failed on this request; it is logged")

    async def _read_body(self, request: web.Request) -> None:
        """The whole body, read before the handler runs (it keeps it): a client that sends
        it slowly gets a 408 after `body_timeout_s` rather than holding a handler."""
        limit = self.settings.body_timeout_s
        try:
            async with asyncio.timeout(limit):
                await request.read()
        except RequestPayloadError as exc:
            coding = request.headers.get("Content-Encoding", "")
            if isinstance(exc.__cause__, ContentEncodingError):
                raise ApiError(
                    400,
                    f"the body is not valid {coding!a} (its Content-Encoding); send it "
                    "compressed whole, or uncompressed without that header",
                    headers={"Connection": "close"},
                ) from None
            if isinstance(exc.__cause__, ConnectionResetError):
                raise exc.__cause__ from None
            raise ApiError(
                400, f"the body cannot be read: {exc}", headers={"Connection": "close"}
            ) from None
        except TimeoutError:
            self.notes.note(
                "body",
                logging.WARNING,
                "answered 408 to requests whose body did not arrive within %g s (body_timeout_s)",
                limit,
            )
            raise ApiError(
                408,
                f"the request body did not arrive within {limit:g} s (body_timeout_s)",
                headers={"Connection": "close"},
            ) from None

    def _tenant(self, request: web.Request, cost: float = 1.0) -> Tenant:
        """The tenant the bearer token names, once its rate allows a request of `cost`
        tokens (docs/rest.md, "Request weights")."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "an Authorization: Bearer <token> header is required",
                headers={"WWW-Authenticate": "Bearer"},
            )
        tenant = self._token_tenant(request)
        if tenant is None:
            raise ApiError(
                401, "the bearer token is not valid", headers={"WWW-Authenticate": "Bearer"}
            )
        bucket = self._buckets.get(tenant.name)
        now = self.clock.monotonic()
        if bucket is None:
            bucket = self._buckets[tenant.name] = _Bucket(tenant.rate_per_s, tenant.burst, now)
        wait = bucket.take(now, cost)
        if wait > 0:
            weight = "" if cost == 1 else f" (this request weighs {cost:g})"
            raise ApiError(
                429,
                f"tenant {tenant.name!r} is over its rate of {tenant.rate_per_s:g} requests/s"
                + weight,
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        return tenant

    def _token_tenant(self, request: web.Request) -> Tenant | None:
        """The tenant whose bearer token the request carries, if any (its rate not asked)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        # Looked up by the token's sha256: timing can tell at most about a digest, never the token.
        try:
            return self._tenants.get(hash_token(token.strip()))
        except UnicodeEncodeError:  # bytes that are not UTF-8 (read as lone surrogates)
            return None

    def _charge(self, tenant: Tenant, image: RunImage, result_bytes: int = 0) -> None:
        """A workflow's view weighs a request more per TASKS_PER_TOKEN of its tasks, and its
        result per BYTES_PER_TOKEN of results: taken once it is read (the next requests wait
        for it)."""
        extra = len(image.tasks) // TASKS_PER_TOKEN + result_bytes // BYTES_PER_TOKEN
        bucket = self._buckets.get(tenant.name)
        if extra and bucket is not None:
            bucket.charge(extra)

    # --- health -------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        durable = self.engine.durable
        problem = None
        if not self.accepting:
            problem = "shutting down"
        elif durable is None:
            problem = "the engine is not running"
        elif durable.error is not None:
            problem = f"the store failed: {durable.error}"
        elif durable.journal.outage:
            problem = "the store is unavailable; waiting for it"
        if problem is not None:
            return web.json_response({"status": "unavailable", "reason": problem}, status=503)
        return web.json_response({"status": "ready", "running": self.engine.running()})

    async def _metrics(self, request: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=PAGE_HTML, content_type="text/html", charset="utf-8")

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi())

    # --- submissions --------------------------------------------------------------------------

    async def _submit(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        body = await _body(request)
        spec = _parse(WorkflowSpec, body)
        run_id, replayed = await self._accept(request, tenant, spec, body)
        return await self._accepted(run_id, replayed)

    async def _submit_task(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        wait = self._wait(request)
        body = await _body(request)
        spec = _parse(SingleTask, body).as_workflow()
        run_id, replayed = await self._accept(request, tenant, spec, body)
        if wait <= 0 or not await self._finished_within(run_id, wait, tenant):
            return await self._accepted(run_id, replayed)
        view = await self._result_of(run_id)
        if not view.finished:  # not running here, nor finished: it waits for a later start
            return await self._accepted(run_id, replayed)
        return await self._result_json(view)

    async def _accepted(self, run_id: str, replayed: bool) -> web.Response:
        """202 with where to follow the workflow; a replayed submission says so (and 200)."""
        if replayed:
            row = await self.store.workflow(run_id)
            status = row.status if row is not None else "running"
            return _json(_accepted(run_id, status), 200, {"Idempotent-Replayed": "true"})
        location = f"/v1/workflows/{run_id}"
        return _json(_accepted(run_id, "running"), 202, {"Location": location})

    async def _accept(
        self, request: web.Request, tenant: Tenant, spec: WorkflowSpec, body: Any
    ) -> tuple[str, bool]:
        """Start the workflow (or find the one this Idempotency-Key made): its id, and
        whether it was there already."""
        self._check_open()
        self._check_size(spec)
        key = _header(request, "Idempotency-Key")
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        if key is None:
            return await self._start(tenant, spec, None, digest), False
        if not key.strip():
            raise ApiError(
                400,
                f"Idempotency-Key must not be blank: send 1 to {MAX_KEY} characters that name "
                "this request, or leave the header out",
            )
        if len(key) > MAX_KEY:
            raise ApiError(400, f"Idempotency-Key must be 1 to {MAX_KEY} characters")
        slot = (tenant.name, key)
        while (racing := self._keys.get(slot)) is not None:
            # The same key is being submitted now: its outcome is this one's.
            if racing[0] != digest:
                raise _reused()
            with contextlib.suppress(Exception):  # it failed: try again for ourselves
                return await asyncio.shield(racing[1]), True
        # Claimed before the first await, so a retry racing this one waits for it.
        pending: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._keys[slot] = (digest, pending)
        try:
            earlier = await self._earlier(tenant, key, digest)
            if earlier is None and self._shared_keys is not None:
                earlier = await self._shared_key(self._shared_keys, tenant, spec, key, digest)
                run_id = earlier or self._known[tenant.name, key][0]
            else:
                run_id = earlier or await self._start(tenant, spec, key, digest)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # retrieved: a racing retry tries again itself
            raise
        else:
            pending.set_result(run_id)
        finally:
            self._keys.pop(slot, None)
        return run_id, earlier is not None

    async def _earlier(self, tenant: Tenant, key: str, digest: str) -> str | None:
        """The workflow an earlier request with this key made, if any (the same body), else
        None; another body under the same key is refused."""
        slot = (tenant.name, key)
        known = self._known.get(slot)
        if known is None and not self._known.whole:
            # Older keys were let go from memory: the store has them all.
            rows = await self.store.workflows(
                tenant=tenant.name, labels={IDEMPOTENCY_LABEL: key}, limit=1
            )
            if rows:
                known = self._known[slot] = (rows[0].id, rows[0].labels.get(REQUEST_LABEL, ""))
        if known is None:
            return None
        run_id, first = known
        if await self.store.workflow(run_id) is None:  # retention has deleted it since
            self._known.pop(slot)
            return None
        if first != digest:
            raise _reused()
        return run_id

    async def _shared_key(
        self, store: KeyStore, tenant: Tenant, spec: WorkflowSpec, key: str, digest: str
    ) -> str | None:
        """With several engines: the key is taken in the store, where every engine sees it.
        The workflow an earlier request made (from any engine), or None once this request
        has started its own."""
        mine, first, workflow = await store.reserve_key(
            tenant.name, key, digest, stale_s=_KEY_STALE_S
        )
        if not mine:
            if first != digest:
                raise _reused()
            if workflow is None:
                raise ApiError(
                    503,
                    "a request with this Idempotency-Key is being accepted by another engine; "
                    "send it again in a moment",
                    headers={"Retry-After": "1"},
                )
            return workflow
        try:
            run_id = await self._start(tenant, spec, key, digest)
        except BaseException:
            with contextlib.suppress(StoreError):
                await store.name_key(tenant.name, key, None)  # refused: the key is free again
            raise
        for attempt in range(3):  # unnamed, the key would be free again after _KEY_STALE_S
            try:
                await store.name_key(tenant.name, key, run_id)
                break
            except StoreError:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
        return None

    async def _load_keys(self) -> None:
        """The store's most recent idempotency keys, read once at start (the store has no
        index on a label: asked per request, a scan of the tenant's workflows); past
        MAX_KNOWN_KEYS, a key not in memory is looked for in the store."""
        offset, found = 0, list[tuple[tuple[str, str], tuple[str, str]]]()
        while len(found) <= MAX_KNOWN_KEYS:
            rows = await self.store.workflows(limit=_KEYS_PAGE, offset=offset)
            for row in rows:  # newest first
                key = row.labels.get(IDEMPOTENCY_LABEL)
                if key is not None and row.tenant is not None:
                    found.append(((row.tenant, key), (row.id, row.labels.get(REQUEST_LABEL, ""))))
            if len(rows) < _KEYS_PAGE:
                break
            offset += len(rows)
        for slot, known in reversed(found):  # the newest are let go last
            self._known[slot] = known

    async def _start(
        self, tenant: Tenant, spec: WorkflowSpec, key: str | None, digest: str, tries: int = 3
    ) -> str:
        # Its batches' rows run under it too; `max_batches` bounds those, not this.
        running = self.engine.running(tenant.name) - self.batches.rows_running(tenant.name)
        if running >= tenant.max_running:
            raise ApiError(
                429,
                f"tenant {tenant.name!r} has {tenant.max_running} workflows running, its limit; "
                "submit again when some have finished",
                headers={"Retry-After": "1"},
            )
        try:
            workflow = build(spec.name, spec.tasks, spec.inputs, self.registry)
        except SpecError as exc:
            raise ApiError(422, "the workflow cannot be built", [_problem(exc)]) from None
        labels = dict(spec.labels)
        if key is not None:
            labels[IDEMPOTENCY_LABEL] = key
            labels[REQUEST_LABEL] = digest
        try:
            handle = self.engine.submit(
                workflow,
                deadline=spec.deadline_s,
                priority=spec.priority,
                late=spec.late,
                tenant=tenant.name,
                labels=labels,
            )
        except PlaitError as exc:
            raise ApiError(503, f"the engine cannot take it now: {exc}") from None
        await self._committed()
        refusal = self.engine.journal and self.engine.journal.refusal(handle.id)
        if isinstance(refusal, WorkflowExistsError):  # its id names a stored run: a new one
            if tries <= 1:
                raise ApiError(503, f"the store cannot record it: {refusal}")
            return await self._start(tenant, spec, key, digest, tries - 1)
        if refusal is not None:  # text the store cannot keep: nothing of the run was stored
            raise ApiError(400, f"the request holds text the store cannot keep: {refusal}")
        if key is not None:
            self._known[tenant.name, key] = (handle.id, digest)
        return handle.id

    async def _committed(self) -> None:
        """Everything recorded so far is in the store (what was accepted survives a crash)."""
        journal = self.engine.journal
        assert journal is not None
        try:
            await journal.durable()
        except PlaitError as exc:
            raise ApiError(503, f"the store cannot record it: {exc}") from None

    def _check_open(self) -> None:
        if not self.accepting:
            raise ApiError(503, "the service is shutting down", headers={"Retry-After": "5"})

    def _check_size(self, spec: WorkflowSpec | AddTasks) -> None:
        settings = self.settings
        if len(spec.tasks) > settings.max_tasks:
            raise ApiError(
                422,
                "the workflow is too large",
                [Problem(field="tasks", message=f"at most {settings.max_tasks} tasks")],
            )
        edges = sum(len(t.after) for t in spec.tasks)
        if edges > settings.max_edges:
            raise ApiError(
                422,
                "the workflow is too large",
                [Problem(field="tasks", message=f"at most {settings.max_edges} dependencies")],
            )
        try:
            check_prompt_sizes(
                spec.tasks,
                spec.inputs,
                per_task=settings.max_prompt_chars,
                per_request=settings.max_request_prompt_chars,
            )
        except TooLargeError as exc:
            raise ApiError(422, "the prompts are too large", [_problem(exc)]) from None

    def _wait(self, request: web.Request) -> float:
        raw = request.query.get("wait")
        if raw is None:
            return 0.0
        try:
            wait = float(raw)
        except ValueError:
            wait = -1.0
        limit = self.settings.max_wait_s
        if not 0 <= wait <= limit or not math.isfinite(wait):
            raise ApiError(
                400,
                "bad query",
                [Problem(field="wait", message=f"seconds from 0 to {limit:g}, got {raw!r}")],
            )
        return wait

    # --- one workflow -----------------------------------------------------------------------

    async def _owned(self, request: web.Request, tenant: Tenant) -> WorkflowRow:
        run_id = request.match_info["id"]
        if not _possible_id(run_id):  # NUL, a lone surrogate, a control character: no store
            raise ApiError(404, f"no workflow {run_id!a}")
        row = await self.store.workflow(run_id)
        if row is None:
            self.images.forget(run_id)  # retention has deleted it, maybe
        if row is None or row.tenant != tenant.name:
            raise ApiError(404, f"no workflow {run_id!r}")
        return row

    async def _get(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        await self._committed()
        row = await self._owned(request, tenant)
        async with _readable(row.id):
            image, counts, tasks = await self.images.tasks(row.id)
        self._charge(tenant, image)
        update: dict[str, Any] = {"counts": counts}
        waiting = self._waiting(row, image)
        if waiting:
            update["waiting_for_decision"] = list(waiting)
        head = _view(row, None).model_copy(update=update)
        text = head.model_dump_json(exclude={"tasks"})[:-1] + ',"tasks":' + tasks + "}"
        return web.Response(text=text, content_type="application/json")

    async def _image(self, run_id: str) -> RunImage:
        return await self.images.image(run_id)

    async def _list(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request, _list_cost(request))
        query = request.query
        problems = []
        status = query.get("status")
        if status is not None and status not in ("pending", "running", *_FINISHED):
            problems.append(
                Problem(field="status", message=f"one of running, {', '.join(_FINISHED)}")
            )
        labels: dict[str, str] = {}
        for item in query.getall("label", []):
            k, sep, v = item.partition("=")
            if not sep or not k:
                problems.append(Problem(field="label", message=f"KEY=VALUE, got {item!r}"))
            elif (problem := text_problem(item)) is not None:
                problems.append(Problem(field="label", message=problem))
            labels[k] = v
        limit = _int(query.get("limit"), PAGE, 1, MAX_PAGE, "limit", problems)
        offset = _int(query.get("offset"), 0, 0, 10**9, "offset", problems)
        if problems:
            raise ApiError(400, "bad query", problems)
        rows = await self.store.workflows(
            status=status,  # type: ignore[arg-type]
            tenant=tenant.name,
            labels=labels,
            limit=limit + 1,
            offset=offset,
        )
        more = len(rows) > limit
        following = None
        if more:
            following = request.rel_url.update_query({"offset": str(offset + limit)})
        return _json(
            WorkflowList(
                workflows=[_view(row, None) for row in rows[:limit]],
                next=None if following is None else str(following),
            )
        )

    async def _result(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        wait = self._wait(request)
        row = await self._owned(request, tenant)
        if wait > 0:
            await self._finished_within(row.id, wait, tenant)
        async with _readable(row.id):
            return await self._result_json(await self._result_of(row.id, tenant))

    async def _result_json(self, view: ResultView) -> web.Response:
        """The result as JSON; large results (hundreds of MB) are encoded in a worker thread,
        so the loop serves other requests meanwhile."""
        if self.images.result_bytes(view.id) <= THREAD_BYTES:
            return _json(view)
        return _json_text(await asyncio.to_thread(_encode, view))

    async def _finished_within(self, run_id: str, seconds: float, tenant: Tenant) -> bool:
        """Wait up to `seconds` for the run to finish; False if it is still running (or the
        tenant holds `max_streams` waits already: a wait holds a connection, so one tenant's
        waits cannot fill the connection cap; the answer comes at once instead)."""
        held = self._waits.get(tenant.name, 0)
        if held >= tenant.max_streams:
            self.notes.note(
                "waits",
                logging.INFO,
                "tenant %r holds %d waiting requests (?wait=), its max_streams: "
                "more are answered at once",
                tenant.name,
                held,
            )
            return False
        self._waits[tenant.name] = held + 1
        try:
            return await self._follow(run_id, seconds)
        finally:
            self._waits[tenant.name] -= 1
            if not self._waits[tenant.name]:
                del self._waits[tenant.name]

    async def _follow(self, run_id: str, seconds: float) -> bool:
        """A run of this engine is awaited; with several engines, one that runs elsewhere
        (or was taken over from this one) is followed in the store."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        handle = self.engine.handle(run_id)
        if handle is not None:
            try:
                async with asyncio.timeout(seconds):
                    await handle.result()
            except TimeoutError:
                return False
            except LeaseLostError:
                pass  # another engine runs it now: follow it in the store
            else:
                return True
        if self.engine.leases is None:
            return True  # not running in this engine: the store has its story
        while True:
            row = await self.store.workflow(run_id)
            if row is None or row.status in _FINISHED:
                return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(_FOLLOW_S, left))

    async def _result_of(self, run_id: str, tenant: Tenant | None = None) -> ResultView:
        """The run's result; read for `tenant`, weighed by its size (`_charge`)."""
        await self._committed()  # a run that has just finished: its end is in the store
        row = await self.store.workflow(run_id)
        assert row is not None
        image = await self._image(run_id)
        if tenant is not None:
            self._charge(tenant, image, self.images.result_bytes(run_id))
        finished = image.status is not None
        failures = {
            t.id: t.error or t.reason or t.state
            for t in image.tasks.values()
            if t.state in ("failed", "cancelled", "skipped")
        }
        return ResultView(
            id=run_id,
            status=image.status or row.status,
            finished=finished,
            results=image.results() if finished else {},
            failures=failures if finished else {},
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        row = await self._owned(request, tenant)
        handle = self.engine.handle(row.id)
        if handle is None:
            if row.status in _FINISHED:
                raise ApiError(409, f"workflow {row.id!r} has finished already ({row.status})")
            leases = self.engine.leases
            if leases is not None:
                # Another engine runs it, or will once it takes it over: the mark in the
                # store reaches the engine holding it at its next heartbeat; the notifier,
                # if any, sooner.
                if not await leases.cancel_store.ask_cancel(row.id, "cancelled through the API"):
                    raise ApiError(409, f"workflow {row.id!r} has finished already")
                if self.notifier is not None:
                    with contextlib.suppress(StoreError):
                        await self.notifier.notify(CANCEL_CHANNEL, row.id)
                return _json(_accepted(row.id, "running"), 202)
            raise ApiError(
                409,
                f"workflow {row.id!r} is not running in this service (it waits to be "
                "resumed); cancel it again once it runs",
                headers={"Retry-After": "5"},
            )
        handle.cancel("cancelled through the API")
        return _json(_accepted(row.id, "running"), 202)

    def _cancel_asked(self, run_id: str) -> None:
        """An engine's API was asked to cancel a workflow; it runs here, maybe."""
        if not run_id:
            return  # a notifier's "look again" after it reconnected
        self.engine.cancel_if_running(run_id, "cancelled through the API")

    async def _add_tasks(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        self._check_open()
        body = await _body(request)
        spec = _parse(AddTasks, body)
        self._check_size(spec)
        row = await self._owned(request, tenant)
        handle = self.engine.handle(row.id)
        if handle is None:
            raise ApiError(409, f"workflow {row.id!r} is not running; tasks cannot be added")
        workflow = handle.workflow
        existing = list(workflow.graph.nodes)
        try:
            added = add_tasks(workflow, spec.tasks, spec.inputs, self.registry, existing=existing)
        except SpecError as exc:
            raise ApiError(422, "the tasks cannot be added", [_problem(exc)]) from None
        except BaseException as exc:
            _take_back(workflow, existing)  # all or none: no await since the first was added
            if isinstance(exc, UsageError):  # refused (a dependency that has finished...)
                raise ApiError(409, str(exc)) from None
            raise
        await self._committed()
        return _json(Added(id=row.id, added=added))

    # --- decisions --------------------------------------------------------------------------

    def _waiting(self, row: WorkflowRow, image: RunImage) -> tuple[str, ...]:
        """The tasks a workflow that this engine does not run waits to have decided. With
        several engines, one that runs elsewhere looks the same in the log: none said."""
        if row.status in _FINISHED or self.engine.handle(row.id) is not None:
            return ()
        if self.engine.leases is not None:
            return ()
        return waiting_for_decision(image)

    async def _decide(self, request: web.Request) -> web.Response:
        """Run again or fail the tasks a workflow waits to have decided, then go on with it.
        The same decision again (a retry) gets the same answer; another is a 409."""
        tenant = self._tenant(request)
        self._check_open()
        spec = _parse(DecisionSpec, await _body(request))
        row = await self._owned(request, tenant)
        taken = self._decided.get(row.id)
        if taken is not None:
            if _asked(spec, tuple(taken)) != taken:
                raise ApiError(409, f"workflow {row.id!r} was decided already: {taken}")
            status = "running" if self.engine.handle(row.id) is not None else row.status
            return _json(Decided(id=row.id, status=status, decisions=taken))
        if row.status in _FINISHED:
            raise ApiError(409, f"workflow {row.id!r} has finished ({row.status})")
        if self.engine.handle(row.id) is not None:
            raise ApiError(409, f"workflow {row.id!r} is running; no task of it waits")
        if self.engine.leases is not None:
            raise ApiError(
                409,
                "with several engines on one store, decide with plait resume --decide "
                "while no engine runs the workflow",
            )
        await self._committed()
        waiting = waiting_for_decision(await self._image(row.id))
        if not waiting:
            raise ApiError(409, f"workflow {row.id!r} has no task waiting for a decision")
        decisions = _asked(spec, waiting)
        problems = [
            Problem(field=f"tasks.{task}", message="this task does not wait for a decision")
            for task in decisions
            if task not in waiting
        ] + [
            Problem(field="tasks", message=f"no decision for {task!r}, which waits for one")
            for task in waiting
            if task not in decisions
        ]
        if problems:
            raise ApiError(422, f"decide each task that waits: {', '.join(waiting)}", problems)
        report = await self.engine.resume(
            self.registry,
            decisions={f"{row.id}/{task}": choice for task, choice in decisions.items()},
            workflows=[row.id],
        )
        if not report.runs:
            error = next((p.error for p in report.plans if p.error), "it cannot be resumed")
            raise ApiError(409, f"workflow {row.id!r} cannot go on: {error}")
        self._decided[row.id] = decisions
        await self._committed()
        return _json(Decided(id=row.id, status="running", decisions=decisions))

    # --- events -----------------------------------------------------------------------------

    async def _events(self, request: web.Request) -> web.StreamResponse:
        tenant = self._tenant(request, STREAM_COST)
        row = await self._owned(request, tenant)
        problems: list[Problem] = []
        after = _int(
            request.headers.get("Last-Event-ID") or request.query.get("after"),
            0,
            0,
            2**62,
            "Last-Event-ID",
            problems,
        )
        if problems:
            raise ApiError(400, "bad request", problems)
        held = self.feeds.by_tenant.get(tenant.name, 0)
        if held >= tenant.max_streams:
            raise ApiError(
                429,
                f"tenant {tenant.name!r} has {held} event streams open, its limit "
                f"(max_streams); close one, or read GET /v1/workflows/{{id}} instead",
                headers={"Retry-After": "5"},
            )
        queue: asyncio.Queue[Any] = asyncio.Queue()
        bus = self.engine.bus
        # Both before the first read: nothing falls between.
        feed = self.feeds.open(row.id, tenant.name)
        bus.subscribe(row.id, queue)
        self._streams.add(queue)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            try:
                async with _readable(row.id):
                    await self._stream(request, response, feed, after, queue)
            except ApiError as exc:  # the headers are sent: the stream ends with the error
                data = ErrorBody(error=exc.error).model_dump_json()
                await response.write(f"event: error\ndata: {data}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away, or the service is closing
        finally:
            bus.unsubscribe(row.id, queue)
            self._streams.discard(queue)
            self.feeds.close(feed, tenant.name)
        return response

    async def _stream(
        self,
        request: web.Request,
        response: web.StreamResponse,
        feed: Feed,
        after: int,
        queue: asyncio.Queue[Any],
    ) -> None:
        heartbeat = self.settings.heartbeat_s
        loop = asyncio.get_running_loop()
        written = loop.time()
        while True:
            # Not running here (it has finished, or waits for a later start): the store has
            # every event that will come, so the stream ends once they are sent, also when
            # it was resumed after the last of them.
            ended = self.engine.handle(feed.run_id) is None
            async for frame in feed.replay(after):
                await response.write(frame.data)
                written, after = loop.time(), frame.seq
                if frame.last:
                    return
            if ended:
                return
            try:
                # A client that went away is noticed within _GONE_S (aiohttp does not cancel
                # the handler), so its stream stops counting against its tenant's cap.
                async with asyncio.timeout(min(_GONE_S, written + heartbeat - loop.time())):
                    item = await queue.get()
            except TimeoutError:
                if request.transport is None or request.transport.is_closing():
                    return
                if loop.time() >= written + heartbeat:
                    await response.write(b": heartbeat\n\n")
                    written = loop.time()
                continue
            if item is None:
                return  # the service is closing
            while not queue.empty():
                queue.get_nowait()

    # --- batches --------------------------------------------------------------------------

    async def _create_batch(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        self._check_open()
        spec = _parse(BatchSpec, await _body(request))
        view = await self.batches.create(tenant.name, spec.rows, max_batches=tenant.max_batches)
        return _json(view, 202, {"Location": f"/v1/batches/{view.id}"})

    async def _get_batch(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        batch = self.batches.get(tenant.name, request.match_info["id"])
        return _json(self.batches.view(batch))

    async def _list_batches(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request, _list_cost(request))
        query = request.query
        problems: list[Problem] = []
        state = query.get("state")
        states = ("running", "completed", "failed", "cancelled")
        if state is not None and state not in states:
            problems.append(Problem(field="state", message=f"one of {', '.join(states)}"))
        limit = _int(query.get("limit"), PAGE, 1, MAX_PAGE, "limit", problems)
        offset = _int(query.get("offset"), 0, 0, 10**9, "offset", problems)
        if problems:
            raise ApiError(400, "bad query", problems)
        views = self.batches.list(tenant.name, state, limit + 1, offset)
        following = None
        if len(views) > limit:
            following = str(request.rel_url.update_query({"offset": str(offset + limit)}))
        return _json(BatchList(batches=views[:limit], next=following))

    async def _cancel_batch(self, request: web.Request) -> web.Response:
        tenant = self._tenant(request)
        view = await self.batches.cancel(tenant.name, request.match_info["id"])
        return _json(view, 202)

    async def _batch_output(self, request: web.Request) -> web.StreamResponse:
        """The output so far: whole lines only (a row being written is left for later)."""
        tenant = self._tenant(request)
        path = self.batches.output(tenant.name, request.match_info["id"])
        end = await asyncio.to_thread(_whole_lines_end, path)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.content_length = end
        await response.prepare(request)
        offset = 0
        while offset < end:  # in chunks, off the loop: an output can be gigabytes
            chunk = await asyncio.to_thread(_read_at, path, offset, min(_CHUNK, end - offset))
            if not chunk:
                break
            await response.write(chunk)
            offset += len(chunk)
        await response.write_eof()
        return response


_CHUNK = 1 << 20


def _whole_lines_end(path: Path) -> int:
    """Where the output's last whole line ends (a row being written is left for later)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            position = size
            while position > 0:
                step = min(_CHUNK, position)
                handle.seek(position - step)
                block = handle.read(step)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    return position - step + newline + 1
                position -= step
    except FileNotFoundError:
        pass
    return 0


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with path.open("rb") as handle:
        handle.seek(offset)
        return handle.read(size)


# --- helpers ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _readable(run_id: str) -> AsyncIterator[None]:
    """Reading the run's stored log: one that cannot be rebuilt (damaged by hand or by the
    disk) is a 500 that says so, for this workflow alone, logged once a read."""
    try:
        yield
    except (ValueError, KeyError, TypeError, UsageError) as exc:  # (pydantic's is a ValueError)
        _log.error("workflow %r: its stored log is damaged: %s", run_id, _one_line(exc))
        raise ApiError(
            500,
            f"workflow {run_id!r}: its stored log is damaged and cannot be shown "
            f"({_one_line(exc)}); it is logged",
        ) from None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return storable(" ".join(text.split()))[:300]


def _possible_id(text: str) -> bool:
    """Whether `text` could name a stored workflow: storable text without control characters
    (an id made of anything else never reaches the store, nor the log)."""
    return text_problem(text) is None and text.isprintable()


def _list_cost(request: web.Request) -> float:
    """1, and one more per ROWS_PER_TOKEN rows the list asks for (a bad limit: 1, and a 400)."""
    try:
        limit = min(MAX_PAGE, max(1, int(request.query.get("limit", PAGE))))
    except ValueError:
        return 1.0
    return 1.0 + limit // ROWS_PER_TOKEN


def _batch_error(exc: BatchError) -> ApiError:
    field, sep, message = exc.message.partition(": ")
    if sep and field == "rows":
        return ApiError(exc.status, exc.message, [Problem(field=field, message=message)])
    return ApiError(exc.status, exc.message)


def _asked(spec: DecisionSpec, waiting: tuple[str, ...]) -> dict[str, Decision]:
    """The decision per task a request asks for (`decision` is for every waiting task)."""
    if spec.tasks:
        return dict(spec.tasks)
    assert spec.decision is not None
    return dict.fromkeys(waiting, spec.decision)


def _reused() -> ApiError:
    return ApiError(
        422,
        "this Idempotency-Key was used with a different request; use a new key for a new "
        "submission",
    )


async def _body(request: web.Request) -> Any:
    """The request's JSON, checked in one pass: nested at most `MAX_JSON_DEPTH` levels, and
    every key and string one the store can hold, every number finite (400 naming the field)."""
    if request.content_type != "application/json":
        raise ApiError(
            415, f"send JSON (Content-Type: application/json), not {storable(request.content_type)}"
        )
    raw = await request.read()
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _too_deep(_deep_path(raw.decode("utf-8", "replace"))) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    _check_body(body)
    return body


_Where: TypeAlias = tuple["_Where", str | int] | None
"""Where a value sits in a body, as (where its parent sits, its key or index): the path is
spelled out only for the value at fault."""


def _check_body(body: Any) -> None:
    """Raise 400 at the first value of `body` nested too deep or that cannot be stored."""
    stack: list[tuple[Any, int, _Where]] = [(body, 1, None)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                raise _unstorable(where, problem)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _unstorable(where, f"{item!r} is not a number JSON can hold")
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep(_path(where))
            if isinstance(item, list):
                stack.extend((child, depth + 1, (where, i)) for i, child in enumerate(item))
                continue
            for key, child in item.items():
                if (problem := text_problem(key)) is not None:
                    raise _unstorable((where, key), f"its key: {problem}")
                stack.append((child, depth + 1, (where, key)))


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]')
"""The JSON tokens that say where a value sits: strings (keys), brackets and separators."""


def _deep_path(text: str) -> str:
    """Where in the JSON `text` a value first lies deeper than `MAX_JSON_DEPTH` (for a body
    too deep for the parser), read from its tokens without building anything."""
    steps: list[list[Any]] = []  # per open container: [is a list, its current key or index]
    key = '""'
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            key = token
        elif token in "[{":
            if len(steps) >= MAX_JSON_DEPTH:
                break
            steps.append([token == "[", 0])
        elif token in "]}":
            if steps:
                steps.pop()
        elif token == "," and steps and steps[-1][0]:
            steps[-1][1] += 1
        elif token == ":" and steps:
            try:
                steps[-1][1] = json.loads(key)
            except ValueError:
                steps[-1][1] = key
    field = ""
    for _, step in steps:
        field = join_path(field, step)
    return field


def _too_deep(field: str) -> ApiError:
    return ApiError(
        400,
        f"the JSON is nested deeper than {MAX_JSON_DEPTH} levels",
        [
            Problem(
                field=field or "(body)",
                message=f"nested deeper than {MAX_JSON_DEPTH} levels; send flatter JSON",
            )
        ],
    )


def _path(where: _Where) -> str:
    steps: list[str | int] = []
    while where is not None:
        where, step = where
        steps.append(step)
    field = ""
    for step in reversed(steps):
        field = join_path(field, step)
    return field


def _unstorable(where: _Where, problem: str, field: str | None = None) -> ApiError:
    if field is None:
        field = _path(where)
    return ApiError(
        400,
        "the request holds text or a number that cannot be stored",
        [Problem(field=field or "(body)", message=problem)],
    )


def _header(request: web.Request, name: str) -> str | None:
    """A header's value, refused (400 naming the header) when it cannot be stored: bytes
    that are not UTF-8 reach us as lone surrogates."""
    value = request.headers.get(name)
    if value is not None and (problem := text_problem(value)) is not None:
        raise _unstorable(None, problem, field=name)
    return value


def _take_back(workflow: Workflow, existing: list[str]) -> None:
    """Remove the tasks a refused `add_tasks` request added before it was refused (newest
    first); none of them has started, as the request has not awaited since."""
    have = set(existing)
    for task_id in reversed(list(workflow.graph.nodes)):
        if task_id not in have:
            workflow.remove(task_id)


def _parse(model: type[M], body: Any) -> M:
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        raise ApiError(422, "the request does not fit the schema", problems_of(exc)) from None


def _problem(exc: SpecError) -> Problem:
    return Problem(field=exc.field, message=exc.message)


def _int(
    raw: str | None, default: int, low: int, high: int, name: str, problems: list[Problem]
) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        problems.append(Problem(field=name, message=f"a whole number from {low} to {high}"))
        return default
    return value


def _accepted(run_id: str, status: str) -> Accepted:
    base = f"/v1/workflows/{run_id}"
    return Accepted(
        id=run_id,
        status=status,  # type: ignore[arg-type]
        links={"self": base, "result": f"{base}/result", "events": f"{base}/events"},
    )


def _view(row: WorkflowRow, image: RunImage | None) -> WorkflowView:
    counts: dict[str, int] | None = None
    tasks = None
    if image is not None:
        counts, tasks = {}, []
        for task in image.tasks.values():
            counts[task.state] = counts.get(task.state, 0) + 1
            tasks.append(
                TaskView(
                    id=task.id,
                    kind=task.action.kind,
                    name=task.action.name,
                    after=sorted(task.after),
                    state=task.state,
                    attempts=task.attempts,
                    error=task.error or task.reason,
                )
            )
    return WorkflowView(
        id=row.id,
        name=row.name,
        # a status no version writes (a damaged row): it will not run again
        status=row.status if row.status in _STATUSES else "failed",
        priority=row.priority,
        labels={k: v for k, v in row.labels.items() if not k.startswith(RESERVED_LABELS)},
        created=row.created,
        updated=row.updated,
        finished=row.finished,
        deadline=row.deadline,
        counts=counts,
        tasks=tasks,
    )


def _json(
    model: pydantic.BaseModel, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return _json_text(model.model_dump_json(), status, headers)


def _json_text(
    text: str, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(text=text, status=status, content_type="application/json", headers=headers)


def _encode(model: pydantic.BaseModel) -> str:
    """A large view's JSON (called in a worker thread)."""
    return model.model_dump_json()


def _error(
    status: int,
    error: str,
    problems: list[Problem] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return _json(ErrorBody(error=error, problems=problems or []), status, headers)
