"""bench/rest.py, reduced: a few submissions to a real `plait serve`, a SIGKILL in the middle
of them, a restart; every accepted submission finishes, once. Also the bench's own parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rest import Server, main, percentile


def test_percentiles_interpolate_between_the_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == pytest.approx(50.5)
    assert percentile(values, 0.99) == pytest.approx(99.01)
    assert percentile([7.0], 0.99) == 7.0


def test_the_resumed_count_is_the_latest_starts(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "plait serve: listening on http://127.0.0.1:1/ (...)\n"
        "plait serve: resumed 12 workflow(s)\n"
        "plait serve: listening on http://127.0.0.1:1/ (...)\n"
    )
    server = Server([], "http://127.0.0.1:1", log)
    assert server.resumed() == 12
    with log.open("a") as out:
        out.write("plait serve: listening on http://127.0.0.1:1/ (...)\n")
    assert server.resumed() == 0


@pytest.mark.slow
def test_a_killed_service_finishes_every_accepted_submission(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sizes = "--requests 20 --crash-requests 40 --concurrency 4 --warmup 2 --finish-s 60"
    code = main(sizes.split())
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 0
    assert result["lost"] == result["duplicates"] == result["orphans"] == 0
    assert result["accepted"] == 2 + 20 + result["crash_accepted"]
    assert result["killed_at"] is not None and result["errors"] == 0
    for key in ("submissions_per_s", "p50_ms", "p99_ms"):
        assert result[key] > 0
