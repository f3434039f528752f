#!/usr/bin/env bash
# Runs `python -m MODULE` from the repository root with $PYTHON, or with the project's
# .venv (created on first use) when PYTHON is unset.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    source "$ROOT/scripts/env.sh"
    PYTHON=python
fi
cd "$ROOT"
export PYTHON
exec "$PYTHON" -m "$@"
