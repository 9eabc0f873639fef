#!/usr/bin/env bash
# End to end: set up (idempotent), start a vLLM server in the background, wait for it,
# run fit_profile.py against it, stop the server. The last line of stdout is the JSON.
# Usage: bash bench/vllm/fit.sh [PORT] [KV_GIB] [-- fit_profile.py args...]
# The server's log goes to .cache/vllm-serve-PORT.log.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PORT="${1:-8311}"
KV_GIB="${2:-1}"
shift $(( $# > 2 ? 2 : $# ))
[ "${1:-}" = "--" ] && shift
LOG="$ROOT/.cache/vllm-serve-$PORT.log"
PY="$ROOT/.venv-vllm/bin/python"

bash "$HERE/setup.sh" >&2
mkdir -p "$ROOT/.cache"
if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    echo "[fit-vllm] ERROR: something already answers on port $PORT" >&2
    exit 1
fi

echo "[fit-vllm] starting server on port $PORT (KV ${KV_GIB} GiB), log $LOG" >&2
T0=$(date +%s)
bash "$HERE/serve.sh" "$PORT" "$KV_GIB" >"$LOG" 2>&1 &
SERVER=$!
stop() {
    if kill -0 "$SERVER" 2>/dev/null; then
        echo "[fit-vllm] stopping server (pid $SERVER)" >&2
        kill -INT "$SERVER" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER" 2>/dev/null || break; sleep 1; done
        kill -KILL "$SERVER" 2>/dev/null || true
    fi
}
trap stop EXIT

for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER" 2>/dev/null; then
        echo "[fit-vllm] ERROR: server exited during start-up; last lines of $LOG:" >&2
        tail -30 "$LOG" >&2
        exit 1
    fi
    sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "[fit-vllm] ERROR: not ready after 300 s" >&2; exit 1; }
echo "[fit-vllm] server ready after $(( $(date +%s) - T0 )) s" >&2
grep -h "KV cache size" "$LOG" | sed 's/^.*\] /[fit-vllm] /' >&2 || true

"$PY" "$HERE/fit_profile.py" --port "$PORT" --server-log "$LOG" "$@"
