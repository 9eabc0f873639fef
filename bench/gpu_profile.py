"""Measure what the simulator's GPU profile assumes, on a real GPU.

The simulator (executors/_simprofile.py) prices one step of continuous batching as
    step_overhead_s + prefill_s_per_token x prompt tokens
                    + decode_s_per_seq x sequences + decode_s_per_context_token x context tokens.
The h100-llama3-8b profile took those four numbers from datasheets and published benchmarks.
This script measures them on the GPU it runs on, for a randomly initialised model with
Llama-3.1-8B's shape (32 layers, hidden 4096, 32 query and 8 KV heads of 128, MLP 14336,
vocabulary 128256, bf16): no weights are downloaded, and random weights cost the same
arithmetic and bytes as trained ones.

  - Prefill: one forward over N prompt tokens (causal attention, logits for the last token
    only, as a serving engine computes them), N from 256 to 16,384; and a chunk of 2,048
    tokens after a prefix already in the KV cache (what a prefix-cache hit leaves to compute).
  - Decode: one step for B sequences each holding L tokens of context (the new token's
    attention reads all L), B from 1 to 256 and L from 512 to 8,192, captured as a CUDA graph
    as vLLM runs decode (eager figures too, to show what launch overhead costs).

It then fits the profile's decode terms to the decode steps by least squares and reads the
prefill rate off the prefill forwards, and prints them beside the h100-llama3-8b profile's.

What it is not: vLLM. The attention is PyTorch's scaled_dot_product_attention over a
contiguous cache (vLLM pages the cache and fuses the norms, rotary and activation into fewer
kernels), so a real server's steps can be somewhat shorter; the matrix products, which are
most of the time, are the same cuBLAS calls.

    python bench/gpu_profile.py                 # on a CUDA GPU: about a minute
    python bench/gpu_profile.py --tiny          # a small model on the CPU: checks the script
    python bench/gpu_profile.py --out DIR       # also writes DIR/gpu_profile.json
    python bench/gpu_profile.py --chunks        # steps of a 128-1,024-token prompt chunk
                                                # beside B decoding sequences (gpu_chunks.json)

Needs only PyTorch. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _results

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
except ImportError as exc:  # plait does not depend on PyTorch; this script alone needs it
    raise SystemExit(f"bench/gpu_profile.py needs PyTorch (2.3 or later): {exc}") from None

# What executors/_simprofile.py's h100-llama3-8b profile assumes (kept in step by hand: this
# script must run where plait is not installed).
ASSUMED = {
    "step_overhead_s": 0.0055,
    "prefill_tokens_per_s": 27_500.0,
    "decode_s_per_seq": 0.00004,
    "decode_s_per_context_token": 39e-9,
}


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 128256

    @property
    def params(self) -> int:
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = qkv + self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.mlp
        return self.layers * (per_layer + 2 * self.hidden) + 2 * self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


LLAMA_8B = Shape()
TINY = Shape(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, mlp=512, vocab=1000)


class Model:
    """Llama's forward in plain PyTorch, weights drawn at random on the device."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype) -> None:
        self.s = shape
        self.device = device
        self.dtype = dtype
        gen = torch.Generator(device=device).manual_seed(0)

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.empty(rows, cols, device=device, dtype=dtype)
            return w.normal_(0.0, 0.02, generator=gen)

        s = shape
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.embed = weight(s.vocab, s.hidden)
        self.lm_head = weight(s.vocab, s.hidden)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.layers = [
            {
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": weight(qkv_out, s.hidden),
                "o": weight(s.hidden, s.heads * s.head_dim),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": weight(2 * s.mlp, s.hidden),
                "down": weight(s.hidden, s.mlp),
            }
            for _ in range(s.layers)
        ]
        inv = 1.0 / (500_000.0 ** (torch.arange(0, s.head_dim, 2, device=device) / s.head_dim))
        self.inv_freq = inv.float()

    @staticmethod
    def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-5)).to(x.dtype) * w

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [..., T, D] with pos broadcastable to [..., T]
        ang = pos.float().unsqueeze(-1) * self.inv_freq
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def _mlp(self, x: torch.Tensor, lw: dict[str, torch.Tensor]) -> torch.Tensor:
        gate, up = (self._norm(x, lw["norm2"]) @ lw["gate_up"].t()).chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ lw["down"].t()

    def _split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = self.s
        return qkv.split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1
        )

    def _prompt_attention(self, qkv: torch.Tensor, i: int, past: int) -> torch.Tensor:
        """Causal attention of n prompt tokens (rows of `qkv`) placed after `past` cached
        ones, whose keys and values are random stand-ins (their values do not change the cost)."""
        s = self.s
        n = qkv.shape[0]
        pos = torch.arange(past, past + n, device=self.device)
        q, k, v = self._split(qkv)
        q = self._rope(q.view(n, s.heads, s.head_dim).transpose(0, 1), pos)
        k = self._rope(k.view(n, s.kv_heads, s.head_dim).transpose(0, 1), pos)
        v = v.view(n, s.kv_heads, s.head_dim).transpose(0, 1)
        if past:
            k = torch.cat((self.past_k[i], k), dim=1)
            v = torch.cat((self.past_v[i], v), dim=1)
        # each KV head serves `heads // kv_heads` query heads: copied out to all of them
        # (past + n tokens a layer; after 30k cached tokens about 10 ms of a 192 ms chunk)
        group = s.heads // s.kv_heads
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        bias = causal_lower_right(n, past + n) if past else None
        attn = F.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=bias, is_causal=not past
        )
        return attn[0].transpose(0, 1).reshape(n, -1)

    def _decode_attention(
        self, qkv: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one new token per sequence (rows of `qkv`) over its cache of L slots;
        the new key and value overwrite slot L-1."""
        s = self.s
        b = qkv.shape[0]
        group = s.heads // s.kv_heads
        ctx = kc.shape[2]
        pos = torch.full((b, 1, 1), ctx - 1, device=self.device)
        q, k, v = self._split(qkv)
        # GQA for one new token: the group's query heads are the "positions" of a query of
        # length `group` against the shared KV head (no mask needed).
        q = self._rope(q.view(b, s.kv_heads, group, s.head_dim), pos)
        k = self._rope(k.view(b, s.kv_heads, 1, s.head_dim), pos)
        kc[:, :, ctx - 1 : ctx].copy_(k)
        vc[:, :, ctx - 1 : ctx].copy_(v.view(b, s.kv_heads, 1, s.head_dim))
        return F.scaled_dot_product_attention(q, kc, vc).reshape(b, -1)

    def prefill(self, tokens: torch.Tensor, past: int = 0) -> torch.Tensor:
        """One sequence's prompt `tokens` [N] after `past` tokens already cached (set_past)."""
        x = self.embed[tokens]
        for i, lw in enumerate(self.layers):
            qkv = self._norm(x, lw["norm1"]) @ lw["qkv"].t()
            x = x + self._prompt_attention(qkv, i, past) @ lw["o"].t()
            x = self._mlp(x, lw)
        return (self._norm(x[-1:], self.final_norm) @ self.lm_head.t()).argmax(-1)

    def set_past(self, past: int) -> None:
        s = self.s
        self.past_k = [self._random(s.kv_heads, past, s.head_dim) for _ in range(s.layers)]
        self.past_v = [self._random(s.kv_heads, past, s.head_dim) for _ in range(s.layers)]

    def _random(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype)

    def make_cache(self, batch: int, context: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        s = self.s
        ks = [self._random(batch, s.kv_heads, context, s.head_dim) for _ in range(s.layers)]
        vs = [self._random(batch, s.kv_heads, context, s.head_dim) for _ in range(s.layers)]
        return ks, vs

    def weights_only(self, tokens: torch.Tensor) -> torch.Tensor:
        """A decode step's matrix products alone (no norms, rotary, attention or activation):
        the same weight reads through the same cuBLAS calls, the floor that fusing the small
        kernels away (as a serving engine does) could approach."""
        s = self.s
        x = self.embed[tokens]
        for lw in self.layers:
            h = x @ lw["qkv"].t()
            x = x + h[:, : s.heads * s.head_dim] @ lw["o"].t()
            gate, up = (x @ lw["gate_up"].t()).chunk(2, dim=-1)
            x = x + (gate * up) @ lw["down"].t()
        return (x @ self.lm_head.t()).argmax(-1)

    def decode(
        self,
        tokens: torch.Tensor,
        ks: list[torch.Tensor],
        vs: list[torch.Tensor],
        prompt: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step of continuous batching: a new token for each of B sequences (`tokens` [B],
        each with a cache of L slots) and, if `prompt` is given, a chunk of a new sequence's
        prompt in the same step (one pass of the weights for both, as vLLM batches them)."""
        b = tokens.shape[0]
        x = self.embed[tokens if prompt is None else torch.cat((tokens, prompt))]
        for i, (lw, kc, vc) in enumerate(zip(self.layers, ks, vs, strict=True)):
            qkv = self._norm(x, lw["norm1"]) @ lw["qkv"].t()
            attn = self._decode_attention(qkv[:b], kc, vc)
            if prompt is not None:
                attn = torch.cat((attn, self._prompt_attention(qkv[b:], i, 0)))
            x = x + attn @ lw["o"].t()
            x = self._mlp(x, lw)
        # logits for each decoding sequence, and for a prompt chunk's last token
        rows = x if prompt is None else torch.cat((x[:b], x[-1:]))
        return (self._norm(rows, self.final_norm) @ self.lm_head.t()).argmax(-1)


class Timer:
    """Median time of a callable: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device, warmup: int, repeat: int) -> None:
        self.cuda = device.type == "cuda"
        self.warmup = warmup
        self.repeat = repeat

    def __call__(self, fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeat):
            if self.cuda:
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def graphed(fn, device: torch.device):  # type: ignore[no-untyped-def]
    """`fn` captured as a CUDA graph (as vLLM captures decode); on the CPU, `fn` itself."""
    if device.type != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def measure_ceilings(device: torch.device, dtype: torch.dtype, timer: Timer) -> dict[str, float]:
    """What this card does at best: a large device-to-device copy (bytes read plus written
    per second) and a large bf16 matrix product (FLOP per second), on random data."""
    src = torch.randn(1 << 30, device=device, dtype=dtype)  # 2 GiB
    dst = torch.empty_like(src)
    copy = timer(lambda src=src, dst=dst: dst.copy_(src))
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    b = torch.randn(8192, 8192, device=device, dtype=dtype)
    mm = timer(lambda a=a, b=b: a @ b)
    del src, dst, a, b
    torch.cuda.empty_cache()
    return {
        "copy_bytes_per_s": 2 * (1 << 30) * 2 / copy,
        "matmul_bf16_flop_per_s": 2 * 8192**3 / mm,
    }


def compiled_decode(model, shape, device, measure, log, tiny):  # type: ignore[no-untyped-def]
    """Decode steps with the small kernels fused by torch.compile, replayed as CUDA graphs,
    beside the same steps uncompiled: how far fusing brings a plain PyTorch step toward the
    matrix products alone."""
    rows = []
    ctx = 256 if tiny else 2048
    for b in [1, 4] if tiny else [1, 32, 128]:
        ks, vs = model.make_cache(b, ctx)
        tokens = torch.randint(0, shape.vocab, (b,), device=device)
        fused = torch.compile(model.decode, dynamic=False)
        with torch.inference_mode():
            step = lambda tokens=tokens, ks=ks, vs=vs: model.decode(tokens, ks, vs)  # noqa: E731
            plain = measure(f"decode graph B={b} L={ctx}", step, graph=True)
            t0 = time.perf_counter()
            fused(tokens, ks, vs)  # compile outside the timing
            compile_s = time.perf_counter() - t0
            seconds = measure(
                f"compiled B={b} L={ctx}",
                lambda tokens=tokens, ks=ks, vs=vs, fused=fused: fused(tokens, ks, vs),
                graph=True,
            )
        rows.append(
            {
                "batch": b,
                "context": ctx,
                "graph_s": plain,
                "compiled_s": seconds,
                "compile_s": compile_s,
            }
        )
        log(
            f"decode B={b:>3} L={ctx}: graph {plain and plain * 1e3:.2f} ms, compiled "
            f"{seconds and seconds * 1e3:.2f} ms (compiled in {compile_s:.0f} s)"
        )
        del ks, vs
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "compiled_decode": rows,
    }


def simulated_step_s(batch: int, context: int, chunk: int) -> float:
    """What the h100-llama3-8b profile charges one step (executors/_simengine.py's sum)."""
    return (
        ASSUMED["step_overhead_s"]
        + chunk / ASSUMED["prefill_tokens_per_s"]
        + ASSUMED["decode_s_per_seq"] * batch
        + ASSUMED["decode_s_per_context_token"] * batch * context
    )


def chunk_steps(model, shape, device, measure, log, tiny, compiled=False, only=None):  # type: ignore[no-untyped-def]
    """Steps that carry a small prompt chunk (128 to 1,024 tokens, as a paced or chunked
    prefill sends) beside B decoding sequences, every one captured as a CUDA graph as a
    serving engine runs its steps: the chunk alone (B = 0), the decode alone (no chunk) and
    both in one pass of the weights. What a chunk adds to a decode step is what pacing the
    batch's prompts costs the urgent calls that share the step; the simulator charges
    `chunk / prefill_tokens_per_s` for it whatever else the step carries."""
    contexts = [64, 256] if tiny else [512, 2048]
    batches = [0, 4] if tiny else [0, 8, 32, 64, 128]
    chunks = [0, 16, 32] if tiny else [0, 128, 256, 512, 1024]
    decode = model.decode
    if compiled:  # torch.compile's fused kernels (a minute of compiling per shape): fewer
        contexts, batches = contexts[-1:], [4] if tiny else [32]
        chunks = [0, 16] if tiny else [0, 128, 512]
        decode = torch.compile(model.decode, dynamic=False)
        # every (B, chunk) is a shape of its own: past dynamo's recompile limit (8) the
        # steps would quietly run eager while the file says compiled
        torch._dynamo.config.recompile_limit = 64
    if only and (only[0] or only[1]):  # --batch B --chunk C: one context, the longest
        contexts, batches = contexts[-1:], only[0] or batches
        # each B's step without a chunk is what the chunks' added cost is read against
        chunks = sorted({0, *only[1]}) if only[1] else chunks
    rows: list[dict] = []
    for ctx in contexts:
        for b in batches:
            if b == 0 and ctx != contexts[0]:
                continue  # the chunk alone does not depend on the decoders' context
            ks, vs = model.make_cache(b, ctx) if b else ([], [])
            tokens = torch.randint(0, shape.vocab, (b,), device=device)
            for c in chunks:
                if b == 0 and c == 0:
                    continue
                prompt = torch.randint(0, shape.vocab, (c,), device=device) if c else None
                if b == 0:
                    step = lambda prompt=prompt: model.prefill(prompt)  # noqa: E731
                else:
                    step = lambda tokens=tokens, ks=ks, vs=vs, prompt=prompt: decode(  # noqa: E731
                        tokens, ks, vs, prompt
                    )
                with torch.inference_mode():
                    seconds = measure(f"chunk step B={b} L={ctx} chunk={c}", step, graph=True)
                if seconds is None:
                    continue
                rows.append(
                    {
                        "batch": b,
                        "context": ctx if b else 0,
                        "chunk": c,
                        "s": seconds,
                        "simulated_s": simulated_step_s(b, ctx if b else 0, c),
                    }
                )
                log(
                    f"B={b:>3} L={ctx if b else 0:>5} chunk={c:>5}: {seconds * 1e3:7.2f} ms "
                    f"(the profile charges {rows[-1]['simulated_s'] * 1e3:7.2f} ms)"
                )
            del ks, vs
            if device.type == "cuda":
                torch.cuda.empty_cache()
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "chunk_steps": rows,
        "compiled": compiled,
    }
    chunk_summary(result, log)
    return result


def chunk_summary(result: dict, log) -> None:  # type: ignore[no-untyped-def]
    """Add to each chunk step what its chunk added to the decode step of the same B and L
    (`chunk_added_s`), and log those beside what the profile charges for the chunk."""
    steps = result["chunk_steps"]
    alone = {(r["batch"], r["context"]): r["s"] for r in steps if r["chunk"] == 0}
    log("")
    log("what a prompt chunk adds to a step of B decoding sequences (ms), measured | profile:")
    for r in steps:
        base = alone.get((r["batch"], r["context"]))
        if r["chunk"] == 0 or r["batch"] == 0 or base is None:
            continue  # a chunk alone (B = 0) is a whole step: logged above
        r["chunk_added_s"] = r["s"] - base
        charged = r["chunk"] / ASSUMED["prefill_tokens_per_s"]
        log(
            f"  B={r['batch']:>3} L={r['context']:>5} chunk={r['chunk']:>5}: "
            f"{r['chunk_added_s'] * 1e3:7.2f} | {charged * 1e3:7.2f}"
        )


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    # relative least squares: each step weighs by its own size, so the 4 ms steps count as
    # much as the 200 ms ones
    w = 1.0 / y
    return torch.linalg.lstsq(a * w, y * w).solution.squeeze(1).tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a small model, to check the script")
    parser.add_argument("--out", type=Path, help="also write gpu_profile.json here")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="only decode steps built by torch.compile (fused small kernels, as vLLM's are), "
        "beside the plain graphs: a minute or more of compiling per batch size",
    )
    parser.add_argument(
        "--chunks",
        action="store_true",
        help="only steps that carry a prompt chunk of 128-1,024 tokens beside B decoding "
        "sequences, all as CUDA graphs (about 30 s on an H100)",
    )
    parser.add_argument(
        "--batch", type=int, action="append", help="with --chunks: only these B (repeatable)"
    )
    parser.add_argument(
        "--chunk", type=int, action="append", help="with --chunks: only these chunks (repeatable)"
    )
    parser.add_argument(
        "--refit", type=Path, metavar="JSON", help="fit again the figures of an earlier run"
    )
    _results.add_arguments(parser)
    args = parser.parse_args(argv)

    def save(figures: dict[str, Any]) -> None:
        _results.save("gpu_profile", figures, parser, args, argv, ignore=("out",))

    if args.refit:
        try:
            result = json.loads(args.refit.read_text())
            if "chunk_steps" in result:  # a saved run of --chunks
                chunk_summary(result, lambda *a: print(*a, file=sys.stderr))
                print(json.dumps(result))
                return 0
            result["decode"], result["prefill"], result["mixed"], result["weight_bytes"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"--refit {args.refit}: not a saved run of this script ({exc!r})")
        fit(result, lambda *a: print(*a, file=sys.stderr))
        print(json.dumps(result))
        return 0
    if (args.batch or args.chunk) and not args.chunks:
        parser.error("--batch and --chunk pick the sizes of --chunks: give --chunks too")

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        parser.error("no CUDA GPU here: the 8B model is for a GPU (--tiny checks the script)")
    device = torch.device("cuda" if cuda else "cpu")
    shape = TINY if args.tiny else LLAMA_8B
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = Timer(device, warmup=3, repeat=args.repeat)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    failures: list[str] = []

    def measure(label: str, fn, graph: bool = False) -> float | None:  # type: ignore[no-untyped-def]
        """The median time of `fn` (replayed as a CUDA graph if `graph`), or None with the
        error kept when this one configuration fails: the others still run."""
        try:
            return timer(graphed(fn, device) if graph else fn)
        except Exception as exc:  # one configuration, reported, not fatal
            failures.append(f"{label}: {type(exc).__name__}: {exc}"[:400])
            log(f"{label}: FAILED {failures[-1]}")
            if cuda:
                torch.cuda.empty_cache()
            return None

    gpu = torch.cuda.get_device_name() if cuda else "cpu"
    log(f"device {gpu}, torch {torch.__version__}, model {shape.params / 1e9:.2f}B parameters")
    t0 = time.perf_counter()
    model = Model(shape, device, dtype)
    if cuda:
        torch.cuda.synchronize()
    log(f"weights drawn in {time.perf_counter() - t0:.1f} s")
    torch.backends.cuda.matmul.allow_tf32 = False
    ceilings = measure_ceilings(device, dtype, timer) if cuda else {}
    for key, value in ceilings.items():
        log(f"{key}: {value / 1e12:.2f} T")

    if args.chunks:
        result = chunk_steps(
            model, shape, device, measure, log, args.tiny, args.compiled, (args.batch, args.chunk)
        )
        result["failures"] = failures
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            name = "gpu_chunks" + ("_compiled" if args.compiled else "")
            name += "".join(f"_b{b}" for b in args.batch or [])  # runs of other sizes beside
            (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result))
        save(result)
        return 0
    if args.compiled:
        result = compiled_decode(model, shape, device, measure, log, args.tiny)
        print(json.dumps(result))
        save(result)
        return 0

    # --- prefill ---------------------------------------------------------------------------
    prefill_sizes = [16, 64, 128] if args.tiny else [256, 512, 1024, 2048, 4096, 8192, 16384]
    prefill = []
    for n in prefill_sizes:
        tokens = torch.randint(0, shape.vocab, (n,), device=device)
        with torch.inference_mode():
            seconds = measure(f"prefill {n}", lambda tokens=tokens: model.prefill(tokens))
        if seconds is None:
            continue
        prefill.append({"tokens": n, "past": 0, "s": seconds, "tokens_per_s": n / seconds})
        log(f"prefill {n:>6} tokens: {seconds * 1e3:8.2f} ms  {n / seconds:9.0f} tokens/s")
    chunk = 64 if args.tiny else 2048
    for past in [128, 512] if args.tiny else [2048, 8192, 30720]:
        model.set_past(past)
        tokens = torch.randint(0, shape.vocab, (chunk,), device=device)
        with torch.inference_mode():
            seconds = measure(
                f"prefill after {past}",
                lambda tokens=tokens, past=past: model.prefill(tokens, past),
            )
        if seconds is None:
            continue
        prefill.append(
            {"tokens": chunk, "past": past, "s": seconds, "tokens_per_s": chunk / seconds}
        )
        log(
            f"prefill {chunk:>6} tokens after {past:>6} cached: {seconds * 1e3:8.2f} ms  "
            f"{chunk / seconds:9.0f} tokens/s"
        )
    model.past_k = model.past_v = []

    # --- decode ----------------------------------------------------------------------------
    batches = [1, 4, 16] if args.tiny else [1, 8, 32, 64, 128, 256]
    contexts = [64, 256] if args.tiny else [512, 2048, 8192]
    if cuda:
        free, _ = torch.cuda.mem_get_info()
        kv_budget = free - (6 << 30)  # room for activations, graphs and the allocator
    else:
        kv_budget = 1 << 30
    decode: list[dict] = []
    # steps that carry a prompt chunk beside the decoding sequences (does the cost add up?)
    mixed: list[dict] = []
    mixed_batches = [4, 16] if args.tiny else [32, 128]
    mixed_chunks = [32, 64] if args.tiny else [512, 2048]
    for ctx in contexts:
        for b in batches:
            need = b * ctx * shape.kv_bytes_per_token
            if need > kv_budget:
                log(f"decode B={b} L={ctx}: skipped ({need / 2**30:.0f} GiB of KV)")
                continue
            ks, vs = model.make_cache(b, ctx)
            tokens = torch.randint(0, shape.vocab, (b,), device=device)
            with torch.inference_mode():
                step = lambda tokens=tokens, ks=ks, vs=vs: model.decode(tokens, ks, vs)  # noqa: E731
                eager = measure(f"decode eager B={b} L={ctx}", step)
                graph = measure(f"decode graph B={b} L={ctx}", step, graph=True)
            if eager is None or graph is None:
                continue
            decode.append({"batch": b, "context": ctx, "s": graph, "eager_s": eager})
            log(
                f"decode B={b:>3} L={ctx:>5}: graph {graph * 1e3:7.2f} ms  "
                f"eager {eager * 1e3:7.2f} ms"
            )
            if ctx == contexts[1] and b in mixed_batches:
                for c in mixed_chunks:
                    prompt = torch.randint(0, shape.vocab, (c,), device=device)
                    with torch.inference_mode():
                        seconds = measure(
                            f"mixed B={b} L={ctx} chunk={c}",
                            lambda tokens=tokens, ks=ks, vs=vs, prompt=prompt: model.decode(
                                tokens, ks, vs, prompt
                            ),
                            graph=True,
                        )
                    if seconds is not None:
                        mixed.append({"batch": b, "context": ctx, "chunk": c, "s": seconds})
                        log(f"  + a prompt chunk of {c:>5}: {seconds * 1e3:7.2f} ms")
            del ks, vs, step
            if cuda:
                torch.cuda.empty_cache()

    # the matrix products alone: how much of a step is weight reads, how much small kernels
    products: list[dict] = []
    for b in batches:
        tokens = torch.randint(0, shape.vocab, (b,), device=device)
        with torch.inference_mode():
            seconds = measure(
                f"products B={b}", lambda tokens=tokens: model.weights_only(tokens), graph=True
            )
        if seconds is not None:
            products.append({"batch": b, "s": seconds})
            log(f"matrix products alone B={b:>3}: {seconds * 1e3:7.2f} ms")

    # what a decode step reads: every weight but the embedding table (it reads B rows of it)
    weight_bytes = (shape.params - shape.vocab * shape.hidden) * (
        2 if dtype == torch.bfloat16 else 4
    )
    result = {
        "device": gpu,
        "torch": torch.__version__,
        "shape": asdict(shape),
        "params": shape.params,
        "weight_bytes": weight_bytes,
        "ceilings": ceilings,
        "prefill": prefill,
        "decode": decode,
        "mixed": mixed,
        "products_only": products,
        "failures": failures,
    }
    fit(result, log)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_profile.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    save(result)
    return 0


def fit(result: dict, log) -> None:  # type: ignore[no-untyped-def]
    """Fit the profile's terms to the measured steps (in place: adds `fitted`, and each mixed
    step's `additive_s`) and log them beside the h100-llama3-8b profile's."""
    decode, prefill, mixed = result["decode"], result["prefill"], result["mixed"]
    rows = [[1.0, d["batch"], d["batch"] * d["context"]] for d in decode]
    overhead, per_seq, per_ctx = lstsq(rows, [d["s"] for d in decode])
    worst = max(
        abs(overhead + per_seq * r[1] + per_ctx * r[2] - d["s"]) / d["s"]
        for r, d in zip(rows, decode, strict=True)
    )
    # The marginal cost of a prompt token (the profile counts the step overhead apart): the
    # slope of forward time over N from 1,024 to 8,192 tokens. Below that an eager forward
    # waits on kernel launches, not the GPU; above it attention's N^2 grows a visible share.
    largest = max(p["tokens"] for p in prefill)
    fresh = [
        p for p in prefill if p["past"] == 0 and min(1024, largest // 8) <= p["tokens"] <= 8192
    ]
    _, per_token = lstsq([[1.0, p["tokens"]] for p in fresh], [p["s"] for p in fresh])
    for m in mixed:
        m["additive_s"] = (
            overhead
            + per_seq * m["batch"]
            + per_ctx * m["batch"] * m["context"]
            + m["chunk"] * per_token
        )
    one = min(decode, key=lambda d: (d["batch"], d["context"]))
    fitted = {
        "step_overhead_s": overhead,
        "prefill_tokens_per_s": 1 / per_token,
        "decode_s_per_seq": per_seq,
        "decode_s_per_context_token": per_ctx,
        "decode_fit_worst_relative_error": worst,
        "weight_read_bytes_per_s_at_batch_1": result["weight_bytes"] / one["s"],
    }
    result["fitted"] = fitted
    result["assumed_h100_llama3_8b"] = ASSUMED
    log("")
    log(f"{'term':<28}{'measured':>14}{'h100-llama3-8b':>16}")
    for key in ASSUMED:
        log(f"{key:<28}{fitted[key]:>14.4g}{ASSUMED[key]:>16.4g}")
    log(f"decode fit worst relative error {worst:.1%}")
    for m in mixed:
        log(
            f"step of B={m['batch']} L={m['context']} + chunk {m['chunk']}: "
            f"{m['s'] * 1e3:.2f} ms measured, {m['additive_s'] * 1e3:.2f} ms by the fitted terms"
        )
    log("")
    log("decode steps, measured against what the h100-llama3-8b profile charges:")
    log(f"{'B':>5}{'L':>7}{'graph ms':>10}{'compiled ms':>13}{'profile ms':>12}")
    compiled = {
        (c["batch"], c["context"]): c["compiled_s"] for c in result.get("compiled_decode", [])
    }
    for d in decode:
        d["profile_s"] = (
            ASSUMED["step_overhead_s"]
            + ASSUMED["decode_s_per_seq"] * d["batch"]
            + ASSUMED["decode_s_per_context_token"] * d["batch"] * d["context"]
        )
        fused = compiled.get((d["batch"], d["context"]))
        log(
            f"{d['batch']:>5}{d['context']:>7}{d['s'] * 1e3:>10.2f}"
            f"{'' if fused is None else f'{fused * 1e3:.2f}':>13}{d['profile_s'] * 1e3:>12.2f}"
        )
    bw = fitted["weight_read_bytes_per_s_at_batch_1"] / 1e12
    log(f"weights read at batch 1, shortest context: {bw:.2f} TB/s")


if __name__ == "__main__":
    sys.exit(main())
