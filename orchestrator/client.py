"""A small typed client of `plait serve` (docs/rest.md): submit workflows and tasks, read
them back, follow their events, cancel them.

    async with Client("http://127.0.0.1:8470", token="demo-token") as plait:
        accepted = await plait.submit(spec)
        async for event in plait.events(accepted.id):
            print(event.id, event.kind)
        result = await plait.result(accepted.id)

A request is checked here with the service's own models before it is sent, so a bad spec
fails with the same field names and without a round trip. Every submission carries an
`Idempotency-Key` (a fresh uuid4 unless one is given): that is what makes the client's own
retries safe. Requests that are safe to repeat are retried a bounded number of times on
429 and 503 (after the `Retry-After` the service asks for) and on a lost connection; an
event stream that drops is resumed from the last event seen (`Last-Event-ID`).

Every failure is a `ClientError`: the service's status, its message and the fields at
fault, or, with status None, why no answer came. The token is sent, never shown.

This module imports the service's request and answer models, not the server.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, overload
from urllib.parse import quote

import aiohttp
import pydantic
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from .model._clock import Clock, SystemClock
from .model._errors import PlaitError, UsageError
from .model._events import EVENT_ADAPTER, Event
from .service._spec import (
    Accepted,
    AddTasks,
    Problem,
    ResultView,
    SingleTask,
    TaskSpec,
    WorkflowList,
    WorkflowSpec,
    WorkflowView,
    problems_of,
)

__all__ = [
    "DEFAULT_URL",
    "WAIT_STEP",
    "Accepted",
    "AddTasks",
    "Client",
    "ClientError",
    "Problem",
    "ResultView",
    "SingleTask",
    "StreamEvent",
    "TaskSpec",
    "WorkflowSpec",
    "WorkflowView",
]

DEFAULT_URL = "http://127.0.0.1:8470"
"""Where `plait serve --config examples/serve.toml` listens; `$PLAIT_URL` overrides it."""

RECONNECT_S = 60.0
"""How long `Client.events` tries to resume a lost stream by default: longer than a
service takes to restart (it resumes its workflows from the store as it starts)."""

WAIT_STEP = 30.0
"""The longest wait asked of the service in one request (its `max_wait_s` is 60 s by
default); a longer `wait` is made of several."""

M = TypeVar("M", bound=pydantic.BaseModel)
_LOST = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
"""No answer, or part of one: the service could not be reached or the connection dropped."""
_backoff = wait_exponential(multiplier=0.25, max=4)
"""Between attempts the service gave no `Retry-After` for: 0.25 s, 0.5 s, ... at most 4 s."""


class ClientError(PlaitError):
    """A request that did not succeed.

    `status` is the service's HTTP status, `error` its message and `problems` the fields at
    fault (`tasks[2].agent`: ...). `status` is None when no answer came: the service could
    not be reached, the connection was lost, or the request was refused here before it was
    sent (a spec that does not fit the schema).
    """

    def __init__(
        self,
        status: int | None,
        error: str,
        problems: Sequence[Problem] = (),
        *,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.error = error
        self.problems = tuple(problems)
        self.retry_after = retry_after
        """Seconds the service asked to wait before trying again (429, 503)."""
        super().__init__(self._text())

    def _text(self) -> str:
        text = self.error if self.status is None else f"{self.status}: {self.error}"
        if self.problems:
            text += "; " + "; ".join(f"{p.field}: {p.message}" for p in self.problems)
        return text


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a workflow's stream: its sequence number in the workflow's log (`id`),
    its kind (`task_succeeded`, ...) and its fields, as JSON."""

    id: int
    kind: str
    data: dict[str, Any]

    def typed(self) -> Event:
        """The event as the engine's typed `Event` (a service newer than this client may
        send kinds it does not know: those raise pydantic's ValidationError)."""
        return EVENT_ADAPTER.validate_python(self.data)


class Client:
    """The API of one `plait serve` for one tenant (docs/rest.md). Use it as an async context
    manager; it owns an aiohttp session unless `session` is given (that one stays open).

    `url` defaults to `$PLAIT_URL`, else `DEFAULT_URL`; `token` to `$PLAIT_TOKEN`.
    `timeout` bounds connecting and each request (plus its `wait`), and the silence of an
    event stream (the service sends a heartbeat every 15 s by default). `retries` bounds the
    attempts after the first (a stream's first connection included). `reconnect_s` bounds
    how long a stream that was following a workflow tries to resume after it is lost (a
    restart of the service), from the loss to the last try. `clock` is what waits between
    attempts.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        reconnect_s: float = RECONNECT_S,
        clock: Clock | None = None,
    ) -> None:
        if not 0 <= reconnect_s < float("inf"):
            raise UsageError(f"reconnect_s must be a number of seconds >= 0, got {reconnect_s!r}")
        self.url = (url or os.environ.get("PLAIT_URL") or DEFAULT_URL).rstrip("/") + "/"
        self._token = token if token is not None else os.environ.get("PLAIT_TOKEN") or None
        self._session = session
        self._owned = session is None
        self.timeout = timeout
        self.retries = retries
        self.reconnect_s = reconnect_s
        self._clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"Client({self.url!r}, token={'set' if self._token else 'none'})"

    async def __aenter__(self) -> Client:
        self._http()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session this client opened (not one it was given)."""
        if self._owned and self._session is not None:
            await self._session.close()
            self._session = None

    # --- submissions ----------------------------------------------------------------------

    async def submit(
        self, spec: WorkflowSpec | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Accepted:
        """Submit a workflow (`POST /v1/workflows`). With the same `idempotency_key` and the
        same spec, a repeated submission answers with the first one's workflow."""
        body = _checked(WorkflowSpec, spec, "workflow spec")
        data = await self._call(
            "POST", "v1/workflows", body=body, headers=_key(idempotency_key), safe=True
        )
        return _answer(Accepted, data)

    @overload
    async def submit_task(
        self,
        task: SingleTask | Mapping[str, Any],
        *,
        wait: None = None,
        idempotency_key: str | None = None,
    ) -> Accepted: ...

    @overload
    async def submit_task(
        self,
        task: SingleTask | Mapping[str, Any],
        *,
        wait: float,
        idempotency_key: str | None = None,
    ) -> ResultView: ...

    async def submit_task(
        self,
        task: SingleTask | Mapping[str, Any],
        *,
        wait: float | None = None,
        idempotency_key: str | None = None,
    ) -> Accepted | ResultView:
        """Run one task as a workflow of that task (`POST /v1/tasks`; its id is `task`).

        Without `wait`, the `Accepted` answer. With `wait`, its `ResultView` once it has
        finished, or after `wait` seconds with `finished` False."""
        body = _checked(SingleTask, task, "task")
        deadline = None if wait is None else self._clock.monotonic() + wait
        step = None if wait is None else min(wait, WAIT_STEP)
        data = await self._call(
            "POST",
            "v1/tasks",
            body=body,
            params={} if step is None else {"wait": _seconds(step)},
            headers=_key(idempotency_key),
            safe=True,
            wait=step,
        )
        if deadline is None:
            return _answer(Accepted, data)
        if isinstance(data, dict) and "finished" in data:
            return _answer(ResultView, data)
        left = max(0.0, deadline - self._clock.monotonic())
        return await self.result(_answer(Accepted, data).id, wait=left)

    async def add_tasks(
        self,
        id: str,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        inputs: Mapping[str, Any] | None = None,
    ) -> builtins.list[str]:
        """Add tasks to a running workflow, all or none; their ids. Not retried after a lost
        connection: the tasks may have been added (a second try would be refused)."""
        body = _checked(AddTasks, {"tasks": tasks, "inputs": dict(inputs or {})}, "tasks")
        data = await self._call("POST", f"{_path(id)}/tasks", body=body, safe=False)
        added = data.get("added") if isinstance(data, dict) else None
        if not isinstance(added, list):
            raise ClientError(None, f"the service answered without the added tasks: {data!r:.200}")
        return [str(task) for task in added]

    # --- reads ------------------------------------------------------------------------------

    async def get(self, id: str) -> WorkflowView:
        """The workflow, its tasks (state, attempts, error) and counts by state."""
        return _answer(WorkflowView, await self._call("GET", _path(id), safe=True))

    async def result(self, id: str, *, wait: float | None = None) -> ResultView:
        """Its results and failures by task once it has finished (`finished`). With `wait`,
        the answer comes when it finishes or after `wait` seconds (asked for in requests of
        at most `WAIT_STEP` seconds: a service waits at most its `max_wait_s` in one)."""
        if wait is None:
            return _answer(ResultView, await self._call("GET", f"{_path(id)}/result", safe=True))
        deadline = self._clock.monotonic() + wait
        while True:
            left = max(0.0, deadline - self._clock.monotonic())
            step = min(left, WAIT_STEP)
            data = await self._call(
                "GET", f"{_path(id)}/result", params={"wait": _seconds(step)}, safe=True, wait=step
            )
            view = _answer(ResultView, data)
            if view.finished or left <= WAIT_STEP:
                return view

    async def cancel(self, id: str) -> Accepted:
        """Cancel it: running tasks are cancelled, the rest never start. A workflow that has
        finished answers 409."""
        return _answer(Accepted, await self._call("DELETE", _path(id), safe=True))

    async def events(self, id: str, *, after: int = 0) -> AsyncIterator[StreamEvent]:
        """The workflow's events after the `after`-th, as they are committed; the iterator
        ends after `workflow_finished`.

        The first connection is tried as any request (`retries` times more at most). Once
        the stream has been open, one that drops or goes silent for `timeout` seconds is
        resumed after the last event seen (`Last-Event-ID`), with pauses of 0.25 s doubling
        to 4 s (or the `Retry-After` the service asks for), for up to `reconnect_s` seconds
        from the loss: long enough to outlast a restart of the service. No event is given
        twice and none is lost."""
        last, failures, opened = after, 0, False
        lost_at: float | None = None
        while True:
            problem: BaseException
            try:
                async with (
                    self._stream(id, last) as response,
                    contextlib.aclosing(_lines(response)) as lines,
                ):
                    opened = True
                    parser = _SSEParser()
                    async for line in lines:
                        failures, lost_at = 0, None  # an event or a heartbeat: alive
                        event = parser.feed(line)
                        if event is None:
                            continue
                        last = event.id
                        yield event
                        if event.kind == "workflow_finished":
                            return
                problem = ConnectionResetError("the service ended the stream (shutting down?)")
            except ClientError as exc:
                if exc.status not in (429, 503):
                    raise
                problem = exc
            except _LOST as exc:
                problem = exc
            failures += 1
            now = self._clock.monotonic()
            lost_at = now if lost_at is None else lost_at
            retry_after = problem.retry_after if isinstance(problem, ClientError) else None
            pause = retry_after if retry_after is not None else 0.25 * 2 ** min(failures - 1, 4)
            if not opened and failures > self.retries:
                if isinstance(problem, ClientError):
                    raise problem
                raise self._unreachable(problem) from problem
            if opened and now + pause - lost_at > self.reconnect_s:
                raise ClientError(
                    None,
                    f"lost the event stream of {id!r} after event {last} and could not resume "
                    f"it within {self.reconnect_s:g} s (reconnect_s): {_reason(problem)}; "
                    f"follow it again from there with after={last}",
                ) from problem
            await self._clock.sleep(pause)

    # In this class body `list` names this method: annotations here say `builtins.list`.
    async def list(
        self,
        *,
        status: str | None = None,
        labels: Mapping[str, str] | None = None,
        limit: int | None = None,
        page: int = 50,
    ) -> AsyncIterator[WorkflowView]:
        """The tenant's workflows, newest first (without their tasks: `get` has those),
        filtered by `status` and `labels`; at most `limit` of them (None: all). Pages of
        `page` are fetched as the iteration needs them, following the service's `next`."""
        params = [("limit", str(page if limit is None else max(1, min(page, limit))))]
        params += [("status", status)] if status is not None else []
        params += [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        path: str | None = "v1/workflows"
        given = 0
        while path is not None:
            listing = _answer(WorkflowList, await self._call("GET", path, params=params, safe=True))
            for workflow in listing.workflows:
                if limit is not None and given >= limit:
                    return
                given += 1
                yield workflow
            # `next` carries the whole query; it is relative to the service's root.
            path, params = (listing.next or "").lstrip("/") or None, []

    # --- transport --------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", **(extra or {})}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        safe: bool,
        wait: float | None = None,
    ) -> Any:
        """One request, retried as far as it is `safe` to repeat: its JSON answer, or a
        ClientError."""

        def retry_after(state: RetryCallState) -> float:
            error = state.outcome.exception() if state.outcome else None
            if isinstance(error, ClientError) and error.retry_after is not None:
                return error.retry_after
            return float(_backoff(state))

        retrying = AsyncRetrying(
            stop=lambda state: state.attempt_number > self.retries,
            wait=retry_after,
            retry=retry_if_exception(_transient if safe else _throttled),
            sleep=self._clock.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._once(method, path, body, params, headers, wait)
        except _LOST as exc:
            raise self._unreachable(exc) from exc
        raise AssertionError("unreachable: tenacity reraises the last error")

    async def _once(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | Sequence[tuple[str, str]],
        headers: Mapping[str, str] | None,
        wait: float | None,
    ) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.timeout + (wait or 0.0))
        async with self._http().request(
            method,
            self.url + path,
            json=body,
            params=params,
            headers=self._headers(headers),
            timeout=timeout,
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise _error_of(response, text)
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise ClientError(
                response.status, f"the service answered with something not JSON: {text!r:.200}"
            ) from None

    @contextlib.asynccontextmanager
    async def _stream(self, id: str, after: int) -> AsyncIterator[aiohttp.ClientResponse]:
        """The response of the event stream after event `after`, or the ClientError it
        answered with."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout, sock_read=self.timeout
        )
        headers = self._headers({"Accept": "text/event-stream", "Last-Event-ID": str(after)})
        url = self.url + f"{_path(id)}/events"
        async with self._http().get(url, headers=headers, timeout=timeout) as response:
            if response.status >= 400:
                raise _error_of(response, await response.text())
            yield response

    def _unreachable(self, exc: BaseException) -> ClientError:
        return ClientError(
            None,
            f"no answer from the service at {self.url}: {_reason(exc)} (is `plait serve` "
            "running there? its address is url=, --url or $PLAIT_URL)",
        )


async def _lines(response: aiohttp.ClientResponse) -> AsyncGenerator[str, None]:
    """The body's lines as they come, however long (aiohttp's own line reader refuses
    lines over 128 KiB, and an event's data is one line: a task's whole result)."""
    line = bytearray()
    async for chunk in response.content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            line += chunk[start:end]
            yield line.decode("utf-8")
            line.clear()
            start = end + 1
        line += chunk[start:]


class _SSEParser:
    """Server-Sent Events, a line at a time: a blank line ends an event; comments
    (`: heartbeat`) and events without data are skipped."""

    def __init__(self) -> None:
        self._fields: dict[str, str] = {}
        self._data: list[str] = []

    def feed(self, line: str) -> StreamEvent | None:
        line = line.rstrip("\r\n")
        if line:
            if not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    self._data.append(value)
                else:
                    self._fields[name] = value
            return None
        fields, data = self._fields, "\n".join(self._data)
        self._fields, self._data = {}, []
        if not data:
            return None
        try:
            return StreamEvent(
                id=int(fields.get("id", "")),
                kind=fields.get("event", "message"),
                data=json.loads(data),
            )
        except ValueError:
            raise ClientError(
                None, f"the event stream sent an event that is not plait's: {fields} {data!r:.200}"
            ) from None


# --- helpers ----------------------------------------------------------------------------------


def _checked(model: type[M], value: M | Mapping[str, Any], what: str) -> Any:
    """`value` checked against `model`, as the JSON to send; refused here, naming the fields,
    when it does not fit."""
    if isinstance(value, model):
        checked = value
    else:
        try:
            checked = model.model_validate(value)
        except pydantic.ValidationError as exc:
            raise ClientError(
                None, f"the {what} does not fit the schema (nothing was sent)", problems_of(exc)
            ) from None
    return checked.model_dump(mode="json", exclude_unset=True)


def _answer(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ClientError(
            None,
            f"the service's answer is not a {model.__name__} (is it a plait service of another "
            f"version?): {exc.error_count()} problem(s)",
            problems_of(exc),
        ) from None


def _error_of(response: aiohttp.ClientResponse, text: str) -> ClientError:
    """The ClientError an error answer stands for: from its ErrorBody when it has one."""
    retry_after = None
    with_header = response.headers.get("Retry-After")
    if with_header is not None:
        try:
            retry_after = max(0.0, float(with_header))
        except ValueError:
            retry_after = None  # an HTTP date: wait as if none was given
    try:
        body = json.loads(text)
        error, problems = str(body["error"]), [Problem(**p) for p in body.get("problems", [])]
    except (ValueError, TypeError, KeyError, pydantic.ValidationError):
        error, problems = f"{response.reason or 'error'}: {text.strip()!r:.200}", []
    return ClientError(response.status, error, problems, retry_after=retry_after)


def _throttled(exc: BaseException) -> bool:
    """Refused before anything was done: safe to send again, whatever the request."""
    return isinstance(exc, ClientError) and exc.status == 429


def _transient(exc: BaseException) -> bool:
    """Worth another try for a request that is safe to repeat."""
    if isinstance(exc, ClientError):
        return exc.status in (429, 503)
    return isinstance(exc, _LOST)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return str(exc) or type(exc).__name__


def _key(given: str | None) -> dict[str, str]:
    # One key for all attempts of this call: a retry of a submission that did arrive finds it.
    return {"Idempotency-Key": given if given is not None else str(uuid.uuid4())}


def _path(id: str) -> str:
    return "v1/workflows/" + quote(id, safe="")


def _seconds(value: float) -> str:
    return f"{value:g}"
