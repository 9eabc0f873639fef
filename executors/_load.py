"""What a serving engine says about its load: Prometheus `/metrics` text and vLLM's
`endpoint-load-metrics` answer header, read into one backend-neutral `LoadReport`.

Pure functions of text, so each server's exposition is pinned by a test on a sample of it.
Metric names are the servers' own, as checked in their source: vLLM (`vllm:`, `gpu_cache_usage_perc`
before 0.10), SGLang (`sglang:`) and llama.cpp's `llama-server --metrics` (`llamacpp:`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

from orchestrator.ext import LoadReport

Samples = Mapping[str, Sequence[tuple[dict[str, str], float]]]

# The first name a server exposes wins; servers expose one spelling each.
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing")
_WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred")
_KV_USAGE = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "llamacpp:kv_cache_usage_ratio",
)
# Prompt tokens found in the prefix cache, and prompt tokens looked up there. SGLang counts
# cached tokens against all prompt tokens, which is the same ratio.
_HITS = (
    "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits_total",
    "sglang:cached_tokens_total",
)
_QUERIES = (
    "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries_total",
    "sglang:prompt_tokens_total",
)
_HIT_RATE = ("sglang:cache_hit_rate",)
# vLLM's ORCA header names (vllm/entrypoints/openai/orca_metrics.py).
_HEADER_NAMES = {
    "kv_cache_usage_perc": "kv_cache_usage",
    "num_requests_waiting": "waiting",
    "num_requests_running": "running",
}


def report_from_metrics(text: str) -> LoadReport:
    """Read a Prometheus text exposition from vLLM, SGLang or llama.cpp.

    Counts and counters are summed over label sets (one per engine or data-parallel
    rank); usage fractions are averaged. NaN samples count as absent.
    """
    samples = parse_prometheus(text)
    running, waiting = _total(samples, _RUNNING), _total(samples, _WAITING)
    hits, queries = _total(samples, _HITS), _total(samples, _QUERIES)
    return LoadReport(
        running=_int(running),
        waiting=_int(waiting),
        kv_cache_usage=_mean(samples, _KV_USAGE),
        prefix_cache_hits=_int(hits),
        prefix_cache_queries=_int(queries),
        cache_hit_rate=_mean(samples, _HIT_RATE),
    )


def report_from_header(value: str | None) -> LoadReport | None:
    """Read vLLM's `endpoint-load-metrics` header (ORCA), in its TEXT or JSON form:
    `TEXT named_metrics.kv_cache_usage_perc=0.4, named_metrics.num_requests_waiting=2.0`.
    None when there is no header or it says nothing this report holds."""
    if not value:
        return None
    form, _, rest = value.strip().partition(" ")
    named: dict[str, float] = {}
    if form.upper() == "TEXT":
        for item in rest.split(","):
            key, _, number = item.strip().partition("=")
            name, number_value = key.removeprefix("named_metrics."), _float(number)
            if name != key and number_value is not None:
                named[name] = number_value
    elif form.upper() == "JSON":
        try:
            data = json.loads(rest)
        except json.JSONDecodeError:
            return None
        metrics = data.get("named_metrics") if isinstance(data, dict) else None
        if isinstance(metrics, dict):
            named = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    fields: dict[str, float] = {
        _HEADER_NAMES[k]: v for k, v in named.items() if k in _HEADER_NAMES and not math.isnan(v)
    }
    if not fields:
        return None
    return LoadReport(
        running=_int(fields.get("running")),
        waiting=_int(fields.get("waiting")),
        kv_cache_usage=fields.get("kv_cache_usage"),
    )


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The samples of a Prometheus text exposition, by metric name, in order.

    Comments (`# HELP`, `# TYPE`), blank lines, timestamps and OpenMetrics exemplars are
    skipped; label values may hold escaped quotes, commas and braces; `NaN` and `+Inf`
    become floats. A line that cannot be read is skipped: one odd metric from a newer
    server must not hide the others.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is not None:
            name, labels, value = sample
            out.setdefault(name, []).append((labels, value))
    return out


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    brace = line.find("{")
    space = line.find(" ")
    labels: dict[str, str] = {}
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        end = _labels(line, brace + 1, labels)
        if end is None:
            return None
        rest = line[end:]
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return None
    fields = rest.split()
    if not name or not fields:
        return None
    value = _float(fields[0])
    if value is None:
        return None
    return name, labels, value


def _labels(line: str, i: int, into: dict[str, str]) -> int | None:
    """Read `a="x",b="y"}` from `line[i:]` into `into`; the index after `}`, or None."""
    n = len(line)
    while i < n:
        while i < n and line[i] in " ,":
            i += 1
        if i < n and line[i] == "}":
            return i + 1
        eq = line.find("=", i)
        if eq == -1 or eq + 1 >= n or line[eq + 1] != '"':
            return None
        key = line[i:eq].strip()
        i = eq + 2
        value: list[str] = []
        while i < n and line[i] != '"':
            if line[i] == "\\" and i + 1 < n:
                i += 1
                value.append("\n" if line[i] == "n" else line[i])
            else:
                value.append(line[i])
            i += 1
        if i >= n:
            return None
        into[key] = "".join(value)
        i += 1
    return None


def _float(text: str) -> float | None:
    try:
        return float(text)  # float() reads NaN, +Inf and -Inf as Prometheus writes them
    except ValueError:
        return None


def _values(samples: Samples, names: Sequence[str]) -> list[float] | None:
    for name in names:
        values = [v for _, v in samples.get(name, ()) if not math.isnan(v)]
        if values:
            return values
    return None


def _total(samples: Samples, names: Sequence[str]) -> float | None:
    values = _values(samples, names)
    return sum(values) if values is not None else None


def _mean(samples: Samples, names: Sequence[str]) -> float | None:
    values = _values(samples, names)
    return sum(values) / len(values) if values is not None else None


def _int(value: float | None) -> int | None:
    if value is None or math.isinf(value):
        return None
    return round(value)
