"""The service and what arrives on the wire: clients that close mid-body and bodies whose
`Content-Encoding` does not decode. A real server through its door, the real store, raw
sockets; no traceback in the log, and one line per condition at most.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from test_service_abuse import serving, sqlite

from orchestrator.service._config import ServiceSettings

A = {"Authorization": "Bearer acme-token"}
HEAD = (
    b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme-token\r\n"
    b"Content-Type: application/json\r\n"
)


def test_clients_that_close_mid_body_are_not_failures_and_log_a_line_at_most(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """200 clients send their headers (a valid token) and part of the body, then close
    (half of them after a half-close): the service answers others meanwhile, and the log
    holds no traceback and at most a line or two."""

    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            sent = []
            for i in range(200):
                _, writer = await asyncio.open_connection(served.host, served.port)
                writer.write(HEAD + b'Content-Length: 100\r\n\r\n{"tool":')
                await writer.drain()
                if i % 2:
                    writer.write_eof()
                sent.append(writer)
            async with served.http.get(served.base + "/healthz") as r:
                assert r.status == 200
            for writer in sent:
                writer.close()
            async with asyncio.timeout(30):  # a guard: the server sees them close at once
                while served.door.open > 1:  # noqa: ASYNC110 (the client session's one is left)
                    await asyncio.sleep(0.01)
            async with served.http.post(
                served.base + "/v1/tasks?wait=10",
                json={"function": "noop"},
                headers={"Authorization": "Bearer acme-token"},
            ) as r:
                assert r.status == 200, await r.text()

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    assert "Traceback" not in caplog.text, caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("plait")]
    assert not [line for line in ours if "failed" in line], ours
    assert len(ours) <= 2, ours


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_a_body_that_does_not_decode_is_a_400(
    encoding: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving(sqlite(tmp_path), ServiceSettings()) as served:
            reader, writer = await asyncio.open_connection(served.host, served.port)
            body = b"not compressed at all"
            writer.write(
                HEAD
                + b"Content-Encoding: %s\r\nContent-Length: %d\r\n" % (encoding.encode(), len(body))
                + b"Connection: close\r\n\r\n"
                + body
            )
            async with asyncio.timeout(30):
                answer = await reader.read()
            writer.close()
            head, _, rest = answer.partition(b"\r\n\r\n")
            assert head.split()[1] == b"400", answer
            if encoding in ("gzip", "deflate"):  # (aiohttp refuses br and zstd without
                error = json.loads(rest)["error"]  # their packages, before the handler)
                assert f"the body is not valid '{encoding}'" in error, error
            async with served.http.get(served.base + "/v1/workflows", headers=A) as r:
                assert r.status == 200 and (await r.json())["workflows"] == []

    with caplog.at_level(logging.INFO, logger="plait"):
        asyncio.run(main())
    assert "Traceback" not in caplog.text, caplog.text
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert len(caplog.records) <= 1, caplog.text
