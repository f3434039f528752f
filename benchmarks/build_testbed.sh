#!/usr/bin/env bash
# Builds the CPU test bed: tokenizer + Qwen3 target trained on the Python stdlib, then a
# DFlash and a Domino draft trained on the target's own greedy text (~30 minutes on two
# cores). Cached under $DOMINO_TESTBED_DIR (default ~/.cache/sglang-domino/testbed)/<preset>;
# an interrupted build resumes at the first missing stage. Arguments go to
# `python -m benchmarks.testbed.build` (--preset full|tiny, --dir, --until, --threads).
# Niced: the build is long and the machine is usually shared.
exec nice -n 10 "$(dirname "${BASH_SOURCE[0]}")/run_python.sh" benchmarks.testbed.build "$@"
