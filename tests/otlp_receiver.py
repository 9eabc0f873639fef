"""An OTLP/HTTP trace receiver for the tests: `POST /v1/traces` with protobuf (or JSON)
`ExportTraceServiceRequest` bodies, decoded with OpenTelemetry's own proto package, on a
free port in a thread of its own (the exporter sends from its own thread, and a flush
blocks its caller: the receiver must not share the test's event loop)."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import zlib
from collections.abc import Callable
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class OTLPReceiver:
    """Collects the spans it is sent as dicts (`spans`): name, ids, parent, kind,
    attributes, status, links and the resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.port = 0
        self._got = threading.Condition()
        self._stop: Callable[[], None] = lambda: None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    async def _receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "").lower()
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        export = ExportTraceServiceRequest()
        if request.content_type == "application/json":
            json_format.Parse(body, export)
        else:
            export.ParseFromString(body)
        found = []
        for resource_spans in export.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "kind": span.kind,
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                            "status": span.status.code,
                            "links": [link.span_id.hex() for link in span.links],
                            "resource": resource,
                            "schema_url": scope_spans.schema_url,
                        }
                    )
        with self._got:
            self.spans.extend(found)
            self._got.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def __enter__(self) -> OTLPReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._receive)
        self.port, self._stop = serve_in_thread(app)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The spans received once there are at least `count` (or `timeout` passed)."""
        with self._got:
            self._got.wait_for(lambda: len(self.spans) >= count, timeout)
            return list(self.spans)


def serve_in_thread(app: web.Application) -> tuple[int, Callable[[], None]]:
    """Serve `app` on a free port of 127.0.0.1 from a thread with its own event loop: the
    port, and a function that stops it."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        box["loop"] = loop
        runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(runner.setup())
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        box["port"] = sock.getsockname()[1]
        loop.run_until_complete(web.SockSite(runner, sock).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="test-http", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the server did not start")

    def stop() -> None:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(10)

    return box["port"], stop
