"""Width-1 steps as plain decode steps (`decode_step.DecodeStep`): where they run (an eager
CPU target that is not hybrid, no compact draft cache, no DP attention; every other case
named at start-up) and the width-1 accept (greedy: the target's argmax committed, nothing
accepted; sampled: the worker's exact accept rule). The step itself is end to end in
`tests/e2e/test_adaptive_context.py` (its tokens and the draft context it leaves equal to
0.5.23's width-1 verify)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang_domino.sglang.adaptive.decode_step import DecodeStep  # noqa: E402
from sglang_domino.sglang.adaptive import AdaptiveWidthConfig  # noqa: E402


@pytest.fixture
def parallel(monkeypatch):
    import sglang.srt.runtime_context as rc

    bag = SimpleNamespace(attn_dp_enabled=False)
    monkeypatch.setattr(rc, "get_parallel", lambda: bag)
    return bag


def worker(device="cpu", graphs=None, hybrid=False, compact=False):
    runner = SimpleNamespace(decode_cuda_graph_runner=graphs, eager_runner=object())
    return SimpleNamespace(device=torch.device(device), _target_worker=SimpleNamespace(model_runner=runner),
                           _need_mamba_verify_commit=hybrid, use_compact_draft_cache=compact)


def test_width_1_is_a_decode_step_on_an_eager_cpu_target(parallel):
    assert DecodeStep.why_not(worker()) is None


@pytest.mark.parametrize("case, needle", [
    (dict(device="meta"), "captured graphs on a device"),
    (dict(graphs=object()), "captured graphs"),
    (dict(hybrid=True), "hybrid"),
    (dict(compact=True), "compact draft cache"),
])
def test_width_1_verifies_one_token_where_a_decode_step_cannot_serve_it(parallel, case, needle):
    assert needle in DecodeStep.why_not(worker(**case))


def test_dp_attention_keeps_the_verify_path(parallel):
    parallel.attn_dp_enabled = True
    assert "DP attention" in DecodeStep.why_not(worker())


def test_grammar_batches_take_upstreams_step():
    assert DecodeStep.serves(SimpleNamespace(has_grammar=False))
    assert not DecodeStep.serves(SimpleNamespace(has_grammar=True))


def test_the_setting_is_on_by_default_and_validated():
    assert AdaptiveWidthConfig().decode_step is True
    assert AdaptiveWidthConfig(decode_step=False).decode_step is False
    with pytest.raises(ValueError, match="decode_step"):
        AdaptiveWidthConfig(decode_step="sometimes")


class Accepting:
    """The worker's side of the width-1 accept: its TP sync (recorded) and its exact
    accept rule (recorded, never reached by a greedy batch)."""

    def __init__(self):
        self.synced, self.accepted = [], []
        self._tp_sync = SimpleNamespace(sync=lambda site, t: self.synced.append((site, t.clone())))

    def _accept_block(self, **kwargs):
        self.accepted.append(kwargs)
        return "exact rule"


def test_a_greedy_width_1_step_commits_the_targets_argmax():
    torch.manual_seed(0)
    w = Accepting()
    step = DecodeStep(w)
    logits = torch.randn(3, 50)
    prefix = torch.tensor([7, 11, 30])
    greedy = SimpleNamespace(is_all_greedy=True)
    accept_len, commit_lens, bonus, out_tokens, new_lens = step._accept(
        torch.tensor([[4], [5], [6]]), logits, greedy, None, prefix, None)
    top = logits.argmax(-1)
    assert torch.equal(bonus, top) and bonus.dtype == torch.int64
    assert torch.equal(out_tokens, top.view(3, 1)) and out_tokens.data_ptr() != bonus.data_ptr()
    assert torch.equal(accept_len, torch.zeros(3, dtype=torch.int32))
    assert torch.equal(commit_lens, torch.ones(3, dtype=torch.int32))
    assert torch.equal(new_lens, prefix + 1)
    assert len(w.synced) == 1 and torch.equal(w.synced[0][1], top) and not w.accepted
    # a deferred-shard argmax the caller already took is used as it is
    given = torch.tensor([1, 2, 3])
    assert torch.equal(step._accept(torch.zeros(3, 1, dtype=torch.int64), None, greedy, None, prefix, given)[2], given)


def test_a_sampled_width_1_step_uses_the_workers_exact_accept_rule():
    w = Accepting()
    sampled = SimpleNamespace(is_all_greedy=False)
    candidates = torch.tensor([[4], [5]])
    assert DecodeStep(w)._accept(candidates, torch.zeros(2, 9), sampled, "draft input", torch.tensor([3, 4]),
                                 None) == "exact rule"
    (kwargs,) = w.accepted
    assert kwargs["candidates"] is candidates and kwargs["bs"] == 2 and kwargs["draft_input"] == "draft input"
    assert not w.synced
