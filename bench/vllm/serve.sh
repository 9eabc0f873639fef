#!/usr/bin/env bash
# Run a real vLLM (CPU build) OpenAI-compatible server on the tiny random model, in the
# foreground. Needs bench/vllm/setup.sh to have run.
# Usage: bash bench/vllm/serve.sh PORT [KV_GIB]
#   PORT    port on 127.0.0.1
#   KV_GIB  KV cache size in GiB (default 1; small => real eviction): a whole number goes
#           to VLLM_CPU_KVCACHE_SPACE, a fraction (0.25) to --kv-cache-memory-bytes
# Extra vLLM flags can be passed in VLLM_EXTRA_ARGS (split on spaces).
# Ready when GET /health answers 200: about 80 s on a 2-core machine the first time
# (torch.compile), less once the compile cache in .cache/vllm exists.
# KV blocks: block size 128 tokens; the tiny model's KV is 16 KiB a token (8 layers x K,V x
# 512 x bf16), so num_blocks = KV_GIB * 2^30 / (128 * 16 KiB) = 512 * KV_GIB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL_DIR="${VLLM_MODEL_DIR:-$ROOT/.cache/tiny-llama}"

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 PORT [KV_GIB]" >&2
    exit 2
fi
PORT="$1"
KV_GIB="${2:-1}"
[ -x "$VENV/bin/python" ] || { echo "[serve-vllm] ERROR: $VENV missing: run bash bench/vllm/setup.sh" >&2; exit 1; }
[ -f "$MODEL_DIR/config.json" ] || { echo "[serve-vllm] ERROR: model $MODEL_DIR missing: run bash bench/vllm/setup.sh" >&2; exit 1; }

# VLLM_CPU_KVCACHE_SPACE takes whole GiB only (vLLM parses it with int()); a fraction
# such as 0.25 goes to --kv-cache-memory-bytes instead (the env var would override it)
KV_ARGS=()
if [[ "$KV_GIB" =~ ^[0-9]+$ ]] && [ "$KV_GIB" -ge 1 ]; then
    export VLLM_CPU_KVCACHE_SPACE="$KV_GIB"
elif [[ "$KV_GIB" =~ ^[0-9]*\.?[0-9]+$ ]]; then
    unset VLLM_CPU_KVCACHE_SPACE
    KV_ARGS=(--kv-cache-memory-bytes "$(python3 -c "print(int(float('$KV_GIB') * 2**30))")")
else
    echo "[serve-vllm] ERROR: KV_GIB must be a positive number of GiB, got '$KV_GIB'" >&2
    exit 2
fi
export VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1
export HF_HUB_OFFLINE=1
export TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
# keep vLLM's torch.compile cache with the model, in the repo's git-ignored .cache/:
# the first start compiles (~40 s), later ones load the compiled graph
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$ROOT/.cache/vllm}"

echo "[serve-vllm] port $PORT, KV cache ${KV_GIB} GiB ${KV_ARGS[*]:-(VLLM_CPU_KVCACHE_SPACE=$KV_GIB)}, model $MODEL_DIR" >&2
# shellcheck disable=SC2086
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" \
    --served-model-name tiny \
    --max-model-len 4096 \
    --enable-prefix-caching \
    --scheduling-policy priority \
    --enable-prompt-tokens-details \
    --host 127.0.0.1 \
    --port "$PORT" \
    "${KV_ARGS[@]}" \
    ${VLLM_EXTRA_ARGS:-}
