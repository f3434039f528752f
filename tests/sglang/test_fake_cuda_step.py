"""The per-step pieces the plugin adds around upstream's DFLASH step, run on fake CUDA
tensors (torch's `FakeTensorMode`: `cuda` tensors on a machine without a GPU; a read of a
device value on the host, as `.item()` or `torch.equal`, raises as a GPU would stall on
it): the width switch with the draft tail's narrowed proposals, the per-width verify
graphs, the reference accept rule and the width-1 rollout answer. Each runs without a host
sync or a device mix. (The sampled and greedy rollouts: `test_sampled_rollout*.py`; the
trainer's step: `tests/train/test_anchors.py`.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode  # noqa: E402

from sglang.srt.speculative import dflash_worker_v2 as w2  # noqa: E402

from sglang_domino.accept import Uniforms, accept_probs  # noqa: E402
from sglang_domino.sglang.seam.hooks import WIDTH_STATE  # noqa: E402
from sglang_domino.sglang.step.rollout_hook import no_proposals  # noqa: E402
from sglang_domino.sglang.adaptive.verify_graphs import VerifyGraphs, VerifyState  # noqa: E402
from sglang_domino.sglang.adaptive.width_switch import WidthSwitch  # noqa: E402

BLOCK, BS, V, H = 16, 4, 64, 8


@pytest.fixture
def cuda():
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        yield mode


def domino_sampler():
    lm_head = torch.randn(V, H, device="cuda")
    return w2._DominoDraftSampler(target_embedding=None, lm_head_weight=lm_head, prefix_gru=None, embed_proj=None,
                                  vocab_size=V, block_size=BLOCK, shift_label=True, max_bs=8, candidate_pool_size=0)


class Worker:
    def __init__(self, sampler):
        for name in WIDTH_STATE:
            setattr(self, name, None)
        self.block_size = self.speculative_num_draft_tokens = BLOCK
        self._draft_sampler = sampler
        self.device = torch.device("cuda")


def test_a_narrow_step_swaps_its_state_and_reads_the_block_proposals_on_the_device(cuda):
    sampler = domino_sampler()
    worker = Worker(sampler)
    switch = WidthSwitch(worker)
    target = SimpleNamespace(attn_backend=f"backend {BLOCK}", decode_cuda_graph_runner=f"graph {BLOCK}")
    switch.graphs = VerifyGraphs(target, BLOCK, {w: VerifyState(w, f"backend {w}", f"graph {w}") for w in (BLOCK, 4)})
    for _ in range(2):   # the second step reuses the width's buffers
        with switch.at(4):
            assert worker._block_pos_offsets.device.type == "cuda" and worker.block_size == 4
            assert target.decode_cuda_graph_runner == "graph 4"
            # upstream's read of the in-graph proposals at the step's width
            proposals = worker._draft_sampler.out[: BS * 3].view(BS, 3)
            assert proposals.device.type == "cuda" and proposals.shape == (BS, 3)
    assert worker._draft_sampler is sampler and target.attn_backend == f"backend {BLOCK}"


def test_the_reference_accept_rule_and_the_width_1_answer_stay_on_the_device(cuda):
    n = 5
    drafts = torch.randint(0, V, (BS, n), device="cuda")
    p = torch.softmax(torch.randn(BS, n + 1, V, device="cuda"), -1)
    q = torch.softmax(torch.randn(BS, n, V, device="cuda"), -1)
    u = Uniforms(torch.rand(BS, n, device="cuda"), torch.rand(BS, device="cuda"))
    for draft_probs in (None, q):     # point-mass drafts (DFlash, greedy Domino) and the q rule
        accepted, nxt = accept_probs(drafts, draft_probs, p, uniforms=u)
        assert accepted.device.type == nxt.device.type == "cuda" and accepted.shape == nxt.shape == (BS,)
    # a width-1 step: nothing proposed, the token drawn from p
    accepted, nxt = accept_probs(drafts[:, :0], None, p[:, :1], uniforms=Uniforms(u.steps[:, :0], u.final))
    assert accepted.device.type == nxt.device.type == "cuda" and accepted.shape == nxt.shape == (BS,)
    assert no_proposals(torch.zeros(BS, 1, H, device="cuda")).device.type == "cuda"


def test_a_host_read_put_back_is_caught(cuda):
    """The control: the accept rule with a host read of the accepted lengths (as a
    `.item()` or `torch.equal` check in the step would do) raises on fake CUDA."""
    n = 3
    drafts = torch.randint(0, V, (BS, n), device="cuda")
    p = torch.softmax(torch.randn(BS, n + 1, V, device="cuda"), -1)
    accepted, _ = accept_probs(drafts, None, p)
    with pytest.raises(DataDependentOutputException):
        int(accepted.max().item())
    with pytest.raises(Exception):
        torch.equal(drafts, drafts.clone())


class _Plan:
    def __init__(self, calls, **kwargs):
        self.kwargs = kwargs
        calls.append(self)

    def bind(self, batch, translator):
        batch.kv_loc_plan = self


def draft_block_worker(calls):
    from types import SimpleNamespace as NS

    def draft_forward(forward_batch, *args, **kwargs):
        rows = int(forward_batch.input_ids.numel())
        return NS(logits_output=NS(hidden_states=torch.randn(rows, H, device="cuda")), can_run_graph=True)

    target = NS(req_to_token_pool=NS(req_to_token=torch.zeros(8, 128, dtype=torch.int32, device="cuda")),
                kv_index_translator=NS(plan=lambda **kw: _Plan(calls, **kw)))
    runner = NS(forward=draft_forward, dtype=torch.float32, kv_index_translator=object())
    return NS(draft_model_runner=runner, model_runner=target, device=torch.device("cuda"), _mask_token_id=V - 1,
              draft_model=NS(config=NS(hidden_size=H)), block_size=8)


@pytest.mark.parametrize("window", [8, 4, 1])
def test_the_draft_block_runner_builds_its_block_batch_on_the_device(cuda, window):
    """b8 (window 8 of a 16-slot draft block) and adaptive narrow steps: the draft batch of
    the whole block, its KV plan and the window's hidden states, with no host read."""
    from sglang_domino.sglang.step.draft_block import DraftBlockRunner

    calls = []
    worker = draft_block_worker(calls)
    worker.block_size = window
    runner = DraftBlockRunner(worker, BLOCK)
    batch = SimpleNamespace(
        batch_size=BS, forward_mode=SimpleNamespace(is_target_verify=lambda: True),
        input_ids=torch.randint(0, V, (BS * window,), device="cuda"),
        input_embeds=torch.randn(BS * window, H, device="cuda"),
        positions=torch.arange(BS * window, device="cuda"), seq_lens=torch.full((BS,), 10, device="cuda"),
        req_pool_indices=torch.arange(BS, device="cuda"), seq_lens_cpu=torch.full((BS,), 10), seq_lens_sum=BS * 10,
        kv_loc_plan=None, out_cache_loc=torch.zeros(BS * window, dtype=torch.int64, device="cuda"),
        num_token_non_padded=torch.tensor(BS * window, device="cuda"))
    out = runner(batch)
    hidden = out.logits_output.hidden_states
    assert hidden.device.type == "cuda"
    assert tuple(hidden.shape) == ((BS * window, H) if window > 1 else (BS, H))
    if window > 1:
        (plan,) = calls
        assert plan.kwargs["read_extent"] == BLOCK and plan.kwargs["write_virtual"].device.type == "cuda"
