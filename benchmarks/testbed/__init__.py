"""A trained test bed on one CPU machine: a small Qwen3 target trained on the Python
standard library, and DFlash / Domino drafts trained for it.

Build: `python -m benchmarks.testbed.build` (cached under `$DOMINO_TESTBED_DIR`, default
`~/.cache/sglang-domino/testbed`). Load: `benchmarks.testbed.load`.
"""
