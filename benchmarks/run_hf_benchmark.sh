#!/usr/bin/env bash
# Transformers-backend benchmark with the model cards' interface:
#   DRAFT_MODEL=... TARGET_MODEL=... PYTHON=python ./run_hf_benchmark.sh
# Variables: DRAFT_MODEL, TARGET_MODEL (both unset: the CPU test bed), PYTHON, TASKS,
# MAX_NEW_TOKENS (2048), TEMPERATURE (0.0), BLOCK_SIZE (16), NUM_GPUS (8), REPEATS (1),
# DTYPE (auto), OUT_DIR.
# Peers, greedy only: ASSISTANT_MODEL (Transformers' assisted generation with this small
# model, method hf-assisted:<name>; on the test bed benchmarks/testbed/checkpoints/assistant
# if trained, else off; 0: off) and PROMPT_LOOKUP (Transformers' prompt lookup with N
# candidate tokens, method hf-prompt-lookup; 10 on the test bed, else 0: off).
# Writes records.jsonl, summary.md and PNG plots into OUT_DIR.
exec "$(dirname "${BASH_SOURCE[0]}")/run_python.sh" benchmarks.hf_bench
