"""`GET /metrics`: the engine's figures in Prometheus' text format, read by Prometheus' own
parser: finished workflows and their completion times, deadlines met, retries, the share of
prompt tokens served from cache, queues and in-flight calls per backend, HTTP answers."""

from __future__ import annotations

import asyncio

from conftest import StoreFactory
from prometheus_client.parser import text_string_to_metric_families
from test_service import Api, Gate, on_stores

from agents import Agent
from executors import FunctionLLM, LaneTuning, echo
from orchestrator import Engine, Hints, LLMRequest, Message, Usage, VirtualClock, Workflow
from orchestrator.model._events import CallRetrying, TaskRetrying, TaskSucceeded, WorkflowFinished
from orchestrator.service._metrics import Metrics


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name and labels."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return samples


def L(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_metrics_count_workflows_deadlines_queues_and_requests(make_store: StoreFactory) -> None:
    async def body(api: Api) -> None:
        spec = {
            "name": "quick",
            "priority": "interactive",
            "deadline_s": 60,
            "tasks": [{"id": "a", "agent": "writer", "prompt": "hi"}],
        }
        status, accepted, _ = await api.call("POST", "/v1/workflows", spec)
        assert status == 202
        status, _, _ = await api.call("GET", f"/v1/workflows/{accepted['id']}/result?wait=30")
        assert status == 200
        held = {"name": "held", "tasks": [{"id": "g", "function": "gate"}]}
        status, _, _ = await api.call("POST", "/v1/workflows", held)
        assert status == 202
        assert Gate.reached is not None
        await Gate.reached.wait()
        status, _, _ = await api.call("GET", "/v1/workflows/nope")
        assert status == 404

        async with api.http.get(api.base + "/metrics") as r:  # no token: Prometheus scrapes
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            m = scrape(await r.text())
        done = L(priority="interactive", status="succeeded")
        assert m["plait_workflows_finished_total", done] == 1
        assert m["plait_workflow_duration_seconds_count", (("priority", "interactive"),)] == 1
        assert m["plait_deadlines_total", (("outcome", "met"),)] == 1
        assert m["plait_deadline_attainment", ()] == 1.0
        assert m["plait_workflows_running", ()] == 1
        assert m["plait_in_flight", (("resource", "local"),)] == 1  # the gate, holding its slot
        assert m["plait_in_flight", (("resource", "default"),)] == 0
        assert m["plait_queue_waiting", (("resource", "default"),)] == 0
        assert m["plait_in_flight_limit", (("resource", "default"),)] >= 1
        assert m["plait_tasks_finished_total", (("state", "succeeded"),)] == 1
        assert m["plait_prompt_tokens_total", ()] > 0
        route = (("method", "GET"), ("route", "/v1/workflows/{id}"), ("status", "404"))
        assert m["plait_http_requests_total", route] == 1
        accepted_route = (("method", "POST"), ("route", "/v1/workflows"), ("status", "202"))
        assert m["plait_http_requests_total", accepted_route] == 2
        assert not any("acme" in str(labels) for _, labels in m)  # no tenant in any series

    on_stores(make_store, body)


def test_retries_cache_share_and_missed_deadlines_are_counted() -> None:
    async def main() -> None:
        async with Engine(backends={"default": FunctionLLM(echo)}) as engine:
            metrics = Metrics(engine)
            usage = Usage(prompt_tokens=300, completion_tokens=5, cached_prompt_tokens=200)
            for event in [
                TaskRetrying(workflow="w", task="t", attempt=1, error="boom", delay=0.5, at=0),
                CallRetrying(
                    workflow="w", task="t", backend="gpu0", attempt=1, error="503", delay=1, at=0
                ),
                TaskSucceeded(workflow="w", task="t", duration=1, usage=usage, at=1),
                TaskSucceeded(workflow="w", task="u", duration=1, usage=Usage(100, 1), at=1),
                WorkflowFinished(
                    workflow="w", status="succeeded", duration=12.0, deadline_met=False, at=2
                ),
                WorkflowFinished(
                    workflow="v", status="failed", duration=0.2, deadline_met=True, at=2
                ),
            ]:
                metrics.observe(event)
            m = scrape(metrics.exposition().decode())
        assert m["plait_task_retries_total", ()] == 1
        assert m["plait_llm_call_retries_total", (("backend", "gpu0"),)] == 1
        assert m["plait_cache_hit_share", ()] == 0.5  # 200 of 400 prompt tokens
        assert m["plait_cached_prompt_tokens_total", ()] == 200
        assert m["plait_deadline_attainment", ()] == 0.5
        assert m["plait_deadlines_total", (("outcome", "missed"),)] == 1
        assert m["plait_workflows_finished_total", L(priority="unknown", status="failed")] == 1
        jct = "plait_workflow_duration_seconds_bucket"
        assert m[jct, L(le="30.0", priority="unknown")] == 2
        assert m[jct, L(le="10.0", priority="unknown")] == 1

    asyncio.run(main())


def test_cluster_figures_leases_shared_limits_and_router_peers(make_store: StoreFactory) -> None:
    """An engine of a cluster (leases on the store, a shared limit, a router joined to a
    peer's): its heartbeats, its share and its router's messages are on /metrics; an engine
    outside a cluster shows none of them."""
    from executors import LocalRouterHub, Router
    from orchestrator import Cluster, SystemClock
    from orchestrator.cluster._slots import LocalSlots

    async def main() -> tuple[dict[tuple[str, tuple[tuple[str, str], ...]], float], set[str]]:
        hub = LocalRouterHub(0.0)
        replicas = {"r0": FunctionLLM(echo), "r1": FunctionLLM(echo)}
        mine = Router(replicas, health_interval_s=None, peers=hub.link())
        peer = Router(replicas, health_interval_s=None, peers=hub.link())
        async with make_store() as store, mine, peer:
            engine = Engine(
                backends={"gpu": mine},
                store=store,
                cluster=Cluster(
                    lease_s=0.4, engine_id="e1", share_limits=LocalSlots(SystemClock())
                ),
            )
            async with engine:
                assert engine.leases is not None
                await engine.leases.beat()
                hints = Hints(program_id="p")
                await peer.complete(LLMRequest((Message("user", "hello there"),), "m"), hints)
                await mine.complete(LLMRequest((Message("user", "and you"),), "m"), hints)
                await asyncio.sleep(0)  # the hub delivers after 0 s: on the next turn
                m = scrape(Metrics(engine).exposition().decode())
            async with Engine(backends={"gpu": FunctionLLM(echo)}) as solo:
                names = {name for name, _ in scrape(Metrics(solo).exposition().decode())}
        return m, names

    m, solo = asyncio.run(main())
    assert m["plait_cluster_renewals_total", ()] >= 1
    assert m["plait_cluster_renewal_failures_total", ()] == 0
    assert m["plait_cluster_lost_total", ()] == 0
    assert m["plait_shared_limit_share", (("resource", "gpu"),)] >= 1
    assert m["plait_router_peer_messages_total", L(direction="published", resource="gpu")] >= 1
    assert m["plait_router_peer_messages_total", L(direction="received", resource="gpu")] >= 1
    assert not any(n.startswith(("plait_cluster_", "plait_shared_", "plait_router_")) for n in solo)


def test_the_knee_and_the_deadline_gate_are_on_metrics() -> None:
    """Admission's learned figures: a run with a deadline in flight counts at the gate,
    and each backend's caps are there from the start (the knee once it is learned)."""

    async def main() -> None:
        called, answered = asyncio.Event(), asyncio.Event()

        async def slow(request: LLMRequest, hints: Hints) -> str:
            called.set()
            await answered.wait()
            return "ok"

        async with Engine(backends={"default": FunctionLLM(slow)}) as engine:
            metrics = Metrics(engine)
            wf = Workflow("w")
            wf.add("a", Agent("a", "You answer.").ask("hi"))
            handle = engine.submit(wf, deadline=60.0, priority="interactive")
            await called.wait()  # the gate let the run in: its call reached the backend
            m = scrape(metrics.exposition().decode())
            assert m["plait_gate_in_flight", ()] == 1
            assert m["plait_gate_waiting", ()] == 0
            assert m["plait_gate_late_waiting", ()] == 0
            assert m["plait_gate_held_total", ()] == 0
            assert m["plait_gate_hopeless_total", ()] == 0
            assert ("plait_gate_cap", ()) not in m  # nothing learned yet: no cap
            limit = m["plait_in_flight_limit", (("resource", "default"),)]
            assert m["plait_headroom_cap", L(case="alone", resource="default")] <= limit
            assert m["plait_headroom_cap", L(case="urgent", resource="default")] <= limit
            assert ("plait_headroom_knee", (("resource", "default"),)) not in m
            answered.set()
            assert (await handle.result()).ok
            m = scrape(metrics.exposition().decode())
            assert m["plait_gate_in_flight", ()] == 0

    asyncio.run(main())


def test_a_routers_urgent_lanes_are_on_metrics() -> None:
    """`plait_router_lanes`: none while only batch work runs, one once an interactive run's
    call is in flight beside it ("auto" lanes, the default), none once both have been
    gone for longer than `LaneTuning.quiet_s` (virtual time)."""
    from executors import Router

    clock = VirtualClock()

    async def main() -> list[float]:
        called, answered = asyncio.Event(), asyncio.Event()

        async def held(request: LLMRequest, hints: Hints) -> str:
            called.set()
            await answered.wait()
            return "ok"

        replicas = {f"r{i}": FunctionLLM(held) for i in range(3)}
        router = Router(
            replicas, health_interval_s=None, lanes=LaneTuning(quiet_s=1.0), clock=clock
        )
        seen = []
        async with Engine(backends={"default": router}, clock=clock) as engine:
            metrics = Metrics(engine)

            def lanes() -> float:
                return scrape(metrics.exposition().decode())[
                    "plait_router_lanes", (("resource", "default"),)
                ]

            seen.append(lanes())
            batch = Workflow("rows")
            batch.add("a", Agent("a", "You answer.").ask("row"))
            rows = engine.submit(batch)
            await called.wait()
            seen.append(lanes())  # batch work only
            called.clear()
            query = Workflow("query")
            query.add("a", Agent("a", "You answer.").ask("question"))
            asked = engine.submit(query, priority="interactive")
            await called.wait()
            seen.append(lanes())  # both around
            caps = scrape(metrics.exposition().decode())
            for case in ("urgent", "alone"):  # no knee over the lanes: the reserve (2 of 32)
                assert caps["plait_headroom_cap", L(case=case, resource="default")] == 30
            assert engine.stats().reserve_caps == (("default", 30),)
            answered.set()
            assert (await rows.result()).ok and (await asked.result()).ok
            await clock.sleep(2.0)  # quiet for longer than the quiet time
            seen.append(lanes())
        return seen

    assert clock.run(main()) == [0, 0, 1, 0]
