# Sourced by the project's commands: creates .venv with plain pip when it is missing or
# when pyproject.toml changed since it was built, then puts it first on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAMP=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$STAMP" ]; then
    echo "[setup] installing into .venv (first run takes ~5 minutes: sglang==0.5.23 and its pins)"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    # Plain pip: this machine's pip configuration serves the large CUDA wheels locally.
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet -e ".[test]"
    rm -f .venv/.installed-*
    touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# Importing sglang/flashinfer creates cache directories; keep them out of $HOME.
export SGLANG_CACHE_DIR="${SGLANG_CACHE_DIR:-$ROOT/.cache/sglang}"
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$ROOT/.cache}"
