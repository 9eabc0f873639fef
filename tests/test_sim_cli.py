"""`plait sim serve` from the command line: bad options and busy ports are one line on
stderr (`plait: error: ...`, exit 2), never a traceback; `--help` says how to use it."""

from __future__ import annotations

import socket

import pytest

from orchestrator.cli._cli import main


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == ""
    assert err.startswith("plait: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = one_line_error(capsys, ["sim", "serve", "--port", str(port)])
    assert err.startswith(f"plait: error: cannot serve on 127.0.0.1:{port}: ")
    assert "choose another --port" in err


@pytest.mark.parametrize(
    ("port", "says"),
    [
        ("70000", "--port 70000 is out of range; give 1-65535"),
        ("-1", "--port -1 is out of range"),
        ("0", "--port 0 is out of range"),
        ("http", "--port 'http' is not a port number"),
    ],
)
def test_an_invalid_port_is_refused_before_binding(
    capsys: pytest.CaptureFixture[str], port: str, says: str
) -> None:
    assert says in one_line_error(capsys, ["sim", "serve", "--port", port])


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--error-rate", "1.5"], "--error-rate 1.5 is not a share from 0 to 1"),
        (["--error-rate", "-0.1"], "--error-rate -0.1 is not a share from 0 to 1"),
        (["--timeout-rate", "nan"], "--timeout-rate nan is not a share from 0 to 1"),
        (["--timeout-rate", "often"], "--timeout-rate 'often' is not a number"),
        (
            ["--error-rate", "0.8", "--timeout-rate", "0.5"],
            "--error-rate 0.8 plus --timeout-rate 0.5 is more than 1",
        ),
    ],
)
def test_fault_rates_outside_0_1_are_refused(
    capsys: pytest.CaptureFixture[str], options: list[str], says: str
) -> None:
    assert says in one_line_error(capsys, ["sim", "serve", *options])


def test_a_host_that_cannot_be_bound_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(capsys, ["sim", "serve", "--host", "bad..host"])
    assert err.startswith("plait: error: cannot serve on bad..host:8000: ")


def test_help_shows_defaults_routes_and_how_to_point_plait_at_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "serve", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("h100-llama3-8b", "127.0.0.1", "8000"):
        assert f"(default: {default})" in text
    assert text.count("(default: 0)") == 3  # seed, error rate, timeout rate
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/health"):
        assert route in text
    for key in ('kind = "openai"', 'dialect = "sim"', 'url = "http://127.0.0.1:8000/v1"'):
        assert key in text
    assert 'clock = "system"' in text
