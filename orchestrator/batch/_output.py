"""Writing a batch's output as rows finish, and reading back what an earlier run wrote.

Each finished row is one record in the OpenAI Batch API output format:

    {"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200,
     "request_id": "...", "body": {...chat completion with usage...}}, "error": null}
    {"id": "batch_req_...", "custom_id": "...", "response": null,
     "error": {"code": "...", "message": "..."}}

`JsonlSink` writes one line per record and flushes it, so a killed run leaves every line it
finished. `ParquetSink` writes row groups as they fill (columns custom_id, status, output,
prompt_tokens, completion_tokens, cached_tokens, error) and keeps a JSONL journal of the
same records beside the file until it closes: a Parquet file is readable only once its
footer is written, so after a kill the journal is the readable record of what finished, and
the next run rebuilds the Parquet file from it.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ..model._errors import UsageError
from ._rows import PARQUET_HINT

Record = dict[str, Any]
Check = Callable[[Mapping[str, Record]], None]


class Sink(ABC):
    """Where finished rows go. `done` holds the records already there (by custom_id),
    read when the sink is opened; `dropped` those of failed rows that `open` removed."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.done: dict[str, Record] = {}
        self.dropped: dict[str, Record] = {}

    @abstractmethod
    def open(self, *, check: Check | None = None, drop_failed: bool = False) -> None:
        """Check the path can be written (before any work), read what is there, pass it to
        `check` (which raises to refuse the output before anything in it changes); with
        `drop_failed`, remove the records of failed rows (their rows run again, and the
        output keeps one record per row)."""

    @abstractmethod
    def write(self, record: Record) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


def sink_for(path: str) -> Sink:
    return ParquetSink(path) if path.lower().endswith(".parquet") else JsonlSink(path)


def _check_writable(path: Path) -> None:
    if path.is_dir():
        raise UsageError(f"output {str(path)!r} is a directory; give a file path")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"cannot write output {str(path)!r}: no directory {str(parent)!r}")
    try:
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write output {str(path)!r}: {exc.strerror}") from None


def _read_jsonl(path: Path) -> tuple[dict[str, Record], int]:
    """Records of a JSONL output and the length of its whole lines (a last line cut by a
    kill is not a record, and is cut off before writing goes on)."""
    records: dict[str, Record] = {}
    if not path.exists():
        return records, 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    for number, line in enumerate(data[:end].splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not _is_record(record):
            raise UsageError(
                f"output {str(path)!r} line {number} is not a line plait batch writes (an "
                "object with custom_id, response and error): is it another file? Write to a "
                "new file, or remove this one"
            )
        records[record["custom_id"]] = record
    return records, end


def _failed(done: Mapping[str, Record]) -> dict[str, Record]:
    return {key: record for key, record in done.items() if record.get("error")}


def _is_record(record: Any) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("custom_id"), str)
        and "response" in record
        and "error" in record
    )


class JsonlSink(Sink):
    """One line per record, flushed as it is written."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._out: TextIO | None = None

    def open(self, *, check: Check | None = None, drop_failed: bool = False) -> None:
        _check_writable(self.path)
        self.done, end = _read_jsonl(self.path)
        if check is not None:
            check(self.done)
        self.dropped = _failed(self.done) if drop_failed else {}
        if self.dropped:
            # The kept lines as they were, written beside and swapped in: a kill leaves the
            # old output or the new, never a part.
            kept = [
                line
                for line in self.path.read_bytes()[:end].splitlines(keepends=True)
                if json.loads(line)["custom_id"] not in self.dropped
            ]
            tmp = Path(f"{self.path}.tmp")
            with tmp.open("wb") as out:
                out.writelines(kept)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            for key in self.dropped:
                del self.done[key]
        else:
            with self.path.open("r+b") as raw:
                raw.truncate(end)
        self._out = self.path.open("a", encoding="utf-8")

    def write(self, record: Record) -> None:
        assert self._out is not None, "open the sink first"
        self._out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._out.flush()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


PARQUET_COLUMNS = (
    "custom_id",
    "status",
    "output",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "error",
)


def columns_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """One output record as a Parquet row."""
    response = record.get("response") or {}
    body = response.get("body") or {}
    usage = body.get("usage") or {}
    error = record.get("error")
    output: str | None = None
    if body.get("choices"):
        choice = body["choices"][0]
        output = choice["message"]["content"] if "message" in choice else choice.get("text")
    elif "outputs" in body:
        output = json.dumps(body["outputs"], separators=(",", ":"))
    return {
        "custom_id": record["custom_id"],
        "status": "failed" if error else "ok",
        "output": output,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "cached_tokens": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
        "error": None if not error else f"{error.get('code')}: {error.get('message')}",
    }


class ParquetSink(Sink):
    """Row groups of `row_group` records, written as they fill; closed with its footer."""

    def __init__(self, path: str, *, row_group: int = 1000) -> None:
        super().__init__(path)
        self.row_group = row_group
        self.journal = Path(f"{path}.partial.jsonl")
        self._buffer: list[Record] = []
        self._writer: Any = None
        self._log: JsonlSink | None = None

    def open(self, *, check: Check | None = None, drop_failed: bool = False) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"writing Parquet needs pyarrow: {PARQUET_HINT}") from None
        _check_writable(self.path)
        done: dict[str, Record] = {}
        try:
            table = pq.read_table(self.path)
        except Exception:
            table = None
        if table is not None and tuple(table.column_names) != PARQUET_COLUMNS:
            raise UsageError(
                f"output {str(self.path)!r} is a Parquet file with other columns "
                f"({', '.join(table.column_names)}): is it another file? Write to a new "
                "file, or remove this one"
            )
        if table is None and self.path.stat().st_size > 0 and not self.journal.exists():
            raise UsageError(
                f"output {str(self.path)!r} is not a Parquet file plait batch wrote (unreadable, "
                "and no journal of a killed run beside it); write to a new file, or remove it"
            )
        if table is not None:  # else: cut by a kill; the journal has its rows
            for row in table.to_pylist():
                done[row["custom_id"]] = _record_of(row)
        journal, _ = _read_jsonl(self.journal)
        done.update(journal)
        if check is not None:
            check(done)
        self.dropped = _failed(done) if drop_failed else {}
        for key in self.dropped:
            del done[key]
        self.done = done
        # The journal again holds everything, then goes on: rewritten whole, then swapped in.
        tmp = Path(f"{self.journal}.tmp")
        with tmp.open("w", encoding="utf-8") as out:
            for record in done.values():
                out.write(json.dumps(record, separators=(",", ":")) + "\n")
        os.replace(tmp, self.journal)
        self._log = JsonlSink(str(self.journal))
        self._log.open()
        schema = pa.schema(
            [
                ("custom_id", pa.string()),
                ("status", pa.string()),
                ("output", pa.string()),
                ("prompt_tokens", pa.int64()),
                ("completion_tokens", pa.int64()),
                ("cached_tokens", pa.int64()),
                ("error", pa.string()),
            ]
        )
        self._pa = pa
        self._writer = pq.ParquetWriter(self.path, schema)
        self._buffer = list(done.values())
        self._flush(whole_groups=True)

    def write(self, record: Record) -> None:
        assert self._log is not None, "open the sink first"
        self._log.write(record)
        self._buffer.append(record)
        self._flush(whole_groups=True)

    def _flush(self, *, whole_groups: bool) -> None:
        while self._buffer and (len(self._buffer) >= self.row_group or not whole_groups):
            chunk, self._buffer = self._buffer[: self.row_group], self._buffer[self.row_group :]
            rows = [columns_of(r) for r in chunk]
            table = self._pa.Table.from_pylist(rows, schema=self._writer.schema)
            self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is None:
            return
        self._flush(whole_groups=False)
        self._writer.close()
        self._writer = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self.journal.unlink(missing_ok=True)


def _record_of(row: Mapping[str, Any]) -> Record:
    """A Parquet row back as an output record (enough to skip it and to rewrite it)."""
    usage = {
        "prompt_tokens": row["prompt_tokens"],
        "completion_tokens": row["completion_tokens"],
        "total_tokens": row["prompt_tokens"] + row["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": row["cached_tokens"]},
    }
    if row["status"] != "ok":
        code, _, message = (row["error"] or "error: ").partition(": ")
        return {
            "custom_id": row["custom_id"],
            "response": None,
            "error": {"code": code, "message": message},
        }
    body = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": row["output"]}}],
        "usage": usage,
    }
    return {
        "custom_id": row["custom_id"],
        "response": {"status_code": 200, "body": body},
        "error": None,
    }
