"""The serving engine model: continuous batching over a paged, prefix-cached KV cache.

It follows vLLM's v1 scheduler: each step first serves running requests (prefill chunks or
one decode token each), preempting the lowest-priority running request when blocks run
out, then admits waiting requests in priority order while the token budget, the sequence
limit and free blocks allow. A request that is admitted looks up its longest cached prefix
(full blocks only, and never its last token). Pure and synchronous: `plan` says what the
next step does and how long it takes, `apply` makes it so; the caller owns time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ._kv import BlockPool
from ._simprofile import Profile

MAX_MACRO_STEPS = 512


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the simulated server. `priority`: lower runs sooner."""

    id: int
    prompt_tokens: int
    output_tokens: int
    hashes: list[int]
    """Chained hashes of the full blocks of prompt + output, known in advance."""
    arrival: float
    priority: float = 0.0
    program: str | None = None
    keep_alive_s: float | None = None
    last_call: bool = False
    state: str = "waiting"
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    generated: int = 0
    cached_tokens: int = 0
    registered: int = 0
    preemptions: int = 0
    scheduled_once: bool = False
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What the next step (or run of identical decode steps) computes."""

    work: list[tuple[SimRequest, int]]
    durations: list[float]
    """One entry per step; more than one only for pure decode with nothing else to do."""


@dataclass(slots=True)
class _Pin:
    blocks: list[int]
    expires_at: float


class SimEngine:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.pool = BlockPool(profile.num_blocks, profile.block_size)
        self.waiting: list[tuple[float, int, SimRequest]] = []
        self.running: list[SimRequest] = []
        self.pins: dict[str, _Pin] = {}
        self._seq = 0
        self.steps = 0
        self.busy_s = 0.0
        self.preemptions = 0

    # --- arrivals and departures -------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        self._seq += 1
        heapq.heappush(self.waiting, (request.priority, self._seq, request))

    def abort(self, request: SimRequest) -> None:
        """Drop a request whose client went away; its blocks return to the pool."""
        if request.state == "running":
            self.running.remove(request)
            self.pool.release(request.blocks)
            request.blocks = []
        elif request.state == "waiting":
            self.waiting = [w for w in self.waiting if w[2] is not request]
            heapq.heapify(self.waiting)
        request.state = "aborted"

    def expire_pins(self, now: float) -> None:
        for program in [p for p, pin in self.pins.items() if pin.expires_at <= now]:
            self.pool.release(self.pins.pop(program).blocks)

    def next_expiry(self) -> float | None:
        return min((pin.expires_at for pin in self.pins.values()), default=None)

    def _unpin(self, program: str | None) -> None:
        if program is not None and program in self.pins:
            self.pool.release(self.pins.pop(program).blocks)

    # --- one step ----------------------------------------------------------------------------

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.profile.block_size)

    def plan(self, now: float) -> StepPlan | None:
        """Decide the next step; None when there is nothing to do."""
        self.expire_pins(now)
        budget = self.profile.max_num_batched_tokens
        work: list[tuple[SimRequest, int]] = []
        preempted = False
        blocked = False
        scheduled: set[int] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.computed, budget)
            need = self._blocks_for(req.computed + n) - len(req.blocks)
            new: list[int] | None = [] if need <= 0 else self.pool.allocate(need)
            while new is None:
                # Out of blocks: preempt the lowest-priority request not yet given work in
                # this step (possibly this one). Those are at index >= i, so i stays valid.
                victim = self._victim(scheduled)
                self._preempt(victim, now)
                preempted = True
                if victim is req:
                    break
                new = self.pool.allocate(need)
            if new is None:
                continue  # this request was preempted; the next one moved up to index i
            req.blocks.extend(new)
            self._register(req, req.computed + n)
            work.append((req, n))
            scheduled.add(req.id)
            budget -= n
            i += 1
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.profile.max_num_seqs
            and not preempted
        ):
            req = self.waiting[0][2]
            if not self._admit(req, budget):
                blocked = True
                break
            heapq.heappop(self.waiting)
            n = min(req.num_tokens - req.computed, budget)
            self._register(req, req.computed + n)
            work.append((req, n))
            budget -= n
        if not work:
            return None
        return StepPlan(work, self._durations(work, preempted, blocked, now))

    def _admit(self, req: SimRequest, budget: int) -> bool:
        pool, size = self.pool, self.profile.block_size
        hit_blocks = pool.match(req.hashes[: (req.num_tokens - 1) // size])
        hit = len(hit_blocks) * size
        n = min(req.num_tokens - hit, budget)
        need = self._blocks_for(hit + n) - len(hit_blocks)
        if not pool.fits(hit_blocks, need):
            return False
        held = len(hit_blocks)
        pin = self.pins.get(req.program) if req.program is not None else None
        handed = pin is not None and pin.blocks[:held] == hit_blocks
        if not handed:
            pool.acquire(hit_blocks)
        new = pool.allocate(need)
        assert new is not None, "fits() said the blocks were there"
        if handed:
            # The program's pin begins with the hits (its previous call's blocks): they pass
            # to this call as they are, the rest of the pin is released. The same as
            # acquiring the hits and releasing the whole pin, without a step per block.
            assert pin is not None and req.program is not None
            del self.pins[req.program]
            pool.release(pin.blocks[held:])
        if not req.scheduled_once:
            pool.count_query(req.num_tokens, hit)
            req.cached_tokens = hit
            req.scheduled_once = True
        req.blocks = hit_blocks + new
        req.computed = hit
        req.registered = len(hit_blocks)
        req.state = "running"
        self.running.append(req)
        self._unpin(req.program)  # its next call holds what it needs now
        return True

    def _victim(self, scheduled: set[int]) -> SimRequest:
        # vLLM's priority policy: the running request with the lowest priority (largest
        # value), latest arrival on ties.
        candidates = [r for r in self.running if r.id not in scheduled]
        return max(candidates, key=lambda r: (r.priority, r.arrival, r.id))

    def _preempt(self, req: SimRequest, now: float) -> None:
        self.running.remove(req)
        self.pool.release(req.blocks)
        req.blocks = []
        req.computed = 0
        req.registered = 0
        req.preemptions += 1
        req.state = "waiting"
        self.preemptions += 1
        self.add(req)

    def _durations(
        self, work: list[tuple[SimRequest, int]], preempted: bool, blocked: bool, now: float
    ) -> list[float]:
        p = self.profile
        prefill = 0
        decodes = 0
        context = 0
        for req, n in work:
            if n == 1 and req.generated > 0 and req.computed == req.num_tokens - 1:
                decodes += 1
                context += req.num_tokens
            else:
                prefill += n
        first = (
            p.step_overhead_s
            + p.prefill_s_per_token * prefill
            + p.decode_s_per_seq * decodes
            + p.decode_s_per_context_token * context
        )
        if prefill or preempted or decodes == 0:
            return [first]
        if self.waiting and len(self.running) < p.max_num_seqs and not blocked:
            return [first]  # someone may get in next step
        # Pure decode with nobody to admit: the next steps are alike until a request ends
        # or blocks run short, so they are planned at once (and cut short on an arrival).
        # Nor while the queue's head waits for blocks: decode steps only take blocks, so it
        # cannot get in before a request ends (that ends the run), a pin expires (the run
        # stops at the first step boundary after that) or another request arrives (cut).
        # Trying it again every step would find the same: its cached prefix already
        # stands at the end of the free queue.
        k = min(min(r.output_tokens - r.generated for r, _ in work), MAX_MACRO_STEPS)
        k = self._affordable_steps(work, k)
        per_step_context = p.decode_s_per_context_token * decodes
        durations = [first + per_step_context * s for s in range(k)]
        expiry = self.next_expiry() if blocked else None
        if expiry is not None:
            end, keep = now, 0
            for d in durations:
                keep += 1
                end += d
                if end >= expiry:
                    break
            del durations[keep:]
        return durations

    def _affordable_steps(self, work: list[tuple[SimRequest, int]], k: int) -> int:
        free = self.pool.free

        def extra(steps: int) -> int:
            return sum(
                max(0, self._blocks_for(r.computed + steps) - len(r.blocks)) for r, _ in work
            )

        lo, hi = 1, max(1, k)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def apply(self, plan: StepPlan, steps: int, now: float) -> list[SimRequest]:
        """Carry out the first `steps` steps of `plan`, ending at `now`; returns the
        requests that finished."""
        finished: list[SimRequest] = []
        pool = self.pool
        self.steps += steps
        self.busy_s += sum(plan.durations[:steps])
        for req, n in plan.work:
            if req.state != "running":
                continue  # aborted while the step ran
            advance = n if steps == 1 else steps  # macro plans are pure decode, 1 a step
            extra = self._blocks_for(req.computed + advance) - len(req.blocks)
            if extra > 0:
                new = pool.allocate(extra)
                assert new is not None, "a macro step was planned without its blocks"
                req.blocks.extend(new)
            if steps == 1:
                req.computed += n
                if req.computed == req.num_tokens:
                    req.generated += 1
            else:
                req.computed += steps
                req.generated += steps
            self._register(req, req.computed)
            if req.generated and req.first_token_at is None:
                req.first_token_at = now
            if req.generated >= req.output_tokens:
                self._finish(req, now)
                finished.append(req)
        return finished

    def _register(self, req: SimRequest, tokens: int) -> None:
        """Offer `req`'s blocks that are full once its first `tokens` are computed for reuse.
        Called when the step that computes them is scheduled, as vLLM does: a request
        scheduled later in the same step already hits them (its attention reads them in
        the same forward pass, after they are written)."""
        full = min(tokens // self.profile.block_size, len(req.hashes))
        while req.registered < full:
            self.pool.register(req.blocks[req.registered], req.hashes[req.registered])
            req.registered += 1

    def _finish(self, req: SimRequest, now: float) -> None:
        self.running.remove(req)
        req.state = "finished"
        req.finished_at = now
        if req.keep_alive_s and not req.last_call and req.program is not None:
            self._unpin(req.program)
            self.pins[req.program] = _Pin(req.blocks, now + req.keep_alive_s)
        else:
            if req.last_call:
                self._unpin(req.program)
            self.pool.release(req.blocks)
        req.blocks = []
