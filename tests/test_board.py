"""The blackboard: the award policy (pure), the board on every store (in-process, SQLite,
PostgreSQL), claims as tasks of the poster's workflow on the virtual clock, and a process
killed while it holds a claim."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from board_support import HandClock, OpenStore, store_opener

from agents import (
    Answered,
    Awarded,
    Board,
    BoardEvent,
    BoardStore,
    ClaimLostError,
    Helper,
    MemoryBoardStore,
    Offer,
    Post,
    PostFailedError,
    award,
)
from memory import SQLBoardStore, SQLStore
from orchestrator import Engine, TaskContext, UsageError, VirtualClock, Workflow

ROOT = Path(__file__).resolve().parent.parent


def helper(name: str, *caps: str, bid: Any = None, work: Any = None) -> Helper:
    return Helper(name, frozenset(caps), work or (lambda post, ctx: f"{name}:{post.content}"), bid)


# --- the award policy: pure ------------------------------------------------------------------


def test_the_highest_bid_wins() -> None:
    assert award({"a": 0.2, "b": 0.9, "c": 0.5}, {}) == Offer("b", 0.9, 0)


def test_ties_go_to_the_least_loaded_then_to_the_first_name() -> None:
    assert award({"a": 1.0, "b": 1.0}, {"a": 2, "b": 1}) == Offer("b", 1.0, 1)
    assert award({"b": 1.0, "a": 1.0}, {"a": 1, "b": 1}) == Offer("a", 1.0, 1)
    # Load only breaks ties: a better bid wins however busy its bidder is.
    assert award({"a": 2.0, "b": 1.0}, {"a": 50}) == Offer("a", 2.0, 50)


def test_no_bids_no_winner() -> None:
    assert award({}, {"a": 0}) is None


# --- the board on every store --------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    user = request.getfixturevalue("pg_user") if request.param == "postgresql" else None
    opener, cleanup = store_opener(request.param, tmp_path, user)
    yield opener
    if cleanup is not None:
        asyncio.run(cleanup())


@asynccontextmanager
async def board_on(open_store: OpenStore, clock: HandClock, **kw: Any) -> AsyncIterator[Board]:
    async with open_store() as store, Board(store, clock=clock, **kw) as board:
        yield board


async def settle(board: Board, post: Post) -> Any:
    """The post's answer once its claim (running on the board) has answered."""
    return await asyncio.wait_for(board.answer_of(post), 10)


def test_both_stores_are_board_stores(open_store: OpenStore) -> None:
    async def main() -> None:
        async with open_store() as store:
            assert isinstance(store, BoardStore)

    asyncio.run(main())


def test_only_capable_agents_are_asked_and_the_best_bid_wins(open_store: OpenStore) -> None:
    asked: list[str] = []

    def bidding(name: str, amount: float) -> Any:
        def bid(post: Post) -> float:
            asked.append(name)
            return amount

        return bid

    async def main() -> None:
        async with board_on(open_store, HandClock()) as board:
            board.join(helper("sql-only", "sql", bid=bidding("sql-only", 9.0)))
            board.join(helper("charts-only", "charts", bid=bidding("charts-only", 9.0)))
            board.join(helper("both-low", "sql", "charts", bid=bidding("both-low", 0.3)))
            board.join(helper("both-high", "sql", "charts", bid=bidding("both-high", 0.7)))
            post = await board.post("q1", capabilities={"sql", "charts"})
            assert await settle(board, post) == "both-high:q1"
            assert sorted(asked) == ["both-high", "both-low"]
            assert board.stats.awards == 1

    asyncio.run(main())


def test_an_async_bid_is_awaited_and_none_declines(open_store: OpenStore) -> None:
    async def llm_bid(post: Post) -> float | None:
        await asyncio.sleep(0)
        return None if post.content == "skip" else 5.0

    async def main() -> None:
        async with board_on(open_store, HandClock()) as board:
            board.join(helper("thinker", "x", bid=llm_bid))
            board.join(helper("plain", "x"))  # no bid function: bids 0
            assert await settle(board, await board.post("go", capabilities={"x"})) == "thinker:go"
            assert await settle(board, await board.post("skip", capabilities={"x"})) == "plain:skip"

    asyncio.run(main())


def test_equal_bids_go_to_the_least_loaded(open_store: OpenStore) -> None:
    gate = asyncio.Event()

    async def slow(post: Post, ctx: Any) -> str:
        await gate.wait()
        return "slow"

    async def main() -> None:
        async with board_on(open_store, HandClock()) as board:
            board.join(helper("a", "x", work=slow))
            board.join(helper("b", "x", work=slow))
            first = await board.post(1, capabilities={"x"})
            second = await board.post(2, capabilities={"x"})
            assert (board.load("a"), board.load("b")) == (1, 1)  # a took the first, b the next
            gate.set()
            await settle(board, first)
            await settle(board, second)
            assert (board.load("a"), board.load("b")) == (0, 0)

    asyncio.run(main())


def test_every_subscriber_sees_every_answer(open_store: OpenStore) -> None:
    async def main() -> None:
        async with board_on(open_store, HandClock()) as board:
            board.join(helper("a", "x"))

            async def collect() -> list[BoardEvent]:
                seen: list[BoardEvent] = []
                async for event in board.events():
                    seen.append(event)
                    if sum(isinstance(e, Answered) for e in seen) == 3:
                        return seen
                raise AssertionError("the stream ended")

            subscribers = [asyncio.create_task(collect()) for _ in range(2)]
            await asyncio.sleep(0)
            posts = [await board.post(i, capabilities={"x"}) for i in range(3)]
            for events in await asyncio.wait_for(asyncio.gather(*subscribers), 10):
                answers = [e.answer for e in events if isinstance(e, Answered)]
                assert [a.post_id for a in answers] == [p.id for p in posts]
                assert [a.result for a in answers] == ["a:0", "a:1", "a:2"]
                kinds = [e.kind for e in events]
                assert kinds[:2] == ["posted", "awarded"]
                assert sorted(kinds) == ["answered"] * 3 + ["awarded"] * 3 + ["posted"] * 3

    asyncio.run(main())


def test_an_expired_lease_puts_the_post_back_and_it_is_re_awarded(
    open_store: OpenStore,
) -> None:
    clock = HandClock()
    stuck = asyncio.Event()
    calls = {"stuck": 0}

    async def hang(post: Post, ctx: Any) -> str:
        stuck.set()
        await asyncio.Event().wait()  # a holder that never answers
        return "never"

    def eager_once(post: Post) -> float | None:
        calls["stuck"] += 1
        return 10.0 if calls["stuck"] == 1 else None

    async def main() -> None:
        async with board_on(open_store, clock, lease=30) as board:
            board.join(helper("stuck", "x", bid=eager_once, work=hang))
            board.join(helper("steady", "x"))
            post = await board.post("job", capabilities={"x"})
            await stuck.wait()
            clock.advance(29.9)
            await board.sweep()
            assert board.load("stuck") == 1  # not yet: the lease runs to 30 s
            clock.advance(0.2)
            await board.sweep()
            assert await settle(board, post) == "steady:job"
            assert board.load("stuck") == 0
            events = await board.store.events()
            kinds = [(kind, data.get("holder")) for _, kind, _, _, data in events]
            assert kinds == [
                ("posted", None),
                ("awarded", "stuck"),
                ("released", "stuck"),
                ("awarded", "steady"),
                ("answered", "steady"),
            ]
            assert "lease of 'stuck' expired" in events[2][4]["reason"]

    asyncio.run(main())


def test_a_late_answer_after_expiry_is_refused(open_store: OpenStore) -> None:
    clock = HandClock()

    async def main() -> None:
        async with board_on(open_store, clock, lease=5) as board:
            board.join(helper("a", "x", work=lambda post, ctx: asyncio.Event().wait()))
            post = await board.post("p", capabilities={"x"})
            await asyncio.sleep(0)
            claim = board._entries[post.id].claim
            assert claim is not None
            board.leave("a")  # so the expired post stays open
            clock.advance(6)
            await board.sweep()
            with pytest.raises(ClaimLostError, match="no longer live"):
                await board.answer(claim, "late")
            rows = await board.store.posts(("open",))
            assert [r["id"] for r in rows] == [post.id]

    asyncio.run(main())


def test_a_failed_claim_returns_to_the_board_until_the_attempts_run_out(
    open_store: OpenStore,
) -> None:
    tries: list[str] = []

    def flaky(post: Post, ctx: Any) -> str:
        tries.append(post.id)
        if len(tries) < 3:
            raise ValueError(f"try {len(tries)} broke")
        return "third time"

    def broken(post: Post, ctx: Any) -> str:
        raise ValueError("always")

    async def main() -> None:
        async with board_on(open_store, HandClock(), max_attempts=3) as board:
            board.join(helper("flaky", "x", work=flaky))
            board.join(helper("broken", "y", work=broken))
            assert await settle(board, await board.post("p", capabilities={"x"})) == "third time"
            doomed = await board.post("q", capabilities={"y"}, max_attempts=2)
            with pytest.raises(PostFailedError, match="all 2 claims failed; the last: .*always"):
                await settle(board, doomed)
            rows = {r["id"]: r for r in await board.store.posts(("answered", "failed"))}
            assert rows[doomed.id]["state"] == "failed"
            assert rows[doomed.id]["attempts"] == 2

    asyncio.run(main())


def test_a_post_nobody_can_serve_waits_for_its_deadline_then_fails(
    open_store: OpenStore,
) -> None:
    clock = HandClock()

    async def main() -> None:
        async with board_on(open_store, clock) as board:
            board.join(helper("a", "charts"))
            post = await board.post("q", capabilities={"sql", "geo"}, deadline=5)
            clock.advance(4.9)
            await board.sweep()
            assert [r["id"] for r in await board.store.posts(("open",))] == [post.id]
            clock.advance(0.2)
            await board.sweep()
            with pytest.raises(
                PostFailedError, match=r"no agent has capabilities \['geo', 'sql'\]"
            ):
                await settle(board, post)

    asyncio.run(main())


def test_a_post_waits_for_a_capable_volunteer_to_join(open_store: OpenStore) -> None:
    async def main() -> None:
        async with board_on(open_store, HandClock()) as board:
            post = await board.post("q", capabilities={"sql"})
            board.join(helper("late", "sql"))
            assert await settle(board, post) == "late:q"

    asyncio.run(main())


def test_two_boards_on_one_store_award_each_post_once(open_store: OpenStore) -> None:
    async def main() -> None:
        clock = HandClock()
        async with (
            open_store() as one,
            open_store() as two,
            Board(one, clock=clock) as a,
            Board(two, clock=clock) as b,
        ):
            posts = [await a.post(i, capabilities={"x"}) for i in range(20)]
            for board, name in ((a, "ann"), (b, "bob")):
                board.join(helper(name, "x"))
            await asyncio.gather(a.sweep(), b.sweep(), a.sweep(), b.sweep())
            for post in posts:
                # The board that won the post settles it at once; the other would see
                # the answer at its next read of the log.
                waits = [asyncio.ensure_future(x.answer_of(post)) for x in (a, b)]
                done, pending = await asyncio.wait(waits, timeout=10, return_when="FIRST_COMPLETED")
                assert done, f"post {post.id} was not answered"
                for wait in pending:
                    wait.cancel()
            events = await one.events()
            awarded = [p for _, kind, p, _, _ in events if kind == "awarded"]
            assert sorted(awarded) == sorted(p.id for p in posts)
            assert a.stats.awards + b.stats.awards == 20

    asyncio.run(main())


def test_a_new_board_on_the_store_sees_open_posts_and_answers(open_store: OpenStore) -> None:
    async def main() -> None:
        clock = HandClock()
        async with board_on(open_store, clock) as first:
            first.join(helper("a", "x"))
            done = await first.post("done", capabilities={"x"})
            await settle(first, done)
            waiting = await first.post("waiting", capabilities={"y"}, deadline=100)
        async with board_on(open_store, clock) as second:
            assert await second.answer_of(done.id) == "a:done"
            second.join(helper("b", "y"))
            await second.sweep()
            assert await settle(second, waiting) == "b:waiting"

    asyncio.run(main())


def test_a_batch_with_one_post_twice_stores_it_once(open_store: OpenStore) -> None:
    post = {
        "id": "p1", "content": {"q": 1}, "capabilities": ["x"], "poster": "app",
        "posted_at": 1.0, "deadline": None, "workflow": None, "max_attempts": 3,
    }  # fmt: skip
    won = {"holder": "a", "bid": 1.0, "lease_until": 100.0, "at": 1.0}
    answer = {"attempt": 1, "result": {"ok": True}, "at": 2.0}

    async def main() -> None:
        async with open_store() as store:
            ops = [("post", "p1", post), ("post", "p1", post), ("award", "p1", won)]
            assert await store.write([*ops, ("award", "p1", won)]) == [1, 0, 1, 0]
            assert await store.write([("post", "p1", post)]) == [0]
            assert await store.write([("answer", "p1", answer)] * 2) == [1, 0]
            assert [kind for _, kind, _, _, _ in await store.events()] == [
                "posted",
                "awarded",
                "answered",
            ]
            (row,) = await store.posts(("answered",))
            assert (row["result"], row["answered_by"], row["attempts"]) == ({"ok": True}, "a", 1)

    asyncio.run(main())


class CountingStore:
    """The in-process store, counting the sweeps that reach it (each starts with `expire`)."""

    def __init__(self) -> None:
        self.inner = MemoryBoardStore()
        self.sweeps = 0

    async def write(self, ops: Any) -> list[int]:
        return await self.inner.write(ops)

    async def expire(self, now: float) -> Any:
        self.sweeps += 1
        return await self.inner.expire(now)

    async def posts(self, states: Any) -> list[dict[str, Any]]:
        return await self.inner.posts(states)

    async def events(self, after: int = 0, limit: int = 10_000) -> Any:
        return await self.inner.events(after, limit)


async def idle(turns: int = 50) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def test_posts_do_not_set_off_sweeps_of_the_store() -> None:
    async def main() -> None:
        store = CountingStore()
        async with Board(store, clock=HandClock()) as board:
            board.join(helper("a", "x"))
            await idle()
            before = store.sweeps
            posts = [await board.post(i, capabilities={"x"}, deadline=50) for i in range(30)]
            assert [await settle(board, post) for post in posts] == [f"a:{i}" for i in range(30)]
            await idle()
            assert store.sweeps == before  # nothing was due: no deadline, no lease has passed

    asyncio.run(main())


def test_a_claimed_post_past_its_deadline_does_not_keep_the_timers_busy() -> None:
    async def main() -> None:
        store, clock = CountingStore(), HandClock()
        async with Board(store, clock=clock, lease=600) as board:
            board.join(helper("slow", "x", work=lambda post, ctx: asyncio.Event().wait()))
            post = await board.post("p", capabilities={"x"}, deadline=5)
            await idle()
            clock.advance(10)  # past the deadline, but the post is claimed until 1,600
            board.join(helper("other", "y"))  # wakes the timers
            await idle()
            assert store.sweeps <= 3
            assert [row["id"] for row in await store.posts(("claimed",))] == [post.id]

    asyncio.run(main())


def test_bad_input_is_refused_with_the_fix() -> None:
    async def main() -> None:
        async with Board(clock=HandClock()) as board:
            with pytest.raises(UsageError, match="write {'sql'}"):
                await board.post("q", capabilities="sql")
            with pytest.raises(UsageError, match="must be JSON data"):
                await board.post(object(), capabilities={"x"})
            with pytest.raises(UsageError, match="deadline=-1"):
                await board.post("q", capabilities={"x"}, deadline=-1)
            with pytest.raises(UsageError, match="takes a Volunteer"):
                board.join("not an agent")  # type: ignore[arg-type]
            board.join(helper("a", "x"))
            with pytest.raises(UsageError, match="already joined"):
                board.join(helper("a", "y"))
        with pytest.raises(UsageError, match="enter it first"):
            await Board(clock=HandClock()).post("q")
        with pytest.raises(UsageError, match="BoardStore"):
            Board(store=object())  # type: ignore[arg-type]

    asyncio.run(main())


# --- claims as tasks of the poster's workflow, on the virtual clock ----------------------------


def test_a_claim_runs_as_a_task_of_the_posters_workflow(clock: VirtualClock) -> None:
    seen: dict[str, Any] = {}

    async def analyst(post: Post, ctx: TaskContext | None) -> str:
        assert ctx is not None
        seen["task"] = ctx.task_id
        await asyncio.sleep(5)
        return f"rows for {post.content['question']}"

    async def main() -> None:
        async with Engine(clock=clock) as engine, Board(clock=clock, lease=60) as board:
            board.join(Helper("analyst", frozenset({"sql"}), analyst))

            async def coordinator(ctx: TaskContext) -> str:
                post = await board.post(
                    {"question": "q1"}, capabilities={"sql"}, poster="lead", ctx=ctx
                )
                return str(await board.answer_of(post))

            wf = Workflow("report")
            wf.add("coordinator", coordinator)
            result = await engine.run(wf)
            assert result.status == "succeeded"
            assert result.results["coordinator"] == "rows for q1"
            claim_task = seen["task"]
            assert claim_task.startswith("board/lead-") and claim_task.endswith("/1")
            assert result.results[claim_task] == "rows for q1"
            assert clock.monotonic() == pytest.approx(5.0)

    clock.run(main())


def test_in_a_workflow_an_expired_lease_is_re_awarded_and_the_run_succeeds(
    clock: VirtualClock,
) -> None:
    async def slow(post: Post, ctx: Any) -> str:
        await asyncio.sleep(100)
        return "slow"

    async def quick(post: Post, ctx: Any) -> str:
        await asyncio.sleep(2)
        return "quick"

    async def main() -> None:
        async with Engine(clock=clock) as engine, Board(clock=clock, lease=10) as board:
            board.join(Helper("slow", frozenset({"x"}), slow, bid=lambda p: 2.0))
            board.join(Helper("quick", frozenset({"x"}), quick, bid=lambda p: 1.0))

            async def coordinator(ctx: TaskContext) -> Any:
                post = await board.post("job", capabilities={"x"}, ctx=ctx)
                board.leave("slow")  # after the first award, so the re-award goes to quick
                return await board.answer_of(post)

            wf = Workflow("w")
            wf.add("coordinator", coordinator)
            result = await engine.run(wf)
            assert result.status == "succeeded", result.failures
            assert result.results["coordinator"] == "quick"
            # Both claims are tasks; the expired one ends with the answer the next one gave.
            claims = sorted(k for k in result.results if k.startswith("board/"))
            assert [c.rsplit("/", 1)[1] for c in claims] == ["1", "2"]
            assert {result.results[c] for c in claims} == {"quick"}
            assert clock.monotonic() == pytest.approx(12.0)  # lease 10 s, then 2 s of work

    clock.run(main())


def test_deadline_on_the_virtual_clock_fails_the_post(clock: VirtualClock) -> None:
    async def main() -> None:
        async with Board(clock=clock) as board:
            post = await board.post("q", capabilities={"nobody"}, deadline=30)
            with pytest.raises(PostFailedError, match=r"no agent has capabilities \['nobody'\]"):
                await board.answer_of(post)
            assert clock.monotonic() == pytest.approx(30.0)

    clock.run(main())


# --- a process killed while it holds a claim -------------------------------------------------

CHILD = """
import asyncio, sys
from agents import Board, Helper
from memory import SQLBoardStore, SQLStore
from orchestrator import VirtualClock

async def main() -> None:
    async with SQLStore(sys.argv[1]) as sql, Board(
        SQLBoardStore(sql), clock=VirtualClock(epoch=1000.0), lease=30
    ) as board:
        async def hold(post, ctx):
            print("claimed", post.id, flush=True)
            await asyncio.Event().wait()
        board.join(Helper("doomed", frozenset({"x"}), hold))
        await board.sweep()
        await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_killed_holder_loses_its_claim_when_the_lease_ends(tmp_path: Path) -> None:
    path = tmp_path / "board.db"
    clock = HandClock(start=1000.0)

    async def main() -> None:
        async with SQLStore(path) as sql, Board(SQLBoardStore(sql), clock=clock) as board:
            post = await board.post({"n": 1}, capabilities={"x"}, id="the-post")
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            child = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CHILD, str(path), stdout=subprocess.PIPE, env=env
            )
            try:
                assert child.stdout is not None
                line = await asyncio.wait_for(child.stdout.readline(), 60)
                assert line.decode().split() == ["claimed", "the-post"]
            finally:
                child.send_signal(signal.SIGKILL)
                await child.wait()
            board.join(helper("survivor", "x"))
            clock.advance(29)
            await board.sweep()
            rows = await board.store.posts(("claimed",))
            assert [(r["id"], r["holder"]) for r in rows] == [("the-post", "doomed")]
            clock.advance(2)
            await board.sweep()
            assert await settle(board, post) == "survivor:{'n': 1}"
            events = await board.store.events()
            kinds = [(kind, data.get("holder")) for _, kind, _, _, data in events]
            assert kinds == [
                ("posted", None),
                ("awarded", "doomed"),
                ("released", "doomed"),
                ("awarded", "survivor"),
                ("answered", "survivor"),
            ]

    asyncio.run(main())


def test_the_sql_store_needs_no_agents_import() -> None:
    # memory satisfies agents' protocol structurally (the layering test checks imports).
    assert not any(
        name.startswith("agents") for name in vars(sys.modules[SQLBoardStore.__module__])
    )
    assert isinstance(SQLBoardStore(SQLStore("x.db")), BoardStore)
    assert isinstance(MemoryBoardStore(), BoardStore)
    assert Awarded.__dataclass_params__.frozen  # type: ignore[attr-defined]
