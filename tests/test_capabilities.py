"""Wrappers answer for what they wrap: a `Router` and a `PrefixGrouper` declare every optional
capability and forward each to the backends that declare it, found once by protocol."""

from __future__ import annotations

from dataclasses import replace

import pytest

from executors import FunctionLLM, OpenAIBackend, PrefixGrouper, Router, echo
from orchestrator import Engine, LLMRequest, Message, VirtualClock
from orchestrator.ext import BackendUnavailableError, FailureIsolating, LoadReport
from orchestrator.model._llm import Capabilities, capabilities

REQUEST = LLMRequest((Message("user", "hello"),), "m", max_tokens=4)


class Probed(FunctionLLM):
    """A fake replica with a health probe, a load report and an ear for finished programs."""

    def __init__(self, report: LoadReport | None = None) -> None:
        super().__init__(echo)
        self.up = True
        self.report = report or LoadReport()
        self.probes = 0
        self.done: list[str] = []

    async def check(self) -> None:
        self.probes += 1
        if not self.up:
            raise BackendUnavailableError("connection refused")

    async def load(self) -> LoadReport:
        if not self.up:
            raise BackendUnavailableError("connection refused")
        return self.report

    async def program_done(self, program_id: str) -> None:
        self.done.append(program_id)


EVERYTHING = Capabilities(
    program_aware=True,
    health_checked=True,
    load_reporting=True,
    isolates_failures=True,
    capacity_reporting=True,
)


def test_wrappers_declare_every_capability_and_answer_as_what_they_wrap() -> None:
    fake = FunctionLLM(echo)
    assert capabilities(fake) == Capabilities()
    assert capabilities(Router({"a": fake})) == EVERYTHING
    # A grouper forwards what its backend has; over one without, check() passes and load()
    # and capacity() say nothing, and isolates_failures() and needs_wall_clock() answer as
    # the backend.
    forwarding = Capabilities(
        program_aware=True, health_checked=True, load_reporting=True, capacity_reporting=True
    )
    assert capabilities(PrefixGrouper(fake)) == forwarding
    grouped = capabilities(PrefixGrouper(Router({"a": fake})))
    assert grouped == EVERYTHING
    remote = OpenAIBackend("http://gpu:8000/v1")
    declared = replace(forwarding, needs_wall_clock=True)
    assert capabilities(remote) == declared
    assert capabilities(PrefixGrouper(remote)) == declared
    assert capabilities(Router({"a": remote, "b": fake})).needs_wall_clock


def test_isolates_failures_is_a_method_the_engine_calls() -> None:
    router = Router({"a": FunctionLLM(echo)})
    assert isinstance(router, FailureIsolating) and router.isolates_failures()
    assert not PrefixGrouper(FunctionLLM(echo)).isolates_failures()
    engine = Engine(backends={"plain": PrefixGrouper(FunctionLLM(echo)), "routed": router})
    assert engine.circuit("plain") is not None and engine.circuit("routed") is None


def test_a_grouper_forwards_health_and_load_so_a_router_above_sees_them(
    clock: VirtualClock,
) -> None:
    """The grouper used to drop `check()` and `load()`: a router over it never probed."""
    inner = {"a": Probed(LoadReport(running=3, waiting=1)), "b": Probed()}

    async def main() -> list[bool | None]:
        grouper = PrefixGrouper(inner["a"])
        assert await grouper.load() == LoadReport(running=3, waiting=1)
        inner["a"].up = False
        with pytest.raises(BackendUnavailableError):
            await grouper.check()
        inner["a"].up = True
        async with Router({"a": grouper, "b": inner["b"]}, health_interval_s=None) as router:
            passed = await router.check_health()
            assert {s.name: s.server_load for s in router.stats()} == {"a": 4, "b": 0}
            inner["a"].up = False
            return [*passed, *await router.check_health()]

    assert clock.run(main()) == [True, True, False, True]
    assert inner["a"].probes == 3  # once through the grouper alone, twice through the router


def test_a_router_is_healthy_while_one_replica_is(clock: VirtualClock) -> None:
    replicas = {"a": Probed(), "b": Probed()}

    async def main() -> None:
        async with Router(replicas, health_interval_s=None) as router:
            replicas["a"].up = False
            await router.check()  # b still serves
            assert [s.healthy for s in router.stats()] == [False, True]
            replicas["b"].up = False
            with pytest.raises(BackendUnavailableError, match="no replica .* healthy"):
                await router.check()
            replicas["a"].up = True
            await router.check()
            assert [s.healthy for s in router.stats()] == [True, False]

    clock.run(main())


def test_a_router_sums_its_replicas_load_reports(clock: VirtualClock) -> None:
    c = Probed(LoadReport(running=4, waiting=4))
    replicas = {
        "a": Probed(LoadReport(running=2, waiting=1, kv_cache_usage=0.5, prefix_cache_hits=10)),
        "b": Probed(LoadReport(running=1, kv_cache_usage=0.25, prefix_cache_hits=6)),
        "c": c,
        "quiet": FunctionLLM(echo),  # reports nothing and is left out
    }

    async def main() -> tuple[LoadReport, LoadReport]:
        router = Router(replicas, health_interval_s=None)
        total = await router.load()
        c.up = False  # a replica that cannot report is left out of the sum
        return total, await router.load()

    total, without_c = clock.run(main())
    assert total == LoadReport(
        running=7, waiting=5, kv_cache_usage=0.375, prefix_cache_hits=16, prefix_cache_queries=None
    )
    assert without_c == LoadReport(running=3, waiting=1, kv_cache_usage=0.375, prefix_cache_hits=16)


def test_a_router_with_no_reporting_replica_reports_unknowns_and_fails_when_all_fail(
    clock: VirtualClock,
) -> None:
    async def main() -> None:
        assert await Router({"a": FunctionLLM(echo)}).load() == LoadReport()
        down = Probed()
        down.up = False
        with pytest.raises(BackendUnavailableError):
            await Router({"a": down}).load()

    clock.run(main())


def test_program_done_reaches_the_replicas_that_want_it_through_every_wrapper(
    clock: VirtualClock,
) -> None:
    listening = Probed()

    async def main() -> None:
        router = Router({"a": listening, "b": FunctionLLM(echo)})
        await PrefixGrouper(router).program_done("p1")
        await PrefixGrouper(FunctionLLM(echo)).program_done("p2")  # nobody listens: harmless

    clock.run(main())
    assert listening.done == ["p1"]


def test_a_grouper_describes_itself_after_its_backend() -> None:
    from executors import SimServer

    assert PrefixGrouper(SimServer()).describe().startswith("simulated h100-llama3-8b: 0 requests")
    assert PrefixGrouper(FunctionLLM(echo)).describe() == "grouping held 0 of 0 calls"
