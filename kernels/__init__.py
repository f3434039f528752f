"""Kernels, installed as `sglang_domino.kernels` (the top-level name `kernels` belongs to
another PyPI package). Each kernel has a PyTorch reference in the package and a test that
holds the two equal.

  * `chain_accept.accept_chain` (Triton): chain speculative-sampling acceptance on the
    sparse Domino draft distribution (reference `sglang_domino.accept.accept_probs`;
    tested on CPU under TRITON_INTERPRET=1).
  * `cpu_paged_attention` (C++, built on the serving machine): attention over SGLang's
    paged KV cache on CPU for the compiled CPU step (reference
    `sglang_domino.sglang.cpu.attention.attend`).
  * `cpu_linear` (C++, built with it): the compiled CPU step's projections, a pass over
    the weight for a few rows, oneDNN over a packed copy above (reference `F.linear`).
  * `cpu_build`: compiles the C++ sources into one library on the serving machine.
"""
