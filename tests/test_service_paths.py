"""Ids in the URL path that no workflow or batch can have (NUL, a lone surrogate, a control
character): a 404 before the store is asked, and the log neither holds a traceback nor lets
the id write a line of its own. A real server and real stores (SQLite, PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import urlsplit

import pytest
from conftest import StoreFactory
from test_hostile_input import Api, on_stores

ROUTES = [
    ("GET", "/v1/workflows/{id}", None),
    ("GET", "/v1/workflows/{id}/result", None),
    ("GET", "/v1/workflows/{id}/events", None),
    ("DELETE", "/v1/workflows/{id}", None),
    ("POST", "/v1/workflows/{id}/tasks", {"tasks": [{"id": "e", "tool": "echo_text"}]}),
    ("POST", "/v1/workflows/{id}/decision", {"decision": "fail"}),
    ("GET", "/v1/batches/{id}", None),
    ("DELETE", "/v1/batches/{id}", None),
    ("GET", "/v1/batches/{id}/output", None),
]
IDS = ["a%00b", "%ED%B3%BF", "x%0Aforged", "x%0D%0Aforged", "a%7Fb", "%FF"]


async def _send(api: Api, method: str, path: str, body: object) -> tuple[int, dict[str, str]]:
    """The request written byte for byte: the path exactly as given, percent escapes kept."""
    url = urlsplit(api.base)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    data = b"" if body is None else json.dumps(body).encode()
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme-token\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    answer = await reader.read()
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(rest)


def test_an_id_no_workflow_can_have_is_a_404_and_logs_nothing_raw(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def check(api: Api) -> None:
        for method, route, body in ROUTES:
            for raw in IDS:
                status, data = await _send(api, method, route.format(id=raw), body)
                assert status == 404, (method, route, raw, data)
                assert data["error"].startswith(("no workflow ", "no batch ")), data
                assert "\n" not in data["error"] and "\x00" not in data["error"], data
        await api.healthy()
        await api.other_tenant_runs()

    on_stores(make_store, check)
    for record in caplog.records:
        text = record.getMessage()
        assert record.exc_info is None, text
        assert "forged" not in text or "\n" not in text, text
        assert "\x00" not in text, text
        assert "Traceback" not in caplog.text


def test_a_failing_request_logs_its_path_escaped(
    make_store: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The one line a failed request logs names its path with escapes, never raw."""
    from orchestrator.service import _app

    caplog.set_level(logging.ERROR)
    owned = _app.Service._owned

    async def failing(self: _app.Service, request: object, tenant: object) -> object:
        raise RuntimeError("the store broke")

    async def check(api: Api) -> None:
        status, _ = await _send(api, "GET", "/v1/workflows/wf%0Aforged%20line", None)
        assert status == 500

    _app.Service._owned = failing  # type: ignore[method-assign,assignment]
    try:
        on_stores(make_store, check)
    finally:
        _app.Service._owned = owned  # type: ignore[method-assign]
    lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert lines and all("\n" not in line for line in lines), lines
