"""The docs' key tables list exactly the keys of the config models they document, with the
models' defaults: a key added to a model and not to its table fails here, and so does a
key table that documents no model."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from executors._config import EndpointSettings, RouterMember, RouterSettings, SimSettings
from orchestrator.cli._cli import main
from orchestrator.durability._retention import Retention
from orchestrator.engine._config import EngineSettings, LimitsSettings, TelemetrySettings
from orchestrator.service._config import RetentionSettings, ServiceSettings, TenantSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"


@dataclass(frozen=True)
class Row:
    keys: tuple[str, ...]
    default: str
    meaning: str


@dataclass(frozen=True)
class Table:
    page: str
    heading: str
    """The nearest heading above the table, as written (`[engine]` in backticks, say)."""
    intro: str
    """The first line of the paragraph just above it."""
    header: tuple[str, ...]
    rows: tuple[Row, ...]


def _cells(line: str) -> list[str]:
    # A cell never holds a pipe in these tables; a row is `| a | b | c |`.
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def tables(page: Path) -> list[Table]:
    """Every table of `page` whose first column is `key`."""
    found: list[Table] = []
    heading, intro, previous = "", "", ""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading, intro = line.lstrip("#").strip(), ""
        elif line.startswith("| key |"):
            header = tuple(_cells(line))
            body = []
            i += 2  # the header and the |---| line
            while i < len(lines) and lines[i].startswith("|"):
                cells = dict(zip(header, _cells(lines[i]), strict=True))
                keys = tuple(re.findall(r"`([a-z][a-z0-9_]*)`", cells["key"]))
                assert keys, f"{page.name}: a row without a `key`: {lines[i]}"
                body.append(Row(keys, cells.get("default", ""), cells.get("meaning", "")))
                i += 1
            found.append(Table(page.name, heading, intro, header, tuple(body)))
            continue
        elif line.strip() and not previous.strip():
            intro = line.strip()
        previous = line
        i += 1
    return found


# Which model each key table documents: (page, heading, the start of its intro) -> model.
DOCUMENTED: dict[tuple[str, str, str], type[BaseModel]] = {
    ("config.md", "`[engine]`", ""): EngineSettings,
    ("config.md", "`[backends.NAME]`", '`kind = "openai"`'): EndpointSettings,
    ("config.md", "`[backends.NAME]`", '`kind = "router"`'): RouterSettings,
    ("config.md", "`[backends.NAME]`", '`kind = "sim"`'): SimSettings,
    ("config.md", "`limits`", ""): LimitsSettings,
    ("config.md", "`[telemetry]`", ""): TelemetrySettings,
    ("rest.md", "`[service]`", ""): ServiceSettings,
    ("rest.md", "`[service.retention]`", ""): RetentionSettings,
    ("rest.md", "`[[tenants]]`", ""): TenantSettings,
}

# Defaults the docs say in words, as each table must say them (the model's default is not
# a value a reader would write: it stands for what is derived or read elsewhere).
IN_WORDS: dict[tuple[type[BaseModel], str], str] = {
    (EngineSettings, "clock"): "the module's `CLOCK`, else system",
    (TelemetrySettings, "endpoint"): "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else "
    "`OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`, else `http://localhost:4318/v1/traces`",
    (EndpointSettings, "model"): "the request's",
    (EndpointSettings, "api_key"): '`"none"`',  # what is sent when the file gives none
    (LimitsSettings, "max_in_flight"): "32 (backends), 256 (`local`), 64 (`tools`); for a "
    "backend without a `limits` table, the sequences its server runs at once where it says "
    "so (SGLang, llama.cpp)",
    (ServiceSettings, "max_connections"): "the open-file limit less 256",
    (ServiceSettings, "engine_id"): "host, pid and a suffix",
    (ServiceSettings, "notify"): '`"postgresql"` with a PostgreSQL store, else none',
    (ServiceSettings, "retention"): "its defaults",
}

REQUIRED = object()
IN_PROSE = object()


@functools.cache
def all_key_tables() -> list[Table]:
    return [table for page in sorted(DOCS.glob("*.md")) for table in tables(page)]


def documented_by(table: Table) -> type[BaseModel] | None:
    for (page, heading, intro), model in DOCUMENTED.items():
        if table.page == page and table.heading == heading and table.intro.startswith(intro):
            return model
    return None


def table_of(model: type[BaseModel]) -> Table:
    [table] = [t for t in all_key_tables() if documented_by(t) is model]
    return table


def parse_default(cell: str) -> Any:
    """A default as the docs write it: a value, REQUIRED, or IN_PROSE."""
    text = cell.strip()
    if text == "required":
        return REQUIRED
    if text in ("—", "-") or text.startswith("none"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d*\.\d+", text):
        return float(text)
    if re.fullmatch(r"`\[\]`", text):
        return []
    quoted = re.fullmatch(r'`"?([^`"]*)"?`', text)
    if quoted:
        return quoted.group(1)
    return IN_PROSE


def model_default(model: type[BaseModel], key: str) -> Any:
    default = model.model_fields[key].get_default(call_default_factory=True)
    return REQUIRED if default is PydanticUndefined else default


def row_defaults(row: Row) -> list[str]:
    """The default cell of each key of a row (`false, 8` for two keys)."""
    if len(row.keys) == 1 or row.default.startswith("as for"):
        return [row.default] * len(row.keys)
    parts = [part.strip() for part in row.default.split(",")]
    assert len(parts) == len(row.keys), f"{row.keys}: give one default each, got {row.default!r}"
    return parts


def test_every_key_table_documents_a_model_and_every_model_has_one() -> None:
    found = all_key_tables()
    assert len(found) >= len(DOCUMENTED)
    for table in found:
        assert documented_by(table) is not None, (
            f"{table.page}, {table.heading}: a key table that documents no model; add it to "
            "DOCUMENTED in this test"
        )
    for model in DOCUMENTED.values():
        assert [t for t in found if documented_by(t) is model], f"no key table for {model}"


@pytest.mark.parametrize("model", DOCUMENTED.values(), ids=lambda m: m.__name__)
def test_a_key_table_lists_exactly_its_models_keys(model: type[BaseModel]) -> None:
    table = table_of(model)
    listed = [key for row in table.rows for key in row.keys]
    twice = sorted({key for key in listed if listed.count(key) > 1})
    assert not twice, f"{table.page} {table.heading}: listed twice: {twice}"
    missing = [key for key in model.model_fields if key not in listed]
    extra = [key for key in listed if key not in model.model_fields]
    assert not missing, f"{table.page} {table.heading} does not list {model.__name__}'s {missing}"
    assert not extra, f"{table.page} {table.heading} lists {extra}, not keys of {model.__name__}"


@pytest.mark.parametrize("model", DOCUMENTED.values(), ids=lambda m: m.__name__)
def test_a_key_tables_defaults_are_its_models(model: type[BaseModel]) -> None:
    table = table_of(model)
    assert "default" in table.header
    for row in table.rows:
        for key, cell in zip(row.keys, row_defaults(row), strict=True):
            ours = model_default(model, key)
            said = re.fullmatch(r"as for `(\w+)`", cell)
            if said:  # the same default as the key of another kind's table
                [other] = [m for m in (EndpointSettings, RouterSettings) if _kind(m) == said[1]]
                assert ours == model_default(other, key), f"{model.__name__}.{key}"
                continue
            if (model, key) in IN_WORDS:
                assert cell == IN_WORDS[(model, key)], f"{model.__name__}.{key}: {cell!r}"
                continue
            value = parse_default(cell)
            assert value is not IN_PROSE, (
                f"{table.page} {table.heading}: {key}'s default {cell!r} is not a value; write "
                f"the model's ({ours!r}), or add it to IN_WORDS"
            )
            assert value == ours and isinstance(value, bool) == isinstance(ours, bool), (
                f"{table.page} {table.heading}: {key} defaults to {cell!r} in the docs, "
                f"{ours!r} in {model.__name__}"
            )


def _kind(model: type[BaseModel]) -> str:
    return {EndpointSettings: "openai", RouterSettings: "router", SimSettings: "sim"}[model]


def test_the_router_endpoints_row_names_every_key_of_a_member() -> None:
    [row] = [row for row in table_of(RouterSettings).rows if row.keys == ("endpoints",)]
    named = set(re.findall(r"`([a-z][a-z0-9_]*)`", row.meaning))
    assert set(RouterMember.model_fields) <= named, set(RouterMember.model_fields) - named


def test_the_retention_table_names_the_fields_of_retention() -> None:
    text = (DOCS / "durability.md").read_text()
    block = text.split("| `Retention(...)` | default | |\n|---|---|---|\n")[1].split("\n\n")[0]
    named = [re.findall(r"`(\w+)`", line)[0] for line in block.splitlines()]
    assert named == [f.name for f in fields(Retention)]


def test_the_checking_example_is_what_config_check_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/config.md's "Checking" example names every key an openai table allows."""
    text = (DOCS / "config.md").read_text()
    example = text.split("\n## Checking\n")[1].split("```\n")[1].split("```")[0]
    path = tmp_path / "plait.toml"
    path.write_text(
        '[backends.gpu]\nkind = "openai"\nurl = "http://gpu1:8000/v1"\n'
        'dialect = "vlm"\ndialekt = "vllm"\n'
    )
    assert main(["config", "check", str(path)]) == 2
    assert capsys.readouterr().err.replace(str(path), "plait.toml") == example
