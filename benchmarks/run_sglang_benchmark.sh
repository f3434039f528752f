#!/usr/bin/env bash
# SGLang benchmark with the model cards' interface:
#   DRAFT_MODEL=... TARGET_MODEL=... PYTHON=python ./run_sglang_benchmark.sh
# Variables: DRAFT_MODEL, TARGET_MODEL (both unset: the CPU test bed), PYTHON, TASKS,
# MAX_NEW_TOKENS (2048), TEMPERATURE (0.0), CONCURRENCIES (1,2,4,8,16,32), BLOCK_SIZE (16),
# VERIFY_TOKENS (= BLOCK_SIZE), TP_SIZE (1), REPEATS (1), SERVER_ARGS, OUT_DIR.
# Writes records.jsonl, summary.md, PNG plots and each server's log into OUT_DIR.
exec "$(dirname "${BASH_SOURCE[0]}")/run_python.sh" benchmarks.sglang_bench
