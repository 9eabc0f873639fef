"""`plait config check` explains every setting in force: for each key of every table, a file
that sets it to other than its default is described otherwise than one that leaves it out."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from executors._config import BACKEND_KINDS, RouterSettings, SimSettings
from orchestrator.cli._cli import main
from orchestrator.engine._config import EngineSettings, LimitsSettings, TelemetrySettings
from orchestrator.service._config import RetentionSettings, ServiceSettings, TenantSettings

TOKEN = "0" * 64

# A value other than the default for each key, and what else the key needs to be in force.
VALUES: dict[type[BaseModel], dict[str, Any]] = {
    EngineSettings: {"admission": "throughput", "clock": "virtual", "deadline": 30.0},
    LimitsSettings: {"max_in_flight": 8, "max_waiting": 50, "batch_in_flight": 4},
    TelemetrySettings: {"endpoint": "http://collector:4318/v1/traces", "service_name": "agents"},
    RouterSettings: {
        "urls": ["http://gpu7:8000/v1"],
        "endpoints": [{"url": "http://gpu8:8000/v1", "name": "eight"}],
        "dialect": "vllm",
        "model": "llama",
        "api_key": "local",
        "api_key_env": "PLAIT_TEST_UNSET_KEY",
        "timeout_s": 30.0,
        "slots": 4,
        "block_tokens": 32,
        "max_imbalance": 2.0,
        "readmit_after_s": 60.0,
        "health_interval_s": 0.0,
        "health_timeout_s": 2.0,
        "tokenizer": "gpt2",
        "kv_cache_tokens": 50_000,
        "min_shared_blocks": 4,
        "lane_clear": False,
    },
    SimSettings: {
        "profile": "cpu-tiny",
        "seed": 7,
        "replicas": 3,
        "max_imbalance": 2.0,
        "min_shared_blocks": 4,
        "lane_clear": False,
    },
    ServiceSettings: {
        "host": "0.0.0.0",
        "port": 9000,
        "store": "other.db",
        "registry": ["serve_registry.py"],
        "registry_entry_points": ["plait.tools"],
        "max_body_bytes": 2048,
        "max_tasks": 10,
        "max_edges": 10,
        "max_prompt_chars": 1000,
        "max_request_prompt_chars": 1000,
        "heartbeat_s": 5.0,
        "drain_s": 1.0,
        "header_timeout_s": 5.0,
        "body_timeout_s": 5.0,
        "max_connections": 64,
        "max_wait_s": 5.0,
        "batch_dir": "elsewhere",
        "max_batch_rows": 10,
        "lease_s": 10.0,
        "engine_id": "one",
        "notify": "redis://:hidden@cache:6379/0",
        "ray_address": "auto",
    },
    RetentionSettings: {
        "compact_after_s": "never",
        "delete_after_s": 60.0,
        "keep_last": 10,
        "every_s": 30.0,
    },
    TenantSettings: {
        "max_running": 5,
        "rate_per_s": 1.0,
        "burst": 2,
        "max_batches": 1,
        "max_streams": 2,
    },
}
NEEDS: dict[str, dict[str, Any]] = {
    "min_shared_blocks": {"group_prefixes": True},
    "engine_id": {"lease_s": 10.0},
    "notify": {"lease_s": 10.0},
}
NOT_SHOWN = {
    (TenantSettings, "name"): "the check lists the tenants by name",
    (TenantSettings, "token_sha256"): "a token is never shown",
    (TenantSettings, "token_env"): "a token is never shown",
    (ServiceSettings, "retention"): "its keys are checked one by one",
}
TWO = ["http://gpu1:8000/v1", "http://gpu2:8000/v1"]


def check(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    """What `plait config check` says of `data`, out and warnings."""
    path = tmp_path / "plait.yaml"
    path.write_text(yaml.safe_dump(data))
    out = io.StringIO()
    status = main(["config", "check", str(path)], out=out)
    assert status == 0, capsys.readouterr().err
    return out.getvalue() + capsys.readouterr().err


def table(model: type[BaseModel], settings: dict[str, Any]) -> dict[str, Any]:
    """A config file with `settings` in `model`'s table."""
    if model is EngineSettings:
        return {"engine": settings}
    if model is LimitsSettings:
        return {"limits": {"tools": settings}}
    if model is TelemetrySettings:
        return {"telemetry": settings}
    if model in (ServiceSettings, RetentionSettings, TenantSettings):
        service = {"retention": settings} if model is RetentionSettings else {}
        service |= settings if model is ServiceSettings else {}
        tenant = {"name": "a", "token_sha256": TOKEN}
        tenant |= settings if model is TenantSettings else {}
        return {"service": service, "tenants": [tenant]}
    raise AssertionError(model)


CASES = [
    (model, key)
    for model in VALUES
    for key in model.model_fields
    if (model, key) not in NOT_SHOWN and model not in (RouterSettings, SimSettings)
]


@pytest.mark.parametrize(("model", "key"), CASES, ids=lambda v: getattr(v, "__name__", v))
def test_config_check_says_each_key_set(
    model: type[BaseModel],
    key: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = dict(NEEDS.get(key, {}))
    plain = check(tmp_path, table(model, base), capsys)
    value = VALUES[model].get(key, not model.model_fields[key].default)  # booleans
    said = check(tmp_path, table(model, base | {key: value}), capsys)
    assert said != plain, f"config check says nothing of {model.__name__}.{key}"
    assert "hidden" not in said  # a password in a URL is never shown


BACKENDS = [
    (model, key)
    for model in (RouterSettings, SimSettings)
    for key in model.model_fields
    if (model, key) not in NOT_SHOWN
]


@pytest.mark.parametrize(("model", "key"), BACKENDS, ids=lambda v: getattr(v, "__name__", v))
def test_a_backends_description_says_each_key_set(model: type[BaseModel], key: str) -> None:
    """What config check prints of a backend (`describe`, without building it: a tokenizer
    needs transformers) differs for every key; lanes and grouping need two replicas."""
    kind = BACKEND_KINDS["router" if model is RouterSettings else "sim"]
    base: dict[str, Any] = {"urls": TWO} if model is RouterSettings else {"replicas": 2}
    base |= NEEDS.get(key, {})
    value = VALUES[model].get(key, not model.model_fields[key].default)
    changed = {k: v for k, v in base.items() if not (key == "endpoints" and k == "urls")}
    plain = kind.describe(model.model_validate(base))
    said = kind.describe(model.model_validate(changed | {key: value}))
    assert said != plain, f"config check says nothing of {model.__name__}.{key}"


def test_the_openai_description_says_each_key_set() -> None:
    kind = BACKEND_KINDS["openai"]
    values = VALUES[RouterSettings]
    base = {"url": "http://gpu1:8000/v1"}
    plain = kind.describe(kind.settings.model_validate(base))
    for key in kind.settings.model_fields:
        if key != "url":
            said = kind.describe(kind.settings.model_validate(base | {key: values[key]}))
            assert said != plain, key
