"""Triton kernels against their PyTorch references (CPU: TRITON_INTERPRET=1, see conftest)."""

import pytest
import torch

from sglang_domino.accept import accept_greedy


@pytest.mark.parametrize("n", [1, 7, 15, 16])
def test_accept_greedy_kernel_matches_reference(n):
    from sglang_domino.kernels.accept import accept_greedy_tokens

    g = torch.Generator().manual_seed(n)
    b, vocab = 8, 11
    logits = torch.randn(b, n + 1, vocab, generator=g)
    target = logits.argmax(-1)
    draft = target[:, :n].clone()
    # Rows 0-1 accept everything; the others diverge at a random place.
    for r in range(2, b):
        j = int(torch.randint(0, n, (1,), generator=g))
        draft[r, j] = (draft[r, j] + 1 + r) % vocab
    accepted, nxt = accept_greedy_tokens(draft, target)
    ref_accepted, ref_next = accept_greedy(draft, logits)
    assert torch.equal(accepted, ref_accepted) and torch.equal(nxt, ref_next)
    assert accepted[:2].tolist() == [n, n] and (accepted[2:] < n).all()


def test_accept_greedy_kernel_checks_shapes():
    from sglang_domino.kernels.accept import accept_greedy_tokens

    with pytest.raises(ValueError, match=r"target_tokens: got shape \(2, 3\), expected \(2, 5\)"):
        accept_greedy_tokens(torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
