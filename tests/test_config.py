"""Config files: TOML and YAML read to the same checked model, every mistake is a UsageError
that names the file and the key, backends are built as configured, and the CLI runs from one."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from executors import OpenAIBackend, PrefixGrouper, Router, SimServer, backends_from_config
from orchestrator import (
    Config,
    Hints,
    Limits,
    LLMRequest,
    Message,
    UsageError,
    VirtualClock,
    load_config,
)
from orchestrator.cli._cli import main

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RESEARCH = str(EXAMPLES / "research_team.py")

FULL_TOML = """
[engine]
admission = "throughput"
clock = "virtual"

[backends.gpu]
kind = "openai"
url = "http://gpu0:8000/v1"
dialect = "vllm"
model = "llama"
api_key_env = "PLAIT_TEST_KEY"
timeout_s = 30
slots = 4
kv_cache_tokens = 50000
limits = { max_in_flight = 8, max_waiting = 100 }

[backends.pool]
kind = "router"
dialect = "sglang"
model = "llama"
block_tokens = 32
max_imbalance = 2.0
readmit_after_s = 5
health_interval_s = 0
kv_cache_tokens = 131072
group_prefixes = true

[[backends.pool.endpoints]]
url = "http://gpu1:8000/v1"
name = "one"

[[backends.pool.endpoints]]
url = "http://gpu2:8000/v1"
name = "two"
dialect = "vllm"
timeout_s = 10
kv_cache_tokens = 262144

[backends.sim]
kind = "sim"
profile = "cpu-tiny"
seed = 7
replicas = 3

[limits.tools]
max_in_flight = 2
"""

FULL_YAML = """
engine: {admission: throughput, clock: virtual}
backends:
  gpu:
    kind: openai
    url: http://gpu0:8000/v1
    dialect: vllm
    model: llama
    api_key_env: PLAIT_TEST_KEY
    timeout_s: 30
    slots: 4
    kv_cache_tokens: 50000
    limits: {max_in_flight: 8, max_waiting: 100}
  pool:
    kind: router
    dialect: sglang
    model: llama
    block_tokens: 32
    max_imbalance: 2.0
    readmit_after_s: 5
    health_interval_s: 0
    kv_cache_tokens: 131072
    group_prefixes: true
    endpoints:
      - {url: "http://gpu1:8000/v1", name: one}
      - {url: "http://gpu2:8000/v1", name: two, dialect: vllm, timeout_s: 10,
         kv_cache_tokens: 262144}
  sim: {kind: sim, profile: cpu-tiny, seed: 7, replicas: 3}
limits:
  tools: {max_in_flight: 2}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def comparable(config: Config) -> Any:
    backends = {name: (b.kind.name, b.settings, b.limits) for name, b in config.backends.items()}
    return config.engine, backends, dict(config.limits)


# --- reading -----------------------------------------------------------------------------------


def test_toml_and_yaml_read_to_the_same_config(tmp_path: Path) -> None:
    toml = load_config(write(tmp_path, "p.toml", FULL_TOML))
    yaml = load_config(write(tmp_path, "p.yml", FULL_YAML))
    assert comparable(toml) == comparable(yaml)
    assert toml.source.endswith("p.toml")
    assert toml.engine.admission == "throughput" and toml.engine.clock == "virtual"
    assert [b.kind.name for b in toml.backends.values()] == ["openai", "router", "sim"]
    assert toml.limits["gpu"].max_in_flight == 8 and toml.limits["gpu"].max_waiting == 100
    assert toml.backends["gpu"].settings.kv_cache_tokens == 50000  # type: ignore[attr-defined]
    assert toml.limits["tools"].max_in_flight == 2
    assert "pool" not in toml.limits  # no limits given: the engine's defaults apply


def test_the_shipped_examples_agree() -> None:
    toml = load_config(EXAMPLES / "plait.toml")
    yaml = load_config(EXAMPLES / "plait.yaml")
    assert comparable(toml) == comparable(yaml)
    assert toml.engine.clock == "virtual"
    assert toml.backends["default"].kind.name == "sim"


def commented_router(text: str) -> tuple[str, str]:
    """The documented-only router at the end of examples/plait.toml, uncommented: once with
    `urls` and once with `endpoints` (the two ways it shows; `##` marks its prose)."""
    tail = text[text.index("# [backends.default]") :]
    lines = [ln.removeprefix("# ") for ln in tail.splitlines() if not ln.startswith("##")]
    both = "\n".join("" if ln == "#" else ln for ln in lines)
    first_member = both.index("[[backends.default.endpoints]]")
    with_urls = both[:first_member]
    with_endpoints = re.sub(r"^urls = .*$", "", both, flags=re.M)
    return with_urls, with_endpoints


def test_the_commented_vllm_router_example_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "k")
    for variant in commented_router((EXAMPLES / "plait.toml").read_text()):
        [router] = backends_from_config(_toml_dict(variant)).values()
        assert isinstance(router, Router)  # no prefix grouping unless asked for
        assert [b.base_url for b in router.backends] == [  # type: ignore[attr-defined]
            "http://gpu1:8000/v1",
            "http://gpu2:8000/v1",
        ]
        assert {b.dialect for b in router.backends} == {"vllm"}  # type: ignore[attr-defined]


def _toml_dict(text: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(text)


# --- every mistake names the file and the key ------------------------------------------------


def error_of(tmp_path: Path, name: str, text: str) -> str:
    path = write(tmp_path, name, text)
    with pytest.raises(UsageError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    return message


def test_an_unknown_extension_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, "plait.ini", "[engine]\n")
    assert "unknown config file type '.ini'; use a .toml, .yaml or .yml file" in message


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"no config file at '.*nope\.toml'"):
        load_config(tmp_path / "nope.toml")


def test_malformed_toml_says_where(tmp_path: Path) -> None:
    message = error_of(tmp_path, "p.toml", '[engine]\nadmission = "off"\nclock = \n')
    assert "not valid TOML" in message and "line 3" in message


def test_malformed_yaml_says_where(tmp_path: Path) -> None:
    message = error_of(tmp_path, "p.yaml", "engine:\n  admission: off\n clock: [virtual\n")
    assert "not valid YAML" in message and re.search(r"line [23], column", message)


def test_a_yaml_key_given_twice_is_an_error_as_in_toml(tmp_path: Path) -> None:
    message = error_of(tmp_path, "p.yaml", "engine:\n  admission: off\n  admission: throughput\n")
    assert "duplicate key 'admission' (at line 3, column 3)" in message


def test_a_yaml_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    message = error_of(tmp_path, "p.yaml", "- engine\n- backends\n")
    assert "the top level must be a mapping with the keys engine, backends, limits" in message


def test_an_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "p.yaml", ""))
    assert config.backends == {} and config.engine.admission == "deadlines"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[backends.gpu]\nkind = "openai"\nurl = "http://x/v1"\ndialect = "vlm"\n',
            "backends.gpu.dialect: unknown dialect 'vlm'; choose one of vllm, vllm-continuum, "
            "sglang, dynamo, llamacpp, openai, sim",
        ),
        (
            '[backends.s]\nkind = "sim"\nprofile = "a100"\n',
            "backends.s.profile: unknown simulator profile 'a100'; choose one of h100-llama3-8b,",
        ),
        (
            '[backends.gpu]\nkind = "openai"\nurl = "http://x/v1"\ndialekt = "vllm"\n',
            "backends.gpu: unknown key 'dialekt'; allowed: url, dialect, model, api_key, "
            "api_key_env, timeout_s, slots, kv_cache_tokens",
        ),
        (
            '[engine]\nadmission = "lifo"\n',
            "engine.admission: Input should be 'deadlines', 'throughput' or 'off' (got 'lifo')",
        ),
        (
            '[engine]\nclock = "wall"\n',
            "engine.clock: Input should be 'system' or 'virtual' (got 'wall')",
        ),
        (
            '[backends.s]\nkind = "sim"\nseed = "7"\n',
            "backends.s.seed: Input should be a valid integer (got '7')",
        ),
        ('[backends.gpu]\nurl = "http://x/v1"\n', "backends.gpu.kind: missing; choose one of"),
        ('[backends.gpu]\nkind = "gpu"\n', "backends.gpu.kind: unknown backend kind 'gpu'"),
        (
            '[backends.gpu]\nkind = "openai"\n',
            "backends.gpu.url: missing; this key is required",
        ),
        (
            '[backends.gpu]\nkind = "openai"\nurl = "http://u/v1"\n'
            'api_key = "k"\napi_key_env = "K"\n',
            "backends.gpu: give api_key or api_key_env, not both",
        ),
        (
            '[backends.r]\nkind = "router"\n',
            "backends.r: give the members as either urls or endpoints (exactly one)",
        ),
        (
            '[backends.r]\nkind = "router"\nurls = []\n',
            "backends.r: a router needs at least one endpoint",
        ),
        (
            '[backends.r]\nkind = "router"\nurls = ["http://a/v1", "http://a/v1"]\n',
            "backends.r: endpoint 'http://a/v1' is listed twice",
        ),
        (
            '[backends.r]\nkind = "router"\nendpoints = [{url = "u", dialect = "x"}]\n',
            "backends.r.endpoints[0].dialect: unknown dialect 'x'",
        ),
        (
            '[backends.s]\nkind = "sim"\nlimits = { max_in_flight = 0 }\n',
            "backends.s.limits.max_in_flight: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            "[limits.tools]\nmax_in_flight = 2\nbatch_in_flight = 4\n",
            "limits.tools: batch_in_flight=4 must be between 1 and max_in_flight (2), or None "
            "to learn it",
        ),
        (
            '[backends.s]\nkind = "sim"\n[limits.s]\nmax_in_flight = 2\n',
            "limits.s: backend 's' has its own limits table; set them once, in backends.s.limits",
        ),
        (
            "[engine.gate]\nlikely = 1.5\n",
            'engine.gate: no longer a key: the deadline gate is part of admission = "deadlines"',
        ),
        (
            '[engine]\npolicy = "las"\n',
            "engine.policy: no longer a key: the order follows the admission mode: admission = "
            '"deadlines"',
        ),
        (
            '[backends.r]\nkind = "router"\nurls = ["http://a/v1"]\ncache_blocks = 4096\n',
            "backends.r.cache_blocks: no longer a key: the router reads each server's KV cache "
            "from the server (vLLM, SGLang, llama.cpp); where a server does not say it, give "
            "kv_cache_tokens, in tokens (cache_blocks x block_tokens)",
        ),
        (
            '[backends.gpu]\nkind = "openai"\nurl = "http://x/v1"\n'
            "limits = { kv_tokens = 50000, max_in_fligt = 2 }\n",
            "backends.gpu.limits.kv_tokens: no longer a key: the engine holds new programs back "
            "at 80% of the server's KV cache",
        ),
        (
            '[backends.gpu]\nkind = "openai"\nurl = "http://x/v1"\nkv_cache_tokens = 0\n',
            "backends.gpu.kv_cache_tokens: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            '[backends.r]\nkind = "router"\nendpoints = [{url = "http://a/v1", '
            "kv_cache_tokens = 100000000000000}]\n",
            "backends.r.endpoints[0].kv_cache_tokens: Input should be less than or equal to "
            "10000000000",
        ),
        ("[backend.s]\n", "unknown key 'backend'; allowed: engine, backends, limits"),
        ("backends = 3\n", "backends: Input should be a valid dictionary (got 3)"),
    ],
)
def test_each_mistake_names_the_key_and_what_is_allowed(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in error_of(tmp_path, "p.toml", text)


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    message = error_of(
        tmp_path,
        "p.toml",
        '[backends.a]\nkind = "sim"\nprofile = "x"\n[backends.b]\nkind = "nope"\n',
    )
    assert "2 problems" in message
    assert "backends.a.profile" in message and "backends.b.kind" in message


# --- building ----------------------------------------------------------------------------------


def test_backends_are_built_as_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAIT_TEST_KEY", "secret")
    clock = VirtualClock()
    built = backends_from_config(write(tmp_path, "p.toml", FULL_TOML), clock)
    assert list(built) == ["gpu", "pool", "sim"]

    gpu = built["gpu"]
    assert isinstance(gpu, OpenAIBackend)
    assert (gpu.base_url, gpu.dialect, gpu.model, gpu.name, gpu.slots) == (
        "http://gpu0:8000/v1",
        "vllm",
        "llama",
        "gpu",
        4,
    )

    grouper = built["pool"]
    assert isinstance(grouper, PrefixGrouper)  # group_prefixes = true
    assert grouper.block_tokens == 32 and grouper.min_shared_blocks == 8
    pool = grouper.backend
    assert isinstance(pool, Router)
    assert pool.names == ["one", "two"]
    assert pool.block_tokens == 32 and pool.readmit_after_s == 5
    assert pool.policy.max_imbalance == 2.0
    assert pool.health_interval_s is None  # 0 in the file: no probes
    assert pool.tokenize is None
    # Its members' caches are read as it is entered (their kv_cache_tokens where their
    # servers do not say them: test_router_capacity.py), not when it is built.
    assert pool.policy.blocks_per_replica is None
    one, two = pool.backends
    assert isinstance(one, OpenAIBackend) and isinstance(two, OpenAIBackend)
    # What a member leaves out it takes from the router's table.
    assert (one.base_url, one.dialect, one.model) == ("http://gpu1:8000/v1", "sglang", "llama")
    assert (two.base_url, two.dialect, two.model) == ("http://gpu2:8000/v1", "vllm", "llama")
    assert one.name == "pool/one"
    assert (gpu.kv_cache_tokens, one.kv_cache_tokens, two.kv_cache_tokens) == (
        50000,
        131072,
        262144,
    )

    sims = built["sim"]
    assert isinstance(sims, Router)
    assert sims.names == ["sim-0", "sim-1", "sim-2"]
    assert all(isinstance(s, SimServer) for s in sims.backends)
    assert [s.seed for s in sims.backends] == [7, 8, 9]  # type: ignore[attr-defined]
    assert {s.profile.name for s in sims.backends} == {"cpu-tiny"}  # type: ignore[attr-defined]
    profile = sims.backends[0].profile  # type: ignore[attr-defined]

    async def entered() -> tuple[int, int | None]:
        async with sims:
            return sims.block_tokens, sims.policy.blocks_per_replica

    # The simulated servers say the profile's block and cache, as vLLM says its own.
    assert clock.run(entered()) == (profile.block_size, profile.num_blocks)


def test_one_simulated_server_is_not_wrapped_in_a_router() -> None:
    [sim] = backends_from_config({"backends": {"d": {"kind": "sim", "seed": 3}}}).values()
    assert isinstance(sim, SimServer)
    assert sim.profile.name == "h100-llama3-8b" and sim.seed == 3


def test_a_missing_key_variable_is_named_when_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PLAIT_TEST_KEY", raising=False)
    path = write(tmp_path, "p.toml", FULL_TOML)
    config = load_config(path)  # reading does not need the secret
    with pytest.raises(UsageError) as caught:
        config.build_backends()
    assert str(caught.value) == (
        f"{path}: backends.gpu: api_key_env: the environment variable PLAIT_TEST_KEY is not "
        "set; export it before running, or remove api_key_env for a server without keys"
    )


def test_a_tokenizer_needs_transformers() -> None:
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed here")
    source = {"backends": {"r": {"kind": "router", "urls": ["http://u/v1"], "tokenizer": "gpt2"}}}
    with pytest.raises(UsageError, match="'gpt2' needs the transformers package"):
        backends_from_config(source)


@asynccontextmanager
async def key_recorder(seen: list[dict[str, Any]]) -> AsyncIterator[str]:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"auth": request.headers.get("Authorization"), **body})
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/v1"))
    finally:
        await server.close()


def test_a_built_endpoint_sends_the_key_from_the_environment_and_its_dialect(
    clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_TEST_KEY", "s3cret")
    seen: list[dict[str, Any]] = []
    request = LLMRequest((Message("user", "hi"),), "asked-for", max_tokens=4)

    async def go() -> str:
        async with key_recorder(seen) as url:
            source = {
                "backends": {
                    "gpu": {
                        "kind": "openai",
                        "url": url,
                        "dialect": "vllm",
                        "model": "served",
                        "api_key_env": "PLAIT_TEST_KEY",
                    }
                }
            }
            backend = backends_from_config(source)["gpu"]
            assert isinstance(backend, OpenAIBackend)
            async with backend:
                return (await backend.complete(request, Hints(program_id="p1"))).text

    assert clock.run(go()) == "ok"
    [body] = seen
    assert body["auth"] == "Bearer s3cret"
    assert body["model"] == "served"
    assert body["session_id"] == "p1" and "priority" in body  # the vllm dialect's fields


# --- the CLI -----------------------------------------------------------------------------------


def mean_completion(text: str) -> float:
    found = re.search(r"mean completion ([0-9.]+) s on the (\w+) clock", text)
    assert found, text
    return float(found.group(1))


@pytest.mark.parametrize("name", ["plait.toml", "plait.yaml"])
def test_cli_runs_the_research_team_from_a_config(name: str) -> None:
    out = io.StringIO()
    assert main(["run", RESEARCH, "--config", str(EXAMPLES / name)], out=out) == 0
    text = out.getvalue()
    assert "4 workflow(s), 4 succeeded" in text
    assert "on the virtual clock" in text
    assert "backend 'default': simulated h100-llama3-8b" in text


def test_command_line_limits_override_the_file(tmp_path: Path) -> None:
    config = str(EXAMPLES / "plait.toml")
    wide, narrow, from_file = io.StringIO(), io.StringIO(), io.StringIO()
    assert main(["run", RESEARCH, "--config", config], out=wide) == 0
    assert main(["run", RESEARCH, "--config", config, "--max-in-flight", "1"], out=narrow) == 0
    one_at_a_time = write(
        tmp_path,
        "one.toml",
        (EXAMPLES / "plait.toml").read_text().replace("max_in_flight = 32", "max_in_flight = 1"),
    )
    assert main(["run", RESEARCH, "--config", str(one_at_a_time)], out=from_file) == 0
    # One call at a time on the simulated GPU: no batching, so every program finishes later;
    # the same bound from the file or from the command line gives the same virtual times.
    assert mean_completion(narrow.getvalue()) > 2 * mean_completion(wide.getvalue())
    assert mean_completion(narrow.getvalue()) == mean_completion(from_file.getvalue())


def test_the_clock_comes_from_the_file_unless_the_command_line_says(tmp_path: Path) -> None:
    flow = write(
        tmp_path,
        "flow.py",
        "from orchestrator import Workflow\n"
        "def workflows():\n"
        "    wf = Workflow('one')\n"
        "    wf.add('a', lambda: 1)\n"
        "    return wf\n",
    )
    config = write(tmp_path, "p.toml", '[engine]\nclock = "virtual"\nadmission = "throughput"\n')
    out = io.StringIO()
    assert main(["run", str(flow), "--config", str(config)], out=out) == 0
    assert "on the virtual clock" in out.getvalue()
    out = io.StringIO()
    assert main(["run", str(flow), "--config", str(config), "--clock", "system"], out=out) == 0
    assert "on the system clock" in out.getvalue()


def test_a_config_backend_wins_over_the_modules_of_the_same_name(tmp_path: Path) -> None:
    """`plait run examples/map_reduce.py --config FILE` with a `default` backend in FILE: the
    file's backend runs the calls, and the summary says it replaced the module's."""
    config = write(
        tmp_path, "p.toml", '[backends.default]\nkind = "sim"\nprofile = "h100x4-llama3-70b"\n'
    )
    out = io.StringIO()
    code = main(["run", "examples/map_reduce.py", "--config", str(config)], out=out)
    text = out.getvalue()
    assert code == 0, text
    assert f"backend 'default': from {config} (replaces the one backends() in map_reduce.py" in text
    # The simulated 70B server's describe() line shows it served the calls.
    assert re.search(r"backend 'default': .*70", text), text


def _remote_config(tmp_path: Path, engine: str = "") -> Path:
    return write(
        tmp_path,
        "remote.toml",
        engine + '[backends.default]\nkind = "openai"\nurl = "http://127.0.0.1:9/v1"\n'
        'dialect = "sim"\n',
    )


def test_a_modules_virtual_clock_gives_way_to_a_configs_network_backend(tmp_path: Path) -> None:
    from orchestrator.cli._cliconfig import clock_of

    module = type("M", (), {"CLOCK": "virtual"})
    config = load_config(_remote_config(tmp_path))
    clock, notes = clock_of(None, config, module)  # type: ignore[arg-type]
    assert clock == "system"
    assert "backend(s) 'default'" in notes[0] and "network" in notes[0]
    # Without network backends the module's choice stands.
    assert clock_of(None, None, module) == ("virtual", [])  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["flag", "file"])
def test_an_explicit_virtual_clock_with_a_network_backend_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    engine = '[engine]\nclock = "virtual"\n' if where == "file" else ""
    config = _remote_config(tmp_path, engine)
    argv = ["run", "examples/research_team.py", "--config", str(config)]
    if where == "flag":
        argv += ["--clock", "virtual"]
    assert main(argv, out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "backend 'default'" in err and "needs the system clock" in err
    assert ("drop --clock virtual" if where == "flag" else 'clock = "system"') in err


def test_a_module_and_a_file_with_different_backends_are_merged(tmp_path: Path) -> None:
    flow = write(
        tmp_path,
        "flow.py",
        "from agents import Agent\n"
        "from executors import echo, FunctionLLM\n"
        "from orchestrator import Workflow\n"
        "CLOCK = 'virtual'\n"
        "def backends(clock):\n"
        "    return {'fake': FunctionLLM(echo, clock=clock)}\n"
        "def workflows():\n"
        "    wf = Workflow('w')\n"
        "    wf.add('a', Agent('a', 'sys', backend='fake').ask('hi'))\n"
        "    wf.add('b', Agent('b', 'sys').ask('hi', max_tokens=4))\n"
        "    return wf\n",
    )
    config = write(tmp_path, "p.toml", '[backends.default]\nkind = "sim"\n')
    out = io.StringIO()
    assert main(["run", str(flow), "--config", str(config)], out=out) == 0
    assert "backend 'default': simulated h100-llama3-8b: 1 requests" in out.getvalue()


def test_a_bad_config_stops_the_run_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, "p.toml", '[backends.default]\nkind = "sim"\nprofile = "a100"\n')
    assert main(["run", RESEARCH, "--config", str(config)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"plait: error: {config}: backends.default.profile: unknown")
    assert "Traceback" not in err


def test_config_check_prints_the_resolved_backends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_TEST_KEY", "secret")
    path = write(tmp_path, "p.toml", FULL_TOML)
    out = io.StringIO()
    assert main(["config", "check", str(path)], out=out) == 0
    text = out.getvalue()
    assert text.splitlines()[:2] == [f"{path}: valid", "engine: clock virtual"]
    assert (
        "backend 'gpu' (openai): vllm endpoint http://gpu0:8000/v1, model llama, "
        "key from $PLAIT_TEST_KEY (set), timeout 30 s, 4 slots; capacity: KV cache and block "
        "read from GET http://gpu0:8000/metrics as the run starts, else kv_cache_tokens 50,000; "
        "new programs are held back as paused ones fill it\n"
        "  limits: at most 8 in flight, 100 waiting\n"
    ) in text
    assert (
        "  one: sglang endpoint http://gpu1:8000/v1, model llama, no key, timeout 600 s; "
        "capacity: KV cache, page and running-request cap (max_in_flight where no limits are "
        "set) read from GET http://gpu1:8000/server_info or GET "
        "http://gpu1:8000/get_server_info as the run starts, else kv_cache_tokens 131,072; "
        "no hold-back: the server keeps paused programs' KV itself\n"
    ) in text
    assert "backend 'pool' (router): router over 2 endpoint(s), blocks of 32 tokens" in text
    assert "  two: vllm endpoint http://gpu2:8000/v1, model llama, no key, timeout 10 s" in text
    assert "backend 'sim' (sim): simulated cpu-tiny" in text and "3 replicas" in text
    assert "resource 'tools': at most 2 in flight" in text
    assert "secret" not in text  # never print a key


def test_config_check_refuses_a_bad_file_and_a_missing_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "bad.yaml", "engine:\n  admission: lifo\n")
    assert main(["config", "check", str(bad)], out=io.StringIO()) == 2
    assert "engine.admission: Input should be" in capsys.readouterr().err
    monkeypatch.delenv("PLAIT_TEST_KEY", raising=False)
    secret = write(tmp_path, "p.toml", FULL_TOML)
    out = io.StringIO()
    assert main(["config", "check", str(secret)], out=out) == 0  # a warning, not a failure
    assert "valid" in out.getvalue()
    assert "plait: warning: backends." in (err := capsys.readouterr().err)
    assert "PLAIT_TEST_KEY is not set" in err
    assert main(["config", "check", "--strict", str(secret)], out=io.StringIO()) == 1
    assert "--strict" in capsys.readouterr().err


def test_the_docs_own_example_checks_with_its_key_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = (ROOT / "docs" / "config.md").read_text()
    example = docs.split("```toml\n", 1)[1].split("```", 1)[0]
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    path = write(tmp_path, "docs.toml", example)
    assert main(["config", "check", str(path)], out=io.StringIO()) == 0
    assert "VLLM_API_KEY is not set" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("gpu1:8000/v1", "is not an http(s) URL; give http:// or https://"),
        ("localhost:8000", "give http:// or https://"),
        ("ftp://gpu1/v1", "is not an http(s) URL"),
        ("http://gpu1:8000", "did you mean 'http://gpu1:8000/v1'?"),
        ("http://gpu1:8000/", "did you mean 'http://gpu1:8000/v1'?"),
    ],
)
def test_a_url_that_cannot_work_is_refused_at_the_check(
    tmp_path: Path, url: str, says: str
) -> None:
    text = f'[backends.gpu]\nkind = "openai"\nurl = "{url}"\n'
    assert says in error_of(tmp_path, "p.toml", text)
    router = f'[backends.r]\nkind = "router"\nurls = ["http://ok:1/v1", "{url}"]\n'
    assert says in error_of(tmp_path, "r.toml", router)


def test_problems_in_every_section_are_reported_in_one_pass(tmp_path: Path) -> None:
    text = (
        '[engine]\nadmission = "lifo"\n\n'
        '[backends.a]\nkind = "openai"\nurl = "gpu1:8000/v1"\n\n'
        '[backends.b]\nkind = "sim"\nprofile = "nope"\n\n'
        "[limits.local]\nmax_in_flight = 0\n"
    )
    message = error_of(tmp_path, "p.toml", text)
    assert "4 problems" in message
    for path in ("engine.admission", "backends.a.url", "backends.b.profile", "limits.local"):
        assert path in message


def test_load_config_takes_a_dict_too() -> None:
    config = load_config({"engine": {"admission": "off"}})
    assert config.source == "<dict>" and config.engine.admission == "off"
    with pytest.raises(UsageError, match=r"^<dict>: engine.admission: Input should be"):
        load_config({"engine": {"admission": "lifo"}})


def test_python_api_runs_a_workflow_on_configured_backends(clock: VirtualClock) -> None:
    from agents import Agent
    from orchestrator import Engine, RunResult, Workflow

    source = EXAMPLES / "plait.toml"
    config = load_config(source)

    async def go() -> RunResult:
        backends = backends_from_config(source)
        async with contextlib.AsyncExitStack() as stack:
            for backend in backends.values():
                if isinstance(backend, contextlib.AbstractAsyncContextManager):
                    await stack.enter_async_context(backend)
            async with Engine(
                backends=backends, admission=config.engine.admission, limits=config.limits
            ) as engine:
                wf = Workflow("w")
                wf.add("a", Agent("a", "sys").ask("hi", max_tokens=5))
                return await engine.run(wf)

    result = clock.run(go())
    assert result.ok and result.llm_calls == 1
    assert result.duration > 0  # the simulated GPU took (virtual) time to answer


def toml_table(table: dict[str, object]) -> str:
    """`table` as the TOML of a backend named d (strings, numbers and lists of strings)."""
    lines = ["[backends.d]"]
    for key, value in table.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _two_replicas(kind: str) -> dict[str, object]:
    """A backend table of two replicas behind a router: simulated, or two endpoints."""
    if kind == "sim":
        return {"kind": "sim", "replicas": 2}
    return {"kind": "router", "urls": ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]}


@pytest.mark.parametrize("kind", ["sim", "router"])
def test_lanes_are_learned_and_their_old_keys_say_what_became_of_them(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A router from a file keeps "auto" lanes sized by the replicas' learned knee, takes no
    batch call on a lane beside tight urgent work, and shares 32 beside `shareable` work;
    the keys that once set these are refused, each saying what to do instead."""
    table = _two_replicas(kind)
    [backend] = backends_from_config({"backends": {"d": table}}).values()
    assert isinstance(backend, Router)
    lanes = backend.lane_policy
    assert (lanes.urgent_lanes, lanes.learns_calls, lanes.batch_in_flight) == ("auto", True, 0)
    assert lanes.share_calls == 32
    for key, value in (
        ("urgent_lanes", 1),
        ("lane_urgent_calls", 8),
        ("lane_batch_in_flight", 2),
        ("lane_batch_programs", 1),
        ("lane_prefill_tokens", 128),
        ("lane_share_calls", 0),
        ("lane_quiet_s", 1.0),
    ):
        with pytest.raises(UsageError, match=f"{key}: no longer a key: lanes size themselves"):
            backends_from_config({"backends": {"d": {**table, key: value}}})
        path = write(tmp_path, f"{kind}.toml", toml_table({**table, key: value}))
        assert main(["config", "check", str(path)], out=io.StringIO()) == 2
        assert "Router(lanes=LaneTuning(...))" in capsys.readouterr().err
    with pytest.raises(UsageError, match="lane_share_slack.*no longer a key.*shareable"):
        backends_from_config({"backends": {"d": {**table, "lane_share_slack": 2.0}}})


@pytest.mark.parametrize("kind", ["sim", "router"])
def test_a_new_lane_is_cleared_of_batch_calls_unless_the_config_says_not(
    kind: str, tmp_path: Path
) -> None:
    table = _two_replicas(kind)

    def clears(**extra: object) -> bool:
        [backend] = backends_from_config({"backends": {"d": {**table, **extra}}}).values()
        assert isinstance(backend, Router)
        return backend.lane_clear

    assert clears() is True
    assert clears(lane_clear=False) is False
    said = []
    for extra in ({}, {"lane_clear": False}):
        out = io.StringIO()
        path = write(tmp_path, f"{kind}.toml", toml_table({**table, **extra}))
        assert main(["config", "check", str(path)], out=out) == 0
        said.append(out.getvalue())
    assert "urgent lanes as the urgent load needs" in said[0]
    assert "cleared of batch calls as they form" in said[0]
    assert "left to drain" in said[1]
    with pytest.raises(UsageError, match="lane_clear"):
        clears(lane_clear="sometimes")


def test_the_admission_mode_is_set_from_the_file_and_retired_keys_say_what_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`[engine] admission` sets the engine's mode in the engine `plait run` builds, and
    `plait config check` says what the mode does; `policy` and `[engine.gate]` are refused
    with what to write instead."""
    import types

    from orchestrator.admission._gate import DEFAULT_GATE
    from orchestrator.cli._cli import Progress, _engine_for

    sim = '[backends.default]\nkind = "sim"\n'
    plain = write(tmp_path, "plain.toml", sim)
    fast = write(tmp_path, "fast.toml", '[engine]\nadmission = "throughput"\n' + sim)
    off = write(tmp_path, "off.toml", '[engine]\nadmission = "off"\n' + sim)
    assert load_config(plain).engine.admission == "deadlines"
    assert load_config(fast).engine.admission == "throughput"

    module = types.ModuleType("flow")  # no backends or lifespan of its own
    module.__file__ = str(tmp_path / "flow.py")
    clock = VirtualClock()

    async def engines() -> list[tuple[str, object, bool, bool]]:
        seen = []
        for path in (plain, fast, off):
            config = load_config(path)
            progress = Progress(io.StringIO(), live=False)
            async with _engine_for(
                module, clock, config.engine.admission, progress, config, None, None, None
            ) as engine:
                gate = engine.urgency.gate
                seen.append(
                    (
                        engine.policy.name,
                        None if gate is None else gate.settings,
                        engine.urgency.headroom is not None,
                        engine.tuning.hold_back,
                    )
                )
        return seen

    assert clock.run(engines()) == [
        ("slack", DEFAULT_GATE, True, True),
        ("fcfs", None, False, True),
        ("fcfs", None, False, False),
    ]
    said = []
    for path in (plain, fast, off):
        out = io.StringIO()
        assert main(["config", "check", str(path)], out=out) == 0
        said.append(out.getvalue().splitlines()[2])
    assert said[0].startswith("admission: deadlines: runs with a deadline least slack first")
    assert said[1].startswith("admission: throughput: runs in arrival order")
    assert said[2].startswith("admission: off: runs in arrival order")
    retired = write(tmp_path, "old.toml", '[engine]\npolicy = "slack"\n[engine.gate]\nmemory = 9\n')
    assert main(["config", "check", str(retired)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert "engine.policy: no longer a key: the order follows the admission mode" in err
    assert "engine.gate: no longer a key: the deadline gate is part of" in err


# --- plait config check: every example, every mistake at once ----------------------------------


@pytest.mark.parametrize(
    "path",
    sorted([*EXAMPLES.glob("*.toml"), *EXAMPLES.glob("*.yaml")]),
    ids=lambda p: p.name,
)
def test_config_check_accepts_every_example_config(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The service's files too (serve.toml, cluster.toml): their [service] and [[tenants]]
    are checked with the rest."""
    out = io.StringIO()
    assert main(["config", "check", str(path)], out=out) == 0, capsys.readouterr().err
    assert f"{path}: valid" in out.getvalue()
    if "[service]" in path.read_text():
        assert "service: http://" in out.getvalue() and "tenants: demo" in out.getvalue()


SEVEN_MISTAKES = """
[engine]
admission = "nope"
clock = "sometimes"
colour = 1

[backends.default]
kind = "sim"
profile = "h100-llama3-8b"
seed = "x"
limits = { max_in_flight = 0, bogus = 2 }

[backends.other]
kind = "warp"

[limits.local]
max_in_flight = -1
"""


def test_config_check_lists_every_mistake_in_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown key in a table hid the other mistakes of that table until it was fixed."""
    path = write(tmp_path, "bad.toml", SEVEN_MISTAKES)
    assert main(["config", "check", str(path)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert f"{path}: 8 problems:" in err
    for said in (
        "engine: unknown key 'colour'; allowed: admission, clock, deadline",
        "engine.admission: Input should be 'deadlines', 'throughput' or 'off' (got 'nope')",
        "engine.clock: Input should be 'system' or 'virtual' (got 'sometimes')",
        "backends.default.seed: Input should be a valid integer (got 'x')",
        "backends.default.limits: unknown key 'bogus'",
        "backends.default.limits.max_in_flight: Input should be greater than or equal to 1",
        "backends.other.kind: unknown backend kind 'warp'",
        "limits.local.max_in_flight: Input should be greater than or equal to 1 (got -1)",
    ):
        assert said in err, said


def test_a_serve_config_lists_every_mistake_in_one_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "serve.toml",
        """
[service]
port = 99999
colour = "red"

[[tenants]]
name = "a"
token_sha256 = "abc"
rate_per_s = 0

[engine]
admission = "nope"
shade = 1
""",
    )
    assert main(["config", "check", str(path)], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    for said in (
        "service: unknown key 'colour'",
        "service.port: Input should be less than or equal to 65535",
        "tenants[0].rate_per_s: Input should be greater than 0",
        "tenants[0].token_sha256: String should match pattern",
        "engine: unknown key 'shade'",
        "engine.admission: Input should be 'deadlines', 'throughput' or 'off' (got 'nope')",
    ):
        assert said in err, (said, err)


def test_config_check_of_a_serve_config_shows_no_store_password(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "serve.toml",
        '[service]\nstore = "postgresql://plait:secret@db:5432/runs"\n\n[[tenants]]\n'
        f'name = "a"\ntoken_sha256 = "{"0" * 64}"\n',
    )
    out = io.StringIO()
    assert main(["config", "check", str(path)], out=out) == 0
    assert "store postgresql://plait:***@db:5432/runs" in out.getvalue()
    assert "secret" not in out.getvalue()


def test_hold_back_is_derived_unless_a_backends_limits_turn_it_off(tmp_path: Path) -> None:
    text = (
        '[backends.gpu]\nkind = "openai"\nurl = "http://gpu0:8000/v1"\ndialect = "vllm"\n'
        "limits = { max_in_flight = 8, hold_back = false }\n"
    )
    config = load_config(write(tmp_path, "p.toml", text))
    assert config.limits["gpu"] == Limits(8, hold_back=False)
    out = io.StringIO()
    assert main(["config", "check", str(tmp_path / "p.toml")], out=out) == 0
    assert "  limits: at most 8 in flight, 100000 waiting, no hold-back\n" in out.getvalue()
