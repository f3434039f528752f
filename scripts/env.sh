# Sourced by the project's commands: creates .venv with plain pip when it is missing or
# when pyproject.toml changed since it was built, then puts it first on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAMP=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$STAMP" ]; then
    echo "[setup] installing into .venv (first run takes ~5 minutes: sglang==0.5.23 and its pins)"
    # the install takes about 11 GB; a full disk otherwise surfaces as pip's "[Errno 28]"
    free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
    if [ "${free_kb:-0}" -lt $((12 * 1024 * 1024)) ]; then
        echo "[setup] warning: $((free_kb / 1024 / 1024)) GB free here; .venv needs about 11 GB" >&2
    fi
    ./scripts/install.sh
    rm -f .venv/.installed-*
    touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
