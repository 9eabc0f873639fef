"""`plait serve` and a task declared not idempotent that was running when the service stopped:
the next start names the workflow and how to decide, its view says it waits for a decision,
`POST /v1/workflows/{id}/decision` decides it (tenant-checked, the same request again gets
the same answer), and `plait resume --decide` takes the serve config to decide it too. The
stop leaves the store as a crash does: the journal is suspended before the runs end, so the
task's `task_started` is its last event. A real service over HTTP, on a SQLite file.
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import StoreFactory

from orchestrator.cli._cli import main
from orchestrator.service import hash_token, load_serve_config
from orchestrator.service._serve import serve

REGISTRY_MODULE = """
import asyncio
from pathlib import Path
from orchestrator import Registry, TaskContext

HERE = Path(__file__).parent
started = asyncio.Event()
release = asyncio.Event()


async def charge(ctx: TaskContext) -> str:
    with (HERE / "charges.txt").open("a") as out:
        out.write(ctx.workflow.name + "\\n")
    started.set()
    if (HERE / "hold").exists():
        await release.wait()
    return "charged"


def receipt(ctx: TaskContext) -> str:
    return "receipt for " + ctx.inputs["charge"]


registry = Registry(charge, receipt)
"""

A = {"Authorization": "Bearer acme-token"}
B = {"Authorization": "Bearer beta-token"}


def write_config(tmp_path: Path, store: str) -> Path:
    (tmp_path / "reg.py").write_text(REGISTRY_MODULE)
    config = tmp_path / "serve.toml"
    config.write_text(
        f"""
[service]
port = 0
store = "{store}"
registry = ["reg.py"]
drain_s = 0

[[tenants]]
name = "acme"
token_sha256 = "{hash_token("acme-token")}"

[[tenants]]
name = "beta"
token_sha256 = "{hash_token("beta-token")}"
"""
    )
    return config


def payment(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "tasks": [
            {"id": "charge", "function": "charge", "idempotent": False},
            {"id": "receipt", "function": "receipt", "after": ["charge"]},
        ],
    }


class Lines(io.StringIO):
    pass


def charges(tmp_path: Path) -> list[str]:
    return (tmp_path / "charges.txt").read_text().split()


def test_a_held_task_is_reported_at_start_shown_and_decided_over_rest_and_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make_store: StoreFactory
) -> None:
    store = make_store()
    url = store.url.render_as_string(hide_password=False)
    schema = store._schema
    path = write_config(tmp_path, f"{url}?schema={schema}" if schema else url)
    config = load_serve_config(path)
    (tmp_path / "hold").write_text("")

    async def start() -> tuple[asyncio.Task[None], asyncio.Event, str, Lines]:
        stop, ready, out = asyncio.Event(), asyncio.Event(), Lines()
        task = asyncio.create_task(serve(config, out=out, stop=stop, ready=ready))
        await ready.wait()
        url = next(w for w in out.getvalue().split() if w.startswith("http://"))
        return task, stop, url, out

    async def call(
        http: aiohttp.ClientSession, method: str, url: str, body: Any = None, **kw: Any
    ) -> tuple[int, Any]:
        async with http.request(method, url, json=body, **kw) as r:
            return r.status, await r.json()

    async def main_() -> dict[str, str]:
        task, stop, url, _ = await start()
        ids: dict[str, str] = {}
        async with aiohttp.ClientSession(headers=A) as http:
            for name in ("rerun-me", "fail-me", "cli-me"):
                module = sys.modules["plait_serve_reg"]
                module.started.clear()
                status, body = await call(http, "POST", url + "v1/workflows", payment(name))
                assert status == 202
                ids[name] = body["id"]
                await module.started.wait()  # charging when the service stops
            stop.set()
            await task  # drain_s = 0: each stops with its charge running

            task, stop, url, out = await start()
            said = out.getvalue()
            for run_id in ids.values():
                assert (
                    f"waits for a decision: workflow {run_id}: task(s) 'charge' not idempotent"
                ) in said
                assert f"POST /v1/workflows/{run_id}/decision" in said
                assert f"plait resume --config {path} --decide '{run_id}=rerun'" in said
            assert charges(tmp_path) == ["rerun-me", "fail-me", "cli-me"]  # none ran again

            one = url + f"v1/workflows/{ids['rerun-me']}"
            status, view = await call(http, "GET", one)
            assert status == 200
            assert view["status"] == "running" and view["waiting_for_decision"] == ["charge"]
            assert {t["id"]: t["state"] for t in view["tasks"]}["charge"] == "running"

            # Another tenant's workflow is not there for it; a bad body names the field.
            status, _ = await call(
                http, "POST", one + "/decision", {"decision": "rerun"}, headers=B
            )
            assert status == 404
            status, body = await call(http, "POST", one + "/decision", {"decision": "maybe"})
            assert status == 422 and body["problems"][0]["field"] == "decision"
            status, body = await call(http, "POST", one + "/decision", {"tasks": {"x": "rerun"}})
            assert status == 422
            assert {p["field"] for p in body["problems"]} == {"tasks.x", "tasks"}

            (tmp_path / "hold").unlink()
            status, body = await call(http, "POST", one + "/decision", {"decision": "rerun"})
            assert (status, body) == (
                200,
                {"id": ids["rerun-me"], "status": "running", "decisions": {"charge": "rerun"}},
            )
            status, again = await call(http, "POST", one + "/decision", {"decision": "rerun"})
            assert (status, again["decisions"]) == (200, {"charge": "rerun"})  # a retry
            status, _ = await call(http, "POST", one + "/decision", {"decision": "fail"})
            assert status == 409
            status, result = await call(http, "GET", one + "/result?wait=30")
            assert result["status"] == "succeeded"
            assert result["results"]["receipt"] == "receipt for charged"
            status, view = await call(http, "GET", one)
            assert view["waiting_for_decision"] is None

            two = url + f"v1/workflows/{ids['fail-me']}"
            status, body = await call(
                http, "POST", two + "/decision", {"tasks": {"charge": "fail"}}
            )
            assert status == 200 and body["decisions"] == {"charge": "fail"}
            status, result = await call(http, "GET", two + "/result?wait=30")
            assert result["status"] == "failed"
            assert "not idempotent" in result["failures"]["charge"]
            assert result["failures"]["receipt"] == "dependency 'charge' failed"

            status, _ = await call(http, "POST", one + "/decision", {"decision": "rerun"})
            assert status == 200  # still the same answer once it has finished
            stop.set()
            await task
        return ids

    ids = asyncio.run(main_())
    assert charges(tmp_path) == ["rerun-me", "fail-me", "cli-me", "rerun-me"]

    # The service is stopped: the CLI decides the last one, from the same config file.
    out = io.StringIO()
    code = main(["resume", "--config", str(path), "--dry-run"], out=out)
    assert code == 1
    assert f"add --decide '{ids['cli-me']}/charge=rerun'" in out.getvalue()
    out = io.StringIO()
    code = main(["resume", "--config", str(path), "--decide", f"{ids['cli-me']}=rerun"], out=out)
    assert code == 0, capsys.readouterr().err
    assert charges(tmp_path)[-1] == "cli-me"
    assert "nothing to resume" in _resume_again(path)


def _resume_again(path: Path) -> str:
    out = io.StringIO()
    assert main(["resume", "--config", str(path), "--dry-run"], out=out) == 0
    return out.getvalue()


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "rerun"},
        {"tasks": {"charge": "fail"}},
        {"decision": None, "tasks": {"charge": "rerun"}},
        {"decision": "fail", "tasks": {}},
        {},  # neither
        {"tasks": {}},  # no task named
        {"decision": "rerun", "tasks": {"charge": "fail"}},  # both
        {"decision": "maybe"},
        {"decision": None},
        {"tasks": {"a b": "rerun"}},  # not a task id
    ],
)
def test_the_document_and_the_model_agree_on_a_decision(body: dict[str, Any]) -> None:
    import jsonschema_rs
    import pydantic

    from orchestrator.service import openapi
    from orchestrator.service._spec import DecisionSpec

    document = jsonschema_rs.validator_for(
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": "#/components/schemas/DecisionSpec",
            "components": openapi()["components"],
        }
    )
    try:
        DecisionSpec.model_validate(body)
        fits = True
    except pydantic.ValidationError:
        fits = False
    assert document.is_valid(body) == fits


PLAIT = [sys.executable, "-c", "from orchestrator.cli._cli import main; raise SystemExit(main())"]


def test_a_service_killed_while_charging_holds_the_charge_for_a_decision(
    tmp_path: Path,
) -> None:
    """A real SIGKILL of `plait serve` while a task declared not idempotent runs."""
    import os
    import subprocess

    path = write_config(tmp_path, "s.db")
    (tmp_path / "hold").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PLAIT_DEBUG"}

    def start() -> tuple[subprocess.Popen[str], list[str], str]:
        proc = subprocess.Popen(
            [*PLAIT, "serve", "--config", str(path)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        said: list[str] = []
        while not said or "listening on" not in said[-1]:
            line = proc.stdout.readline()
            assert line, f"plait serve ended: {said}"
            said.append(line)
        url = next(w for w in said[-1].split() if w.startswith("http://"))
        return proc, said, url

    async def submit_and_see_it_charge(url: str) -> str:
        async with aiohttp.ClientSession(headers=A) as http:
            async with http.post(url + "v1/workflows", json=payment("killed")) as r:
                run_id = (await r.json())["id"]
            async with http.get(url + f"v1/workflows/{run_id}/events") as r:
                async for line in r.content:  # the store has the charge's start
                    started = line.startswith(b"data:") and b'"task_started"' in line
                    if started and b'"charge"' in line:
                        return str(run_id)
        raise AssertionError("the stream ended before the charge started")

    proc, _, url = start()
    try:
        run_id = asyncio.run(submit_and_see_it_charge(url))
    finally:
        proc.kill()  # SIGKILL: no drain, no goodbye
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    (tmp_path / "hold").unlink()

    async def decide(url: str) -> dict[str, Any]:
        async with aiohttp.ClientSession(headers=A) as http:
            one = url + f"v1/workflows/{run_id}"
            async with http.get(one) as r:
                assert (await r.json())["waiting_for_decision"] == ["charge"]
            async with http.post(one + "/decision", json={"decision": "rerun"}) as r:
                assert r.status == 200
            async with http.get(one + "/result?wait=30") as r:
                result: dict[str, Any] = await r.json()
                return result

    proc, said, url = start()
    try:
        assert any(f"waits for a decision: workflow {run_id}" in line for line in said), said
        result = asyncio.run(decide(url))
    finally:
        proc.terminate()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
    assert result["status"] == "succeeded", result
    assert charges(tmp_path) == ["killed", "killed"]  # once before the kill, once decided
