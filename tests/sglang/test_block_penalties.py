"""Per-position penalties in a verified block (`sglang_domino.penalties`) against 0.5.23's
own penalizers run the way plain decoding runs them: for each row of the block, one
orchestrator fed the row's whole history one token at a time (as plain decoding feeds it
step by step), its additive penalties accumulated and added, then its scaling applied
(0.5.23's overlap path). Also: the commit of accepted tokens, and the whole step on fake
CUDA without a host read."""

from __future__ import annotations

import array
import random
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.sampling import penaltylib  # noqa: E402
from sglang.srt.sampling.penaltylib import repetition_penalty as rp  # noqa: E402

from sglang_domino.penalties import BlockPenalties, apply_block_penalties, commit_counts  # noqa: E402
from tests.fake_cuda import fake_cuda  # noqa: E402

V, W = 40, 6
EOS = 3
PENALIZERS = {penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedMinNewTokensPenalizer,
              penaltylib.BatchedPresencePenalizer, penaltylib.BatchedRepetitionPenalizer}
# 0.5.23 compiles the scaling with torch.compile; the same function, uncompiled
apply_scaling = getattr(rp.apply_scaling_penalties, "_torchdynamo_orig_callable", rp.apply_scaling_penalties)


class _Batch:
    """What the orchestrator reads of a ScheduleBatch."""

    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def _req(params: dict):
    sampling = SimpleNamespace(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
                               min_new_tokens=0, stop_token_ids={7})
    for key, value in params.items():
        setattr(sampling, key, value)
    return SimpleNamespace(sampling_params=sampling, eos_token_ids={EOS},
                           tokenizer=SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS))


def plain_row(logits_row: torch.Tensor, params: dict, history: list[int]) -> torch.Tensor:
    """The logits plain decoding samples from after `history` (0.5.23's penalizers)."""
    batch = _Batch([_req(params)])
    orch = penaltylib.BatchedPenalizerOrchestrator(vocab_size=V, batch=batch, penalizers=PENALIZERS)
    for token in history:
        orch.cumulate_output_tokens(torch.tensor([token]))
    out = logits_row.clone()[None]
    if not orch.is_required:
        return out[0]
    acc = torch.zeros(1, V)
    orch.accumulate_additive_penalties(acc)
    out.add_(acc)
    scaling = orch.accumulate_scaling_penalties()
    if scaling is not None:
        apply_scaling(out, scaling)
    return out[0]


def block_inputs(rows: list[dict], committed: list[list[int]]):
    """`BlockPenalties` for rows with these parameters and committed outputs (each
    without its last token, which the block's column 0 carries)."""
    bs = len(rows)
    counts = torch.zeros(bs, V)
    for b, hist in enumerate(committed):
        for t in hist:
            counts[b, t] += 1
    get = lambda key, default: torch.tensor([float(r.get(key, default)) for r in rows])  # noqa: E731
    stops = [sorted({7, EOS}) for _ in rows]
    return BlockPenalties(
        counts=counts, generated=torch.tensor([len(h) for h in committed]),
        frequency=get("frequency_penalty", 0.0), presence=get("presence_penalty", 0.0),
        repetition=get("repetition_penalty", 1.0),
        min_new=torch.tensor([int(r.get("min_new_tokens", 0)) for r in rows]),
        stop_ids=torch.tensor(stops), stop_valid=torch.ones(bs, len(stops[0]), dtype=torch.bool))


ROWS = [
    {"frequency_penalty": 2.0},
    {"presence_penalty": 1.5},
    {"repetition_penalty": 2.0},
    {"min_new_tokens": 9},
    {"frequency_penalty": 0.5, "presence_penalty": 0.25, "repetition_penalty": 1.5, "min_new_tokens": 4},
    {"frequency_penalty": -1.0, "repetition_penalty": 0.5},
    {},
]


@pytest.mark.parametrize("seed", range(4))
def test_every_row_of_the_block_is_plain_decodings(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    bs = len(ROWS)
    # few distinct tokens, so the block repeats tokens and the history holds them
    committed = [[rng.choice([1, 2, EOS, 5, 7, 8]) for _ in range(rng.randint(0, 5))] for _ in range(bs)]
    candidates = torch.tensor([[rng.choice([1, 2, EOS, 5, 7, 8, 9]) for _ in range(W)] for _ in range(bs)])
    logits = torch.randn(bs, W, V) * 3
    logits[:, :, 8] = -2.5   # a negative logit the repetition penalty scales the other way
    got = logits.clone()
    apply_block_penalties(got, candidates, block_inputs(ROWS, committed))
    for b in range(bs):
        for i in range(W):
            history = committed[b] + candidates[b, :i + 1].tolist()
            want = plain_row(logits[b, i], ROWS[b], history)
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=1e-6, msg=f"row {b} position {i}")


@pytest.mark.parametrize("factor, at_least_one", [(2.0, True), (0.5, False), (2.0, None)])
def test_repetition_with_the_factor_side_known_is_the_same(factor, at_least_one):
    """`minimum` / `maximum` (the factor's side known on the host) and `where` agree."""
    torch.manual_seed(1)
    rows = [{"repetition_penalty": factor, "frequency_penalty": 0.5}] * 3
    committed = [[1, 2, 8], [8], []]
    candidates = torch.tensor([[2, 8, 8, 5, 1, 9], [1, 1, 2, 8, 3, 9], [8, 9, 8, 9, 2, 2]])
    logits = torch.randn(3, W, V) * 3
    got = logits.clone()
    pen = block_inputs(rows, committed)
    pen.repetition_at_least_one = at_least_one
    apply_block_penalties(got, candidates, pen)
    for b in range(3):
        for i in range(W):
            want = plain_row(logits[b, i], rows[b], committed[b] + candidates[b, :i + 1].tolist())
            torch.testing.assert_close(got[b, i], want, rtol=0, atol=1e-6)


def test_min_new_tokens_counts_the_block():
    """Stop tokens are blocked exactly while fewer than min_new tokens precede the row."""
    rows, committed = [{"min_new_tokens": 5}], [[1, 2]]   # + candidates[:, 0]: 3 generated before row 0
    logits = torch.zeros(1, W, V)
    apply_block_penalties(logits, torch.tensor([[1] * W]), block_inputs(rows, committed))
    blocked = torch.isinf(logits[0, :, EOS]).tolist()
    assert blocked == [True, True, False, False, False, False]   # rows generate tokens 4, 5, 6, ...
    assert torch.isinf(logits[0, :, 7]).tolist() == blocked


def test_commit_adds_the_last_token_and_the_accepted_drafts():
    counts, generated = torch.zeros(5, V), torch.zeros(5, dtype=torch.int64)
    candidates = torch.tensor([[4, 9, 9, 6], [2, 2, 3, 1]])
    commit_counts(counts, generated, torch.tensor([3, 1]), candidates, torch.tensor([2, 0]))
    assert counts[3, 4] == 1 and counts[3, 9] == 2 and counts[3, 6] == 0
    assert counts[1, 2] == 1 and counts[1, 3] == 0
    assert generated.tolist() == [0, 1, 0, 3, 0]


def test_block_penalties_read_nothing_back_on_fake_cuda():
    with fake_cuda():
        bs = 3
        pen = BlockPenalties(
            counts=torch.zeros(bs, V, device="cuda"), generated=torch.zeros(bs, dtype=torch.int64, device="cuda"),
            frequency=torch.ones(bs, device="cuda"), presence=torch.ones(bs, device="cuda"),
            repetition=torch.full((bs,), 2.0, device="cuda"),
            min_new=torch.full((bs,), 4, dtype=torch.int64, device="cuda"),
            stop_ids=torch.zeros(bs, 2, dtype=torch.int64, device="cuda"),
            stop_valid=torch.ones(bs, 2, dtype=torch.bool, device="cuda"))
        logits = torch.randn(bs, W, V, device="cuda")
        candidates = torch.randint(0, V, (bs, W), device="cuda")
        apply_block_penalties(logits, candidates, pen)
        pool, gen = torch.zeros(8, V, device="cuda"), torch.zeros(8, dtype=torch.int64, device="cuda")
        commit_counts(pool, gen, torch.tensor([0, 5, 2], device="cuda"), candidates,
                      torch.zeros(bs, dtype=torch.int32, device="cuda"))


def test_custom_processors_see_the_request_as_it_is_at_each_row():
    """0.5.23's n-gram blocker (a processor that reads `__req__`'s output) run on every row
    of the block as plain decoding runs it at that position: row i with the block's first
    i drafts appended to the request's output."""
    from sglang.srt.sampling.custom_logit_processor import DeepseekOCRNoRepeatNGramLogitProcessor
    from sglang.srt.sampling.sampling_batch_info import ProcessorEntry

    from sglang_domino.sglang.sampling.penalty_state import apply_custom_processors_per_position

    proc = DeepseekOCRNoRepeatNGramLogitProcessor()
    # 0.5.23 keeps a request's token ids in arrays (a list for the second, as other callers may)
    reqs = [SimpleNamespace(origin_input_ids=array.array("l", [1, 2]), output_ids=array.array("l", [5, 6, 5])),
            SimpleNamespace(origin_input_ids=[3], output_ids=[7])]
    candidates = torch.tensor([[5, 6, 5, 6, 9, 9], [7, 7, 8, 7, 7, 8]])   # column 0: the last output token
    params = [{"ngram_size": 2, "window_size": 32, "__req__": req} for req in reqs]
    info = SimpleNamespace(custom_logit_processor={"k": ProcessorEntry(proc, rows=[0, 1], indices=torch.tensor([0, 1]))},
                           custom_params=params)
    logits = torch.zeros(2 * W, V)
    apply_custom_processors_per_position(logits, candidates, info)
    blocked = 0
    for b, req in enumerate(reqs):
        for i in range(W):
            at = SimpleNamespace(origin_input_ids=list(req.origin_input_ids),
                                 output_ids=list(req.output_ids) + candidates[b, 1:i + 1].tolist())
            want = proc(torch.zeros(1, V), [{**params[b], "__req__": at}])[0]
            torch.testing.assert_close(logits[b * W + i], want)
            blocked += int(torch.isinf(want).sum())
    assert blocked > 0   # the processor acted on some rows


def test_pool_rows_with_fewer_stop_tokens_than_the_widest_still_block_them():
    """The pool pads each request's stop ids to the widest request's count; the padding
    must not undo the block (every write to one logit agrees)."""
    from sglang_domino.sglang.sampling.penalty_state import PenaltyPool

    def req(rid, row, stops):
        return SimpleNamespace(rid=rid, kv=SimpleNamespace(req_pool_idx=row), eos_token_ids=set(), tokenizer=None,
                               sampling_params=SimpleNamespace(frequency_penalty=0.0, presence_penalty=0.0,
                                                               repetition_penalty=1.0, min_new_tokens=50,
                                                               stop_token_ids=set(stops)))

    pool = PenaltyPool(rows=lambda: 8, vocab=V, device="cpu")
    first = [req("a", 5, [11])]
    pool.step(SimpleNamespace(reqs=first, req_pool_indices=torch.tensor([5]),
                              sampling_info=SimpleNamespace(acc_additive_penalties=torch.zeros(1))))
    reqs = [req("b", 2, [3, 4, 9]), *first]   # widens the pool's stop columns to 3
    step = pool.step(SimpleNamespace(reqs=reqs, req_pool_indices=torch.tensor([2, 5]),
                                     sampling_info=SimpleNamespace(acc_additive_penalties=torch.zeros(1),
                                                                   logit_bias=None)))
    logits = torch.zeros(2 * W, V)
    step.apply(logits, torch.ones(2, W, dtype=torch.int64), SimpleNamespace(logit_bias=None))
    rows = logits.view(2, W, V)
    assert torch.isinf(rows[0][:, [3, 4, 9]]).all() and not torch.isinf(rows[0][:, 11]).any()
    assert torch.isinf(rows[1][:, 11]).all() and not torch.isinf(rows[1][:, [3, 4, 9]]).any()
