"""`plait` answers every mistake with one line on stderr and a meaningful exit status."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from orchestrator.cli._cli import main

ROOT = Path(__file__).resolve().parent.parent


def flow(tmp_path: Path, body: str) -> str:
    path = tmp_path / "flow.py"
    path.write_text(body)
    return str(path)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    code = main(argv, out=out)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Traceback" not in out.getvalue()
    return code, out.getvalue(), err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"plait {version('plait')}"


def test_run_help_states_the_module_contract(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for name in ("workflows()", "backends(clock)", "CLOCK", "CONFIG", "--deadline"):
        assert name in text


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("def workflows():\n    return None\n", "returned NoneType None; return a Workflow"),
        ("def workflows():\n    return [1]\n", "returned a int among them"),
        ("import no_such_module_here\n", "importing"),
        ("def workflows():\n    raise ValueError('bad input')\n", "ValueError: bad input"),
    ],
)
def test_a_broken_module_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, says: str
) -> None:
    code, _, err = run(["run", flow(tmp_path, body)], capsys)
    assert code == 2
    assert err.startswith("plait: error: ") and says in err
    assert err.count("\n") == 1


def test_a_users_exception_names_the_line_in_their_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = flow(tmp_path, "x = 1\n\ndef workflows():\n    return {}['missing']\n")
    code, _, err = run(["run", path], capsys)
    assert code == 2
    assert "KeyError: 'missing'" in err and f"{path}:4" in err


def test_a_deadlock_is_a_run_time_error_naming_the_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (
        "import asyncio\n"
        "from orchestrator import Workflow\n"
        "CLOCK = 'virtual'\n"
        "async def stuck(ctx):\n"
        "    await asyncio.Event().wait()\n"
        "def workflows():\n"
        "    wf = Workflow('research')\n"
        "    wf.add('write', stuck)\n"
        "    return wf\n"
    )
    code, _, err = run(["run", flow(tmp_path, body)], capsys)
    assert code == 1
    assert "deadlock" in err and "research/write" in err and "Task-" not in err


def test_an_unknown_backend_says_which_config_table_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = (
        "from agents import Agent\n"
        "from orchestrator import Workflow\n"
        "def workflows():\n"
        "    wf = Workflow('w')\n"
        "    wf.add('ask', Agent('a', 'You help.', backend='gpus').ask('hi'))\n"
        "    return wf\n"
    )
    code, _, err = run(["run", flow(tmp_path, body)], capsys)
    assert code == 2
    assert "[backends.gpus]" in err


def ctrl_c_reaches_it() -> None:
    """In the child, before it starts: SIGINT as at a terminal. A shell starts background
    jobs with SIGINT ignored, which their children inherit and Python then keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_prints_the_partial_summary_and_exits_130(tmp_path: Path) -> None:
    # A real SIGINT, sent by a task once the quick workflow is done, in a child process (an
    # interrupt inside the test process would disturb pytest itself).
    body = (
        "import os, signal\n"
        "from orchestrator import Workflow\n"
        "CLOCK = 'virtual'\n"
        "async def interrupt(ctx):\n"
        "    await ctx.clock.sleep(2.0)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    await ctx.clock.sleep(60.0)\n"
        "def workflows():\n"
        "    quick = Workflow('quick')\n"
        "    quick.add('a', lambda: 1)\n"
        "    long = Workflow('long')\n"
        "    long.add('stop', interrupt)\n"
        "    return [quick, long]\n"
    )
    plait = Path(sys.executable).parent / "plait"
    proc = subprocess.run(
        [str(plait), "run", flow(tmp_path, body)],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=ctrl_c_reaches_it,
    )
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {
        line.split()[0]: line.split()[1]
        for line in proc.stdout.splitlines()
        if line[:1] == "q" or line[:4] == "long"
    }
    assert rows.get("quick") == "succeeded"
    assert rows.get("long") == "running"
    assert "interrupted (Ctrl-C)" in proc.stdout


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # `plait run ... | head -1`: the reader leaves after one line, and the summary of 3,000
    # workflows (far more than a pipe's buffer) is written into a closed pipe.
    path = flow(
        tmp_path,
        "from orchestrator import Workflow\n"
        "CLOCK = 'virtual'\n"
        "def workflows():\n"
        "    flows = [Workflow(f'w{i}') for i in range(3000)]\n"
        "    for wf in flows:\n"
        "        wf.add('a', lambda: 1)\n"
        "    return flows\n",
    )
    plait = Path(sys.executable).parent / "plait"
    proc = subprocess.run(
        f"'{plait}' run '{path}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr
    assert "BrokenPipeError" not in proc.stderr


def test_a_syntax_error_in_the_module_names_file_and_line(tmp_path: Path) -> None:
    # In a child process: compiling broken code in this one trips a CPython 3.11 bug that
    # makes later ast.parse calls (pytest's assertion rewriting) fail.
    path = flow(tmp_path, "x = 1\ndef workflows(:\n")
    plait = Path(sys.executable).parent / "plait"
    proc = subprocess.run([str(plait), "run", path], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("plait: error: ") and f"{path}:2: syntax error" in proc.stderr
    assert "Traceback" not in proc.stderr


LIFESPAN = """
import contextlib
import pathlib
from orchestrator import Workflow

CLOCK = "virtual"
LOG = []
OPENED = {}

@contextlib.asynccontextmanager
async def lifespan():
    LOG.append("enter")
    OPENED["greeting"] = "hello"
    yield
    LOG.append("exit")
    pathlib.Path(__file__).with_suffix(".log").write_text(" ".join(LOG))

def greet():
    return OPENED["greeting"]

def workflows():
    wf = Workflow("uses-what-lifespan-opened")
    wf.add("greet", greet)
    return wf
"""


def test_a_modules_lifespan_is_entered_around_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["run", flow(tmp_path, LIFESPAN)], capsys)
    assert code == 0, out
    assert "1 workflow(s), 1 succeeded" in out
    assert (tmp_path / "flow.log").read_text() == "enter exit"


def test_a_lifespan_that_is_not_a_context_manager_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = "from orchestrator import Workflow\nCLOCK = 'virtual'\n"
    body += "def lifespan():\n    return 3\ndef workflows():\n    return Workflow('w')\n"
    code, _, err = run(["run", flow(tmp_path, body)], capsys)
    assert code == 2
    assert "lifespan() in" in err and "returned int" in err and "asynccontextmanager" in err


@pytest.mark.parametrize("command", ["run", "resume"])
def test_the_retired_policy_flag_names_admission(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, str(tmp_path / "flow.py"), "--policy", "las"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--policy is no longer an option" in err and "--admission" in err
