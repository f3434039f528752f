#!/usr/bin/env bash
# Transformers-backend benchmark with the model cards' interface:
#   DRAFT_MODEL=... TARGET_MODEL=... PYTHON=python ./run_hf_benchmark.sh
# Variables: DRAFT_MODEL, TARGET_MODEL (both unset: the CPU test bed), PYTHON, TASKS,
# MAX_NEW_TOKENS (2048), TEMPERATURE (0.0), BLOCK_SIZE (16), NUM_GPUS (8), REPEATS (1),
# OUT_DIR. Writes records.jsonl, summary.md and PNG plots into OUT_DIR.
exec "$(dirname "${BASH_SOURCE[0]}")/run_python.sh" benchmarks.hf_bench
