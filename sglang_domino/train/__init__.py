"""Training DFlash and Domino drafts against a Transformers causal LM target.

`python -m sglang_domino.train --help` for the command line; `TrainConfig` and
`train()` for use from Python.
"""
