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
# mooncake's transfer engine (the test and pd-cpu extras: prefill-decode disaggregation)
# loads libibverbs.so.1 and libcurl.so.4 (Debian: libibverbs1, libcurl4); installed here
# when missing and root can.
case "${INSTALL_EXTRAS-[test]}" in *test*|*pd-cpu*)
    missing=""
    ldconfig -p | grep -q 'libibverbs\.so\.1 ' || missing="$missing libibverbs1"
    ldconfig -p | grep -q 'libcurl\.so\.4 ' || missing="$missing libcurl4"
    if [ -n "$missing" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "[setup] installing Debian's$missing (mooncake's transfer engine loads them)"
            # shellcheck disable=SC2086
            (apt-get install -y -qq $missing >/dev/null 2>&1 \
                || { apt-get update -qq >/dev/null && apt-get install -y -qq $missing >/dev/null; })
        else
            echo "[setup] note: mooncake's transfer engine needs libibverbs.so.1 and libcurl.so.4" \
                 "(Debian/Ubuntu:$missing)" >&2
        fi
    fi;;
esac
