# Sourced by the project's commands: creates .venv with plain pip when it is missing or
# when pyproject.toml changed since it was built, then puts it first on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAMP=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$STAMP" ]; then
    echo "[setup] installing into .venv (first run takes ~5 minutes: sglang==0.5.23 and its pins)"
    ./scripts/install.sh
    rm -f .venv/.installed-*
    touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
