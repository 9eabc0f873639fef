"""A minimal trace collector: receives OTLP/HTTP spans and prints each trace as a tree.

    python examples/trace_collector.py            # listens on 127.0.0.1:4318
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 plait run examples/tool_agent.py

plait exports a trace of each run when `[telemetry]` is in its config or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (docs/tracing.md); any OpenTelemetry collector, Jaeger
or Tempo receives the same spans. This one prints them, indented under their parents, with
a few GenAI attributes: enough to see what a trace holds without running a tracing backend.
Needs `pip install 'plait[otel]'` (for OpenTelemetry's protocol definitions).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SHOWN = (
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "plait.queue_wait_s",
    "plait.status",
)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def tree(spans: list[dict[str, Any]]) -> list[str]:
    """The spans of one trace as lines, children indented under their parents."""
    children: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    ids = {s["span_id"] for s in spans}
    for span in sorted(spans, key=lambda s: s["start"]):
        children[span["parent"] if span["parent"] in ids else None].append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in children[parent]:
            ms = (span["end"] - span["start"]) / 1e6
            shown = ", ".join(
                f"{k.split('.')[-1]}={span['attributes'][k]}"
                for k in SHOWN
                if k in span["attributes"]
            )
            lines.append(f"{'  ' * depth}{span['name']}  {ms:.1f} ms  {shown}".rstrip())
            walk(span["span_id"], depth + 1)

    walk(None, 0)
    return lines


class Collector:
    """Keeps the spans it receives by trace, and prints a trace once its root span came."""

    def __init__(self, out: Any = None) -> None:
        self.traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.printed: list[str] = []
        self._out = out

    async def receive(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest()
        export.ParseFromString(await request.read())
        for resource_spans in export.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    trace = span.trace_id.hex()
                    self.traces[trace].append(
                        {
                            "name": span.name,
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                        }
                    )
                    if not span.parent_span_id:  # the run's span ends last: print the trace
                        self.show(trace)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    def show(self, trace: str) -> None:
        text = "\n".join([f"trace {trace}", *tree(self.traces[trace])]) + "\n"
        self.printed.append(text)
        print(text, file=self._out, flush=True)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self.receive)
        return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    print(f"collecting traces at http://{args.host}:{args.port}/v1/traces", flush=True)
    web.run_app(Collector().app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
