"""The blackboard: post a request, capable volunteers bid, the best bid wins a claim with a
lease, the claim runs (as a task in the poster's workflow when posted from a task), and its
answer goes to every subscriber.

What is durable lives in the `BoardStore` (exactly-once awards, leases, answers, the log);
the board keeps a view of it for speed: its volunteers, their loads, the posts it waits
on. Writes are grouped: whoever writes while no commit is under way commits everything
queued since, so many posts and awards share one transaction (as the journal does).

Durability: nothing is acknowledged before the transaction holding it committed ("committed"
means what the store makes of it: with `memory.SQLBoardStore`, synced to disk under the SQL
store's `synchronous=FULL`, or committed by PostgreSQL; with the in-process store, in this
process's memory only). A batch that fails fails every write in it, and none of it is
stored. In particular:
- when `post()` returns, the post and its "posted" event are committed, and so is its
  award, if a capable volunteer bid (the post's own write and its award go in one batch);
- an award takes effect (the claim is counted, its task or handler starts) only after the
  conditional UPDATE that made it committed: no volunteer serves a claim the store could
  lose, and two boards on one store never both win one attempt;
- when `answer()` returns, the answer (the claim and the post marked answered, the result,
  the "answered" event) is committed, and only then are waiters on `answer_of` woken;
  `ClaimLostError` means nothing was written;
- `release()` and `renew()` likewise return after their commit.
A process that dies between a commit and its acknowledgement leaves the write in the store
(a post other boards see, a claim whose lease runs out and puts the post back).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import math
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import Clock, StoreError, TaskContext, UsageError
from orchestrator.ext import Notifier, running_clock

from ._board_model import (
    Answer,
    Answered,
    Awarded,
    BoardEvent,
    Claim,
    ClaimLostError,
    Post,
    Posted,
    PostFailed,
    PostFailedError,
    Released,
    Volunteer,
    award,
    capable,
    tags,
)
from ._board_store import POST_FIELDS, BoardRecord, BoardStore, BoardWrite, MemoryBoardStore

_log = logging.getLogger("plait.board")
BOARD_CHANNEL = "plait_board"
"""The notification channel of board writes (a hint: boards sweep the store)."""


@dataclass(slots=True)
class BoardStats:
    posts: int = 0
    awards: int = 0
    awards_lost: int = 0
    """Awards another board won first (several processes on one store)."""
    answers: int = 0
    releases: int = 0
    failures: int = 0
    commits: int = 0
    bid_errors: int = 0
    last_bid_error: str | None = None


@dataclass(slots=True)
class _Entry:
    """A post this board waits on: its outcome, and where its claims run."""

    post: Post
    outcome: asyncio.Future[Any]
    editor: Any = None
    """The poster's workflow (`ctx.workflow`): its claims become its tasks."""
    awarding: bool = False
    claim: Claim | None = None


@dataclass(slots=True)
class _Writer:
    pending: list[tuple[BoardWrite, asyncio.Future[int]]] = field(default_factory=list)
    busy: bool = False


class Board:
    """A shared board. `async with Board(store) as board:` runs its timers (deadlines,
    leases, foreign posts); `board.join(volunteer)` adds a volunteer; `await
    board.post(...)` posts; `await board.answer_of(post)` waits for the answer.

    `lease`: seconds a claim may take before the post goes back on the board (`renew`
    extends it). `max_attempts`: claims one post may have before it fails. `poll`: seconds
    between reads of the store for other processes' posts and expired leases (None: only
    when this board has something due). `notifier` (`memory.PgNotifier`,
    `memory.RedisNotifier`): every board on it, in any process, looks at the store as soon
    as another writes to it (posts, claims, answers), instead of at its next poll."""

    def __init__(
        self,
        store: BoardStore | None = None,
        *,
        clock: Clock | None = None,
        lease: float = 60.0,
        max_attempts: int = 3,
        poll: float | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        if store is not None and not isinstance(store, BoardStore):
            raise UsageError(
                f"Board(store=...) takes a BoardStore (memory.SQLBoardStore, or the default "
                f"in-process one), got {type(store).__name__}"
            )
        for what, value in (("lease", lease), ("poll", poll)):
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise UsageError(f"Board({what}={value!r}) must be a positive number of seconds")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise UsageError(f"Board(max_attempts={max_attempts!r}) must be an int >= 1")
        self.store: BoardStore = store if store is not None else MemoryBoardStore()
        self._clock = clock
        self.lease = float(lease)
        self.max_attempts = max_attempts
        self.poll = poll
        self.stats = BoardStats()
        self._volunteers: dict[str, Volunteer] = {}
        self._names: set[str] = set()
        self._index: dict[str, set[str]] = {}
        self._loads: dict[str, int] = {}
        self._entries: dict[str, _Entry] = {}
        self._held: dict[tuple[str, int], Claim] = {}
        self._writer = _Writer()
        self._subscribers: list[asyncio.Queue[BoardEvent]] = []
        self._seen = 0
        self._tg: asyncio.TaskGroup | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._due: list[tuple[float, int, str, Any]] = []
        """(time, push number, "deadline" | "lease", post id | claim key): a heap of what
        the timers wait for; an item whose post ended or claim moved on is dropped when met."""
        self._pushed = 0
        self._sleeping_until = -math.inf
        """When the timers wake unless woken: an earlier due time wakes them (-inf: awake)."""
        self._sweep_wanted = True
        self._last_sweep = -math.inf
        self.notifier = notifier
        self._name = secrets.token_hex(8)
        """This board's name in its notifications (it does not wake for its own)."""

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            self._clock = running_clock()
        return self._clock

    # --- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Board:
        if self._tg is not None:
            raise UsageError("this Board is already running; enter it once")
        if self.notifier is not None:
            await self.notifier.listen(BOARD_CHANNEL, self._written_elsewhere)
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._spawn(self._timers(), "plait-board")
        return self

    def _written_elsewhere(self, payload: str) -> None:
        """Another board wrote to the store (maybe in another process): sweep it now."""
        if payload != self._name:
            self._sweep_wanted = True
            self._wake.set()

    def _spawn(self, coro: Any, name: str) -> None:
        assert self._tg is not None
        task = self._tg.create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def __aexit__(self, *exc: Any) -> None:
        tg, self._tg = self._tg, None
        assert tg is not None
        for task in list(self._running):
            task.cancel()  # claims in flight stay live in the store: their leases run out
        await tg.__aexit__(None, None, None)
        if self.notifier is not None:
            self.notifier.unlisten(BOARD_CHANNEL, self._written_elsewhere)

    async def _timers(self) -> None:
        # A sweep reads the store (expiries, every open post, the log): it runs when
        # something is due or a volunteer joined, never merely because a post came in.
        while True:
            await self.sweep()
            while not self._sweep_wanted:
                self._wake.clear()
                due = self._next_due()
                if due is not None and due <= 0:
                    break
                self._sleeping_until = math.inf if due is None else self.clock.now() + due
                try:
                    async with asyncio.timeout(due):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                finally:
                    self._sleeping_until = -math.inf

    def _schedule(self, at: float, kind: str, key: Any) -> None:
        self._pushed += 1
        heapq.heappush(self._due, (at, self._pushed, kind, key))
        if at < self._sleeping_until:
            self._wake.set()

    def _still_due(self, item: tuple[float, int, str, Any]) -> bool:
        at, _, kind, key = item
        if kind == "lease":
            claim = self._held.get(key)
            return claim is not None and claim.lease_until == at
        entry = self._entries.get(key)
        return entry is not None and not entry.outcome.done() and entry.post.deadline == at

    def _next_due(self) -> float | None:
        """Seconds until the next deadline, lease end or poll (None: nothing is due)."""
        due = self._due
        while due and not self._still_due(due[0]):
            heapq.heappop(due)
        times = [due[0][0]] if due else []
        if self.poll is not None:
            times.append(self._last_sweep + self.poll)
        return None if not times else min(times) - self.clock.now()

    # --- volunteers ---------------------------------------------------------------------------

    def join(self, volunteer: Volunteer) -> None:
        """Add a volunteer; open posts it can serve are offered to it at the next sweep."""
        if not isinstance(volunteer, Volunteer):
            raise UsageError(
                f"board.join() takes a Volunteer (name, capabilities, bid, serve), got "
                f"{type(volunteer).__name__}; wrap a function in agents.Helper"
            )
        name = volunteer.name
        if name in self._volunteers:
            raise UsageError(f"a volunteer named {name!r} already joined this board")
        self._volunteers[name] = volunteer
        self._names.add(name)
        self._loads.setdefault(name, 0)
        for tag in tags(volunteer.capabilities, f"volunteer {name!r}"):
            self._index.setdefault(tag, set()).add(name)
        self._sweep_wanted = True
        self._wake.set()

    def leave(self, name: str) -> None:
        """Stop offering posts to `name` (claims it holds run on)."""
        if self._volunteers.pop(name, None) is None:
            raise UsageError(f"no volunteer named {name!r} joined this board")
        self._names.discard(name)
        for members in self._index.values():
            members.discard(name)

    def load(self, name: str) -> int:
        """Claims `name` holds now, through this board."""
        return self._loads.get(name, 0)

    # --- posting ------------------------------------------------------------------------------

    async def post(
        self,
        content: Any,
        *,
        capabilities: Iterable[str] = (),
        poster: str = "app",
        deadline: float | None = None,
        ctx: TaskContext | None = None,
        max_attempts: int | None = None,
        id: str | None = None,
    ) -> Post:
        """Post `content` (JSON data) for a volunteer having every tag in `capabilities`.

        `deadline`: seconds from now; no award by then fails the post with the reason.
        `ctx`: posting from inside a task: each claim runs as a task of that task's workflow
        (`claim.task_id`), whose result is the answer. Returns once the post is committed,
        and with it its award, if a capable volunteer bid (see the module docstring)."""
        required = tags(capabilities, f"post by {poster!r}")
        if deadline is not None and not (isinstance(deadline, int | float) and deadline >= 0):
            raise UsageError(f"post deadline={deadline!r} must be seconds from now, >= 0")
        try:
            json.dumps(content)
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"post content must be JSON data (it is stored and read by other processes): "
                f"{exc}; post a dict of plain values"
            ) from None
        if ctx is None and self._tg is None:
            raise UsageError(
                "a post made outside a task runs its claims on the board: enter it first "
                "(`async with Board(...) as board:`), or pass ctx= from inside a task"
            )
        now = self.clock.now()
        post = Post(
            id=id or f"{poster}-{secrets.token_hex(6)}",
            content=content,
            capabilities=required,
            poster=poster,
            posted_at=now,
            deadline=None if deadline is None else now + deadline,
            workflow=None if ctx is None else ctx.workflow.id,
            max_attempts=max_attempts or self.max_attempts,
        )
        if post.id in self._entries:
            raise UsageError(f"post id {post.id!r} is taken; leave id= out for a fresh one")
        entry = _Entry(post, asyncio.get_running_loop().create_future())
        entry.editor = None if ctx is None else ctx.workflow
        self._entries[post.id] = entry
        self.stats.posts += 1
        fields = _post_fields(post)
        if post.deadline is not None:
            self._schedule(post.deadline, "deadline", post.id)
        await self._offer(entry, first=("post", post.id, fields))
        return post

    async def _offer(self, entry: _Entry, first: BoardWrite | None = None) -> None:
        """Ask the capable volunteers for bids and award `entry`'s post to the best (the
        post's own write, `first`, goes in the same commit)."""
        if entry.awarding or entry.outcome.done():
            if first is not None:
                await self._write([first])
            return
        entry.awarding = True
        try:
            post = entry.post
            names = capable(post.capabilities, self._index, self._names)
            bids = await self._bids(post, names) if names else {}
            offer = award(bids, self._loads)
            ops = [first] if first is not None else []
            if offer is not None:
                until = self.clock.now() + self.lease
                fields = {"holder": offer.volunteer, "bid": offer.bid, "lease_until": until}
                ops.append(("award", post.id, {**fields, "at": self.clock.now()}))
            if not ops:
                return
            results = await self._write(ops)
            if offer is None:
                return
            attempt = results[-1]
            if attempt == 0:
                self.stats.awards_lost += 1
                return
            claim = Claim(post, attempt, offer.volunteer, offer.bid, until)
            self._claimed(entry, claim)
        finally:
            entry.awarding = False

    async def _bids(self, post: Post, names: set[str]) -> dict[str, float]:
        bids: dict[str, float] = {}
        asked: list[tuple[str, Awaitable[float | None]]] = []
        for name in names:
            fn = self._volunteers[name].bid
            if fn is None:
                bids[name] = 0.0
                continue
            try:
                amount = fn(post)
            except Exception as exc:
                self._bid_failed(name, exc)
                continue
            if isinstance(amount, Awaitable):
                asked.append((name, amount))
            elif amount is not None:
                bids[name] = float(amount)
        if asked:
            answers = await asyncio.gather(*(a for _, a in asked), return_exceptions=True)
            for (name, _), got in zip(asked, answers, strict=True):
                if isinstance(got, Exception):
                    self._bid_failed(name, got)
                elif isinstance(got, BaseException):
                    raise got
                elif got is not None:
                    bids[name] = float(got)
        return bids

    def _bid_failed(self, name: str, exc: Exception) -> None:
        # A volunteer's broken bid must not break other agents' posts: it counts as a
        # decline, and the last error is kept to be read.
        self.stats.bid_errors += 1
        self.stats.last_bid_error = f"volunteer {name!r}: {type(exc).__name__}: {exc}"

    def _claimed(self, entry: _Entry, claim: Claim) -> None:
        self.stats.awards += 1
        entry.claim = claim
        self._held[(claim.post.id, claim.attempt)] = claim
        self._schedule(claim.lease_until, "lease", (claim.post.id, claim.attempt))
        self._loads[claim.holder] = self._loads.get(claim.holder, 0) + 1
        editor = entry.editor
        volunteer = self._volunteers[claim.holder]
        if editor is not None:

            async def serve(ctx: TaskContext) -> Any:
                return await self._run_claim(volunteer, claim, ctx)

            try:
                editor.add(claim.task_id, serve)
                return
            except UsageError:
                pass  # the poster's workflow has ended: the board runs the claim itself
        if self._tg is None:
            raise UsageError(
                f"post {claim.post.id!r} was awarded to {claim.holder!r}, but the board is "
                "not running to serve it; enter it (`async with board:`)"
            )
        self._spawn(self._run_claim(volunteer, claim, None), f"board:{claim.task_id}")

    async def _run_claim(self, volunteer: Volunteer, claim: Claim, ctx: TaskContext | None) -> Any:
        try:
            async with asyncio.timeout(max(claim.lease_until - self.clock.now(), 0.0)):
                result = await volunteer.serve(claim.post, ctx)
            await self.answer(claim, result)
            return result
        except ClaimLostError:
            pass
        except TimeoutError:
            await self.release(claim, f"the lease of {claim.holder!r} expired")
        except Exception as exc:
            await self.release(claim, f"{claim.holder!r} failed: {type(exc).__name__}: {exc}")
        # This claim ended without answering: the post went back on the board (or failed).
        # As a task, end as the post ends: its answer from the next claim, or its failure.
        if ctx is None:
            return None
        return await self.answer_of(claim.post)

    # --- claims -------------------------------------------------------------------------------

    async def answer(self, claim: Claim, result: Any) -> None:
        """Record `claim`'s answer; returns once it is committed, and every subscriber sees
        it. Raises `ClaimLostError` if the claim is no longer live (its lease expired; the
        post was offered again): then nothing was written."""
        try:
            json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise UsageError(
                f"the answer to post {claim.post.id!r} must be JSON data: {exc}"
            ) from None
        at = self.clock.now()
        fields = {"attempt": claim.attempt, "result": result, "at": at}
        (done,) = await self._write([("answer", claim.post.id, fields)])
        if not done:
            raise ClaimLostError(claim)
        self.stats.answers += 1
        self._ended(claim)
        self._resolve(claim.post.id, result, None)

    async def release(self, claim: Claim, reason: str) -> None:
        """Give `claim` up: the post goes back on the board (or fails, after its last
        attempt). A claim no longer live is left as it is."""
        at = self.clock.now()
        fields = {"attempt": claim.attempt, "reason": reason, "at": at}
        (outcome,) = await self._write([("release", claim.post.id, fields)])
        if outcome:
            self._ended(claim)
            await self._after_release(claim.post.id, outcome == 1)

    async def renew(self, claim: Claim, lease: float | None = None) -> Claim:
        """Extend `claim`'s lease by `lease` seconds from now (the board's by default)."""
        until = self.clock.now() + (lease or self.lease)
        fields = {"attempt": claim.attempt, "lease_until": until}
        (done,) = await self._write([("renew", claim.post.id, fields)])
        if not done:
            raise ClaimLostError(claim)
        renewed = Claim(claim.post, claim.attempt, claim.holder, claim.bid, until)
        self._held[(claim.post.id, claim.attempt)] = renewed
        self._schedule(until, "lease", (claim.post.id, claim.attempt))
        return renewed

    def _ended(self, claim: Claim) -> None:
        if self._held.pop((claim.post.id, claim.attempt), None) is not None:
            self._loads[claim.holder] = max(self._loads.get(claim.holder, 1) - 1, 0)

    async def _after_release(self, post_id: str, reopened: bool) -> None:
        self.stats.releases += 1
        entry = self._entries.get(post_id)
        if entry is None:
            return
        entry.claim = None
        if reopened:
            if entry.post.deadline is not None:
                self._schedule(entry.post.deadline, "deadline", post_id)
            await self._offer(entry)
        else:
            await self._refresh_outcomes()

    # --- answers ----------------------------------------------------------------------------

    async def answer_of(self, post: Post | str) -> Any:
        """The post's answer, once given (by this process or another); raises
        `PostFailedError` if the post failed."""
        post_id = post if isinstance(post, str) else post.id
        entry = self._entries.get(post_id)
        if entry is None:
            rows = await self.store.posts(("open", "claimed", "answered", "failed"))
            row = next((r for r in rows if r["id"] == post_id), None)
            if row is None:
                raise UsageError(f"no post {post_id!r} on this board; check the id")
            entry = self._adopt(row)
        return await asyncio.shield(entry.outcome)

    def _resolve(self, post_id: str, result: Any, failure: str | None) -> None:
        entry = self._entries.get(post_id)
        if entry is None or entry.outcome.done():
            return
        if failure is None:
            entry.outcome.set_result(result)
        else:
            self.stats.failures += 1
            entry.outcome.set_exception(PostFailedError(post_id, failure))
            entry.outcome.exception()  # retrieved: nobody may be waiting on it

    async def events(self) -> AsyncIterator[BoardEvent]:
        """Every event from now on (posts, awards, releases, answers, failures), from every
        process on the store, in the log's order."""
        queue: asyncio.Queue[BoardEvent] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.remove(queue)

    async def answers(self) -> AsyncIterator[Answer]:
        """Every answer from now on: `async for answer in board.answers():`."""
        async for event in self.events():
            if isinstance(event, Answered):
                yield event.answer

    # --- the sweep: expiries, deadlines, posts from elsewhere ------------------------------------

    async def sweep(self) -> None:
        """End expired leases, fail posts past their deadline, offer open posts (also other
        processes') to this board's volunteers, and deliver the log's new events. The board's
        timers call it; call it yourself when driving time by hand."""
        now = self.clock.now()
        self._sweep_wanted = False
        self._last_sweep = now
        mark = self._pushed
        for post_id, attempt, _holder, _reopened in await self.store.expire(now):
            claim = self._held.get((post_id, attempt))
            if claim is not None:
                self._ended(claim)
            self.stats.releases += 1
            entry = self._entries.get(post_id)
            if entry is not None:
                entry.claim = None
        for row in await self.store.posts(("open",)):
            entry = self._entries.get(row["id"]) or self._adopt(row)
            post = entry.post
            if post.deadline is not None and post.deadline <= now:
                await self._write([("fail", post.id, {"reason": self._why(post), "at": now})])
            elif self._volunteers:
                await self._offer(entry)
        await self._refresh_outcomes()
        # What was due by `now` has been dealt with: a post past its deadline that was open
        # failed; one that was claimed is scheduled again if its claim puts it back.
        kept = [d for d in self._due if d[0] > now or d[1] > mark]
        if len(kept) < len(self._due):
            heapq.heapify(kept)
            self._due = kept

    def _why(self, post: Post) -> str:
        if capable(post.capabilities, self._index, self._names):
            return (
                f"no agent with capabilities {sorted(post.capabilities)} bid for it by its deadline"
            )
        return f"no agent has capabilities {sorted(post.capabilities)}"

    def _adopt(self, row: dict[str, Any]) -> _Entry:
        post = _post_from(row)
        entry = _Entry(post, asyncio.get_running_loop().create_future())
        self._entries[post.id] = entry
        if post.deadline is not None and row["state"] in ("open", "claimed"):
            self._schedule(post.deadline, "deadline", post.id)
        if row["state"] == "answered":
            entry.outcome.set_result(row["result"])
        elif row["state"] == "failed":
            self._resolve(post.id, None, row["reason"])
        return entry

    async def _refresh_outcomes(self) -> None:
        """Read the log from where this board left it: deliver to subscribers, settle the
        posts it waits on that were answered or failed (here or elsewhere)."""
        while True:
            records = await self.store.events(self._seen)
            for record in records:
                self._deliver(record)
            if len(records) < 10_000:
                return

    def _deliver(self, record: BoardRecord) -> None:
        seq, kind, post_id, _at, data = record
        if seq <= self._seen:
            return  # two reads of the log overlapped: each event is delivered once
        self._seen = seq
        if kind == "answered":
            self._resolve(post_id, data["result"], None)
        elif kind == "post_failed":
            self._resolve(post_id, None, data["reason"])
        if self._subscribers:
            event = _event_from(record, self._entries.get(post_id))
            for queue in self._subscribers:
                queue.put_nowait(event)

    # --- group commit -------------------------------------------------------------------------

    async def _write(self, ops: list[BoardWrite]) -> list[int]:
        loop = asyncio.get_running_loop()
        futures = []
        writer = self._writer
        for op in ops:
            future: asyncio.Future[int] = loop.create_future()
            writer.pending.append((op, future))
            futures.append(future)
        if not writer.busy:
            writer.busy = True
            try:
                while writer.pending:
                    batch, writer.pending = writer.pending, []
                    try:
                        results = await self.store.write([op for op, _ in batch])
                    except Exception as exc:
                        _settle(batch, exc)
                        continue
                    except BaseException:
                        _settle(batch, None)  # the committer was cancelled: so are its waiters
                        raise
                    self.stats.commits += 1
                    _settle(batch, results)
                    if self.notifier is not None:
                        try:
                            await self.notifier.notify(BOARD_CHANNEL, self._name)
                        except StoreError as exc:  # the other boards' polls find it
                            _log.warning("board write kept but not notified: %s", exc)
                    if self._subscribers:
                        await self._refresh_outcomes()
            finally:
                writer.busy = False
                _settle(writer.pending, None)
                writer.pending = []
        return [await future for future in futures]


def _settle(
    batch: list[tuple[BoardWrite, asyncio.Future[int]]],
    outcome: list[int] | Exception | None,
) -> None:
    """Hand each waiter its write's answer (the store's error; None: cancelled). A waiter
    that was cancelled meanwhile has nothing to hear."""
    for i, (_, future) in enumerate(batch):
        if future.done():
            continue
        if outcome is None:
            future.cancel()
        elif isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome[i])


def _post_fields(post: Post) -> dict[str, Any]:
    fields = {name: getattr(post, name) for name in POST_FIELDS}
    fields["capabilities"] = sorted(post.capabilities)
    return fields


def _post_from(row: dict[str, Any]) -> Post:
    return Post(
        id=row["id"],
        content=row["content"],
        capabilities=frozenset(row["capabilities"]),
        poster=row["poster"],
        posted_at=row["posted_at"],
        deadline=row["deadline"],
        workflow=row["workflow"],
        max_attempts=row["max_attempts"],
    )


def _event_from(record: BoardRecord, entry: _Entry | None) -> BoardEvent:
    _seq, kind, post_id, at, data = record
    if kind == "posted":
        return Posted(_post_from({**data, "id": post_id}))
    if kind == "awarded":
        post = entry.post if entry is not None else _unknown_post(post_id)
        claim = Claim(post, data["attempt"], data["holder"], data["bid"], data["lease_until"])
        return Awarded(claim)
    if kind == "released":
        return Released(post_id, data["attempt"], data["holder"], data["reason"], data["reopened"])
    if kind == "answered":
        return Answered(Answer(post_id, data["attempt"], data["holder"], data["result"], at))
    return PostFailed(post_id, data["reason"])


def _unknown_post(post_id: str) -> Post:
    return Post(post_id, None, frozenset(), "?", 0.0)
