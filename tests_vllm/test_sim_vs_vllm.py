"""The simulator against a real vLLM on the CPU: the same requests, the same block size and
cache size, must give the same prefix-cache hits. Only exact checks live here: the latency
comparison, which a busy machine distorts many-fold, is `bench/sim_vs_vllm.py`."""

from __future__ import annotations

from pathlib import Path

from _vllm_server import VLLMServer
from sim_vs_vllm import compare

ROOT = Path(__file__).resolve().parent.parent


def test_prefix_hits_match_a_real_vllm(vllm_small_cache: VLLMServer) -> None:
    blocks, real, sim = compare(vllm_small_cache)
    report = (
        f"{blocks} usable blocks of 128 tokens. "
        f"vLLM: hits {real.hits} of {real.queries} tokens, mean latency "
        f"{real.mean_latency:.3f} s | sim: hits {sim.hits} of {sim.queries}, mean latency "
        f"{sim.mean_latency:.3f} s (latency not checked: see bench/sim_vs_vllm.py)"
    )
    print(report)
    (ROOT / ".cache").mkdir(exist_ok=True)
    (ROOT / ".cache" / "sim_vs_vllm.txt").write_text(report + "\n")
    assert sim.queries == real.queries  # the same tokens were asked for
    assert real.hits > 0, "the workload should reuse prefixes on the real server too"
    assert abs(sim.hits - real.hits) <= 0.05 * real.hits, report
