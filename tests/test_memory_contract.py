"""One contract for agent memory, on SQLite and on PostgreSQL (the `make_store` fixture of
conftest: a file under tmp_path, or a schema of its own in the local database)."""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from conftest import StoreFactory

from memory import (
    EmbedderError,
    Fact,
    Memory,
    MemoryQueryError,
    MemoryValueError,
    Note,
    Scope,
)
from memory._memory_search import ranges
from orchestrator import SystemClock, UsageError

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class SetClock(SystemClock):
    """Epoch time that moves only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.at = now

    def now(self) -> float:
        return self.at


class BagOfWords:
    """A deterministic embedder: each word adds 1 to one of 64 dimensions (by its CRC32)."""

    def __init__(self) -> None:
        self.calls = 0

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        vectors = []
        for text in texts:
            vector = [0.0] * 64
            for word in text.lower().split():
                vector[zlib.crc32(word.strip(".,").encode()) % 64] += 1.0
            vectors.append(vector)
        return vectors


class ShortEmbedder:
    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0]]  # one vector, whatever it is asked


@asynccontextmanager
async def memory(make_store: StoreFactory, **kw: Any) -> AsyncIterator[Memory]:
    async with make_store() as store:
        yield Memory(store, **kw)


def values(facts: Sequence[Fact]) -> list[tuple[int, Any]]:
    return [(f.version, f.value) for f in facts]


# --- facts ----------------------------------------------------------------------------------


def test_every_write_is_a_new_version_and_none_is_lost(make_store: StoreFactory) -> None:
    async def main() -> None:
        clock = SetClock()
        async with memory(make_store, clock=clock) as mem:
            first = await mem.remember("prefs", "tz", "Europe/Paris", tags=("user",), source="t1")
            clock.at += 5
            await mem.remember("prefs", "tz", {"zone": "Asia/Tokyo", "dst": False})
            await mem.remember("prefs", "tz", [1, 2.5, None, "x"])
            assert (first.version, first.tags, first.source, first.at) == (1, ("user",), "t1", 1e6)
            got = await mem.versions("prefs", "tz")
            assert values(got) == [
                (1, "Europe/Paris"),
                (2, {"zone": "Asia/Tokyo", "dst": False}),
                (3, [1, 2.5, None, "x"]),
            ]
            assert got[0].tags == ("user",) and got[1].at == 1e6 + 5
            latest = await mem.fact("prefs", "tz")
            assert latest is not None and latest.version == 3
            assert await mem.fact("prefs", "other") is None
            assert await mem.versions("nothing", "here") == []
            # Writing the same value again is still a version: nothing is deduplicated away.
            again = await mem.remember("prefs", "tz", [1, 2.5, None, "x"])
            assert again.version == 4

    run(main())


def test_forget_writes_a_tombstone_and_destroys_nothing(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            await mem.remember("prefs", "color", "turquoise")
            await mem.remember("prefs", "color", "vermilion")
            tomb = await mem.forget("prefs", "color", source="user asked")
            assert tomb is not None and tomb.forgotten and tomb.version == 3
            assert await mem.fact("prefs", "color") is None
            kept = await mem.versions("prefs", "color")
            assert values(kept) == [(1, "turquoise"), (2, "vermilion"), (3, None)]
            assert [f.forgotten for f in kept] == [False, False, True]
            assert kept[2].source == "user asked"
            assert await mem.search("vermilion") == []  # forgotten: not found any more
            assert await mem.forget("prefs", "color") is None  # already forgotten
            assert await mem.forget("prefs", "never") is None  # nothing to forget
            assert await mem.versions("prefs", "never") == []
            back = await mem.remember("prefs", "color", "ochre")
            assert back.version == 4
            assert [h.item for h in await mem.search("ochre")] == [back]

    run(main())


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({1, 2}, "set"),
        (object(), "not JSON data"),
        (float("nan"), "finite"),
        ({"a": {3: "x"}}, "key 3"),
        (b"bytes", "bytes"),
        ([1, complex(1, 2)], r"value\[1\]"),
    ],
)
def test_a_value_that_is_not_json_is_refused_and_nothing_written(
    make_store: StoreFactory, value: Any, words: str
) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            with pytest.raises(MemoryValueError, match=words):
                await mem.remember("ns", "k", value)
            assert await mem.versions("ns", "k") == []

    run(main())


def test_oversized_values_and_notes_are_refused_naming_the_limit(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store, max_value_bytes=100, max_note_bytes=200) as mem:
            await mem.remember("ns", "k", "x" * 98)  # 100 bytes with its quotes: fits
            with pytest.raises(MemoryValueError, match=r"101 bytes.*limit of 100 bytes"):
                await mem.remember("ns", "k", "é" * 49 + "y")
            with pytest.raises(MemoryValueError, match=r"limit of 200 bytes"):
                await mem.note("n" * 201)
            assert values(await mem.versions("ns", "k")) == [(1, "x" * 98)]
            assert await mem.search("n" * 201) == []

    run(main())


def test_bad_names_are_refused(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            for call in (
                mem.remember("", "k", 1),
                mem.remember("ns", "k" * 501, 1),
                mem.remember("ns", "k", 1, tags="one-string"),
                mem.note("   "),
            ):
                with pytest.raises(MemoryValueError):
                    await call
            with pytest.raises(MemoryValueError, match="scope tenant"):
                Scope(tenant="")

    run(main())


def test_concurrent_writers_to_one_key_get_distinct_consecutive_versions(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        # Two stores: two engines, two sets of connections, as two processes would have.
        async with make_store() as one, make_store() as two:
            mems = [Memory(one), Memory(two)]
            scope = Scope(tenant="t", agent="a")
            writes = [mems[i % 2].remember("ns", "k", i, scope=scope) for i in range(24)]
            facts = await asyncio.gather(*writes)
            assert sorted(f.version for f in facts) == list(range(1, 25))
            stored = await mems[0].versions("ns", "k", scope=scope)
            assert [f.version for f in stored] == list(range(1, 25))
            assert sorted(f.value for f in stored) == list(range(24))
            latest = await mems[1].fact("ns", "k", scope=scope)
            assert latest is not None and latest.version == 24

    run(main())


# --- scopes ---------------------------------------------------------------------------------


def test_scopes_are_isolated_and_tenants_never_see_each_other(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            a = Scope(tenant="A", workflow="w", agent="x")
            b = Scope(tenant="B", workflow="w", agent="x")
            await mem.remember("acct", "plan", "platinum alpha", scope=a)
            await mem.remember("acct", "plan", "platinum beta", scope=b)
            await mem.remember("acct", "plan", "platinum shared")  # the shared scope
            await mem.remember("acct", "ceo", "platinum tenant", scope=Scope(tenant="A"))
            await mem.remember("acct", "crew", "platinum agent", scope=Scope("A", agent="x"))
            await mem.remember("acct", "loose", "platinum loose", scope=Scope(workflow="w"))
            await mem.note("platinum memo for B", scope=Scope(tenant="B"))
            fa = await mem.fact("acct", "plan", scope=a)
            fb = await mem.fact("acct", "plan", scope=b)
            assert fa is not None and fa.value == "platinum alpha"
            assert fb is not None and fb.value == "platinum beta"
            assert await mem.fact("acct", "plan", scope=Scope(tenant="A")) is None

            def seen(hits: Sequence[Any]) -> set[str]:
                return {h.item.value if h.kind == "fact" else h.item.text for h in hits}

            assert seen(await mem.search("platinum", scope=a, include_shared=False)) == {
                "platinum alpha"
            }
            assert seen(await mem.search("platinum", scope=a)) == {
                "platinum alpha", "platinum shared", "platinum tenant", "platinum agent",
            }  # fmt: skip
            assert seen(await mem.search("platinum", scope=b)) == {
                "platinum beta", "platinum shared", "platinum memo for B",
            }  # fmt: skip
            # No tenant: the shared row and tenant-less rows that enclose the scope.
            assert seen(await mem.search("platinum", scope=Scope(workflow="w"))) == {
                "platinum shared", "platinum loose",
            }  # fmt: skip
            assert seen(await mem.search("platinum", include_shared=False)) == {"platinum shared"}
            assert seen(await mem.search("platinum", scope=Scope(tenant="C"))) == {
                "platinum shared"
            }

    run(main())


# --- search ---------------------------------------------------------------------------------


def test_search_ranks_the_relevant_row_first(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            await mem.note("The cafeteria menu changes every Monday.", title="lunch")
            await mem.note(
                "Rollback procedure: the billing database migration is reverted with the "
                "rollback script, then billing workers restart.",
                title="billing rollback runbook",
                tags=("ops",),
            )
            await mem.note("Quarterly billing totals are reported to finance.")
            await mem.remember("deploy", "billing", {"region": "eu-west", "owner": "payments"})
            await mem.remember("deploy", "search", {"region": "us-east", "owner": "discovery"})
            hits = await mem.search("how do I roll back the billing migration?")
            assert hits and isinstance(hits[0].item, Note)
            assert hits[0].item.title == "billing rollback runbook"
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            top = (await mem.search("discovery owner", kinds=("fact",)))[0].item
            assert isinstance(top, Fact) and top.key == "search"
            # Words are stemmed: "migrations" finds "migration".
            assert any(h.kind == "note" for h in await mem.search("migrations"))
            assert all(h.kind == "fact" for h in await mem.search("billing", kinds=["fact"]))
            assert len(await mem.search("billing", limit=1)) == 1
            # Only a fact's latest version is searched.
            await mem.remember("deploy", "billing", {"region": "ap-south", "owner": "payments"})
            assert await mem.search("eu west") == []
            found = await mem.search("ap south")
            assert [(h.item.kind, getattr(h.item, "version", None)) for h in found] == [("fact", 2)]

    run(main())


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        "((( ))) ",
        '"" * - : ^ +',
        "x" * 1001,
        " ".join(f"w{i}" for i in range(33)),
        None,
        42,
    ],
)
def test_a_malformed_query_is_a_clear_error_and_memory_carries_on(
    make_store: StoreFactory, query: Any
) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            await mem.note("saffron risotto recipe")
            with pytest.raises(MemoryQueryError) as caught:
                await mem.search(query)
            assert isinstance(caught.value, UsageError)
            assert "query" in str(caught.value)
            assert len(await mem.search("saffron")) == 1

    run(main())


@pytest.mark.parametrize(
    "query",
    [
        'saffron" OR "x',
        "saffron AND (risotto",
        "NEAR(saffron risotto)",
        "title:saffron",
        "saffron* -risotto ^x",
        "saffron | !risotto & <->",
        "saffron'); DROP TABLE plait_memory; --",
    ],
)
def test_fts_syntax_in_a_query_is_taken_as_words(make_store: StoreFactory, query: str) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            await mem.note("saffron risotto recipe")
            hits = await mem.search(query)
            assert [h.item.text for h in hits] == ["saffron risotto recipe"]  # type: ignore[union-attr]

    run(main())


def test_bad_search_arguments_are_clear_errors(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            with pytest.raises(MemoryQueryError, match="kinds"):
                await mem.search("x", kinds=())
            with pytest.raises(MemoryQueryError, match="kinds"):
                await mem.search("x", kinds=("facts",))  # type: ignore[arg-type]
            with pytest.raises(MemoryQueryError, match="limit"):
                await mem.search("x", limit=0)
            with pytest.raises(MemoryValueError, match="needs an embedder"):
                await mem.similar("x")

    run(main())


# --- embeddings -----------------------------------------------------------------------------


def test_embedding_search_ranks_by_cosine_within_scope(make_store: StoreFactory) -> None:
    async def main() -> None:
        embedder = BagOfWords()
        async with memory(make_store, embedder=embedder) as mem:
            await mem.note("red apples grow in the orchard")
            await mem.note("the server crashed during the deploy")
            await mem.remember("fruit", "favourite", "green apples orchard")
            await mem.note("apples orchard harvest", scope=Scope(tenant="other"))
            hits = await mem.similar("apples orchard", scope=Scope(tenant="mine"))
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            texts = [getattr(h.item, "text", None) or h.item.value for h in hits]  # type: ignore[union-attr]
            assert "apples orchard harvest" not in texts  # another tenant's
            assert set(texts[:2]) == {"red apples grow in the orchard", "green apples orchard"}
            assert texts[-1] == "the server crashed during the deploy"
            assert len(await mem.similar("deploy", limit=1)) == 1
            await mem.forget("fruit", "favourite")
            assert all(h.kind == "note" for h in await mem.similar("apples orchard"))
            with pytest.raises(MemoryQueryError):
                await mem.similar("  ")
        async with memory(make_store, embedder=ShortEmbedder()) as broken:
            with pytest.raises(EmbedderError, match="one per text"):
                await broken.remember_many([("a", "1", 1), ("a", "2", 2)])
            assert await broken.versions("a", "1") == []

    run(main())


# --- conversations --------------------------------------------------------------------------


def test_a_conversation_reads_back_in_order_per_agent_and_workflow(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        async with memory(make_store) as mem:
            for i in range(5):
                await mem.append_turn(
                    "planner", "w1", "user" if i % 2 == 0 else "assistant", f"m{i}"
                )
            await mem.append_turn("planner", "w2", "user", "elsewhere")
            await mem.append_turn("critic", "w1", "user", "another agent")
            await mem.append_turn("planner", "w1", "user", "tenant t", tenant="t")
            turns = await mem.conversation("planner", "w1")
            assert [(t.seq, t.role, t.content) for t in turns] == [
                (1, "user", "m0"), (2, "assistant", "m1"), (3, "user", "m2"),
                (4, "assistant", "m3"), (5, "user", "m4"),
            ]  # fmt: skip
            assert [t.content for t in await mem.conversation("planner", "w1", last=2)] == [
                "m3", "m4",
            ]  # fmt: skip
            # At most 5 characters of content: the two newest turns, whole.
            assert [t.content for t in await mem.conversation("planner", "w1", max_chars=5)] == [
                "m3", "m4",
            ]  # fmt: skip
            assert [t.content for t in await mem.conversation("planner", "w1", tenant="t")] == [
                "tenant t"
            ]
            assert await mem.conversation("nobody", "w1") == []
            with pytest.raises(MemoryValueError, match="last"):
                await mem.conversation("planner", "w1", last=-1)

    run(main())


# --- retention ------------------------------------------------------------------------------


def test_retention_bounds_growth_and_keeps_each_latest_version(make_store: StoreFactory) -> None:
    async def main() -> None:
        clock = SetClock()
        async with memory(make_store, clock=clock) as mem:
            mine = Scope(tenant="t")
            for i in range(5):
                await mem.remember("ns", "k", i)
                await mem.remember("ns", "k", i, scope=mine)
                await mem.append_turn("a", "w", "user", f"m{i}")
                clock.at += 10
            assert await mem.retain(keep_versions=2, scope=mine) == 3
            assert [f.version for f in await mem.versions("ns", "k", scope=mine)] == [4, 5]
            assert len(await mem.versions("ns", "k")) == 5  # another scope: untouched
            assert await mem.retain(keep_turns=3) == 2
            assert [t.seq for t in await mem.conversation("a", "w")] == [3, 4, 5]
            await mem.note("old note")
            clock.at += 101
            await mem.remember("solo", "k", "only version")
            # Older than 100 s: superseded versions, turns and the note; never a latest version.
            assert await mem.retain(older_than_s=100) == 4 + 1 + 3 + 1
            assert [f.version for f in await mem.versions("ns", "k")] == [5]
            assert [f.version for f in await mem.versions("ns", "k", scope=mine)] == [5]
            assert await mem.conversation("a", "w") == []
            assert await mem.search("note") == []
            assert len(await mem.search("only version")) == 1
            # Asked for explicitly: latest versions go too (and leave the search index).
            assert await mem.retain(older_than_s=50, drop_latest=True) == 2
            assert await mem.versions("ns", "k") == []
            assert (await mem.fact("solo", "k")) is not None
            assert await mem.search("ns") == []
            with pytest.raises(MemoryValueError, match="keep_versions"):
                await mem.retain(keep_versions=0)

    run(main())


def test_a_query_matching_more_than_the_window_ranks_the_newest(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store, search_window=3) as mem:
            await mem.note("walrus walrus walrus walrus", title="walrus")  # the best match, oldest
            for i in range(4):
                await mem.note(f"walrus sighting {i}", scope=Scope(tenant="other"))
                await mem.note(f"walrus sighting {i}")
            hits = await mem.search("walrus", limit=10)
            # Three rows in scope are ranked (the other tenant's never count against it).
            assert sorted(h.item.text for h in hits) == [  # type: ignore[union-attr]
                "walrus sighting 1", "walrus sighting 2", "walrus sighting 3",
            ]  # fmt: skip
        async with memory(make_store) as mem:
            assert (await mem.search("walrus"))[0].item.title == "walrus"  # type: ignore[union-attr]

    run(main())


def test_a_word_in_every_row_stays_inside_its_scope_and_kind(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store, search_window=5) as mem:
            # Scopes whose names differ by a byte, a stem, a prefix or a character.
            names = ["a", "ab", "abed", "abe", "é", "e\u0301", "x", "7878"]
            mine = Scope(tenant="ab", workflow="w", agent="x")
            await mem.note("common mine", scope=mine)
            await mem.remember("k", "v", "common my fact", scope=mine)
            for tenant in names:
                for i in range(8):  # newer than mine, and more than the window
                    await mem.note(f"common other {tenant} {i}", scope=Scope(tenant=tenant))
                    await mem.note(f"common near {i}", scope=Scope(tenant, "w", "x2"))
            hits = await mem.search("common", scope=mine, include_shared=False, limit=50)
            assert {h.item.scope for h in hits} == {mine} and len(hits) == 2
            notes = await mem.search(
                "common", scope=mine, include_shared=False, kinds=("note",), limit=50
            )
            assert [h.item.text for h in notes] == ["common mine"]  # type: ignore[union-attr]
            # The tenant's own rows enclose the scope: the newest 5 of them, no other's.
            wide = await mem.search("common", scope=mine, limit=50)
            assert len(wide) == 5
            assert {h.item.scope for h in wide} == {Scope(tenant="ab")}
            assert {
                h.item.scope for h in await mem.search("common", scope=Scope("é"), limit=50)
            } == {Scope("é")}

    run(main())


# --- search's walk over id ranges (PostgreSQL) -----------------------------------------------


async def _next_id(mem: Memory, value: int) -> None:
    """Make the next memory row's id `value` on PostgreSQL, whose search walks id ranges
    (memory/_memory_search.py); SQLite's FTS5 orders by rowid itself, and its ids stay
    consecutive here."""
    if mem.store.url.get_backend_name() == "postgresql":
        async with mem.store.engines[0].begin() as conn:
            await conn.execute(sa.text(f"ALTER SEQUENCE plait_memory_id_seq RESTART WITH {value}"))


def test_search_finds_the_newest_matches_across_far_apart_ids(make_store: StoreFactory) -> None:
    async def main() -> None:
        async with memory(make_store, search_window=4) as mem:
            await mem.note("bittern", title="bittern")  # the oldest row: id range 0
            # Ranges of every size (4,096 ids up to 2,097,152), far apart.
            for i, start in enumerate([5_000, 40_000, 300_000, 2_500_000, 20_000_000, 20_004_100]):
                await _next_id(mem, start)
                await mem.note(f"heron {i}")
                await mem.note(f"egret {i}", scope=Scope(tenant="other"))
            heron = await mem.search("heron", limit=10)
            assert sorted(h.item.text for h in heron) == [  # type: ignore[union-attr]
                "heron 2",
                "heron 3",
                "heron 4",
                "heron 5",
            ]  # fmt: skip: the newest four (the window), each once
            # A word only in the oldest row is found after walking every range.
            assert [h.item.title for h in await mem.search("bittern")] == ["bittern"]  # type: ignore[union-attr]
            assert await mem.search("egret") == []  # another tenant's
            assert len(await mem.search("egret", scope=Scope(tenant="other"))) == 4

    run(main())


def test_the_walk_covers_every_id_once_newest_first() -> None:
    for top in [0, 1, 4095, 4096, 32_767, 32_768, 100_000, 262_144 * 3 + 5, 2**21 * 40 + 17]:
        walk = ranges(top)
        spans = [(n << (12 + 3 * lvl), (n + 1) << (12 + 3 * lvl)) for lvl, n in walk]
        assert spans[0][0] <= top < spans[0][1]
        assert spans[-1][0] == 0
        for (low, _), (_, high) in itertools.pairwise(spans):
            assert high == low  # contiguous, descending, no overlap
        levels = [lvl for lvl, _ in walk]
        assert levels == sorted(levels)  # never back to a finer size
        for level in set(levels[:-1]) - {levels[-1]}:
            assert levels.count(level) >= 8  # up a size only after eight of one
    assert len(ranges(2**21 * 40)) < 80  # a word found nowhere: dozens of lookups, not 20,000


def test_memory_written_by_an_older_plait_is_found_after_the_upgrade(
    make_store: StoreFactory,
) -> None:
    async def main() -> None:
        old = make_store()
        old._connect()
        await old._migrate("v6")  # schema 6 indexed memory without id ranges
        await Memory(old).note("kingfisher by the river", scope=Scope(tenant="t"))
        await old.close()
        async with memory(make_store) as mem:
            hits = await mem.search("kingfisher", scope=Scope(tenant="t"))
            assert [h.item.text for h in hits] == ["kingfisher by the river"]  # type: ignore[union-attr]

    run(main())
