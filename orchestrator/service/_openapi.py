"""The OpenAPI 3.1 document at `/v1/openapi.json`, generated from the request and answer
models, so that what is documented is what is validated."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ._spec import (
    Accepted,
    Added,
    AddTasks,
    BatchList,
    BatchSpec,
    BatchView,
    Decided,
    DecisionSpec,
    ErrorBody,
    ResultView,
    SingleTask,
    WorkflowList,
    WorkflowSpec,
    WorkflowView,
)

_MODELS: list[type[BaseModel]] = [
    WorkflowSpec, SingleTask, AddTasks, Accepted, Added, WorkflowView, WorkflowList, ResultView,
    ErrorBody, BatchSpec, BatchView, BatchList, DecisionSpec, Decided,
]  # fmt: skip
_REQUESTS: tuple[type[BaseModel], ...] = (
    WorkflowSpec, SingleTask, AddTasks, BatchSpec, DecisionSpec,
)  # fmt: skip
_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _object(description: str, **properties: str) -> dict[str, Any]:
    """A small answer that has no model (health), as a JSON object of these typed fields."""
    schema = {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    said = {
        400: "a malformed request (not JSON, too deep, a bad query)",
        401: "no or a wrong bearer token",
        404: "no such workflow for this tenant",
        408: "the body did not arrive whole within body_timeout_s",
        409: "the workflow is not in a state for this",
        413: "the body is larger than the service's max_body_bytes",
        415: "the body is not JSON",
        422: "the request does not fit the schema or the service's limits, or names what "
        "is not registered",
        429: "over the tenant's rate (requests weighed by cost), running or stream limit; "
        "see Retry-After",
        503: "shutting down, or the store cannot record it now",
    }
    return {str(c): _json(ErrorBody, said[c]) for c in codes}


_EVENT = {
    "type": "object",
    "description": "one event of the stream",
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+$", "description": "its seq in the log"},
        "event": {"type": "string", "description": "its kind: workflow_started, task_added..."},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["id", "event", "data"],
}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "schema": {"type": "number", "minimum": 0},
    "description": "seconds to wait for the workflow to finish before answering",
}


def _closed_keys(schema: Any) -> None:
    """pydantic writes the key pattern of a `dict` (labels, inputs) as `patternProperties`,
    which lets keys of any other form through, with any value; the models refuse them, and
    so does the document, with `additionalProperties: false` beside the pattern."""
    if isinstance(schema, dict):
        if "patternProperties" in schema:
            schema.setdefault("additionalProperties", False)
        for value in schema.values():
            _closed_keys(value)
    elif isinstance(schema, list):
        for value in schema:
            _closed_keys(value)


@cache
def openapi() -> dict[str, Any]:
    _, defs = models_json_schema(
        [(m, "validation" if m in _REQUESTS else "serialization") for m in _MODELS],
        ref_template=_REF,
    )  # fmt: skip
    _closed_keys(defs)
    common = _errors(401, 429)

    def request(model: type[BaseModel]) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}

    key = {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "minLength": 1, "maxLength": 200},
        "description": "a retried submission with the same key returns the same workflow",
    }
    paths: dict[str, Any] = {
        "/v1/workflows": {
            "post": {
                "summary": "Submit a workflow",
                "parameters": [key],
                "requestBody": request(WorkflowSpec),
                "responses": {
                    "202": _json(Accepted, "accepted: recorded, and running"),
                    "200": _json(Accepted, "the workflow this Idempotency-Key made before"),
                    **_errors(400, 408, 413, 415, 422, 503),
                    **common,
                },
            },
            "get": {
                "summary": "List the tenant's workflows, newest first",
                "parameters": [
                    {"name": "status", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "label",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "KEY=VALUE; repeat for several",
                    },
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                    {"name": "offset", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {"200": _json(WorkflowList, "a page"), **_errors(400), **common},
            },
        },
        "/v1/tasks": {
            "post": {
                "summary": "Run one task as a one-task workflow",
                "parameters": [key, _WAIT],
                "requestBody": request(SingleTask),
                "responses": {
                    "200": {
                        "description": "finished within the wait (its result), or the workflow "
                        "this Idempotency-Key made before (where to follow it)",
                        "content": {
                            "application/json": {
                                "schema": {"anyOf": [_ref(ResultView), _ref(Accepted)]}
                            }
                        },
                    },
                    "202": _json(Accepted, "accepted (or not finished within the wait)"),
                    **_errors(400, 408, 413, 415, 422, 503),
                    **common,
                },
            }
        },
        "/v1/workflows/{id}": {
            "get": {
                "summary": "A workflow and its tasks",
                "parameters": [_ID],
                "responses": {
                    "200": _json(WorkflowView, "the workflow"),
                    **_errors(404, 503),
                    **common,
                },
            },
            "delete": {
                "summary": "Cancel a running workflow",
                "parameters": [_ID],
                "responses": {
                    "202": _json(Accepted, "cancelling"),
                    **_errors(404, 409),
                    **common,
                },
            },
        },
        "/v1/workflows/{id}/tasks": {
            "post": {
                "summary": "Add tasks to a running workflow",
                "parameters": [_ID],
                "requestBody": request(AddTasks),
                "responses": {
                    "200": _json(Added, "added, in the order given to the engine"),
                    **_errors(400, 404, 408, 409, 413, 415, 422, 503),
                    **common,
                },
            }
        },
        "/v1/workflows/{id}/decision": {
            "post": {
                "summary": "Run again or fail the tasks that wait for a decision",
                "description": "A task declared not idempotent that was running when the "
                "service stopped is not run again silently: its workflow waits, and its view "
                "lists it in waiting_for_decision, until this decides. The same request "
                "again gets the same answer.",
                "parameters": [_ID],
                "requestBody": request(DecisionSpec),
                "responses": {
                    "200": _json(Decided, "decided: the workflow goes on"),
                    **_errors(400, 404, 409, 415, 422, 503),
                    **common,
                },
            }
        },
        "/v1/workflows/{id}/result": {
            "get": {
                "summary": "Results and failures by task, once finished",
                "parameters": [_ID, _WAIT],
                "responses": {
                    "200": _json(ResultView, "the result"),
                    **_errors(400, 404, 503),
                    **common,
                },
            }
        },
        "/v1/workflows/{id}/events": {
            "get": {
                "summary": "Server-Sent Events from the workflow's log",
                "description": "Each event's `id` is its sequence number: reconnect with "
                "Last-Event-ID to go on after it. Idle streams get a comment every "
                "heartbeat. The stream ends after workflow_finished.",
                "parameters": [
                    _ID,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                    {"name": "after", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {
                    "200": {
                        "description": "an event stream",
                        # Before OpenAPI 3.2 (itemSchema), an event stream's schema is one event's.
                        "content": {"text/event-stream": {"schema": _EVENT}},
                    },
                    **_errors(400, 404),
                    **common,
                },
            }
        },
        "/v1/batches": {
            "post": {
                "summary": "Run rows as a batch job (an LLM call each; docs/batch.md)",
                "requestBody": request(BatchSpec),
                "responses": {
                    "202": _json(BatchView, "accepted: the rows are on disk, and running"),
                    **_errors(400, 408, 413, 415, 422, 503),
                    **common,
                },
            },
            "get": {
                "summary": "List the tenant's batch jobs, newest first",
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer"}},
                    {"name": "offset", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {"200": _json(BatchList, "a page"), **_errors(400), **common},
            },
        },
        "/v1/batches/{id}": {
            "get": {
                "summary": "A batch job's state and progress (its summary once completed)",
                "parameters": [_ID],
                "responses": {"200": _json(BatchView, "the batch"), **_errors(404), **common},
            },
            "delete": {
                "summary": "Cancel a running batch job (rows written so far stay)",
                "parameters": [_ID],
                "responses": {"202": _json(BatchView, "cancelled"), **_errors(404), **common},
            },
        },
        "/v1/batches/{id}/output": {
            "get": {
                "summary": "The output so far: a line per finished row, OpenAI batch format",
                "parameters": [_ID],
                "responses": {
                    "200": {
                        "description": "JSON lines",
                        "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
                    },
                    **_errors(404),
                    **common,
                },
            }
        },
        "/v1/openapi.json": {"get": {"summary": "This document", "security": [],
                                     "responses": {"200": _object("OpenAPI 3.1")}}},
        "/healthz": {"get": {"summary": "The process is up", "security": [],
                             "responses": {"200": _object("up", status="string")}}},
        "/readyz": {"get": {"summary": "Ready for work (store writable, not closing)",
                            "security": [],
                            "responses": {
                                "200": _object("ready", status="string", running="integer"),
                                "503": _object("not ready", status="string", reason="string"),
                            }}},
        "/metrics": {"get": {"summary": "Prometheus text format (docs/rest.md lists the series)",
                             "security": [],
                             "responses": {"200": {
                                 "description": "the figures",
                                 "content": {"text/plain": {"schema": {"type": "string"}}},
                             }}}},
        "/": {"get": {"summary": "The live DAG page", "security": [],
                      "responses": {"200": {
                          "description": "HTML",
                          "content": {"text/html": {"schema": {"type": "string"}}},
                      }}}},
    }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "plait", "version": "1"},
        "components": {
            "schemas": defs["$defs"],
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }
