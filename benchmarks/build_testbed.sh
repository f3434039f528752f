#!/usr/bin/env bash
# Rebuilds the CPU test bed from scratch: tokenizer + Qwen3 target trained on the generated
# codechat corpus, then a DFlash and a Domino draft trained on the target's own greedy
# answers (see benchmarks/testbed/checkpoints/manifest.json for the time it took). Cached
# under $DOMINO_TESTBED_DIR (default ~/.cache/sglang-domino/testbed)/<preset>; an
# interrupted build resumes at the first missing stage. A complete `full` build then
# replaces the committed test bed (benchmarks/testbed/checkpoints, bf16). Arguments go to
# `python -m benchmarks.testbed.build` (--preset full|tiny, --dir, --until, --threads,
# --no-publish).
# Niced: the build is long and the machine is usually shared.
exec nice -n 10 "$(dirname "${BASH_SOURCE[0]}")/run_python.sh" benchmarks.testbed.build "$@"
