"""Width-1 steps' draft context written when the draft next needs it
(`sglang_domino.sglang.adaptive.draft_context.DeferredContext`) and its place in the worker: rows
kept at width 1, written in one call, in step order, before a step that drafts, before a
forward that is not a decode step and after `max_steps` steps, a slot's latest row winning;
a request leaving the batch writes nothing; dropped when the pools are flushed."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang")

from sglang_domino.sglang.adaptive.draft_context import DeferredContext  # noqa: E402
from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig  # noqa: E402

HIDDEN = 6


class Writes:
    """Upstream's append as a recorder: every call's rows, copied."""

    def __init__(self):
        self.calls = []

    def __call__(self, **rows):
        self.calls.append({k: v.clone() for k, v in rows.items()})


def _step(context, rids, seed, buffers=None):
    """One width-1 step's append, from step buffers that the next step overwrites (as
    upstream's are), commit length 1 per request."""
    g = torch.Generator().manual_seed(seed)
    bs = len(rids)
    buffers = buffers or {}
    hidden = buffers.setdefault("hidden", torch.empty(8, HIDDEN))
    loc = buffers.setdefault("loc", torch.empty(8, dtype=torch.int64))
    pos = buffers.setdefault("pos", torch.empty(8, dtype=torch.int64))
    hidden[: bs + 1].copy_(torch.randn(bs + 1, HIDDEN, generator=g))   # a padding row past the batch
    loc[:bs].copy_(torch.randint(0, 1000, (bs,), generator=g))
    pos[:bs].copy_(torch.randint(0, 100, (bs,), generator=g))
    rows = dict(target_hidden=hidden[: bs + 1], cache_loc=loc[:bs], positions=pos[:bs],
                cache_loc_2d=loc[:bs].view(bs, 1), commit_lens=torch.ones(bs, dtype=torch.int32))
    expected = {k: v.clone() for k, v in rows.items()}
    expected["target_hidden"] = expected["target_hidden"][:bs]
    context.keep(**rows)
    return expected


def test_kept_rows_are_written_in_one_call_in_step_order_before_a_step_that_drafts():
    writes, buffers = Writes(), {}
    context = DeferredContext(writes)
    steps = [_step(context, ["a", "b"], seed, buffers) for seed in range(3)]   # the buffers reused
    context.before_step(1)
    assert writes.calls == []                   # still width 1, same requests: nothing written
    context.before_step(16)
    (call,) = writes.calls
    # 6 rows padded to 8 (`padded_rows`): the padding's commit length 0, so it is not written
    for key in ("target_hidden", "cache_loc", "positions", "commit_lens"):
        assert call[key].shape[0] == 8
        torch.testing.assert_close(call[key][:6], torch.cat([s[key] for s in steps]))
    assert call["commit_lens"][6:].tolist() == [0, 0]
    torch.testing.assert_close(call["cache_loc_2d"], call["cache_loc"].view(-1, 1))
    assert context.written_steps == 3 and not context.rows
    context.before_step(16)
    assert len(writes.calls) == 1               # nothing left to write


def test_a_request_leaving_the_batch_keeps_its_rows_until_a_forward_that_is_not_a_decode_step():
    writes = Writes()
    context = DeferredContext(writes)
    _step(context, ["a", "b"], 0)
    # the next width-1 steps, whoever joined or left the batch (finished, aborted, retracted): nothing written
    context.before_step(1)
    context.before_step(1)
    assert writes.calls == []
    _step(context, ["b", "c"], 1)
    context.before_step(None)   # a prefill, mixed or idle forward
    (call,) = writes.calls
    assert int(call["cache_loc"].numel()) == 4 and call["commit_lens"].tolist() == [1, 1, 1, 1]


def test_a_slot_kept_twice_is_written_with_its_latest_committed_row():
    """A finished request's slot handed to another request's next token: both rows are
    kept, and upstream's prefix-valid write (the real pool, on CPU) stores the later one."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_domino.sglang.adaptive.draft_context import latest_rows

    loc = torch.tensor([5, 7, 5, 9, 7])
    commit = torch.tensor([1, 1, 1, 1, 0], dtype=torch.int32)
    # slot 5: the later row; slot 7: the earlier one, the later is not committed
    assert latest_rows(loc, commit).tolist() == [0, 1, 1, 1, 0]
    assert latest_rows(loc[:2], commit[:2]).tolist() == [1, 1]

    pool = MHATokenToKVPool(size=16, page_size=1, dtype=torch.float32, head_num=1, head_dim=2, layer_num=1,
                            device="cpu", enable_memory_saver=False)
    layer = type("Layer", (), {"layer_id": 0})()

    def write(*, target_hidden, cache_loc_2d, commit_lens, **_):
        rows = target_hidden.view(-1, 1, 2)
        pool.set_kv_buffer_prefix_valid(layer, cache_loc_2d, commit_lens, rows, rows)

    context = DeferredContext(write)
    first = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    second = torch.tensor([[3.0, 3.0]])
    context.keep(target_hidden=first, cache_loc=torch.tensor([5, 7]), positions=torch.tensor([10, 20]),
                 cache_loc_2d=torch.tensor([[5], [7]]), commit_lens=torch.ones(2, dtype=torch.int32))
    context.before_step(1)   # the request holding slot 5 left
    context.keep(target_hidden=second, cache_loc=torch.tensor([5]), positions=torch.tensor([3]),
                 cache_loc_2d=torch.tensor([[5]]), commit_lens=torch.ones(1, dtype=torch.int32))
    context.before_step(16)   # 3 rows and a padding row on slot 5, none of them written over it
    torch.testing.assert_close(pool.get_key_buffer(0)[[5, 7], 0], torch.tensor([[3.0, 3.0], [2.0, 2.0]]))


def test_a_write_is_padded_to_a_power_of_two_rows_that_are_not_written():
    """A write's row count repeats (a new matrix-product shape is slow in bfloat16 on the
    CPU): the padding's hidden states and positions are zeros, its slot the last row's and
    its commit length 0."""
    from sglang_domino.sglang.adaptive.draft_context import padded_rows

    for n, size in ((1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (100, 128)):
        hidden, loc, pos = torch.randn(n, HIDDEN), torch.arange(10, 10 + n), torch.arange(n) + 1
        commit = torch.ones(n, dtype=torch.int32)
        h, l, p, c = padded_rows(hidden, loc, pos, commit)
        assert h.shape == (size, HIDDEN) and l.shape == p.shape == c.shape == (size,)
        torch.testing.assert_close(h[:n], hidden)
        assert l[:n].tolist() == loc.tolist() and p[:n].tolist() == pos.tolist() and c[:n].tolist() == [1] * n
        assert not h[n:].any() and set(l[n:].tolist()) <= {10 + n - 1} and not p[n:].any() and not c[n:].any()
        assert l.dtype == loc.dtype and c.dtype == torch.int32
    empty = (torch.zeros(0, HIDDEN), torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
             torch.zeros(0, dtype=torch.int32))
    assert [t.shape[0] for t in padded_rows(*empty)] == [0, 0, 0, 0]


def test_rows_are_written_after_max_steps_and_dropped_when_the_pools_are_flushed():
    writes = Writes()
    context = DeferredContext(writes, max_steps=2)
    _step(context, ["a"], 0)
    context.before_step(1)
    assert writes.calls == []
    _step(context, ["a"], 1)
    context.before_step(1)
    assert len(writes.calls) == 1 and int(writes.calls[0]["cache_loc"].numel()) == 2
    _step(context, ["a"], 2)
    context.drop()
    context.before_step(16)
    assert len(writes.calls) == 1


def test_a_step_of_more_than_one_token_per_request_is_refused():
    context = DeferredContext(Writes())
    with pytest.raises(RuntimeError, match="one token per request"):
        context.keep(target_hidden=torch.zeros(4, HIDDEN), cache_loc=torch.zeros(4, dtype=torch.int64),
                     positions=torch.zeros(4, dtype=torch.int64), cache_loc_2d=torch.zeros(2, 2, dtype=torch.int64),
                     commit_lens=torch.ones(2, dtype=torch.int32))


def _worker(monkeypatch, widths=(16, 1), **cfg):
    """A `DominoDFlashWorker` holding only what its context methods read; upstream's
    append recorded."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_domino.sglang.step import worker as worker_mod

    upstream = Writes()
    monkeypatch.setattr(DFlashWorkerV2, "_append_target_hidden_to_draft_kv_by_loc",
                        lambda self, **rows: upstream(**rows))
    worker = worker_mod.DominoDFlashWorker.__new__(worker_mod.DominoDFlashWorker)
    worker.width_policy = AdaptiveWidth(AdaptiveWidthConfig(widths=list(widths), **cfg))
    worker.use_compact_draft_cache = False
    worker._compiled_context = None   # an eager draft: upstream writes the context
    monkeypatch.setattr(worker_mod, "get_memory", lambda: type("M", (), {"enable_hierarchical_cache": False})())
    worker._context = worker._deferred_context()
    return worker, upstream


def test_the_worker_keeps_the_append_of_a_width_1_step_and_passes_any_other_to_upstream(monkeypatch):
    worker, upstream = _worker(monkeypatch)
    rows = dict(target_hidden=torch.ones(2, HIDDEN), cache_loc=torch.tensor([3, 4]), positions=torch.tensor([7, 9]),
                cache_loc_2d=torch.tensor([[3], [4]]), commit_lens=torch.ones(2, dtype=torch.int32))
    with worker._keeping(True):
        worker._append_target_hidden_to_draft_kv_by_loc(**rows)
    assert upstream.calls == [] and len(worker._context.rows) == 1 and not worker._context.keeping
    worker._append_target_hidden_to_draft_kv_by_loc(**rows)     # a prefill's or a wider step's append
    assert len(upstream.calls) == 1
    with worker._keeping(False):
        worker._append_target_hidden_to_draft_kv_by_loc(**rows)
    assert len(upstream.calls) == 2
    worker._context.before_step(16)
    assert len(upstream.calls) == 3 and int(upstream.calls[2]["cache_loc"].numel()) == 2
    worker.clear_cache_pool()


def test_no_deferred_context_without_width_1_when_turned_off_or_with_a_compact_draft_cache(monkeypatch):
    assert _worker(monkeypatch)[0]._context is not None
    assert _worker(monkeypatch, widths=(16, 8))[0]._context is None
    assert _worker(monkeypatch, defer_context=False)[0]._context is None
    worker, _ = _worker(monkeypatch)
    worker.use_compact_draft_cache = True
    assert worker._deferred_context() is None


def test_a_pinned_policy_runs_its_widths_in_turn_and_pins_are_checked():
    policy = AdaptiveWidth(AdaptiveWidthConfig(widths=[16, 8, 1], pin=[1, 1, 16]))
    assert [policy.choose(["a"]) for _ in range(7)] == [1, 1, 16, 1, 1, 16, 1]
    assert policy.histogram == {16: 2, 8: 0, 1: 5}
    with pytest.raises(ValueError, match="pin"):
        AdaptiveWidthConfig(widths=[16, 1], pin=[4])
    with pytest.raises(ValueError, match="pin"):
        AdaptiveWidthConfig(widths=[16, 1], pin=[])
    with pytest.raises(ValueError, match="at most the verify window 8"):
        AdaptiveWidthConfig(widths=[16, 1], pin=[16]).for_window(8)


def test_keeping_and_writing_rows_reads_nothing_back_on_fake_cuda():
    """On a GPU the kept rows stay on the device: copies and one concatenation, no host read."""
    from tests.fake_cuda import fake_cuda

    writes = Writes()
    with fake_cuda():
        context = DeferredContext(writes)
        for _ in range(3):
            loc = torch.zeros(4, dtype=torch.int64, device="cuda")
            context.keep(target_hidden=torch.zeros(5, HIDDEN, device="cuda"), cache_loc=loc,
                         positions=torch.zeros(4, dtype=torch.int64, device="cuda"), cache_loc_2d=loc.view(4, 1),
                         commit_lens=torch.ones(4, dtype=torch.int32, device="cuda"))
        context.before_step(16)
        (call,) = writes.calls
        assert call["target_hidden"].shape == (16, HIDDEN) and call["target_hidden"].device.type == "cuda"
        assert call["cache_loc_2d"].shape == (16, 1) and call["commit_lens"].device.type == "cuda"


def test_a_width_1_steps_result_ages_its_requests_estimates(monkeypatch):
    """The scheduler's hook after a width-1 step hands the step to the policy, which ages
    the requests' counts (`unverified_decay`); before, width-1 steps never reached it."""
    import collections

    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from sglang_domino.sglang.adaptive.width_switch import StepTimer

    monkeypatch.setattr(DFlashWorkerV2, "on_verify_complete_cpu", lambda self, *a, **k: None)
    worker, _ = _worker(monkeypatch, unverified_decay=0.5)
    worker._clock, worker._in_flight, worker.drafts_proposed = StepTimer(), collections.deque(), 0
    req = type("Req", (), {"is_retracted": False, "finished": lambda self: False})()
    worker.width_policy.observe_step(["a"], 16, [0])
    before = worker.width_policy.stats.requests["a"].tried[0]
    worker._in_flight.append(([req], ["a"], 1, [], 1.0))
    worker.on_verify_complete_cpu([0], batch_size=1)
    assert worker.width_policy.stats.requests["a"].tried[0] == pytest.approx(0.5 * before)
    assert worker.drafts_proposed == 0 and 1 not in worker.width_policy.tallies
