"""docs/rest.md's "Limits and abuse" section names every limit a config sets, with its default
and the answer a client gets."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.service._config import ServiceSettings, TenantSettings

DOCS = Path(__file__).parents[1] / "docs" / "rest.md"

LIMITS = {
    ServiceSettings: [
        "max_body_bytes",
        "max_tasks",
        "max_edges",
        "max_prompt_chars",
        "max_request_prompt_chars",
        "max_batch_rows",
        "max_wait_s",
        "header_timeout_s",
        "body_timeout_s",
        "max_connections",
    ],
    TenantSettings: ["rate_per_s", "burst", "max_running", "max_streams", "max_batches"],
}


def _section() -> str:
    text = DOCS.read_text()
    return text.split("\n## Limits and abuse\n")[1].split("\n## ")[0]


def test_every_limit_of_the_config_is_listed_with_its_table() -> None:
    section = _section()
    for model, names in LIMITS.items():
        table = "[service]" if model is ServiceSettings else "[[tenants]]"
        for name in names:
            assert f"`{table} {name}`" in section or f"{name}`" in section, name
            assert name in model.model_fields, f"{name} is not a setting of {model.__name__}"


def test_each_row_of_the_section_says_what_the_client_gets() -> None:
    rows = [
        line
        for line in _section().splitlines()
        if line.startswith("| ") and not line.startswith("| what") and "---" not in line
    ]
    assert len(rows) >= 30
    for row in rows:
        answer = row.rstrip(" |").rsplit("|", 1)[1]
        assert re.search(r"`\d{3}`|closed|fails|escaped|refuses|waits|go on|dropped", answer), row


def test_the_defaults_the_section_gives_are_the_models() -> None:
    section = " ".join(_section().split())
    service, tenant = ServiceSettings(), TenantSettings(name="t", token_sha256="0" * 64)
    assert (
        service.max_body_bytes == 4 * 1024 * 1024 and "`[service] max_body_bytes`, 4 MiB" in section
    )
    assert f"`[service] max_tasks`, {service.max_tasks:,}" in section
    assert f"`[service] max_edges`, {service.max_edges:,}" in section
    assert f"`[service] max_prompt_chars`, {service.max_prompt_chars:,}" in section
    assert f"`[service] max_request_prompt_chars`, {service.max_request_prompt_chars:,}" in section
    assert f"`[service] header_timeout_s`, {service.header_timeout_s:g} s" in section
    assert f"`[service] body_timeout_s`, {service.body_timeout_s:g} s" in section
    assert f"`[service] max_wait_s` ({service.max_wait_s:g} s)" in section
    assert f"`[[tenants]] rate_per_s` {tenant.rate_per_s:g}, `burst` {tenant.burst}" in section
    assert f"`[[tenants]] max_running`, {tenant.max_running:,}" in section
    assert f"`[[tenants]] max_streams`, {tenant.max_streams}" in section
    assert f"`[[tenants]] max_batches`, {tenant.max_batches}" in section
