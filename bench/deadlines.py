"""Deadlines that hold while batch work fills the GPUs (docs/admission.md).

Part 1: text-to-SQL queries with deadlines (interactive, 12-24 s each) arrive while a batch
job of document x question rows runs, on simulated replicas of `h100-llama3-8b` in virtual
time. Three ways to run the same programs and arrivals:

- naive: every call sent as soon as it is ready, no hints, round-robin over replicas;
- priority-only: plait (`slack` policy, prefix routing), the queries' urgency sent to the
  servers (which order their queues by it), nothing held back
  (`AdmissionTuning(headroom=None, gate=None)`, `Router(lanes=NO_LANES)`);
- plait, the defaults: the router keeps urgent lanes as the urgent load needs while batch
  work is around too (`Router()`'s default: one replica here, with no batch call
  on it while queries are around), and queries start in deadline order, as many at
  once as meets the most deadlines (the default `DeadlineGate`);
- plait, no lane: the same without lanes (`NO_LANES`): slack-rich work held back to
  the backend's learned throughput knee while urgent work is around (`Engine()`'s default
  `Headroom`).

Three rows keep one replica as an urgent lane whatever the load (`LaneTuning(lanes=1)`):
"plait + lane" lets at most 2 batch calls onto it while queries are around, "lane,
programs" the calls of one batch program, and "lane, paced" the same with that program's
uncached prompt computed in pieces of 128 tokens first (`LaneTuning(prefill_tokens=...)`); `--lane
P:N` adds rows for other settings.

Reported: the queries' deadline attainment, and the batch's throughput relative to the batch
alone (the fastest of the modes running it alone; each mode's own alone run too); an
estimate of the most batch share any schedule could keep while meeting the target share of
deadlines (`Ceiling`; docs/decisions/admission-figures.md, "How far a lane can go"); and the
share a lane that takes no batch work leaves the batch (`Ceiling.whole_lane`: the queries
alone on one replica, the batch on the others until they end).

Part 2: text-to-SQL alone on one replica, at the first rate (1.0, 1.1, 1.2, ... queries/s)
where naive attains under 0.5, against priority-only and plait (hopeless deadlines demoted
and held; runs judged late while waiting to start, fewer than 70% of runs at the present
load making it in their time left, go behind the rest and start only into spare room),
plait with an earlier gate (`DeadlineGate(late_in_flight=1, likely=0.5, min_seen=10)`:
late judged by the median, one late run kept going through an overload, nothing held until
ten runs ended), and
plait with the queries submitted `late="cancel"` (a query that cannot make its deadline at
the present load is shed while it waits to start, and one still running at its deadline
is cancelled; both count as misses; JCT figures are over the queries answered), and the
same without the deadline gate (every query started at once), to show what it adds.

    python bench/deadlines.py --quick    # 2,000 batch rows; about a minute
    python bench/deadlines.py            # 10,000 batch rows; a few minutes
    python bench/deadlines.py --part 2 --seed 3   # one part, another sample
    python bench/deadlines.py --part 1 --lane 2:128 --lane 2:-   # more lane settings

The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

_BENCH = Path(__file__).resolve().parent
for _path in (str(_BENCH), str(_BENCH.parent)):
    if _path not in sys.path:
        sys.path.insert(1, _path)

import _results  # noqa: E402
from _harness import (  # noqa: E402
    Outcome,
    Report,
    Runner,
    as_workflow,
    run_naive,
    simulate,
)

from executors import LaneTuning, Router, SimServer, get_profile  # noqa: E402
from orchestrator import Clock, Engine, KeepAlive, Limits, LLMBackend  # noqa: E402
from orchestrator.admission._gate import DEFAULT_GATE, GateStats  # noqa: E402
from orchestrator.admission._knee import DEFAULT_HEADROOM, KneeStats  # noqa: E402
from orchestrator.ext import AdmissionTuning, DeadlineGate, Headroom  # noqa: E402
from workloads import LLMStep, Program, batch_programs, sql_programs  # noqa: E402

PROFILE = "h100-llama3-8b"
REPLICAS = 4
PER_REPLICA = 256
"""plait's in-flight limit per replica: the simulated server's max_num_seqs."""
TARGET_ATTAINMENT = 0.95
TARGET_SHARE = 0.85
"""Part 1's targets (issue 12): this share of deadlines met, with the batch at this share of
its throughput alone."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(slots=True)
class Seen:
    """What a plait run learned (its knee), kept for the report."""

    knees: tuple[KneeStats, ...] = ()
    gate: GateStats | None = None
    hopeless: int = 0
    hopeless_met: int = 0
    """Of those found hopeless, the ones that met their deadline after all."""
    shed: int = 0
    """Queries cancelled by `late="cancel"` (shed at submission or at their deadline)."""


def plait_mixed(
    headroom: Headroom | None,
    seen: Seen | None = None,
    lanes: int | Literal["auto"] = "auto",
    late: bool = False,
    gate: DeadlineGate | None = DEFAULT_GATE,
    lane_programs: int | None = None,
    lane_prefill: int | None = None,
    lane_calls: int = 0,
    lane_share: int | None = None,
) -> Runner:
    """plait with the `slack` policy: queries (programs with a deadline) as interactive,
    the rest as batch; `headroom` and `gate` None is priority-only (nothing held back).
    `lanes`: the router keeps that many replicas for urgent calls (`LaneTuning(lanes=...)`;
    "auto", the default: as many as the urgent load needs while batch work is around too);
    `lane_programs`: a lane takes the calls of that many batch
    programs at once instead of a count of calls (`LaneTuning(batch_programs=...)`);
    `lane_prefill`: their uncached prompts are sent ahead in pieces of that many tokens
    (`LaneTuning(prefill_tokens=...)`); `lane_calls`: else the batch calls a lane takes at
    once (`LaneTuning(batch_in_flight=...)`, 0 by default); `lane_share`: the batch calls
    a lane takes beside queries with slack to spare (`LaneTuning(share_calls=...)`; None:
    the router's default).
    `late`: queries are submitted with `late="cancel"` (shed when they cannot make their
    deadline at the present load, cancelled when it passes); a cancelled query counts as a
    miss."""

    async def run(
        programs: Sequence[Program], servers: Sequence[LLMBackend], clock: Clock
    ) -> list[Outcome]:
        backend: LLMBackend = servers[0]
        if len(servers) > 1:
            backend = Router(  # its block and cache as the servers say them
                {f"replica{i}": s for i, s in enumerate(servers)},
                lanes=LaneTuning(
                    lanes=lanes,
                    batch_in_flight=lane_calls,
                    batch_programs=lane_programs,
                    prefill_tokens=lane_prefill,
                    **({} if lane_share is None else {"share_calls": lane_share}),
                ),
            )
        limits = {"default": Limits(PER_REPLICA * len(servers)), "tools": Limits(100_000)}
        outcomes: list[Outcome] = []
        async with Engine(
            backends={"default": backend},
            admission=AdmissionTuning(order="slack", headroom=headroom, gate=gate),
            clock=clock,
            limits=limits,
            keep_alive=KeepAlive(),
        ) as engine:

            async def one(program: Program) -> None:
                await clock.sleep(max(0.0, program.arrival - clock.monotonic()))
                urgent = program.deadline is not None
                result = await engine.run(
                    as_workflow(program, name=program.kind),
                    deadline=program.deadline,
                    priority="interactive" if urgent else "batch",
                    late="cancel" if late and urgent else "finish",
                )
                if late and urgent and result.status == "cancelled":
                    if seen is not None:
                        seen.shed += 1
                    outcomes.append(
                        Outcome(program.id, program.arrival, clock.monotonic(), program.deadline,
                                dropped=True)
                    )  # fmt: skip
                    return
                if not result.ok:
                    raise RuntimeError(f"{program.id} {result.status}: {dict(result.failures)}")
                if seen is not None and result.hopeless_at is not None:
                    seen.hopeless += 1
                    seen.hopeless_met += bool(result.deadline_met)
                outcomes.append(
                    Outcome(program.id, program.arrival, clock.monotonic(), program.deadline)
                )

            async with asyncio.TaskGroup() as tg:
                for program in programs:
                    tg.create_task(one(program))
            if seen is not None:
                seen.knees = engine.stats().knees
                seen.gate = engine.stats().gate
        return sorted(outcomes, key=lambda o: o.arrival)

    return run


@dataclass(frozen=True, slots=True)
class Mixed:
    mode: str
    attainment: float
    sql_mean_jct: float
    sql_p95_jct: float
    batch_makespan: float
    alone_makespan: float

    def share(self, reference: float) -> float:
        return reference / self.batch_makespan


def split(outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[Outcome]]:
    sql = [o for o in outcomes if o.deadline is not None]
    batch = [o for o in outcomes if o.deadline is None]
    return sql, batch


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(0.95 * len(ordered)) - 1))]


def outcomes_of(
    programs: Sequence[Program], runner: Runner, replicas: int, mode: str
) -> tuple[list[Outcome], Report]:
    """The programs' outcomes, and the run's report (its servers' busy time and steps)."""
    kept: list[Outcome] = []

    async def keep(
        programs: Sequence[Program], servers: Sequence[SimServer], clock: Clock
    ) -> list[Outcome]:
        out = await runner(programs, servers, clock)
        kept.extend(out)
        return out

    report = simulate(programs, keep, profile=PROFILE, replicas=replicas, mode=mode)
    return kept, report


@dataclass(frozen=True, slots=True)
class Window:
    """A query's window, arrival to deadline, and the steps it needs in it beyond the
    batch's own: its critical tokens, less the steps the batch's own rate puts there."""

    start: float
    end: float
    need: float


@dataclass(frozen=True, slots=True)
class Ceiling:
    """An estimate of the most batch share a schedule could keep while meeting the target
    share of deadlines, on the simulator's cost model (docs/decisions/admission-figures.md,
    "How far a lane can go"). The batch ends at M only if the servers' time up to M holds the
    batch's own busy time, the tokens of every query that must end by M (deadline by M, not one of
    those let miss), and, since every step has a fixed cost, the steps those queries need beyond the
    batch's own. It counts only the steps of queries whose windows do not overlap (leaning high) and
    each query's tokens as the mean query's (either way): an estimate, not a bound."""

    reference: float
    replicas: int
    batch_busy_s: float
    """Replica-seconds the fastest batch-alone run kept its servers busy."""
    query_work_s: float
    """Replica-seconds of the queries' own tokens: their busy time alone on one replica, less
    each step's fixed cost."""
    step_s: float
    batch_savings: int
    """Steps the batch could save at most: its steps alone less its output tokens over the
    server's `max_num_seqs` (every step full)."""
    windows: tuple[Window, ...]
    misses: int
    """Queries that may miss at the target attainment."""
    lane_attainment: float
    """The queries' deadline attainment alone on one replica: the most a lane of one
    replica can give them."""
    lane_busy_s: float
    """How long the queries alone keep that replica busy."""
    lane_until: float
    """When the last of them ends there (from the batch's start)."""

    def _cost(self, due: Sequence[Window], steps: bool) -> float | None:
        """Replica-seconds the queries `due` cost the batch: the tokens of those met, and
        (`steps`) the fixed cost of the steps they need beyond the batch's own. None: too
        many ways to choose the misses (`least_need`)."""
        met = max(0, len(due) - self.misses)
        cost = self.query_work_s / max(1, len(self.windows)) * met
        if not steps:
            return cost
        need = least_need(due, min(self.misses, len(due)))
        if need is None:
            return None
        return cost + self.step_s * max(0.0, need - self.batch_savings)

    @property
    def steady(self) -> float | None:
        """The ceiling with every query due by the batch's end (with the steps they need),
        as for a batch that outlasts the queries: what a lane can keep while they come.
        None: too many ways to choose the misses (`least_need`)."""
        cost = self._cost(self.windows, steps=True)
        if cost is None:
            return None
        return self.reference / max(self.reference, (self.batch_busy_s + cost) / self.replicas)

    @property
    def whole_lane(self) -> float:
        """The batch share if one replica is given whole to the queries until the last of
        them ends (as alone on it) and the batch has the others, then all of them: what a
        lane that takes no batch work keeps."""
        others = (self.replicas - 1) * self.lane_until
        if self.batch_busy_s <= others:
            makespan = self.batch_busy_s / (self.replicas - 1)
        else:
            makespan = self.lane_until + (self.batch_busy_s - others) / self.replicas
        return self.reference / max(self.reference, makespan)

    def share(self, steps: bool) -> float | None:
        """The ceiling: the fastest batch alone over the least makespan M that holds what
        must be done by M; `steps`: counting the fixed cost of the steps queries need (else
        their tokens only; None: too many ways to choose the misses)."""
        ends = sorted({w.end for w in self.windows})
        lowest = max(self.reference, self.batch_busy_s / self.replicas)
        cost = 0.0
        for i, at in enumerate([0.0, *ends]):
            if i:
                due = self._cost([w for w in self.windows if w.end <= at], steps)
                if due is None:
                    return None
                cost = due
            makespan = max(at, (self.batch_busy_s + cost) / self.replicas, lowest)
            if i == len(ends) or makespan < ends[i]:
                return self.reference / makespan
        raise AssertionError("unreachable: the last piece has no end")


def most_need(windows: Sequence[Window]) -> tuple[float, list[Window]]:
    """The most steps any set of windows that do not overlap needs (they cannot share a
    step), and that set."""
    by_end = sorted(windows, key=lambda w: w.end)
    ends = [w.end for w in by_end]
    best: list[tuple[float, list[Window]]] = [(0.0, [])]
    for j, w in enumerate(by_end):
        before = best[bisect.bisect_right(ends, w.start, 0, j)]
        with_it = (before[0] + w.need, [*before[1], w])
        best.append(with_it if with_it[0] > best[j][0] else best[j])
    return best[-1]


MAX_TRIED = 20_000
"""Sets of misses `least_need` tries at most (about a second and a half; the sets grow
steeply with the misses: 6 of 120 queries take a few hundred, 12 of 240 tens of thousands)."""


class _TooMany(Exception):
    pass


def least_need(windows: Sequence[Window], misses: int) -> float | None:
    """`most_need`, least over which `misses` queries are let miss. Letting a query miss
    only lowers the need if it is in the set that needs the most, so only those are tried;
    each set of misses is tried once, whatever the order it was reached in. None if that
    is more than `MAX_TRIED` sets."""
    seen: dict[frozenset[int], float] = {}

    def least(missed: frozenset[int], left: int) -> float:
        if missed in seen:
            return seen[missed]
        if len(seen) >= MAX_TRIED:
            raise _TooMany
        kept = [w for i, w in enumerate(windows) if i not in missed]
        need, chosen = most_need(kept)
        if left > 0 and need > 0.0:
            index = {id(w): i for i, w in enumerate(windows)}
            need = min(least(missed | {index[id(c)]}, left - 1) for c in chosen)
        seen[missed] = need
        return need

    try:
        return least(frozenset(), misses)
    except _TooMany:
        return None


def critical_tokens(program: Program) -> int:
    """Output tokens on the program's longest chain of calls: the steps it needs one after
    another (a call's prefill step gives its first token)."""
    steps = {s.id: s for s in program.steps if isinstance(s, LLMStep)}
    longest: dict[str, int] = {}

    def chain(step_id: str) -> int:
        if step_id not in longest:
            step = steps[step_id]
            longest[step_id] = step.max_tokens + max(
                (chain(a) for a in step.after if a in steps), default=0
            )
        return longest[step_id]

    return max((chain(s) for s in steps), default=0)


def ceiling(
    batch: Sequence[Program],
    sql: Sequence[Program],
    alone: Report,
    reference: float,
    attainment: float = TARGET_ATTAINMENT,
) -> Ceiling:
    """`alone`: the fastest batch-alone run. Runs the queries alone on one replica for
    their own tokens."""
    profile = get_profile(PROFILE)
    by_itself = simulate(sql, plait_mixed(DEFAULT_HEADROOM), profile=PROFILE, mode="sql alone")
    query_work = by_itself.server.busy_s - profile.step_overhead_s * by_itself.server.steps
    batch_tokens = sum(s.max_tokens for p in batch for s in p.steps if isinstance(s, LLMStep))
    least = math.ceil(batch_tokens / profile.max_num_seqs)
    rate = alone.server.steps / (REPLICAS * reference)
    windows = tuple(
        Window(p.arrival, p.arrival + p.deadline, max(0.0, critical_tokens(p) - rate * p.deadline))
        for p in sql
        if p.deadline is not None
    )
    return Ceiling(
        reference=reference,
        replicas=REPLICAS,
        batch_busy_s=alone.server.busy_s,
        query_work_s=query_work,
        step_s=profile.step_overhead_s,
        batch_savings=max(0, alone.server.steps - least),
        windows=windows,
        misses=len(windows) - math.ceil(attainment * len(windows) - 1e-9),
        lane_attainment=by_itself.deadline_attainment,
        lane_busy_s=by_itself.server.busy_s,
        lane_until=min(p.arrival for p in sql) + by_itself.makespan,
    )


PACED = 128
"""The paced row's `lane_prefill_tokens` (with one program on the lane): the best trade of
the sweep in docs/admission.md ("Paced prefill on lanes")."""


def lane_mode(programs: int, prefill: int | None) -> str:
    return f"lane {programs}p {prefill}t" if prefill else f"lane {programs}p"


def part1(
    rows: int, rate: float, seed: int, lanes: Sequence[tuple[int, int | None]] = ()
) -> tuple[dict[str, Mixed], float, Seen, int, Ceiling]:
    documents, questions = rows // 10, 10
    batch = batch_programs(documents, questions, seed=seed)
    seen = Seen()
    runners: dict[str, Runner] = {
        "naive": run_naive,
        "priority-only": plait_mixed(None, gate=None, lanes=0),
        "plait": plait_mixed(DEFAULT_HEADROOM),
        "plait, no lane": plait_mixed(DEFAULT_HEADROOM, seen, lanes=0),
        "plait + lane": plait_mixed(DEFAULT_HEADROOM, lanes=1, lane_calls=2, lane_share=0),
        "lane, programs": plait_mixed(DEFAULT_HEADROOM, lanes=1, lane_programs=1),
        "lane, paced": plait_mixed(DEFAULT_HEADROOM, lanes=1, lane_programs=1, lane_prefill=PACED),
    }
    for programs, prefill in lanes:
        runners[lane_mode(programs, prefill)] = plait_mixed(
            DEFAULT_HEADROOM, lanes=1, lane_programs=programs, lane_prefill=prefill
        )
    alone: dict[str, float] = {}
    reports: dict[str, Report] = {}
    for mode, runner in runners.items():
        started = time.perf_counter()
        out, reports[mode] = outcomes_of(batch, runner, REPLICAS, f"{mode}-alone")
        alone[mode] = max(o.finished for o in out)
        log(f"  batch alone, {mode}: {alone[mode]:.1f} s ({time.perf_counter() - started:.1f} s)")
    fastest = min(alone, key=lambda mode: alone[mode])
    reference = alone[fastest]
    # Queries arrive throughout the batch's run (as long as the fastest batch alone).
    n_sql = max(1, round(rate * reference))
    sql = sql_programs(n_sql, rate=rate, seed=seed)
    bound = ceiling(batch, sql, reports[fastest], reference)
    mixed: dict[str, Mixed] = {}
    for mode, runner in runners.items():
        started = time.perf_counter()
        out, _ = outcomes_of([*batch, *sql], runner, REPLICAS, mode)
        queries, rows_done = split(out)
        jcts = [o.jct for o in queries]
        mixed[mode] = Mixed(
            mode=mode,
            attainment=sum(o.met_deadline for o in queries) / len(queries),
            sql_mean_jct=sum(jcts) / len(jcts),
            sql_p95_jct=p95(jcts),
            batch_makespan=max(o.finished for o in rows_done),
            alone_makespan=alone[mode],
        )
        m = mixed[mode]
        log(
            f"  mixed, {mode}: attainment {m.attainment:.3f}, query JCT mean "
            f"{m.sql_mean_jct:.1f} s p95 {m.sql_p95_jct:.1f} s, batch {m.batch_makespan:.1f} s "
            f"({m.share(reference):.3f}x of the fastest alone) "
            f"({time.perf_counter() - started:.1f} s)"
        )
    return mixed, reference, seen, n_sql, bound


def part2(n: int, rates: Sequence[float], seed: int) -> dict[str, object]:
    sweep = []
    chosen = None
    for rate in rates:
        programs = sql_programs(n, rate=rate, seed=seed)
        naive = simulate(programs, run_naive, profile=PROFILE, seed=seed, mode="naive")
        log(f"  rate {rate}/s: naive attainment {naive.deadline_attainment:.3f}")
        sweep.append({"rate": rate, "naive": round(naive.deadline_attainment, 4)})
        if naive.deadline_attainment < 0.5:
            chosen = (rate, programs, naive)
            break
    if chosen is None:
        raise SystemExit(f"naive attained 0.5 or more at every rate of {list(rates)}")
    rate, programs, naive = chosen
    seen = Seen()
    priority = simulate(
        programs, plait_mixed(None, gate=None), profile=PROFILE, seed=seed, mode="prio"
    )
    plait = simulate(
        programs, plait_mixed(DEFAULT_HEADROOM, seen), profile=PROFILE, seed=seed, mode="plait"
    )
    # As before the fifth session of 2026-11-26: late judged by the median, one late run
    # kept going whatever else waits, nothing held until ten runs ended.
    kept = simulate(
        programs,
        plait_mixed(DEFAULT_HEADROOM, gate=DeadlineGate(late_in_flight=1, likely=0.5, min_seen=10)),
        profile=PROFILE,
        seed=seed,
        mode="plait, late kept going",
    )
    shed = Seen()
    shedding = simulate(
        programs,
        plait_mixed(DEFAULT_HEADROOM, shed, late=True),
        profile=PROFILE,
        seed=seed,
        mode="plait, late=cancel",
    )
    # The same without the deadline gate (every query starts at once): what the gate adds.
    ungated = simulate(
        programs,
        plait_mixed(DEFAULT_HEADROOM, late=True, gate=None),
        profile=PROFILE,
        seed=seed,
        mode="plait, late=cancel, no gate",
    )
    log(
        f"  at {rate}/s: naive {naive.deadline_attainment:.3f}, priority-only "
        f"{priority.deadline_attainment:.3f}, plait {plait.deadline_attainment:.3f} "
        f"({seen.hopeless} runs found hopeless, {seen.hopeless_met} of them met their deadline "
        f"after all), one late run kept going {kept.deadline_attainment:.3f}, "
        f"plait with late='cancel' "
        f"{shedding.deadline_attainment:.3f} ({shed.shed} queries given up; gate: {shed.gate}), "
        f"without the gate {ungated.deadline_attainment:.3f}"
    )
    return {
        "rate": rate,
        "programs": n,
        "naive": naive,
        "priority": priority,
        "plait": plait,
        "kept": kept,
        "shedding": shedding,
        "ungated": ungated,
        "shed": shed.shed,
        "gate": shed.gate,
        "hopeless": seen.hopeless,
        "hopeless_met": seen.hopeless_met,
        "knees": seen.knees,
        "sweep": sweep,
    }


def report_part1(
    rows: int,
    rate: float,
    mixed: dict[str, Mixed],
    reference: float,
    seen: Seen,
    n_sql: int,
    bound: Ceiling,
) -> dict[str, object]:
    print(
        f"\nPart 1: {rows:,} batch rows + {n_sql} text-to-SQL queries at {rate}/s, "
        f"{REPLICAS} x {PROFILE} (simulated); batch alone: {reference:.1f} s (fastest mode)"
    )
    print(f"{'mode':<14} {'attain.':>7} {'JCT mean':>8} {'JCT p95':>8} {'batch s':>8} "
          f"{'share':>6} {'own alone':>9}")  # fmt: skip
    for m in mixed.values():
        print(
            f"{m.mode:<14} {m.attainment:>7.3f} {m.sql_mean_jct:>8.1f} {m.sql_p95_jct:>8.1f} "
            f"{m.batch_makespan:>8.1f} {m.share(reference):>6.3f} "
            f"{m.share(m.alone_makespan):>9.3f}"
        )
    for knee in seen.knees:
        print(
            f"plait learned for {knee.backend!r}: {knee.samples} calls over {knee.levels} "
            f"levels; per-token latency {knee.base_s_per_token or 0:.4f} + "
            f"{knee.per_call_s_per_token or 0:.2e} x in-flight s; knee {knee.knee} of "
            f"{knee.limit} (cap {knee.cap_urgent} with urgent work, {knee.cap_alone} without)"
        )
    tokens, with_steps, steady = bound.share(steps=False), bound.share(steps=True), bound.steady

    def shown(share: float | None) -> str:
        return (
            "(not estimated: too many ways to choose the misses)"
            if share is None
            else (f"{share:.3f}x")
        )

    print(
        f"ceiling (an estimate, docs/decisions/admission-figures.md): the queries' own tokens take "
        f"{bound.query_work_s:.1f} replica-s beside the batch's {bound.batch_busy_s:.1f}: "
        f"at most {shown(tokens)}; with the fixed cost of the steps that meeting "
        f"{TARGET_ATTAINMENT} of the deadlines needs, at most {shown(with_steps)} (target "
        f"{TARGET_SHARE}); {shown(steady)} if every query were due by the batch's end"
    )
    print(
        f"a replica given whole to the queries: alone on it they attain "
        f"{bound.lane_attainment:.3f} and keep it busy {bound.lane_busy_s:.1f} s of the "
        f"{bound.lane_until:.1f} s until the last ends "
        f"({bound.lane_busy_s / bound.lane_until:.0%}); "
        f"the batch on the other replicas until then keeps {bound.whole_lane:.3f}x"
    )
    plait = mixed["plait"]
    return {
        "interactive_attainment": round(plait.attainment, 4),
        "batch_throughput_share": round(plait.share(reference), 4),
        "batch_throughput_share_own_alone": round(plait.share(plait.alone_makespan), 4),
        "interactive_attainment_no_lane": round(mixed["plait, no lane"].attainment, 4),
        "batch_throughput_share_no_lane": round(mixed["plait, no lane"].share(reference), 4),
        "interactive_attainment_lane": round(mixed["plait + lane"].attainment, 4),
        "batch_throughput_share_lane": round(mixed["plait + lane"].share(reference), 4),
        "interactive_attainment_lane_programs": round(mixed["lane, programs"].attainment, 4),
        "batch_throughput_share_lane_programs": round(mixed["lane, programs"].share(reference), 4),
        "interactive_attainment_lane_paced": round(mixed["lane, paced"].attainment, 4),
        "batch_throughput_share_lane_paced": round(mixed["lane, paced"].share(reference), 4),
        "lane_paced_prefill_tokens": PACED,
        "lane_sweep": {
            m.mode: [round(m.attainment, 4), round(m.share(reference), 4)]
            for m in mixed.values()
            if m.mode.startswith("lane ")
        },
        "interactive_attainment_naive": round(mixed["naive"].attainment, 4),
        "interactive_attainment_priority_only": round(mixed["priority-only"].attainment, 4),
        "batch_throughput_share_naive": round(mixed["naive"].share(reference), 4),
        "batch_throughput_share_priority_only": round(mixed["priority-only"].share(reference), 4),
        "batch_share_ceiling_tokens": None if tokens is None else round(tokens, 4),
        "batch_share_ceiling": None if with_steps is None else round(with_steps, 4),
        "batch_share_ceiling_all_due": None if steady is None else round(steady, 4),
        "queries_alone_on_one_replica_attainment": round(bound.lane_attainment, 4),
        "batch_share_whole_lane": round(bound.whole_lane, 4),
        "batch_alone_s": round(reference, 2),
        "batch_rows": rows,
        "queries": n_sql,
        "query_rate_per_s": rate,
        "knee": [
            {"backend": k.backend, "knee": k.knee, "limit": k.limit, "samples": k.samples}
            for k in seen.knees
        ],
    }


def report_part2(alone: dict[str, object]) -> dict[str, object]:
    reports: dict[str, Report] = {
        "naive": alone["naive"],  # type: ignore[dict-item]
        "priority-only": alone["priority"],  # type: ignore[dict-item]
        "plait": alone["plait"],  # type: ignore[dict-item]
        "  late kept going": alone["kept"],  # type: ignore[dict-item]
        "plait, late=cancel": alone["shedding"],  # type: ignore[dict-item]
        "  same, no gate": alone["ungated"],  # type: ignore[dict-item]
    }
    print(f"\nPart 2: {alone['programs']} text-to-SQL queries alone at {alone['rate']}/s, "
          f"1 x {PROFILE}")  # fmt: skip
    print(f"{'mode':<18} {'attain.':>7} {'JCT mean':>8} {'JCT p95':>8}")
    for name, r in reports.items():
        print(f"{name:<18} {r.deadline_attainment:>7.3f} {r.mean_jct:>8.1f} {r.p95_jct:>8.1f}")
    gate = alone["gate"]
    if isinstance(gate, GateStats):
        print(
            f"the deadline gate (late=cancel run) learned: a run takes {gate.base_s or 0:.2f} + "
            f"{gate.per_run_s or 0:.3f} x runs in flight s; cap {gate.cap}; {gate.held} runs "
            f"waited, {gate.shed} found hopeless while waiting"
        )
    attained = {name: round(r.deadline_attainment, 4) for name, r in reports.items()}
    return {
        "sql_rate_per_s": alone["rate"],
        "sql_attainment_naive": attained["naive"],
        "sql_attainment_priority_only": attained["priority-only"],
        "sql_attainment_plait": attained["plait"],
        "sql_attainment_plait_late_kept_going": attained["  late kept going"],
        "sql_attainment_plait_late_cancel": attained["plait, late=cancel"],
        "sql_attainment_plait_late_cancel_no_gate": attained["  same, no gate"],
        "sql_gate_cap": gate.cap if isinstance(gate, GateStats) else None,
        "sql_queries_given_up": alone["shed"],
        "sql_hopeless_runs": alone["hopeless"],
        "sql_hopeless_runs_met": alone["hopeless_met"],
        "sql_sweep": alone["sweep"],
    }


def _lane_setting(parser: argparse.ArgumentParser, text: str) -> tuple[int, int | None]:
    programs, _, prefill = text.partition(":")
    try:
        setting = (int(programs), None if prefill in ("", "-") else int(prefill))
    except ValueError:
        parser.error(f"--lane {text!r}: give P:N, e.g. 2:128 (or 2:- for no pacing)")
    if setting[0] < 0 or (setting[1] is not None and setting[1] < 16):
        parser.error(f"--lane {text!r}: P must be >= 0 and N >= 16 (a block)")
    return setting


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 batch rows, fewer queries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=1.0, help="queries/s during the batch")
    parser.add_argument("--part", choices=("1", "2"), help="run only this part (default: both)")
    parser.add_argument(
        "--lane",
        action="append",
        default=[],
        metavar="P:N",
        help="part 1: also run one urgent lane taking P batch programs, their prompts paced "
        "in pieces of N tokens (N '-': not paced); repeatable",
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)
    lanes = [_lane_setting(parser, text) for text in args.lane]
    started = time.perf_counter()
    figures: dict[str, object] = {}
    if args.part in (None, "1"):
        rows = 2_000 if args.quick else 10_000
        log(f"part 1: {rows:,} batch rows on {REPLICAS} replicas, queries at {args.rate}/s:")
        mixed, reference, seen, n_sql, bound = part1(rows, args.rate, args.seed, lanes)
        figures.update(report_part1(rows, args.rate, mixed, reference, seen, n_sql, bound))
    if args.part in (None, "2"):
        n2 = 120 if args.quick else 300
        log(f"part 2: {n2} text-to-SQL queries alone on one replica:")
        # The first rate where naive attains under 0.5, in steps of 0.1 queries/s: coarser
        # steps overshoot into overload, where no scheduler can meet 0.8 (one replica serves
        # at most ~1.6 of these queries a second, docs/admission.md).
        alone = part2(n2, tuple(round(1.0 + 0.1 * i, 1) for i in range(21)), args.seed)
        figures.update(report_part2(alone))
    figures.update(
        quick=args.quick,
        seed=args.seed,
        profile=PROFILE,
        wall_s=round(time.perf_counter() - started, 1),
    )
    print(json.dumps(figures, separators=(",", ":")))
    _results.save("deadlines", figures, parser, args, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
