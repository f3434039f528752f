#!/usr/bin/env bash
# The demo: speculative decoding with DFlash and Domino drafts against a target, printing
# outputs and acceptance. Creates .venv on first use.
source "$(dirname "$0")/env.sh"
exec python -m sglang_domino.demo "$@"
