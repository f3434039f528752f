#!/usr/bin/env bash
# The model cards call ./run_hf_benchmark.sh from the repository root.
exec "$(dirname "${BASH_SOURCE[0]}")/benchmarks/run_hf_benchmark.sh" "$@"
