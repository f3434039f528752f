"""A trained test bed on one CPU machine: a small Qwen3 chat target trained on a generated
corpus of Python coding conversations (`codechat`), and DFlash / Domino drafts trained
for it.

Committed ready in `benchmarks/testbed/checkpoints` (bf16; load it with
`benchmarks.testbed.load.committed()` and `load()`). Rebuild from scratch:
`benchmarks/build_testbed.sh` (`python -m benchmarks.testbed.build`, cached under
`$DOMINO_TESTBED_DIR`, default `~/.cache/sglang-domino/testbed`, then published).
"""
