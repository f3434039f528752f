#!/usr/bin/env bash
# The whole test suite on CPU. Creates .venv on first use.
source "$(dirname "$0")/env.sh"
exec python -m pytest "$@"
