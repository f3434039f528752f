#!/usr/bin/env bash
# The whole test suite on CPU. Creates .venv on first use.
#
# Two test processes (pytest-xdist), each taking whole test files: most of a server
# test's time is a `sglang serve` start, two single-threaded imports of sglang one after
# the other, so two files in flight keep both cores busy. TEST_WORKERS=0 runs in this
# process alone.
source "$(dirname "$0")/env.sh"
exec python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "$@"
