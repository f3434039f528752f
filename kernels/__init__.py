"""Triton kernels, installed as `sglang_domino.kernels` (the top-level name `kernels`
belongs to another PyPI package). Each kernel has a PyTorch reference in the package
and a test that holds the two equal (on CPU under TRITON_INTERPRET=1).

  * `chain_accept.accept_chain`: chain speculative-sampling acceptance on the sparse
    Domino draft distribution (reference `sglang_domino.accept.accept_probs`).
"""
