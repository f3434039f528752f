#!/usr/bin/env bash
# The one install recipe, used by scripts/env.sh (README commands, CI) and docker/Dockerfile:
# a virtual environment in .venv and, with plain pip, this project plus stock sglang==0.5.23
# and its pins. Plain pip on purpose: the build machines' pip configuration serves the
# large CUDA wheels locally (uv and poetry would not read it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON_BIN="${PYTHON_BIN:-python3}"
[ -x .venv/bin/python ] || "$PYTHON_BIN" -m venv .venv
.venv/bin/pip install -qq --upgrade pip
.venv/bin/pip install -qq -e ".${INSTALL_EXTRAS-[test]}"
