"""`make demo`'s comparison: the same agents through a naive client and through plait."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from demo import compare, main


def test_plait_finishes_the_seeded_agents_sooner_than_the_naive_client() -> None:
    row = compare(rate=0.25, programs=8, seed=0)
    assert row.naive.programs == row.plait.programs == 8
    assert row.plait.mean_jct < row.naive.mean_jct
    assert row.plait.cache_hit_share > row.naive.cache_hit_share
    assert row.mean_ratio == row.naive.mean_jct / row.plait.mean_jct


def test_the_demo_prints_both_modes_the_ratio_and_why() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["--programs", "6", "--rates", "0.25"]) == 0
    text = out.getvalue()
    assert "naive" in text and "plait" in text and "ratio" in text
    assert "What made the difference" in text
