"""The crash harness (bench/crash.py), reduced: a process running workflows against a
recording fake LLM server is SIGKILLed at moments picked from its progress and restarted;
every workflow completes exactly once, nothing is lost or done twice, and no LLM call whose
reply was recorded before a kill is sent again. On SQLite and PostgreSQL.

Also the harness's own parts: the server's log and answers, and how repeats are sorted.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from _crash_work import build, expected, llm_calls
from _recording_llm import Arrival, answer, app, read_log, request_hash
from aiohttp.test_utils import TestClient, TestServer
from conftest import PG_HOST
from crash import Epoch, Options, Trigger, audit, crash_run, plan_kills, repeats


def test_the_server_answers_from_the_messages_and_logs_each_request(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}

    async def main() -> list[dict[str, Any]]:
        with log.open("a", buffering=1) as out:
            async with TestClient(TestServer(app(out, (0.0, 0.0), 0))) as client:
                replies = []
                for _ in range(2):
                    response = await client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"Authorization": "Bearer epoch-4"},
                    )
                    replies.append(await response.json())
                counts = await client.get("/control/wait", params={"responses": 2})
                assert await counts.json() == {"arrivals": 2, "responses": 2}
                return replies

    replies = asyncio.run(main())
    text = answer([("user", "hi")])
    assert [r["choices"][0]["message"]["content"] for r in replies] == [text, text]
    assert text.startswith("ans-") and len(text) == 20
    arrivals = read_log(log)
    assert [(a.index, a.epoch, a.answer) for a in arrivals] == [(0, 4, text), (1, 4, text)]
    assert {a.hash for a in arrivals} == {request_hash(body)}
    assert all(a.done is not None and a.done >= a.at for a in arrivals)
    with log.open("a") as out:
        out.write('{"ev": "arrive", "i": 2, "epo')  # a line cut by a kill is ignored
    assert len(read_log(log)) == 2


def test_workflows_are_deterministic_per_name() -> None:
    for name in ("w0", "w1", "w7"):
        wf = build(name)
        results = expected(name)
        assert set(results) >= {t.id for t in wf}  # plus the tasks added at run time
        assert 8 <= len(results) <= 11
        assert 4 <= llm_calls(name) <= 8
        assert expected(name) == results
    assert expected("w0")["brief"] != expected("w1")["brief"]


def test_kills_are_planned_from_progress() -> None:
    triggers = plan_kills(random.Random(3), 20, 3000)
    assert len(triggers) == 20
    assert plan_kills(random.Random(3), 20, 3000) == triggers
    for trigger in triggers:
        most = {"start": 0, "commits": 3}.get(trigger.kind, 300)
        assert (0 if trigger.kind == "start" else 1) <= trigger.after <= most


def test_repeats_are_sorted_by_what_the_store_held_at_the_kill() -> None:
    def arrival(i: int, epoch: int, key: str, done: float | None, at: float) -> Arrival:
        return Arrival(i, epoch, key, f"ans-{key}", at, done)

    epochs = [
        Epoch(Trigger("arrivals", 5), killed_at=10.0),
        Epoch(Trigger("responses", 9), killed_at=20.0, recorded=frozenset({"ans-a"})),
        Epoch(None, recorded=frozenset({"ans-a", "ans-b"})),
    ]
    log = [
        arrival(0, 0, "a", 1.0, 0.5),  # recorded before the first kill...
        arrival(1, 0, "b", 2.0, 1.5),  # delivered, not recorded by the first kill
        arrival(2, 0, "c", None, 9.0),  # in flight at the first kill
        arrival(3, 0, "d", 11.0, 9.5),  # written after its client was killed
        arrival(4, 1, "a", 12.0, 11.0),  # ...sent again: paid twice
        arrival(5, 1, "b", 13.0, 12.0),
        arrival(6, 1, "c", 14.0, 13.0),
        arrival(7, 1, "d", 15.0, 14.0),
        arrival(8, 1, "d", 16.0, 15.0),  # twice by one process
        arrival(9, 2, "b", 21.0, 20.5),  # recorded by the second kill: paid twice
    ]
    assert repeats(log, epochs) == {
        "llm_requests": 10,
        "repeated_llm_calls": 2,
        "repeated_unrecorded": 1,
        "repeated_in_flight": 2,
        "repeated_in_process": 1,
    }


def test_a_log_that_did_something_twice_is_caught() -> None:
    def event(kind: str, task: str = "") -> dict[str, Any]:
        return {"kind": kind, "task": task} if task else {"kind": kind}

    once = [
        event("workflow_started"),
        event("task_added", "plan"),
        event("task_started", "plan"),
        event("task_added", "section 0"),
        event("workflow_resumed"),
        event("task_started", "plan"),  # running at the kill: it runs again
        event("task_succeeded", "plan"),
        event("workflow_finished"),
    ]
    found = audit(once)
    assert (found.finished, found.twice, found.run_again, found.replanned) == (1, [], 1, True)
    twice = [*once, event("task_succeeded", "plan"), event("workflow_finished")]
    assert (audit(twice).finished, audit(twice).twice) == (2, ["plan"])
    assert audit([*once, event("task_added", "section 0")]).twice == ["section 0"]


def _target(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return "sqlite"
    user = request.getfixturevalue("pg_user")
    return f"postgresql+asyncpg://{user}@{PG_HOST}/test"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request: pytest.FixtureRequest) -> str:
    return _target(request)


def test_without_kills_every_workflow_completes_once(store_target: str, tmp_path: Path) -> None:
    result = asyncio.run(crash_run(store_target, Options(workflows=6, kills=0), tmp_path))
    assert result["errors"] == 0, result["error_messages"]
    assert result["completed_once"] == 6, result["problems"]
    assert (result["lost"], result["duplicated"], result["kills"]) == (0, 0, 0)
    assert result["llm_requests"] == result["llm_calls"]
    json.dumps(result)


def test_killed_and_restarted_every_workflow_completes_once(
    store_target: str, tmp_path: Path
) -> None:
    # One kill of each kind: mid-call, between a reply and its commit, just after a commit
    # that recorded replies, and inside resume().
    triggers = (
        Trigger("arrivals", 15),
        Trigger("commits", 1),
        Trigger("responses", 10),
        Trigger("start"),
    )
    options = Options(workflows=12, kills=len(triggers), triggers=triggers)
    result = asyncio.run(crash_run(store_target, options, tmp_path))
    assert result["errors"] == 0, result["error_messages"]
    assert result["kills"] == len(triggers)
    assert result["recorded_at_kills"] > 0  # the store held replies when a process was killed
    assert result["completed_once"] == 12, result["problems"]
    assert (result["lost"], result["duplicated"], result["broken_logs"]) == (0, 0, 0)
    assert result["repeated_llm_calls"] == 0  # no call recorded before a kill is paid again
    assert result["repeated_in_process"] == 0
