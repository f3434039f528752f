"""An adaptive width-1 step on CUDA without the draft side (`decode_step.DecodeStep`, its
`_verify_forward`), run through the worker's step entry on fake CUDA tensors
(`tests.fake_cuda`: a host read of a device value raises, as a GPU would stall on it).

Recorded: upstream's draft-side calls (the Triton prepare-block kernel's wrapper, the
block's embedding, the draft model runner's forward, the Domino rollout), its accept/bonus
kernel's wrapper, the draft-context write (upstream's `_append_target_hidden_to_draft_kv_by_loc`)
and the target's forward (with the verify graph runner installed at the time, and upstream's
own `DecodeCudaGraphRunner.can_run_graph` asked about the verify batch). Stand-ins, shape-only:
the target's forward (logits and captured hidden states), the verify batch's preparation
(`DFlashVerifyInput.prepare_for_verify`, whose `ForwardBatch.init_new` needs a real
scheduler batch), the KV plan, the stream of `record_stream`. Upstream's step itself runs
for real in the control (width 1 through 0.5.23's body, as before: every draft-side call
recorded) and at width 16 after two width-1 steps (the kept rows written before the draft).
"""

from __future__ import annotations

import collections
from types import SimpleNamespace as NS

import pytest
import torch
from torch import nn

pytest.importorskip("sglang")

import sglang.srt.runtime_context as rc  # noqa: E402
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner  # noqa: E402
from sglang.srt.speculative import dflash_worker_v2 as w2  # noqa: E402
from sglang.srt.speculative.dflash_info import DFlashVerifyInput  # noqa: E402
from sglang.srt.speculative.draft_worker_common import make_draft_input_v2  # noqa: E402

from sglang_domino.sglang.step import worker as worker_mod  # noqa: E402
from sglang_domino.sglang.adaptive.decode_step import DecodeStep  # noqa: E402
from sglang_domino.sglang.step.draft_block import DraftBlockRunner  # noqa: E402
from sglang_domino.sglang.adaptive.draft_context import DeferredContext  # noqa: E402
from sglang_domino.sglang.seam.hooks import WIDTH_STATE  # noqa: E402
from sglang_domino.sglang.step.rollout_hook import no_proposals  # noqa: E402
from sglang_domino.sglang.adaptive.verify_graphs import VerifyGraphs, VerifyState  # noqa: E402
from sglang_domino.sglang.adaptive.width_switch import StepTimer, WidthSwitch  # noqa: E402
from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig  # noqa: E402
from tests.fake_cuda import fake_cuda  # noqa: E402

BLOCK, BS, V, H, HC, MASK = 16, 4, 64, 8, 12, 63   # HC: the target's captured hidden size
DRAFT_SIDE = ("prepare_block", "embed", "draft_forward", "rollout")


class Runner(DecodeCudaGraphRunner):
    """Upstream's graph runner class at one captured width; `can_run_graph` is upstream's
    own, the fields it reads set as a TP-only server sets them (no capture here)."""

    def __init__(self, model_runner, width):
        self.model_runner = model_runner
        self.captured_req_width = int(width)
        self.ragged_verify_mode = self.require_mlp_tp_gather = self.require_mlp_sync = False
        self.disable_padding = self.is_encoder_decoder = self.enable_two_batch_overlap = False
        self.enable_pdmux = self.record_nolora_graph = False
        self.max_bs = 32

    def __repr__(self):
        return f"graph {self.captured_req_width}"


class Plan:
    """The iteration's KV plan (`KVIndexTranslator.plan`): its write ids are the window's."""

    def __init__(self, events, **kwargs):
        self.kwargs = kwargs
        events.append(("plan", int(kwargs["read_extent"])))

    def bind(self, forward_batch, translator):
        forward_batch.kv_loc_plan = self

    def write_ids(self, translator):
        return self.kwargs["write_virtual"]


class Harness:
    """A `DominoDFlashWorker` on fake CUDA holding what its step and 0.5.23's body read,
    adaptive over widths 16 and 1 and pinned to `pin`; every call of interest appended to
    `events` in order."""

    def __init__(self, monkeypatch, pin, decode_step=True, dev="cuda"):
        self.dev = dev
        torch.manual_seed(0)
        self.events = events = []
        self.writes = []            # upstream's draft-context writes (rows)
        self.targets = []           # the target's forwards: (verify batch, kwargs, graph runner installed)
        self.logits = []            # the target's logits, per forward
        self.prepared = []          # the verify batches' preparation: (verify input, host lengths, sum, can run graph)
        self._patch_upstream(monkeypatch)

        w = object.__new__(worker_mod.DominoDFlashWorker)
        self.worker = w
        w.device = torch.device(dev)
        for name in WIDTH_STATE:
            setattr(w, name, None)
        w._block_pos_offsets = torch.arange(BLOCK, device=dev)
        w._accept_bonus_buffer_cap, w._accept_bonus_buffer_slot = 0, 0
        w.block_size = w.speculative_num_draft_tokens = BLOCK
        w._draft_sampler = None
        w.q_rule, w._q_sampler = False, None
        w._penalties = NS(forget=lambda reqs: None, step=lambda batch: None)
        w._step_penalties = None
        w._tp_sync = NS(sync=lambda site, t: events.append(("tp_sync", tuple(t.shape))))
        w._target_logits_processor = None
        w._need_mamba_verify_commit = w.use_compact_draft_cache = False
        w.selector = w.lilicorr = w._selector_sample = None
        w._is_domino = True
        w._use_triton_prepare_block = w._use_triton_accept_bonus = True
        w._full_embed_gpu, w._noise_embed_scale = None, 1.0
        w.domino_candidate_pool_size = 0
        w.draft_parallel_layout = NS(tp_group=None)
        w.draft_model = NS(is_nemotron_35_draft=False, shift_label=True, prefix_gru=object(), embed_proj=object(),
                           config=NS(hidden_size=H))
        w._draft_block_spec_info = None
        w._mask_token_id = MASK

        # the target: its model (embedding recorded), its KV pools and plan, its graph runners
        embedding = nn.Embedding(V, H, device=dev)
        embed_forward = embedding.forward

        def embed(ids):
            events.append(("embed", tuple(ids.shape)))
            return embed_forward(ids)

        embedding.forward = embed
        model = NS(lm_head=NS(weight=torch.randn(V, H, device=dev)), get_input_embeddings=lambda: embedding)
        target_runner = NS(
            model=model, model_config=NS(vocab_size=V), spec_algorithm=NS(is_ngram=lambda: False),
            req_to_token_pool=NS(req_to_token=torch.arange(8 * 256, dtype=torch.int32, device=dev).view(8, 256)),
            kv_index_translator=NS(plan=lambda **kw: Plan(events, **kw)), eager_runner=object())
        graphs = {w_: VerifyState(w_, f"backend {w_}", Runner(target_runner, w_)) for w_ in (BLOCK, 1)}
        target_runner.attn_backend = graphs[BLOCK].attn_backend
        target_runner.decode_cuda_graph_runner = graphs[BLOCK].graph_runner
        self.target_runner = target_runner

        # the target as a function of its input: each token's logits and captured hidden
        # states from tables, moved by its position
        logit_table, hidden_table = torch.randn(V, V, device=dev), torch.randn(V, HC, device=dev)

        def target_forward(batch=None, forward_batch=None, **kwargs):
            n = int(forward_batch.input_ids.numel())
            events.append(("target", n))
            self.targets.append((forward_batch, kwargs, target_runner.decode_cuda_graph_runner))
            ids, shift = forward_batch.input_ids, forward_batch.positions.to(torch.float32)[:, None]
            logits = logit_table[ids] + 0.01 * shift
            self.logits.append(logits)
            return NS(logits_output=NS(next_token_logits=logits, hidden_states=hidden_table[ids] + shift),
                      can_run_cuda_graph=True, routed_experts_output=None, indexer_topk_output=None)

        w._target_worker = NS(model_runner=target_runner, forward_batch_generation=target_forward)
        w.model_runner = target_runner

        # the draft: its runner's forward recorded behind the plugin's block runner
        def draft_forward(forward_batch, *args, **kwargs):
            rows = int(forward_batch.input_ids.numel())
            events.append(("draft_forward", rows))
            return NS(logits_output=NS(hidden_states=torch.randn(rows, H, device=dev)), can_run_graph=False)

        w.draft_model_runner = NS(forward=draft_forward, dtype=torch.float32, kv_index_translator=object())
        w.draft_block = BLOCK
        DraftBlockRunner(w, BLOCK).install()

        # the adaptive step's state
        w.width_policy = AdaptiveWidth(AdaptiveWidthConfig(widths=[BLOCK, 1], pin=list(pin)).for_window(BLOCK))
        w._widths = WidthSwitch(w)
        w._widths.graphs = VerifyGraphs(target_runner, BLOCK, graphs)
        w._clock = StepTimer()
        w._in_flight = collections.deque()
        w.drafts_proposed = 0
        w._compiled_context = None
        monkeypatch.setattr(worker_mod, "get_memory", lambda: NS(enable_hierarchical_cache=False))
        w._context = w._deferred_context()
        assert isinstance(w._context, DeferredContext)
        w._decode_step = w._width_one_decode_step() if decode_step else None

    def _patch_upstream(self, monkeypatch):
        events, dev = self.events, self.dev
        bag = NS(attn_dp_enabled=False, tp_group=None, tp_rank=0, tp_size=1, moe_ep_size=1)
        monkeypatch.setattr(rc, "get_parallel", lambda: bag)
        monkeypatch.setattr(w2, "get_parallel", lambda: bag)
        monkeypatch.setattr(w2, "enable_num_token_non_padded", lambda: False)
        # the overlap stream's hold on the lengths (no device runtime here)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: "forward stream")
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, stream: events.append(("record_stream", stream)), raising=False)

        def prepare_block(**kwargs):
            events.append(("prepare_block", tuple(kwargs["block_ids_out"].shape)))

        def accept_kernel(**kwargs):
            events.append(("accept_kernel", tuple(kwargs["candidates"].shape)))

        def rollout(*, draft_hidden, **kwargs):
            events.append(("rollout", tuple(draft_hidden.shape[:2])))
            if draft_hidden.shape[1] <= 1:
                return no_proposals(draft_hidden)   # the plugin's rollout hook at width 1
            return torch.randint(0, V, (draft_hidden.shape[0], draft_hidden.shape[1] - 1), device=dev)

        monkeypatch.setattr(w2, "_prepare_dflash_draft_block_unchecked", prepare_block)
        monkeypatch.setattr(w2, "_compute_dflash_accept_bonus_triton_unchecked", accept_kernel)
        monkeypatch.setattr(w2, "domino_greedy_rollout", rollout)

        def append(worker, **rows):
            events.append(("context_write", int(rows["cache_loc"].numel())))
            self.writes.append(rows)

        monkeypatch.setattr(w2.DFlashWorkerV2, "_append_target_hidden_to_draft_kv_by_loc", append)
        prepared = self.prepared

        def prepare_for_verify(verify_input, batch, target_worker, *, defer_metadata_init=False):
            """`ForwardBatch.init_new` needs a real batch: the verify batch's fields the
            step and the graph's choice read, and upstream's own `can_run_graph` on the
            graph runner installed on the target now."""
            batch.input_ids, batch.spec_info = verify_input.draft_token, verify_input
            forward_batch = NS(batch_size=int(batch.seq_lens.shape[0]), input_ids=verify_input.draft_token,
                               positions=verify_input.positions, out_cache_loc=batch.out_cache_loc,
                               spec_info=verify_input, replace_embeds=None, kv_loc_plan=verify_input.kv_loc_plan)
            can_run = target_worker.model_runner.decode_cuda_graph_runner.can_run_graph(forward_batch)
            prepared.append((verify_input, batch.seq_lens_cpu, batch.seq_lens_sum, can_run))
            return forward_batch, can_run

        monkeypatch.setattr(DFlashVerifyInput, "prepare_for_verify", prepare_for_verify)

    def batch(self, seq_lens, bonus):
        dev = self.dev
        """A decode batch of the scheduler (greedy; no grammar, logprobs or masks), its draft
        input as 0.5.23 hands it over (GPU-only host bound: `nxt_kv_lens_cpu`)."""
        bs = int(seq_lens.shape[0])
        draft_input = make_draft_input_v2(bonus_tokens=bonus, new_seq_lens=seq_lens)
        draft_input.nxt_kv_lens_cpu = torch.full((bs,), 64, dtype=torch.int32)
        draft_input.nxt_kv_lens_sum = 64 * bs
        mode = NS(is_extend=lambda: False, is_idle=lambda: False, is_target_verify=lambda: False)
        return NS(forward_mode=mode, is_extend_in_batch=False, reqs=[NS(rid=f"r{i}") for i in range(bs)],
                  seq_lens=seq_lens, seq_lens_cpu=None, seq_lens_sum=None, req_pool_indices=torch.arange(bs, device=dev),
                  spec_info=draft_input, sampling_info=None, has_grammar=False, return_logprob=False,
                  can_run_decode_cuda_graph=True, out_cache_loc=None, input_ids=None)

    def step(self, seq_lens, bonus):
        return self.worker.forward_batch_generation(self.batch(seq_lens, bonus))

    def calls(self, *names):
        return [e for e in self.events if e[0] in names]


@pytest.fixture
def cuda():
    with fake_cuda():
        yield


def lengths():
    return torch.tensor([10, 20, 30, 40], dtype=torch.int64, device="cuda")


def bonus():
    return torch.randint(0, V, (BS,), dtype=torch.int64, device="cuda")


def test_width_1_on_cuda_runs_the_targets_one_token_verify_and_no_draft_side_work(cuda, monkeypatch):
    """The worker's width-1 step on a CUDA worker: no prepare-block kernel, no embedding, no
    draft forward or rollout, no accept kernel, no draft-context write; the target once,
    one token per request (the bonus at its position, into the slot the step reserved), on
    the width-1 verify graph, which upstream's `can_run_graph` replays; one token committed
    per request; the context rows kept."""
    h = Harness(monkeypatch, pin=[1])
    w = h.worker
    assert isinstance(w._decode_step, DecodeStep) and w._decode_step.on_device
    seq_lens, tokens = lengths(), bonus()
    batch = h.batch(seq_lens, tokens)
    result = w.forward_batch_generation(batch)

    assert h.calls(*DRAFT_SIDE, "accept_kernel", "context_write") == []
    (verify_batch, kwargs, graph), = h.targets
    assert h.calls("target") == [("target", BS)]
    assert repr(graph) == "graph 1" and kwargs == dict(is_verify=True, skip_attn_backend_init=True)
    (verify_input, host_lens, host_sum, can_run), = h.prepared
    assert can_run, "upstream's can_run_graph replays the width-1 verify graph"
    assert verify_input.draft_token_num == verify_input.num_tokens_per_req == 1
    assert batch.spec_info is verify_input and verify_input.draft_token.shape == (BS,)   # as upstream's step leaves it
    assert verify_input.capture_hidden_mode.name == "FULL" and verify_input.kv_loc_plan is verify_batch.kv_loc_plan
    assert verify_input.positions.shape == (BS,) and verify_input.positions.dtype == torch.int64
    assert verify_batch.out_cache_loc.shape == (BS,) and verify_batch.out_cache_loc.dtype == torch.int64
    assert host_sum == 64 * BS and batch.seq_lens_cpu is None and batch.seq_lens_sum is None   # restored
    assert h.calls("plan") == [("plan", 1)] and ("record_stream", "forward stream") in h.events
    assert h.calls("tp_sync") == [("tp_sync", (BS,))]   # the greedy accept's sync, as upstream's

    # one token per request committed; the step's stride is 1
    assert result.speculative_num_draft_tokens == 1
    assert result.next_token_ids.shape == (BS,) and result.next_token_ids.device.type == "cuda"
    assert result.accept_lens.shape == (BS,) and result.accept_lens.dtype == torch.int32
    assert result.new_seq_lens.shape == (BS,) and result.next_draft_input.bonus_tokens.shape == (BS,)
    # the committed token's draft context kept for the next drafting step
    (rows,) = w._context.rows
    hidden, cache_loc, positions, commit = rows
    assert hidden.shape == (BS, HC) and cache_loc.shape == positions.shape == commit.shape == (BS,)
    assert all(t.device.type == "cuda" for t in rows)
    assert not w._context.keeping and w.block_size == BLOCK and w._decode_step.steps == 1
    assert repr(h.target_runner.decode_cuda_graph_runner) == f"graph {BLOCK}"   # home restored


def test_a_following_wider_step_writes_the_kept_rows_before_it_drafts(cuda, monkeypatch):
    """Widths 1, 1, 16 in turn: the two width-1 steps keep their rows; the width-16 step
    (0.5.23's body, run here) writes them in one call before anything of its draft runs,
    then drafts, verifies 16 tokens per request and writes its own context."""
    h = Harness(monkeypatch, pin=[1, 1, BLOCK])
    for _ in range(2):
        h.step(lengths(), bonus())
    assert h.calls(*DRAFT_SIDE, "accept_kernel", "context_write") == []
    assert h.calls("target") == [("target", BS)] * 2 and len(h.worker._context.rows) == 2

    h.events.clear()
    result = h.step(lengths(), bonus())
    names = [e[0] for e in h.events if e[0] not in ("record_stream", "tp_sync", "plan")]
    assert names == ["context_write", "prepare_block", "embed", "draft_forward", "rollout", "target",
                     "accept_kernel", "context_write"]
    kept, own = h.calls("context_write")
    assert kept == ("context_write", 2 * BS) and own == ("context_write", BS * BLOCK)
    assert h.writes[0]["commit_lens"].shape == (2 * BS,) and h.writes[0]["target_hidden"].shape == (2 * BS, HC)
    assert h.calls("target") == [("target", BS * BLOCK)] and result.speculative_num_draft_tokens == BLOCK
    assert not h.worker._context.rows and h.worker._context.written_steps == 2


def test_the_control_width_1_through_upstreams_step_runs_the_draft_side(cuda, monkeypatch):
    """The same harness without the width-1 step (`decode_step: false`, or before): 0.5.23's
    body at one token prepares the draft block, embeds it, runs the draft batch (answered by
    the block runner without the draft), the rollout and the accept kernel; so the
    recorders above see what they are there to see."""
    h = Harness(monkeypatch, pin=[1], decode_step=False)
    assert h.worker._decode_step is None
    h.step(lengths(), bonus())
    assert h.calls("prepare_block") == [("prepare_block", (BS, 1))]
    assert h.calls("embed") == [("embed", (BS, 1))]
    assert h.calls("rollout") == [("rollout", (BS, 1))]
    assert h.calls("accept_kernel") == [("accept_kernel", (BS, 1))]
    assert h.calls("target") == [("target", BS)] and h.calls("context_write") == []   # kept all the same
    (_, _, _, can_run), = h.prepared
    assert can_run


def test_the_cpu_path_and_the_refusals_are_unchanged(monkeypatch):
    """On CPU the width-1 step stays the target's decode path; a device other than CUDA,
    a hybrid target, a compact draft cache and DP attention keep upstream's step."""
    bag = NS(attn_dp_enabled=False)
    monkeypatch.setattr(rc, "get_parallel", lambda: bag)

    def worker(device, **kw):
        runner = NS(decode_cuda_graph_runner=kw.pop("graphs", None), eager_runner=object())
        return NS(device=torch.device(device), _target_worker=NS(model_runner=runner),
                  _need_mamba_verify_commit=kw.get("hybrid", False), use_compact_draft_cache=kw.get("compact", False))

    assert DecodeStep.why_not(worker("cuda")) is None
    assert DecodeStep.why_not(worker("cuda", graphs=object())) is None   # the width-1 verify graph serves it
    assert DecodeStep.why_not(worker("cpu")) is None and not DecodeStep(worker("cpu")).on_device
    assert "captured graphs" in DecodeStep.why_not(worker("cpu", graphs=object()))
    assert "built for CUDA" in DecodeStep.why_not(worker("meta"))
    assert "hybrid" in DecodeStep.why_not(worker("cuda", hybrid=True))
    assert "compact" in DecodeStep.why_not(worker("cuda", compact=True))
    bag.attn_dp_enabled = True
    assert "DP attention" in DecodeStep.why_not(worker("cuda"))


def test_width_1_without_the_draft_side_commits_what_upstreams_width_1_step_commits(monkeypatch):
    """Values (CPU tensors standing for the device's; upstream's eager prepare-block and
    accept paths in place of its Triton kernels): on the same target, the step without the
    draft side verifies the same tokens at the same positions and slots, commits the same
    token per request (the argmax) with the same lengths, and keeps the same context rows
    as 0.5.23's step at width 1."""
    seq_lens = torch.tensor([10, 20, 30, 40], dtype=torch.int64)
    tokens = torch.tensor([3, 17, 42, 5], dtype=torch.int64)

    def cache_locs(*, req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num,
                   device):
        """0.5.23's `assign_extend_cache_locs_func` in plain torch (no CPU kernel built here)."""
        cols = start_offset.to(torch.int64)[:, None] + torch.arange(draft_token_num)
        return req_to_token[req_pool_indices.to(torch.int64)[:, None], cols].reshape(-1).to(torch.int64)

    def run(mine):
        h = Harness(monkeypatch, pin=[1], decode_step=False, dev="cpu")
        monkeypatch.setattr(w2, "assign_extend_cache_locs_func", cache_locs)
        w = h.worker
        w._use_triton_prepare_block = w._use_triton_accept_bonus = False
        if mine:   # the CUDA path, on these CPU tensors
            w._decode_step = DecodeStep(w)
            w._decode_step.on_device = True
        result = h.step(seq_lens.clone(), tokens.clone())
        (verify_batch, _, _), = h.targets
        return h, result, verify_batch, w._context.rows

    up, up_result, up_verify, up_rows = run(False)
    assert up.calls("prepare_block", "accept_kernel") == [] and up.calls("rollout")   # the eager paths ran
    mine, result, verify, rows = run(True)
    assert mine.calls(*DRAFT_SIDE, "accept_kernel", "context_write") == []
    for a, b in ((verify.input_ids, up_verify.input_ids), (verify.positions, up_verify.positions),
                 (verify.out_cache_loc, up_verify.out_cache_loc)):
        assert torch.equal(a, b)
    assert torch.equal(verify.input_ids, tokens) and torch.equal(verify.positions, seq_lens)
    assert torch.equal(result.next_token_ids, up_result.next_token_ids)
    assert torch.equal(result.next_token_ids, mine.logits[0].argmax(-1))   # the target's argmax
    for name in ("accept_lens", "new_seq_lens"):
        assert torch.equal(getattr(result, name), getattr(up_result, name)), name
    assert torch.equal(result.next_draft_input.bonus_tokens, up_result.next_draft_input.bonus_tokens)
    assert torch.equal(result.next_draft_input.new_seq_lens, seq_lens + 1)
    (row,), (up_row,) = rows, up_rows
    for a, b in zip(row, up_row):
        assert torch.equal(a, b)
