"""Reading a batch's input: JSONL, CSV or Parquet rows, or OpenAI Batch API request lines.

A row becomes a `Row`: its position, its `custom_id`, the raw data (what a workflow factory
receives) and, for a row that is one LLM call, the `LLMRequest`. A row that cannot be read
(not JSON, no prompt, a bad `max_tokens`, an unsupported OpenAI `url`) keeps its `error`:
the batch reports it in the output and goes on. What makes the whole input unusable (no
such file, a missing column, every row an unsupported url) is a `UsageError`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from ..model._errors import UsageError
from ..model._llm import LLMRequest, Message, Sampling

Format = Literal["jsonl", "csv", "parquet"]
RowKind = Literal["chat", "completion", "workflow"]

FORMATS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
}
OPENAI_URLS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
DEFAULT_MODEL = "default"
PARQUET_HINT = "pip install 'plait[parquet]'"


@dataclass(frozen=True, slots=True)
class Row:
    """One input row. `request` is set for a row that is one LLM call and read cleanly;
    `error` for a row that could not be read (it fails in the output, the batch goes on)."""

    index: int
    custom_id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    request: LLMRequest | None = None
    kind: RowKind = "chat"
    error: str | None = None
    error_code: str = "invalid_row"


def format_of(path: str, given: str | None = None) -> Format:
    """The input's format: `given` (--format), else by the file's extension."""
    if given is not None:
        if given not in ("jsonl", "csv", "parquet"):
            raise UsageError(f"--format {given!r}: choose jsonl, csv or parquet")
        return given  # type: ignore[return-value]
    found = FORMATS.get(Path(path).suffix.lower())
    if found is None:
        raise UsageError(
            f"cannot tell the format of {path!r} from its extension; name it .jsonl, .csv or "
            ".parquet, or give --format jsonl|csv|parquet"
        )
    return found


def read_rows(path: str, *, fmt: str | None = None, llm_rows: bool = True) -> list[Row]:
    """Every row of the input file. `llm_rows`: rows are single LLM calls (no workflow
    factory), so each needs a prompt or messages; otherwise rows are data for a factory."""
    file = Path(path)
    if not file.exists():
        raise UsageError(f"no input file at {path!r}")
    if not file.is_file():
        raise UsageError(f"input {path!r} is not a file")
    kind = format_of(path, fmt)
    raw = list(_raw_rows(file, kind))
    if not raw:
        raise UsageError(f"input {path!r} has no rows")
    if all(isinstance(r, str) for r in raw):  # not one row could be read: the wrong file?
        raise UsageError(f"input {path!r}: no row could be read; the first: {raw[0]}")
    openai = kind == "jsonl" and _looks_openai(raw)
    if openai:
        rows = [_openai_row(i, item) for i, item in enumerate(raw)]
        bad_urls = {r.error or "" for r in rows if r.error_code == "unsupported_url"}
        if len(bad_urls) and all(r.error_code == "unsupported_url" for r in rows):
            raise UsageError(f"{path}: every row: {sorted(bad_urls)[0]}")
    elif llm_rows:
        _check_columns(path, raw)
        rows = [_plain_row(i, item) for i, item in enumerate(raw)]
    else:
        rows = [_data_row(i, item) for i, item in enumerate(raw)]
    return _unique_ids([_storable(row) for row in rows])


# --- raw rows -----------------------------------------------------------------------------

_Raw = dict[str, Any] | str  # a row, or the error that stopped it being read


def _raw_rows(file: Path, kind: Format) -> Iterator[_Raw]:
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"reading Parquet needs pyarrow: {PARQUET_HINT}") from None
        try:
            table = pq.read_table(file)
        except Exception as exc:  # pyarrow's own errors: a damaged or foreign file
            raise UsageError(f"cannot read {file} as Parquet: {exc}") from exc
        yield from table.to_pylist()
        return
    try:
        handle = file.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise UsageError(f"cannot open input {str(file)!r}: {exc.strerror}") from exc
    with handle:
        if kind == "csv":
            # Cells hold whole documents: the csv module's 128 KiB default is too small.
            csv.field_size_limit(max(csv.field_size_limit(), 256 * 1024 * 1024))
            try:
                yield from (dict(r) for r in csv.DictReader(handle))
            except (csv.Error, UnicodeDecodeError) as exc:
                raise UsageError(f"{file}: not readable as CSV: {exc}") from exc
            return
        if file.suffix.lower() == ".json" and handle.read(65536).lstrip()[:1] == "[":
            yield from _json_array(file, handle)
            return
        handle.seek(0)
        try:
            for n, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f"line {n} is not JSON ({exc.msg} at column {exc.colno})"
                    continue
                yield item if isinstance(item, dict) else f"line {n} is not a JSON object"
        except UnicodeDecodeError as exc:
            raise UsageError(f"{file}: not UTF-8 text ({exc.reason})") from exc


def _json_array(file: Path, handle: Any) -> Iterator[_Raw]:
    """A `.json` file holding one JSON array of rows (not JSON lines)."""
    handle.seek(0)
    try:
        data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"{file}: not UTF-8 text ({exc.reason})") from exc
    if not isinstance(data, list):
        raise UsageError(f"{file}: a .json input is one array of rows or JSON lines")
    for n, item in enumerate(data):
        yield item if isinstance(item, dict) else f"item {n} is not a JSON object"


def _looks_openai(raw: Sequence[_Raw]) -> bool:
    first = next((r for r in raw if isinstance(r, dict)), None)
    return first is not None and {"custom_id", "url", "body"} <= first.keys()


def _check_columns(path: str, raw: Sequence[_Raw]) -> None:
    rows = [r for r in raw if isinstance(r, dict)]
    if rows and not any("prompt" in r or "messages" in r for r in rows):
        columns = sorted({str(k) for r in rows for k in r})
        raise UsageError(
            f"{path}: no 'prompt' or 'messages' column (columns: {', '.join(columns) or 'none'});"
            " a row without --workflow is one LLM call: give it a prompt (and optionally "
            "system, max_tokens, model), or pass --workflow module:factory"
        )


def _storable(row: Row) -> Row:
    """The row, or its failure if it holds text that cannot be stored: a lone surrogate
    (not UTF-8, so not JSON a store keeps) or a NUL (PostgreSQL keeps none in text)."""
    problem = _bad_text(row.custom_id, "custom_id") or _bad_text(dict(row.data), "")
    if problem is None:
        return row
    return Row(
        row.index,
        row.custom_id.encode("utf-8", "backslashreplace").decode("utf-8"),
        row.data,
        kind=row.kind,
        error=f"{problem}: text that cannot be stored; remove it from the row",
        error_code="invalid_text",
    )


def _bad_text(value: Any, where: str) -> str | None:
    """Where in `value` (dicts, lists, strings) a lone surrogate or a NUL is, if anywhere."""
    if isinstance(value, str):
        for char in value:
            if "\ud800" <= char <= "\udfff":
                return f"a lone surrogate ({char!r}) in {where or 'the row'}"
            if char == "\x00":
                return f"a NUL character in {where or 'the row'}"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            found = _bad_text(str(key), f"a field name at {where or 'the row'}")
            found = found or _bad_text(item, name)
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for n, item in enumerate(value):
            found = _bad_text(item, f"{where}[{n}]")
            if found:
                return found
    return None


def _unique_ids(rows: list[Row]) -> list[Row]:
    """Each row's custom_id made unique: a repeat (a broken row's too) fails as one, under a
    name no other row has, so that no two output lines share an id (resume finds rows by
    it: a repeat taking the first one's name would make a resumed run skip the first)."""
    taken = {row.custom_id for row in rows}
    first: dict[str, int] = {}
    out = []
    for row in rows:
        was = first.setdefault(row.custom_id, row.index)
        if was != row.index:
            name, n = f"{row.custom_id}#{row.index}", 1
            while name in taken:
                name, n = f"{row.custom_id}#{row.index}.{n}", n + 1
            taken.add(name)
            row = Row(
                row.index,
                name,
                row.data,
                kind=row.kind,
                error=f"custom_id {row.custom_id!r} repeats row {was}'s; give each row its own",
                error_code="duplicate_custom_id",
            )
        out.append(row)
    return out


# --- one row ------------------------------------------------------------------------------


def _id_of(index: int, item: Mapping[str, Any]) -> str:
    given = item.get("custom_id", item.get("id"))
    return str(given) if given not in (None, "") else f"row-{index}"


def _data_row(index: int, item: _Raw) -> Row:
    if isinstance(item, str):
        return Row(index, f"row-{index}", error=item)
    return Row(index, _id_of(index, item), item, kind="workflow")


def _plain_row(index: int, item: _Raw) -> Row:
    if isinstance(item, str):
        return Row(index, f"row-{index}", error=item)
    custom_id = _id_of(index, item)
    try:
        request = _request(item, where="")
    except ValueError as exc:
        return Row(index, custom_id, item, error=str(exc))
    return Row(index, custom_id, item, request)


_READ_FIELDS = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "stop", "temperature", "top_p",
     "seed", "system", "stream", "n"}
)  # fmt: skip
"""Body fields `_request` reads; the others of an OpenAI batch line are sent as they are."""


def _openai_row(index: int, item: _Raw) -> Row:
    if isinstance(item, str):
        return Row(index, f"row-{index}", error=item)
    custom_id = _id_of(index, item)
    url = item.get("url")
    if url is None:
        return Row(
            index,
            custom_id,
            item,
            error="no 'url': this input is in the OpenAI batch format (its first row is), "
            "so every row must be a request line with custom_id, method, url and body",
        )
    kind = OPENAI_URLS.get(str(url))
    if kind is None:
        supported = ", ".join(OPENAI_URLS)
        return Row(
            index,
            custom_id,
            item,
            error=f"url {url!r} is not supported; plait batch runs {supported}",
            error_code="unsupported_url",
        )
    method = str(item.get("method", "POST")).upper()
    body = item.get("body")
    try:
        if method != "POST":
            raise ValueError(f"method {method!r}: the Batch API sends POST")
        if not isinstance(body, dict):
            raise ValueError("'body' must be a JSON object (the request)")
        if kind == "completion":
            if not isinstance(body.get("prompt"), str):
                raise ValueError("body.prompt must be a string for /v1/completions")
            body = {**body, "messages": [{"role": "user", "content": body["prompt"]}]}
            body.pop("prompt")
        if body.get("stream"):
            raise ValueError("body.stream: a batch row is answered whole; leave stream out")
        if body.get("n", 1) != 1:
            raise ValueError(f"body.n: plait batch asks for one choice a row, not {body['n']!r}")
        request = _request(body, where="body.")
        extra = {k: v for k, v in body.items() if k not in _READ_FIELDS}
        if extra:  # server fields (vLLM's ignore_eos, min_tokens...) go to the server as given
            request = replace(request, extra_body=extra)
    except ValueError as exc:
        return Row(index, custom_id, item, kind=kind, error=str(exc))  # type: ignore[arg-type]
    return Row(index, custom_id, item, request, kind=kind)  # type: ignore[arg-type]


def _request(item: Mapping[str, Any], *, where: str) -> LLMRequest:
    """The LLM call a row asks for; ValueError says what is wrong with it."""
    messages = _messages(item, where)
    max_tokens = _int(item.get("max_tokens", item.get("max_completion_tokens")), "max_tokens")
    stop = item.get("stop")
    if stop is not None and not isinstance(stop, str | list):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    stops = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop or ())
    sampling = Sampling(
        temperature=_float(item.get("temperature"), "temperature", 0.0),
        top_p=_float(item.get("top_p"), "top_p", 1.0),
        seed=_int(item.get("seed"), "seed"),
        stop=stops,
    )
    model = item.get("model") or DEFAULT_MODEL
    return LLMRequest(tuple(messages), str(model), sampling=sampling, max_tokens=max_tokens)


def _messages(item: Mapping[str, Any], where: str) -> list[Message]:
    system = item.get("system")
    out = [Message("system", str(system))] if system not in (None, "") else []
    given = item.get("messages")
    if given not in (None, ""):
        if isinstance(given, str):  # a CSV cell
            try:
                given = json.loads(given)
            except json.JSONDecodeError:
                raise ValueError(f"{where}messages is not JSON: give a list of messages") from None
        if not isinstance(given, list) or not given:
            raise ValueError(f"{where}messages must be a non-empty list of {{role, content}}")
        for n, m in enumerate(given):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"{where}messages[{n}] needs a role of system, user or assistant")
            out.append(Message(m["role"], _content(m.get("content"), f"{where}messages[{n}]")))
        return out
    prompt = item.get("prompt")
    if prompt in (None, ""):
        raise ValueError(f"no {where}prompt or {where}messages in this row")
    out.append(Message("user", str(prompt)))
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}: content part {kind!r} is not supported (text only)")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ValueError(f"{where}.content must be a string or a list of text parts")


def _int(value: Any, name: str) -> int | None:
    if value in (None, ""):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None
    if number < 0 or (name == "max_tokens" and number == 0):
        raise ValueError(f"{name} must be positive, got {value!r}")
    return number


def _float(value: Any, name: str, default: float) -> float:
    if value in (None, ""):
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number
