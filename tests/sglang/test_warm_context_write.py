"""The step's draft-context write warmed at start-up for every verify width
(`warmup.warm_step_kernels`, issue 45 item 2b): 0.5.23's prefix-valid KV write
(`set_kv_buffer_prefix_valid_tiled`) takes the verify width as a plain int that Triton
specialises at 1 and at multiples of 16, so an adaptive server's width 1 and first width
not a multiple of 16 would compile it in the middle of serving. Upstream's
`DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc` is run once per width on one
request of zero rows in slot 0 with commit length 0 (nothing written), on CUDA/HIP only."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang_domino.sglang.step import warmup  # noqa: E402

WIDTHS = [16, 8, 1]
HIDDEN, FEATURES, KV_HEADS, HEAD_DIM, LAYERS = 8, 3, 2, 4, 2


class Calls:
    """Upstream's append as a recorder (its keyword arguments, per call)."""

    def __init__(self):
        self.calls = []

    def __call__(self, worker, **rows):
        self.calls.append(rows)


def worker(device="cpu", dtype=torch.bfloat16):
    """What `warm_step_kernels` and upstream's append read: the step's other kernels off
    (tested in test_warmup.py), a draft of `LAYERS` layers over `FEATURES` target layers."""
    device = torch.device(device)
    req_to_token = torch.zeros(2, 40, dtype=torch.int32, device=device)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                             model_config=SimpleNamespace(vocab_size=64, dtype=dtype), device=device)
    return SimpleNamespace(device=device, model_runner=runner, _mask_token_id=63, domino_candidate_pool_size=16,
                           _use_triton_prepare_block=False, _use_triton_accept_bonus=False,
                           draft_model=_Draft(device, dtype), draft_parallel_layout=SimpleNamespace(tp_group=None),
                           lilicorr=None, _use_fused_kv_materialize=False, _fused_kv_helper=None)


class _Attn:
    """A draft layer's attention as upstream's append uses it (`DFlashAttention`)."""

    def __init__(self, layer_id, device, dtype):
        self.kv = torch.nn.Linear(HIDDEN, 2 * KV_HEADS * HEAD_DIM, bias=False, device=device, dtype=dtype)
        self.num_kv_heads, self.head_dim = KV_HEADS, HEAD_DIM
        self.attn = SimpleNamespace(layer_id=layer_id, k_scale=None, v_scale=None)

    def kv_proj_only(self, hidden):
        return self.kv(hidden).chunk(2, dim=-1)

    def apply_k_norm(self, k):
        return k

    def apply_k_rope(self, positions, k):
        return k


class _Draft:
    def __init__(self, device, dtype):
        self.num_context_features = FEATURES
        self.config = SimpleNamespace(hidden_size=HIDDEN)
        self.fc = torch.nn.Linear(FEATURES * HIDDEN, HIDDEN, bias=False, device=device, dtype=dtype)
        self.layers = [SimpleNamespace(self_attn=_Attn(i, device, dtype)) for i in range(LAYERS)]

    def project_target_hidden(self, target_hidden):   # upstream checks the feature width the same way
        assert target_hidden.shape[-1] == self.fc.in_features, target_hidden.shape
        return self.fc(target_hidden)

    def prepare_context_hidden_for_kv(self, layer, hidden):
        return hidden


class _Pool:
    """The draft pool's prefix-valid write, recorded; `impl` (if given) is run on a real
    K/V cache of `slots` rows."""

    def __init__(self, impl=None, slots=4):
        self.calls, self.impl = [], impl
        self.k_cache = torch.full((slots, KV_HEADS * HEAD_DIM), 7.0, dtype=torch.bfloat16)
        self.v_cache = self.k_cache.clone()

    def set_kv_buffer_prefix_valid(self, layer, loc_2d, commit_lens, k, v, k_scale=None, v_scale=None):
        self.calls.append((layer.layer_id, tuple(loc_2d.shape), loc_2d, commit_lens, tuple(k.shape)))
        if self.impl is not None:
            self.impl(k.reshape(k.shape[0], -1).contiguous(), v.reshape(v.shape[0], -1).contiguous(),
                      self.k_cache, self.v_cache, loc_2d, commit_lens,
                      row_dim=KV_HEADS * HEAD_DIM, store_dtype=torch.bfloat16)


def _upstream_recorded(monkeypatch) -> Calls:
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    calls = Calls()
    monkeypatch.setattr(DFlashWorkerV2, "_append_target_hidden_to_draft_kv_by_loc", calls)
    return calls


def test_the_write_is_launched_once_per_width_with_nothing_committed(monkeypatch):
    """Values read back: the gate opened on CPU tensors (the CUDA gate itself is tested on
    fake CUDA below)."""
    calls = _upstream_recorded(monkeypatch)
    monkeypatch.setattr(warmup, "_context_write_runs_triton", lambda device: True)
    launched = warmup.warm_step_kernels(worker(), WIDTHS, q_rule=False)
    assert launched == [("context_write", w) for w in WIDTHS]
    assert len(calls.calls) == len(WIDTHS)
    for width, call in zip(WIDTHS, calls.calls):
        assert tuple(call["cache_loc_2d"].shape) == (1, width)
        assert call["commit_lens"].dtype == torch.int32 and call["commit_lens"].tolist() == [0]
        assert call["cache_loc"].tolist() == [0] * width == call["positions"].tolist()   # the padding slot
        assert tuple(call["target_hidden"].shape) == (width, FEATURES * HIDDEN)
        assert call["target_hidden"].dtype == torch.bfloat16 and not call["target_hidden"].any()


def test_on_fake_cuda_upstreams_write_reaches_the_pool_at_every_width():
    """Upstream's append run for real (its argument checks, projection and per-layer K/V)
    on fake CUDA tensors: every draft layer's prefix-valid write gets one request of
    `width` slots, and nothing is read back to the host."""
    from tests.fake_cuda import fake_cuda

    pool = _Pool()
    with fake_cuda():
        w = worker("cuda")
        w.draft_model_runner = SimpleNamespace(token_to_kv_pool=pool)
        launched = warmup.warm_step_kernels(w, WIDTHS, q_rule=False)
    assert launched == [("context_write", wd) for wd in WIDTHS]
    assert [(layer, shape, k) for layer, shape, _, _, k in pool.calls] == [
        (layer, (1, wd), (wd, KV_HEADS, HEAD_DIM)) for wd in WIDTHS for layer in range(LAYERS)]
    for _, _, loc_2d, commit_lens, _ in pool.calls:
        assert loc_2d.device.type == commit_lens.device.type == "cuda"
        assert loc_2d.dtype == torch.int64 and commit_lens.dtype == torch.int32 and tuple(commit_lens.shape) == (1,)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter on CPU")
def test_the_kernel_runs_at_every_width_and_writes_nothing(monkeypatch):
    """Through upstream's append to 0.5.23's Triton write (`_set_kv_buffer_prefix_valid_impl`,
    under the interpreter): launched with block size = the width, the cache left as it was."""
    from sglang.srt.mem_cache import memory_pool

    seen = []

    def impl(k, v, k_cache, v_cache, loc_2d, commit_lens, **kw):
        seen.append(int(loc_2d.shape[1]))
        return memory_pool._set_kv_buffer_prefix_valid_impl(k, v, k_cache, v_cache, loc_2d, commit_lens, **kw)

    monkeypatch.setattr(warmup, "_context_write_runs_triton", lambda device: True)
    pool = _Pool(impl)
    w = worker()
    w.draft_model_runner = SimpleNamespace(token_to_kv_pool=pool)
    assert warmup.warm_step_kernels(w, WIDTHS, q_rule=False) == [("context_write", wd) for wd in WIDTHS]
    assert seen == [wd for wd in WIDTHS for _ in range(LAYERS)]
    assert (pool.k_cache == 7).all() and (pool.v_cache == 7).all()


def test_nothing_is_written_on_a_cpu_worker(monkeypatch):
    calls = _upstream_recorded(monkeypatch)
    assert warmup.warm_step_kernels(worker(), WIDTHS, q_rule=False) == []
    assert calls.calls == []
    assert not warmup._context_write_runs_triton("cpu") and warmup._context_write_runs_triton("cuda:1")


def test_a_domino_worker_inside_a_width_1_step_still_reaches_upstream_and_keeps_nothing(monkeypatch):
    """The warm-up calls upstream's function, not `DominoDFlashWorker`'s override, which
    keeps a width-1 step's rows for later (`draft_context`)."""
    from sglang_domino.sglang.step import worker as worker_mod
    from sglang_domino.sglang.adaptive.draft_context import DeferredContext

    calls = _upstream_recorded(monkeypatch)
    monkeypatch.setattr(warmup, "_context_write_runs_triton", lambda device: True)
    domino = worker_mod.DominoDFlashWorker.__new__(worker_mod.DominoDFlashWorker)
    vars(domino).update(vars(worker()))
    domino._compiled_context = None
    domino._context = DeferredContext(lambda **rows: pytest.fail("the kept rows were written"))
    domino._context.keeping = True
    assert warmup.warm_step_kernels(domino, WIDTHS, q_rule=False) == [("context_write", w) for w in WIDTHS]
    assert len(calls.calls) == len(WIDTHS) and domino._context.rows == []


def test_a_failing_write_is_a_warning_not_a_failed_start(monkeypatch, caplog):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    tries = []

    def broken(self, **rows):
        tries.append(int(rows["cache_loc_2d"].shape[1]))
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(DFlashWorkerV2, "_append_target_hidden_to_draft_kv_by_loc", broken)
    monkeypatch.setattr(warmup, "_context_write_runs_triton", lambda device: True)
    assert warmup.warm_step_kernels(worker(), WIDTHS, q_rule=False) == []
    assert tries == [16]     # not retried at every width
    assert "draft-context write failed at width 16" in caplog.text
