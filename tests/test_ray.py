"""The Ray runner on a real local Ray cluster, which this module starts and stops.

The head node runs on 127.0.0.1 with its own temp dir and port, so it touches no other Ray on
the machine; it is stopped by signalling the `ray start --block` process that started it,
never by `ray stop` (which stops every Ray on the machine). The functions that run on the
cluster are pickled by value, so the workers need not import this module.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from agents import Tool
from executors import RayCluster, RayError, RayRunner, RayWorkerLostError, ray_task
from orchestrator import (
    Engine,
    Event,
    Registry,
    Retry,
    TaskTimeoutError,
    UsageError,
    VirtualClock,
    Workflow,
)
from orchestrator.ext import ActionSpec, FunctionAction, RebuildError
from orchestrator.model._task import describe

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CPUS = 4
MiB = 1024**2


# --- what runs on the cluster ----------------------------------------------------------------


def wait_for_file(path: Path, seconds: float = 60.0) -> None:
    """Poll for `path`, at most `seconds` (a task waiting on the test, never for ever)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.01)


def count_primes(below: int, gate: str) -> dict[str, Any]:
    """CPU-heavy: the primes below `below`, by trial division, once the gate opens."""
    start = time.time()
    tempfile.mkstemp(dir=gate, prefix="started-")
    wait_for_file(Path(gate, "open"))
    count = sum(1 for n in range(2, below) if all(n % d for d in range(2, math.isqrt(n) + 1)))
    return {
        "count": count,
        "pid": os.getpid(),
        "start": start,
        "end": time.time(),
        "resources": ray.get_runtime_context().get_assigned_resources(),
    }


def total(inputs: dict[str, Any]) -> int:
    return sum(inputs["rows"])


def bad_row(inputs: dict[str, Any]) -> int:
    raise ValueError(f"bad row {inputs['rows'][2]}")


def stall_first(marks: str) -> int:
    """Marks its pid; the first call waits (to be killed by the test), later ones return."""
    first = not any(Path(marks).iterdir())
    Path(marks, str(os.getpid())).touch()
    if first:
        wait_for_file(Path(marks, "never"))
    return os.getpid()


def stall(marks: str) -> int:
    Path(marks, str(os.getpid())).touch()
    wait_for_file(Path(marks, "never"))
    return os.getpid()


# --- the cluster -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    address: str
    temp_dir: Path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child: SIGTERM it when the test process dies, so a killed test run leaves no
    cluster behind (`ray start --block` stops its processes on SIGTERM)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _poll(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    # Short, because Ray's socket paths under it must fit in 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="plait-ray-"))
    log, port = temp_dir / "start.log", _free_port()
    command = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp_dir}",
        f"--num-cpus={CPUS}", "--num-gpus=0", "--include-dashboard=false",
        "--disable-usage-stats",
    ]  # fmt: skip
    env = {
        **os.environ,
        # The mode this process's Ray reads when it is imported ("disabled" unless set), so
        # that a token in ~/.ray/auth_token does not turn it on for the head node alone.
        "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    }
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    try:
        _poll(
            lambda: "Ray runtime started" in log.read_text() or process.poll() is not None,
            120,
            "the Ray head node did not start",
        )
        assert process.poll() is None, log.read_text()
        yield Head(f"127.0.0.1:{port}", temp_dir)
    finally:
        # `ray start --block` stops every process it started on SIGTERM.
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        shutil.rmtree(temp_dir, ignore_errors=True)


# --- helpers ---------------------------------------------------------------------------------


async def _wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds} s")
        await asyncio.sleep(0.02)


async def _collect(events: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in events]


def _succeeded(events: list[Event]) -> dict[str, Any]:
    return {e.task: e.result for e in events if e.kind == "task_succeeded"}


def _marks(folder: Path) -> list[int]:
    """The pids the tasks marked in `folder`."""
    return sorted(int(path.name) for path in folder.iterdir())


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1].startswith("Z")  # a zombie: dead
    except FileNotFoundError:
        return True


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


# --- on the cluster --------------------------------------------------------------------------


def test_cpu_heavy_tool_tasks_run_in_parallel_with_the_resources_they_declare(
    head: Head, tmp_path: Path
) -> None:
    primes = Tool("primes", count_primes, runner=RayRunner(num_cpus=2, memory=64 * MiB))
    gate = tmp_path / "gate"
    gate.mkdir()

    async def open_gate() -> int:
        # A local task of the same run opens the gate once two Ray tasks wait at it: the
        # engine's loop runs on while Ray tasks do, and the cluster runs two at once.
        await _wait_for(lambda: len(list(gate.iterdir())) >= 2, 60, "two tasks did not start")
        (gate / "open").touch()
        return len(list(gate.iterdir())) - 1

    wf = Workflow("primes")
    for i in range(4):
        wf.add(f"primes{i}", primes.call({"below": 20_000 + i, "gate": str(gate)}))
    wf.add("gate", open_gate)

    async def main() -> list[Event]:
        async with RayCluster(head.address), Engine() as engine:
            return await _collect(engine.iter(wf))

    events = asyncio.run(main())
    results = _succeeded(events)
    assert events[-1].kind == "workflow_finished" and events[-1].status == "succeeded"
    assert [results[f"primes{i}"]["count"] for i in range(4)] == [2262, 2262, 2262, 2262]
    assert {r["pid"] for r in results.values() if isinstance(r, dict)}.isdisjoint({os.getpid()})
    # Each ran with what its tool declares, and at most CPUS / 2 of them at once.
    for i in range(4):
        assert results[f"primes{i}"]["resources"] == {"CPU": 2.0, "memory": 64.0 * MiB}
    spans = [(results[f"primes{i}"]["start"], results[f"primes{i}"]["end"]) for i in range(4)]
    assert _max_overlap(spans) == 2


def test_function_tasks_get_their_inputs_and_a_remote_exception_comes_back_as_itself(
    head: Head,
) -> None:
    wf = Workflow("rows")
    wf.add("rows", lambda: [1, 2, 3, 4])
    # Rebuilt from its spec, as a resumed run would.
    wf.add("total", Registry().action(describe(ray_task(total, num_cpus=1))), after=["rows"])
    wf.add("bad", ray_task(bad_row), after=["rows"], retry=Retry(attempts=2, initial_delay=0))

    async def main() -> tuple[list[Event], Any]:
        async with RayCluster(head.address), Engine() as engine:
            events = await _collect(engine.iter(wf))
            return events, engine

    events, _ = asyncio.run(main())
    assert _succeeded(events)["total"] == 10
    retrying = [e for e in events if e.kind == "task_retrying"]
    failed = [e for e in events if e.kind == "task_failed"]
    assert [(e.task, e.error) for e in retrying] == [("bad", "ValueError: bad row 3")]
    assert [(e.task, e.error, e.error_type, e.attempts) for e in failed] == [
        ("bad", "ValueError: bad row 3", "ValueError", 2)
    ]


def test_a_remote_exception_keeps_the_remote_traceback_in_a_note(head: Head) -> None:
    wf = Workflow("note")
    wf.add("rows", lambda: [1, 2, 3])
    wf.add("bad", ray_task(bad_row), after=["rows"])

    async def main() -> Any:
        async with RayCluster(head.address), Engine() as engine:
            return await engine.run(wf)

    error = asyncio.run(main()).errors["bad"]
    assert type(error) is ValueError and str(error) == "bad row 3"
    assert error.__notes__[0].startswith("raised in Ray task note/bad, where its traceback")
    assert "in bad_row" in error.__notes__[0]


def test_a_killed_worker_makes_ray_run_the_task_again(head: Head, tmp_path: Path) -> None:
    stall_tool = Tool("stall", stall_first, runner=RayRunner(max_retries=1))
    wf = Workflow("kill")
    wf.add("stall", stall_tool.call({"marks": str(tmp_path)}))

    async def main() -> tuple[list[Event], int]:
        async with RayCluster(head.address), Engine() as engine:
            async with asyncio.TaskGroup() as tg:
                running = tg.create_task(_collect(engine.iter(wf)))
                await _wait_for(lambda: bool(_marks(tmp_path)), 60, "the task did not start")
                [killed] = _marks(tmp_path)
                os.kill(killed, signal.SIGKILL)
            return running.result(), killed

    events, killed = asyncio.run(main())
    pid = _succeeded(events)["stall"]
    assert pid != killed and sorted(int(p.name) for p in tmp_path.iterdir()) == sorted(
        [killed, pid]
    )
    # Ray retried it inside one attempt of the plait task.
    assert [e.kind for e in events if e.kind.startswith("task_")] == [
        "task_added", "task_ready", "task_started", "task_succeeded"
    ]  # fmt: skip


def test_a_worker_lost_past_rays_retries_fails_the_attempt_and_plait_retries_it(
    head: Head, tmp_path: Path
) -> None:
    stall_tool = Tool("stall", stall_first, runner=RayRunner(max_retries=0))
    wf = Workflow("lost")
    wf.add(
        "stall",
        stall_tool.call({"marks": str(tmp_path)}),
        retry=Retry(attempts=2, initial_delay=0, on=(RayWorkerLostError,)),
    )

    async def main() -> tuple[list[Event], int]:
        async with RayCluster(head.address), Engine() as engine:
            async with asyncio.TaskGroup() as tg:
                running = tg.create_task(_collect(engine.iter(wf)))
                await _wait_for(lambda: bool(_marks(tmp_path)), 60, "the task did not start")
                [killed] = _marks(tmp_path)
                os.kill(killed, signal.SIGKILL)
            return running.result(), killed

    events, killed = asyncio.run(main())
    retrying = [e for e in events if e.kind == "task_retrying"]
    assert len(retrying) == 1
    assert retrying[0].error.startswith(
        "RayWorkerLostError: task 'stall': the Ray worker running stall_first was lost "
        "(WorkerCrashedError: "
    )
    assert "max_retries=0" in retrying[0].error
    assert _succeeded(events)["stall"] != killed


def test_a_lost_worker_without_retries_fails_the_task_and_the_run_ends(
    head: Head, tmp_path: Path
) -> None:
    wf = Workflow("lost-once")
    wf.add("stall", ray_task(functools.partial(stall, str(tmp_path)), max_retries=0))

    async def main() -> Any:
        async with RayCluster(head.address), Engine() as engine:
            handle = engine.submit(wf)
            await _wait_for(lambda: bool(_marks(tmp_path)), 60, "the task did not start")
            [pid] = _marks(tmp_path)
            os.kill(pid, signal.SIGKILL)
            return await asyncio.wait_for(handle.result(), 60)

    result = asyncio.run(main())
    assert result.status == "failed"
    assert isinstance(result.errors["stall"], RayWorkerLostError)


def test_a_timed_out_task_cancels_its_ray_task_and_frees_its_worker(
    head: Head, tmp_path: Path
) -> None:
    wf = Workflow("slow")
    wf.add("stall", ray_task(functools.partial(stall, str(tmp_path))), timeout=4)

    async def main() -> Any:
        async with RayCluster(head.address), Engine() as engine:
            return await engine.run(wf)

    result = asyncio.run(main())
    assert isinstance(result.errors["stall"], TaskTimeoutError)
    marks = _marks(tmp_path)
    assert len(marks) == 1, "the Ray task had not started within the timeout; nothing to see"
    # ray.cancel(force=True) killed the worker that ran it.
    _poll(lambda: _gone(marks[0]), 30, "the worker running the task did not stop")


def test_the_example_counts_primes_on_the_cluster(head: Head) -> None:
    path = Path(__file__).resolve().parent.parent / "examples" / "ray_tools.py"
    spec = importlib.util.spec_from_file_location("example_ray_tools", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # not in sys.modules: Ray pickles its functions by value
    result = asyncio.run(example.main(head.address, limit=50_000, slices=4))
    assert result.ok and result["total"] == 5133  # the primes below 50,000
    assert [result[f"slice{i}"] for i in range(4)] == [1492, 1270, 1206, 1165]


# --- mistakes --------------------------------------------------------------------------------


def test_a_ray_task_without_a_connection_fails_with_a_usage_error() -> None:
    assert not ray.is_initialized()
    wf = Workflow("unconnected")
    wf.add("total", ray_task(total))

    async def main() -> Any:
        async with Engine() as engine:
            return await engine.run(wf)

    error = asyncio.run(main()).errors["total"]
    assert isinstance(error, UsageError)
    assert "not connected to a Ray cluster" in str(error) and "RayCluster(address)" in str(error)
    assert not ray.is_initialized()  # Ray did not start a cluster of its own


def test_a_ray_task_on_a_virtual_clock_is_refused(head: Head) -> None:
    clock = VirtualClock()
    wf = Workflow("virtual")
    wf.add("total", ray_task(total))

    async def main() -> Any:
        async with RayCluster(head.address), Engine(clock=clock) as engine:
            return await engine.run(wf)

    error = clock.run(main()).errors["total"]
    assert isinstance(error, UsageError) and "VirtualClock" in str(error)


def test_a_second_connection_is_refused(head: Head) -> None:
    async def main() -> None:
        async with RayCluster(head.address):
            with pytest.raises(UsageError, match="already connected to Ray"):
                async with RayCluster(head.address):
                    pass
        assert not ray.is_initialized()

    asyncio.run(main())


def test_an_address_where_no_head_node_listens_fails_at_once() -> None:
    # ray.init would wait for it for ever.
    async def main() -> None:
        async with RayCluster(f"127.0.0.1:{_free_port()}"):
            pass

    with pytest.raises(RayError, match=r"no Ray head node answers at '127\.0\.0\.1:\d+'"):
        asyncio.run(main())
    assert not ray.is_initialized()


def test_without_ray_installed_the_errors_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as when not installed
    wf = Workflow("noray")
    wf.add("total", ray_task(total))

    async def main() -> Any:
        with pytest.raises(UsageError, match=r"RayCluster needs Ray.*pip install 'plait\[ray\]'"):
            async with RayCluster("auto"):
                pass
        async with Engine() as engine:
            return await engine.run(wf)

    error = asyncio.run(main()).errors["total"]
    assert isinstance(error, UsageError) and "pip install 'plait[ray]'" in str(error)


def test_executors_imports_without_ray() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import executors, agents\n"
        "from executors import RayRunner, ray_task\n"
        "ray_task(len, num_cpus=2)\n"
        "assert sys.modules['ray'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_cpus": -1}, r"num_cpus=-1\) must be a finite number"),
        ({"num_gpus": math.inf}, r"num_gpus=inf\) must be a finite number"),
        ({"memory": 1.5}, r"memory=1.5\) must be a number of bytes"),
        ({"resources": {"CPU": 1}}, r"declare CPU with num_cpus="),
        ({"resources": {"highmem": -1}}, r"resources\['highmem'\]=-1\)"),
        ({"max_retries": -1}, r"max_retries=-1\) must be 0 or more"),
    ],
)
def test_runner_settings_are_checked(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        RayRunner(**settings)


def test_async_functions_cannot_run_on_ray() -> None:
    async def fetch() -> int:
        return 1

    async def lookup(key: str) -> str:
        return key

    with pytest.raises(UsageError, match="is async, and the 'ray' runner runs plain functions"):
        ray_task(fetch)
    with pytest.raises(UsageError, match="tool 'lookup': its function is async"):
        Tool("lookup", lookup, runner=RayRunner())


def test_a_runner_must_be_a_runner() -> None:
    with pytest.raises(UsageError, match="runner must be a Runner .* got str 'ray'"):
        FunctionAction(total, runner="ray")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="tool 'total': runner must be a Runner"):
        Tool("total", total, runner="ray")  # type: ignore[arg-type]


# --- the run's log ---------------------------------------------------------------------------


def test_a_ray_task_is_recorded_with_its_resources_and_rebuilt_from_them() -> None:
    action = ray_task(total, num_cpus=2, num_gpus=0.5, memory=MiB, resources={"highmem": 1})
    spec = describe(action)
    assert spec == ActionSpec(
        "function",
        f"{__name__}:total",
        {
            "runner": {
                "kind": "ray", "num_cpus": 2, "num_gpus": 0.5, "memory": MiB,
                "resources": {"highmem": 1}, "max_retries": 3,
            }
        },
    )  # fmt: skip
    rebuilt = Registry().action(spec)
    assert isinstance(rebuilt, FunctionAction) and rebuilt.runner == action.runner
    assert rebuilt.label == "function total on ray"
    # A plain function task stays a plain one.
    assert Registry().action(describe(FunctionAction(total))).runner is None


def test_a_runner_kind_nothing_provides_cannot_be_rebuilt() -> None:
    spec = ActionSpec("function", f"{__name__}:total", {"runner": {"kind": "dask"}})
    with pytest.raises(RebuildError, match="no installed package provides the runner kind 'dask'"):
        Registry().action(spec)
    spec = ActionSpec("function", f"{__name__}:total", {"runner": {"kind": "ray", "cpus": 2}})
    with pytest.raises(RebuildError, match="cannot be made from its recorded settings"):
        Registry().action(spec)
