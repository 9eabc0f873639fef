"""What the `plait` command says when something goes wrong on a user's first day: a port in
use, a task that fails (where, and the traceback with PLAIT_DEBUG=1), a service that cannot
be reached, Ctrl-C (and how to go on), and a batch answered by the simulator. Each through
the command itself; Ctrl-C is a real SIGINT, in a subprocess."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli._cli import main
from orchestrator.service import hash_token

PLAIT = [sys.executable, "-c", "from orchestrator.cli._cli import main; raise SystemExit(main())"]


def plait(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLAIT_STORE", "PLAIT_DEBUG")}
    return subprocess.run(
        [*PLAIT, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=cwd,
        preexec_fn=ctrl_c_reaches_it,
    )


def ctrl_c_reaches_it() -> None:
    """In the child, before it starts: SIGINT as at a terminal. A shell starts background
    jobs with SIGINT ignored, which their children inherit and Python then keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# --- plait serve: a port in use ----------------------------------------------------------------


def test_serve_on_a_port_in_use_says_so_and_how_to_pick_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[service]\nstore = "s.db"\n\n[[tenants]]\nname = "a"\n'
        f'token_sha256 = "{hash_token("t")}"\n'
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--config", str(config), "--port", str(port)], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "internal error" not in err
    assert f"port {port} on 127.0.0.1 is in use" in err
    assert f"plait serve --config {config} --port N" in err


# --- plait run: where a task failed -------------------------------------------------------------

FAILING = """\
from orchestrator import Workflow


def parse(row: str) -> int:
    return int(row)


def step() -> int:
    return parse("not a number")


def workflows() -> list[Workflow]:
    wf = Workflow("fails")
    wf.add("step", step)
    return [wf]
"""


def test_a_failed_task_says_where_and_plait_debug_adds_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing.py").write_text(FAILING)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PLAIT_DEBUG", raising=False)
    out = io.StringIO()
    assert main(["run", "failing.py"], out=out) == 1
    line = next(line for line in out.getvalue().splitlines() if "failed:" in line)
    assert line == (
        "  ! fails/step failed: ValueError: invalid literal for int() with base 10: "
        "'not a number' (at failing.py:5, in parse)"
    )
    assert "Traceback" not in out.getvalue()
    monkeypatch.setenv("PLAIT_DEBUG", "1")
    out = io.StringIO()
    assert main(["run", "failing.py"], out=out) == 1
    text = out.getvalue()
    assert "    Traceback (most recent call last):" in text
    assert 'failing.py", line 9, in step' in text and "return int(row)" in text


# --- plait watch: a service that cannot be reached -----------------------------------------------


def test_watch_of_a_service_that_cannot_be_reached_names_it_and_what_to_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_client import Instant

    import orchestrator.client

    monkeypatch.setattr(orchestrator.client, "SystemClock", Instant)  # no waits between tries
    monkeypatch.setenv("PLAIT_TOKEN", "t")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}/"
    assert main(["watch", "some-id", "--url", url], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err == (
        f"plait: error: cannot reach the service at {url} (connection refused); check that "
        "`plait serve` runs there, and that --url (or $PLAIT_URL) names its host and port\n"
    )


# --- Ctrl-C -------------------------------------------------------------------------------------

INTERRUPTED = """\
import asyncio
import os
import signal
from pathlib import Path

from orchestrator import Workflow

FLAG = Path(__file__).with_name("interrupted")


def first() -> str:
    return "kept"


async def second() -> str:
    if not FLAG.exists():
        FLAG.write_text("")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        await asyncio.Event().wait()
    return "done"


def workflows() -> list[Workflow]:
    wf = Workflow("stops")
    wf.add("first", first)
    wf.add("second", second, after=["first"])
    return [wf]
"""


def test_ctrl_c_on_run_prints_the_resume_command_that_goes_on(tmp_path: Path) -> None:
    """A real SIGINT, to this process: asyncio's runner turns it into KeyboardInterrupt."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    module = tmp_path / "stops.py"
    module.write_text(INTERRUPTED)
    store = tmp_path / "runs.db"
    out = io.StringIO()
    assert main(["run", str(module), "--store", str(store), "--admission", "off"], out=out) == 130
    said = "to go on where it stopped: "
    command = next(line for line in out.getvalue().splitlines() if line.startswith(said))
    argv = shlex.split(command.removeprefix(said))
    assert argv == [
        "plait",
        "resume",
        str(module),
        "--store",
        str(store),
        "--admission",
        "off",
    ]
    went_on = plait(*argv[1:])  # the command as printed, in a shell of its own
    assert went_on.returncode == 0, went_on.stderr
    assert "1 workflow(s), 1 succeeded" in went_on.stdout  # the same run, from the store

    (tmp_path / "interrupted").unlink()
    out = io.StringIO()
    assert main(["run", str(module)], out=out) == 130
    assert "nothing was recorded (no --store)" in out.getvalue()


BATCH_BACKEND = """\
import os
import signal
from pathlib import Path

from executors import FunctionLLM

FLAG = Path(__file__).with_name("interrupted")


def answer(request, hints):
    if not FLAG.exists():
        FLAG.write_text("")
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
    return "an answer"


def backends(clock):
    return {"default": FunctionLLM(answer)}
"""


def test_ctrl_c_on_a_batch_says_to_run_the_same_command_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "stopper.py").write_text(BATCH_BACKEND)
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"row {i}"}) + "\n" for i in range(4)))
    out = tmp_path / "out.jsonl"
    command = ["batch", "run", "--input", str(rows), "--output", str(out), "--progress", "none"]
    command += ["--backend", f"{tmp_path / 'stopper.py'}:backends"]
    assert main(command, out=io.StringIO()) == 130
    err = capsys.readouterr().err
    assert (
        f"plait batch: interrupted; rows finished are kept in {out} and the store: run the "
        "same command again to go on with the rest"
    ) in err
    assert "simulated" not in err  # the rows' answers came from --backend
    assert main(command, out=io.StringIO()) == 0
    assert len(out.read_text().splitlines()) == 4


def test_a_batch_without_config_says_its_answers_come_from_a_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"prompt": "hi", "max_tokens": 1}) + "\n")
    argv = ["batch", "run", "--input", str(rows), "--output", str(tmp_path / "o.jsonl")]
    assert main([*argv, "--progress", "none", "--replicas", "1"], out=io.StringIO()) == 0
    err = capsys.readouterr().err
    assert (
        "plait batch: no --config: the answers come from a simulated H100 (1 replicas), not a "
        "model; pass --config FILE to call real servers"
    ) in err


def test_watch_of_a_stream_lost_midway_says_how_to_follow_it_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service sends one event, ends the stream, then answers 503 to every retry."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer
    from test_client import Instant

    import orchestrator.client

    monkeypatch.setattr(orchestrator.client, "SystemClock", Instant)
    monkeypatch.setenv("PLAIT_TOKEN", "t")

    async def events(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Last-Event-ID") != "0":
            return web.json_response({"error": "shutting down"}, status=503)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'id: 1\nevent: workflow_started\ndata: {"at": 0}\n\n')
        return response

    async def body() -> tuple[int, str, str]:
        app = web.Application()
        app.router.add_get("/v1/workflows/{id}/events", events)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            url = str(server.make_url("/"))
            out = io.StringIO()
            argv = ["watch", "wf-1", "--url", url, "--json"]
            return await asyncio.to_thread(main, argv, out), out.getvalue(), url
        finally:
            await server.close()

    code, out, url = asyncio.run(body())
    assert code == 2 and json.loads(out)["id"] == 1
    err = capsys.readouterr().err
    assert err.startswith(f"plait: error: lost the event stream of 'wf-1' at {url} after event 1")
    assert err.endswith("; follow it again from there: plait watch wf-1 --after 1\n")
    assert "after=" not in err
