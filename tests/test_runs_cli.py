"""`plait runs list|show|delete|compact|gc` on SQLite and PostgreSQL: what each prints, what
it changes in the store, and one line on stderr (never a traceback) for every mistake."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable, Coroutine
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import StoreFactory
from stored_runs import BIG_RESULT, put_run, stored_image

from memory import SQLStore
from orchestrator import EVENT_ADAPTER, WorkflowResumed
from orchestrator.cli._cli import main
from orchestrator.ext import EventRecord, StoreBatch

T = TypeVar("T")
Plait = Callable[..., tuple[int, str, str]]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def store_args(make_store: StoreFactory) -> list[str]:
    """`--store ...` (and `--schema ...` on PostgreSQL) naming the test's store, created."""
    store = make_store()

    async def create() -> None:
        async with store:
            pass

    run(create())
    target = store.url.render_as_string(hide_password=False)
    args = ["--store", target]
    return [*args, "--schema", store._schema] if store._schema else args


@pytest.fixture
def plait(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Plait:
    monkeypatch.delenv("PLAIT_STORE", raising=False)

    def call(*argv: str) -> tuple[int, str, str]:
        out = io.StringIO()
        code = main(list(argv), out=out)
        captured = capsys.readouterr()
        err = captured.err
        assert "Traceback" not in err and "Traceback" not in out.getvalue()
        assert captured.out == ""  # everything goes to `out`
        return code, out.getvalue(), err

    return call


def opened(store_args: list[str]) -> SQLStore:
    target = store_args[1]
    schema = store_args[3] if len(store_args) > 2 else None
    return SQLStore(target, schema=schema)


def with_store(store_args: list[str], fill: Callable[[SQLStore], Coroutine[Any, Any, T]]) -> T:
    async def main_() -> T:
        async with opened(store_args) as store:
            return await fill(store)

    return run(main_())


async def three_runs(store: SQLStore) -> None:
    await put_run(store, "first", status="succeeded", created=1.0, finished=2.0, name="alpha")
    await put_run(store, "second", status="failed", created=3.0, finished=4.0, big=True)
    await put_run(store, "third", status="running", created=5.0, name="gamma")


def one_line(err: str) -> str:
    assert err.startswith("plait: error: ") and err.count("\n") == 1, err
    return err


def test_the_command_is_registered_by_entry_point() -> None:
    assert "runs" in {e.name for e in entry_points(group="plait.cli")}


# --- list -------------------------------------------------------------------------------------


def test_list_shows_one_line_per_run_newest_first(plait: Plait, store_args: list[str]) -> None:
    code, out, _ = plait("runs", "list", *store_args)
    assert (code, out) == (0, "no runs in the store\n")
    with_store(store_args, three_runs)
    code, out, _ = plait("runs", "list", *store_args)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "CREATED", "FINISHED"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["third", "gamma", "running"],
        ["second", "replayed", "failed"],
        ["first", "alpha", "succeeded"],
    ]
    assert re.search(r"running\s+1970-01-01 \d\d:\d\d:\d\d\s+-$", lines[1])
    _, out, _ = plait("runs", "list", "--status", "failed", *store_args)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["second"]
    _, out, _ = plait("runs", "list", "--limit", "1", *store_args)
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["third"]
    _, out, _ = plait("runs", "list", "--status", "cancelled", *store_args)
    assert out == "no cancelled runs in the store\n"


# --- show -------------------------------------------------------------------------------------


def test_show_rebuilds_a_run_from_its_log(plait: Plait, store_args: list[str]) -> None:
    with_store(store_args, three_runs)
    code, out, _ = plait("runs", "show", "second", *store_args)
    assert code == 0
    assert "status    failed\n" in out
    assert "log       40 events\n" in out
    assert "tasks     8 (done 6, failed 1, skipped 1)\n" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "attempts 2  -> worked at attempt 2" in lines["flaky"]
    assert "failed     function test_replay:broken  error: ValueError: bad input" in lines["broken"]
    assert "(dependency 'broken' failed)" in out
    # A long result is cut to one short line.
    write = lines["write"]
    assert write.endswith("...") and len(write.split("  -> ")[1]) == 60
    assert "events:" not in out

    _, out, _ = plait("runs", "show", "second", "--events", *store_args)
    events = out.split("events:\n")[1].splitlines()
    assert len(events) == 40
    assert events[0].split()[:3] == ["1", "0.000", "workflow_started"]
    assert BIG_RESULT.strip() in out  # the log shows payloads read back whole

    code, out, _ = plait("runs", "show", "third", *store_args)
    assert "status    running\n" in out and "finished  -\n" in out
    assert "research batching" in out and "resumed" not in out

    async def resume_third(store: SQLStore) -> None:
        event = WorkflowResumed(workflow="third", program=2, deadline=None, at=50.0)
        data = EVENT_ADAPTER.dump_json(event).decode()
        record = EventRecord(workflow="third", seq=40, kind=event.kind, at=50.0, data=data)
        await store.append(StoreBatch(events=[record]))

    with_store(store_args, resume_third)
    _, out, _ = plait("runs", "show", "third", *store_args)
    assert "resumed   1 time(s) in a new process\n" in out


def test_show_says_a_run_was_compacted(plait: Plait, store_args: list[str]) -> None:
    with_store(store_args, three_runs)
    before = with_store(store_args, lambda s: stored_image(s, "second"))
    code, out, _ = plait("runs", "compact", "second", *store_args)
    assert code == 0
    # Its retry's big error was held by a dropped event alone.
    assert out.splitlines()[:2] == ["compacted 1 run(s)", "collected 1 unused payload(s)"]
    assert re.fullmatch(r"store: 119 -> 104 events, .* of events and payloads", out.splitlines()[2])
    _, out, _ = plait("runs", "show", "second", "--events", *store_args)
    assert "log       25 events (compacted: " in out and "seqs have gaps" in out
    assert "tasks     8 (done 6, failed 1, skipped 1)\n" in out
    seqs = [int(line.split()[0]) for line in out.split("events:\n")[1].splitlines()]
    assert seqs[:3] == [1, 2, 3] and seqs[-1] == 40 and len(seqs) == 25
    after = with_store(store_args, lambda s: stored_image(s, "second"))
    assert after.tasks == before.tasks


def test_show_of_an_unknown_run_is_one_line_and_exit_1(plait: Plait, store_args: list[str]) -> None:
    code, out, err = plait("runs", "show", "nobody", *store_args)
    assert (code, out) == (1, "")
    assert "no run 'nobody' in the store" in one_line(err)
    assert "plait runs list" in err


# --- delete -----------------------------------------------------------------------------------


def ids(store_args: list[str]) -> list[str]:
    async def listed(store: SQLStore) -> list[str]:
        return sorted(w.id for w in await store.workflows())

    return with_store(store_args, listed)


def test_delete_by_id_refuses_unfinished_runs_without_force(
    plait: Plait, store_args: list[str]
) -> None:
    with_store(store_args, three_runs)
    code, out, err = plait("runs", "delete", "first", "third", *store_args)
    assert (code, out) == (2, "")
    assert "not finished: third (running)" in one_line(err) and "--force" in err
    assert ids(store_args) == ["first", "second", "third"]  # nothing was deleted

    code, out, err = plait("runs", "delete", "first", "nobody", *store_args)
    assert code == 1 and "no run 'nobody'" in one_line(err)
    assert ids(store_args) == ["first", "second", "third"]

    code, out, _ = plait("runs", "delete", "second", *store_args)
    assert code == 0
    # The second run's big result and error were its own: collected with it.
    assert out == "deleted 1 run(s): second\ncollected 2 unused payload(s)\n"
    code, out, _ = plait("runs", "delete", "first", "third", "--force", *store_args)
    assert (code, out.splitlines()[0]) == (0, "deleted 2 run(s): first, third")
    assert ids(store_args) == []


def test_delete_by_age_or_count_takes_finished_runs_only(
    plait: Plait, store_args: list[str]
) -> None:
    with_store(store_args, three_runs)
    code, out, _ = plait("runs", "delete", "--keep-last", "1", *store_args)
    assert code == 0
    assert out.splitlines()[0] == ("deleted 1 finished run(s): beyond the 1 most recently finished")
    assert ids(store_args) == ["second", "third"]
    code, out, _ = plait("runs", "delete", "--finished-before", "2000-01-01", *store_args)
    assert out.startswith("deleted 1 finished run(s): finished before 2000-01-01 00:00:00\n")
    assert ids(store_args) == ["third"]  # running: never deleted by age or count
    _, out, _ = plait("runs", "delete", "--finished-before", "1d", *store_args)
    assert out.startswith("deleted 0 finished run(s)")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["first", "--keep-last", "1"], "not both"),
        ([], "say what to delete"),
    ],
)
def test_delete_needs_one_way_to_say_what(
    plait: Plait, store_args: list[str], argv: list[str], says: str
) -> None:
    with_store(store_args, three_runs)
    code, _, err = plait("runs", "delete", *argv, *store_args)
    assert code == 2 and says in one_line(err)
    assert ids(store_args) == ["first", "second", "third"]


# --- compact and gc ---------------------------------------------------------------------------


def test_compact_takes_every_finished_run_and_leaves_unfinished_ones_whole(
    plait: Plait, store_args: list[str]
) -> None:
    with_store(store_args, three_runs)
    code, out, _ = plait("runs", "compact", "third", "first", *store_args)
    assert code == 0
    assert out.splitlines()[:2] == ["compacted 1 run(s)", "left whole (not finished): third"]
    _, out, _ = plait("runs", "compact", *store_args)
    # "second"; "first" was done. Its retry's big error goes with the event that held it.
    assert out.splitlines()[:2] == ["compacted 1 run(s)", "collected 1 unused payload(s)"]
    _, out, _ = plait("runs", "compact", *store_args)
    assert out.startswith("compacted 0 run(s)\n")
    _, out, _ = plait("runs", "gc", *store_args)
    assert out == "collected 0 unused payload(s)\n"
    assert (
        with_store(store_args, lambda s: stored_image(s, "second")).tasks["write"].result
        == BIG_RESULT
    )


# --- naming the store -------------------------------------------------------------------------


def test_the_store_comes_from_the_environment_when_not_given(
    plait: Plait, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.db"
    with_store(["--store", str(path)], three_runs)
    monkeypatch.setenv("PLAIT_STORE", str(path))
    code, out, _ = plait("runs", "list", "--limit", "1")
    assert (code, out.splitlines()[1].split()[0]) == (0, "third")


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        ([], 2, "no store given: pass --store PATH_OR_URL, or set $PLAIT_STORE"),
        (["--store", "{tmp}/missing.db"], 2, "missing.db' (no such file)"),
        (["--store", "{tmp}"], 2, "(a directory)"),
        (["--store", "mysql://host/db"], 1, "names neither SQLite nor PostgreSQL"),
        (["--store", "{tmp}/notes.db"], 1, "not a SQLite database"),
    ],
)
def test_a_bad_store_is_one_line(
    plait: Plait, tmp_path: Path, argv: list[str], code: int, says: str
) -> None:
    (tmp_path / "notes.db").write_bytes(b"not a database" * 100)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    got, out, err = plait("runs", "list", *argv)
    assert (got, out) == (code, "")
    assert says in one_line(err)
    assert not (tmp_path / "missing.db").exists()  # a mistyped path is not a new store


def test_a_bad_time_or_count_is_a_usage_error(
    plait: Plait, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, says in [
        (["--finished-before", "yesterday"], "'yesterday' is neither a date and time"),
        (["--keep-last", "-1"], "'-1': give 0 or more"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(["runs", "delete", *argv, "--store", "x.db"])
        assert exit_.value.code == 2
        assert says in capsys.readouterr().err


# --- store URLs and wide values -----------------------------------------------------------------


@pytest.mark.parametrize("make_store", ["postgresql"], indirect=True)
def test_a_postgresql_url_without_a_driver_is_taken(plait: Plait, store_args: list[str]) -> None:
    """`postgresql://` (as psql and libpq write it) gets the store's driver, asyncpg; another
    driver is one line saying what to write."""
    with_store(store_args, three_runs)
    plain = store_args[1].replace("postgresql+asyncpg://", "postgresql://")
    code, out, err = plait("runs", "list", "--store", plain, *store_args[2:])
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["third", "second", "first"]
    other = store_args[1].replace("+asyncpg", "+psycopg")
    code, _, err = plait("runs", "list", "--store", other, *store_args[2:])
    assert code == 1
    assert "through asyncpg; write postgresql://" in one_line(err)


def long_task() -> str:
    return "done"


@pytest.mark.parametrize("make_store", ["sqlite"], indirect=True)
def test_columns_fit_their_values_and_a_long_one_pads_nothing(
    plait: Plait, store_args: list[str]
) -> None:
    from orchestrator import Engine, Workflow

    long_id, long_task_id = "w" * 1000, "t" * 1000

    async def fill(store: SQLStore) -> str:
        await put_run(store, long_id, name="n" * 300)
        await put_run(store, "short", created=3.0, finished=4.0)
        wf = Workflow("tasks")
        wf.add(long_task_id, long_task)
        wf.add("x", long_task)
        async with Engine(store=store) as engine:
            return (await engine.run(wf)).workflow

    run_id = with_store(store_args, fill)
    code, out, _ = plait("runs", "list", *store_args)
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines if long_id not in line) < 150
    assert any(long_id in line for line in lines)  # the id is whole, to copy
    code, out, _ = plait("runs", "show", *store_args, run_id)
    assert code == 0
    shown = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(shown) == 2 and all(len(line) < 150 for line in shown), shown
    assert any(line.startswith("  ttttt") and "..." in line for line in shown)
