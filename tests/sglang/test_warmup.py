"""The step's Triton kernels launched at start-up for every width (`warmup.warm_step_kernels`):
run for real on CPU tensors under TRITON_INTERPRET=1 (set by tests/conftest.py before
sglang's kernels are defined)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang_domino.sglang.step import warmup  # noqa: E402

WIDTHS = [16, 8, 4, 2, 1]
V = 64


def worker(**flags):
    req_to_token = torch.arange(4 * 40, dtype=torch.int32).view(4, 40)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                             model_config=SimpleNamespace(vocab_size=V))
    return SimpleNamespace(device=torch.device("cpu"), model_runner=runner, _mask_token_id=V - 1,
                           domino_candidate_pool_size=16, _use_triton_prepare_block=True,
                           _use_triton_accept_bonus=True, **flags)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter on CPU")
def test_every_kernel_is_launched_once_per_width(monkeypatch):
    from sglang.kernels.ops.speculative import dflash as kernels

    from sglang_domino.kernels import chain_accept

    seen = []

    def record(name, fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)      # runs under the interpreter
            width = kwargs.get("block_ids_out", kwargs.get("candidates"))
            seen.append((name, int(width.shape[1]) if width is not None else int(args[0].shape[1]) + 1))
            return out
        return wrapped

    monkeypatch.setattr(kernels, "_prepare_dflash_draft_block_unchecked",
                        record("prepare_block", kernels._prepare_dflash_draft_block_unchecked))
    monkeypatch.setattr(kernels, "_compute_dflash_accept_bonus_triton_unchecked",
                        record("accept_bonus", kernels._compute_dflash_accept_bonus_triton_unchecked))
    monkeypatch.setattr(chain_accept, "accept_chain", record("chain_accept", chain_accept.accept_chain))
    w = worker()
    launched = warmup.warm_step_kernels(w, WIDTHS, q_rule=True)
    want = [(k, width) for width in WIDTHS for k in ("prepare_block", "accept_bonus", "chain_accept")
            if not (k == "chain_accept" and width == 1)]
    assert launched == want and seen == want
    assert w._use_triton_prepare_block and w._use_triton_accept_bonus     # nothing failed


def test_a_kernel_that_fails_is_switched_off_as_upstream_does(monkeypatch, caplog):
    from sglang.kernels.ops.speculative import dflash as kernels

    def broken(**_):
        raise RuntimeError("no such device")

    monkeypatch.setattr(kernels, "_prepare_dflash_draft_block_unchecked", broken)
    monkeypatch.setattr(kernels, "_compute_dflash_accept_bonus_triton_unchecked", broken)
    w = worker()
    assert warmup.warm_step_kernels(w, [8, 4], q_rule=False) == []
    assert not w._use_triton_prepare_block and not w._use_triton_accept_bonus
    assert "eager path serves" in caplog.text


def test_nothing_is_launched_where_the_step_has_no_triton_kernel():
    w = worker()
    w._use_triton_prepare_block = w._use_triton_accept_bonus = False   # CPU, non-CUDA platforms
    assert warmup.warm_step_kernels(w, WIDTHS, q_rule=False) == []
