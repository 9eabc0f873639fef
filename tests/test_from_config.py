"""`Engine.from_config`: one line from a config file to a running engine, and back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents import Agent
from orchestrator import Engine, UsageError, VirtualClock, Workflow

CONFIG = """\
[engine]
admission = "deadlines"
clock = "virtual"

[backends.default]
kind = "sim"
profile = "h100-llama3-8b"

[backends.default.limits]
max_in_flight = 7
"""


def _workflow() -> Workflow:
    wf = Workflow("asked")
    wf.add("ask", Agent("asker", "You answer.").ask("What is 2 + 2?"))
    return wf


def test_an_engine_comes_from_a_file_with_its_backends_open(tmp_path: Path) -> None:
    path = tmp_path / "plait.toml"
    path.write_text(CONFIG)
    clock = VirtualClock()

    async def main() -> tuple[object, ...]:
        async with Engine.from_config(path, clock=clock) as engine:
            server = engine.backends["default"]
            result = await engine.run(_workflow())
            running = server._driver is not None  # type: ignore[attr-defined]
            settings = (
                engine.policy.name,
                {r.name: r.max_in_flight for r in engine.admission.stats()}["default"],
                engine.urgency.gate is not None,
            )
        return result.status, running, server._driver is None, settings  # type: ignore[attr-defined]

    status, open_while_running, closed_after, settings = clock.run(main())
    assert status == "succeeded"
    assert open_while_running and closed_after  # the simulated server lived as long as it
    assert settings == ("slack", 7, True)


def test_a_store_path_makes_the_runs_durable(tmp_path: Path) -> None:
    """A store is opened and closed with the engine; it needs the system clock, so the
    backend here is a config dict's own with no latency to wait out."""
    from memory import SQLStore

    config = {"backends": {"default": {"kind": "sim", "profile": "h100-llama3-8b"}}}
    target = str(tmp_path / "runs.db")

    async def main() -> list[str]:
        async with Engine.from_config(config, store=target) as engine:
            workflow = Workflow("stored")
            workflow.add("one", lambda: 1)
            await engine.run(workflow)
        async with SQLStore(target) as store:
            return [row.name for row in await store.workflows()]

    assert asyncio.run(main()) == ["stored"]


def test_a_virtual_clock_in_the_file_asks_for_a_clock_to_drive(tmp_path: Path) -> None:
    path = tmp_path / "plait.toml"
    path.write_text(CONFIG)

    async def main() -> None:
        async with Engine.from_config(path):
            raise AssertionError("not reached")

    with pytest.raises(UsageError, match="clock=clock.*VirtualClock"):
        asyncio.run(main())


def test_a_bad_file_is_refused_before_anything_opens(tmp_path: Path) -> None:
    path = tmp_path / "plait.toml"
    path.write_text("[engine]\nadmission = 'fastest'\n")

    async def main() -> None:
        async with Engine.from_config(path):
            raise AssertionError("not reached")

    with pytest.raises(
        UsageError, match="engine.admission: Input should be 'deadlines', 'throughput' or 'off'"
    ):
        asyncio.run(main())
