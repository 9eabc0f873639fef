"""One replica's prefix cache as a router models it: blocks evicted least recently used first.

A request uses its blocks tail first, so its head ends up the most recent (as a server
frees a request's blocks, so that a shared prefix outlives each request's own suffix). The
plain way to keep that order, one ordered dict of blocks moved to the end on every use,
costs a step per block of every request: 4,000 steps for a turn of a 60k-token agent
conversation, at every router of every engine. Here blocks are kept in runs along their
prefix tree instead (a run has no branch inside and was last used by one request), so a
request costs a step per run on its path plus one per block it adds or evicts.

Why it evicts exactly as the ordered dict would: every use of a block also uses its
ancestors, later, so the least recently used block has no child: it is the last block of a
run at a leaf. Two leaves were never last used by the same request (a request is one path),
so the leaf whose request is oldest holds it, and within a run the deeper block is older.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import KeysView, Sequence


class _Run:
    """Blocks `depth`, `depth + 1`, ... of a chain, last used by request number `seq`."""

    __slots__ = ("blocks", "children", "depth", "parent", "seq")

    def __init__(self, blocks: list[int], parent: _Run | None, depth: int, seq: int) -> None:
        self.blocks = blocks
        self.parent = parent
        self.depth = depth
        self.seq = seq
        self.children = 0


class CacheModel:
    """The block hashes believed held by one replica, evicted least recently used first.

    Hashes must be chained (block i's hash covers blocks 0..i): then the held set is closed
    under prefixes, and `touch` needs to be told only how many leading blocks are held."""

    __slots__ = ("_heap", "_pushes", "run")

    def __init__(self) -> None:
        self.run: dict[int, _Run] = {}
        """Each held hash -> the run holding it."""
        # Leaf runs by the request that last used them; stale entries are skipped.
        self._heap: list[tuple[int, int, _Run]] = []
        self._pushes = 0

    def __len__(self) -> int:
        return len(self.run)

    def __contains__(self, block: int) -> bool:
        return block in self.run

    def hashes(self) -> KeysView[int]:
        return self.run.keys()

    def touch(self, held: int, last: int, new: Sequence[int], seq: int) -> None:
        """Request number `seq` (larger than any before) used a prefix of `held` blocks
        held here and ending with block `last` (none if `held` is 0), then the blocks `new`:
        those become the most recent, the head most, and `new` is added."""
        runs = self.run
        parent: _Run | None = None
        if held:
            run = runs[last]
            cut = held - run.depth  # how many of the run's blocks the request used
            if not 0 < cut <= len(run.blocks) or run.blocks[cut - 1] != last:
                raise ValueError("block hashes must be chained: a block held at another depth")
            if cut < len(run.blocks):
                # The request ends inside the run: the used part becomes a run of its own,
                # above the rest (which keeps its children and its older use).
                upper = _Run(run.blocks[:cut], run.parent, run.depth, run.seq)
                upper.children = 1
                runs.update(dict.fromkeys(upper.blocks, upper))
                del run.blocks[:cut]
                run.depth += cut
                run.parent = upper
                run = upper
            parent = run
            up: _Run | None = run
            while up is not None:
                up.seq = seq
                up = up.parent
        if new:
            if parent is not None and parent.children == 0:
                parent.blocks.extend(new)
                target = parent
            else:
                target = _Run(list(new), parent, held, seq)
                if parent is not None:
                    parent.children += 1
            before = len(runs)
            runs.update(dict.fromkeys(new, target))
            if len(runs) - before != len(new):
                raise ValueError("block hashes must be chained: a new block was held already")
            self._push(target)
        elif parent is not None and parent.children == 0:
            self._push(parent)

    def holds(self, block: int, blocks: int) -> bool:
        """Whether the `blocks`-block prefix ending with `block` is held."""
        run = self.run.get(block)
        if run is None:
            return False
        at = blocks - 1 - run.depth
        return 0 <= at < len(run.blocks) and run.blocks[at] == block

    def prefix(self, block: int, blocks: int) -> tuple[int, ...] | None:
        """The hashes of the held `blocks`-block prefix that ends with `block`; None if no
        such prefix is held."""
        run = self.run.get(block)
        end = blocks - (run.depth if run is not None else 0)
        if run is None or not 0 < end <= len(run.blocks) or run.blocks[end - 1] != block:
            return None
        parts = [run.blocks[:end]]
        up = run.parent
        while up is not None:
            parts.append(up.blocks)
            up = up.parent
        parts.reverse()
        return tuple(itertools.chain.from_iterable(parts))

    def evict(self, count: int = 1) -> list[int]:
        """Drop the `count` least recently used blocks (fewer if fewer are held); returns
        their hashes, least recent first."""
        heap, runs = self._heap, self.run
        out: list[int] = []
        while len(out) < count and runs:
            seq, _, run = heap[0]
            if not (run.blocks and run.children == 0 and run.seq == seq):
                heapq.heappop(heap)  # stale: used again, extended, or emptied since
                continue
            # The leaf stays the least recent until it is empty: take its tail at once.
            take = min(count - len(out), len(run.blocks))
            dropped = run.blocks[-take:]
            del run.blocks[-take:]
            dropped.reverse()
            for block in dropped:
                del runs[block]
            out += dropped
            if not run.blocks:
                heapq.heappop(heap)
                parent = run.parent
                if parent is not None:
                    parent.children -= 1
                    if parent.children == 0:
                        self._push(parent)
        return out

    def _push(self, run: _Run) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (run.seq, self._pushes, run))
