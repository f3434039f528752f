"""The test bed: its corpus split, tokenizer, and trained drafts. Uses the cached full
build when there is one; otherwise builds the `tiny` preset into a temporary directory
(about a minute), never the full one."""

import torch
import pytest

from benchmarks.testbed import corpus
from benchmarks.testbed.build import build, read_manifest
from benchmarks.testbed.load import find, load
from benchmarks.testbed.prompts import heldout_prompts, humaneval_prompts
from benchmarks.testbed.spec import PRESETS


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    path = find("full")
    if path is None:
        path = build("tiny", root=tmp_path_factory.mktemp("testbed"))
    return load(path)


def test_split_is_deterministic_disjoint_and_skips_tests():
    train_a, held_a = corpus.split(0, 12)
    train_b, held_b = corpus.split(0, 12)
    assert (train_a, held_a) == (train_b, held_b)
    assert not set(train_a) & set(held_a) and held_a
    assert not [f for f in train_a + held_a if f.split("/")[0] in ("test", "idlelib")]
    # A file's side does not depend on which other files are listed.
    assert all(corpus.is_held_out(f, 12) for f in held_a)


def test_build_is_complete_and_records_each_stage(testbed):
    m = read_manifest(testbed.path)
    spec = PRESETS[m["preset"]]
    for stage in ("target", "data", "dflash", "domino"):
        assert m["stages"][stage]["digest"] == spec.stage_digest(stage)
        assert m["stages"][stage]["wall_seconds"] > 0


def test_tokenizer_leaves_the_mask_row_unused(testbed):
    tok, target = testbed.tokenizer, testbed.target
    vocab = target.get_input_embeddings().weight.shape[0]
    mask_id = testbed.dflash.config.mask_token_id
    assert len(tok) < vocab and mask_id == vocab - 1 and mask_id >= len(tok)
    assert tok.eos_token_id is not None and tok.pad_token_id == tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "x = 1"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>user") and text.endswith("<|im_start|>assistant\n")
    assert testbed.domino.config.shift_label and testbed.domino.config.is_domino


def test_heldout_prompts_come_from_heldout_files(testbed):
    import json

    spec = PRESETS[read_manifest(testbed.path)["preset"]]
    rows = [json.loads(line) for line in open(testbed.path / "heldout_prompts.jsonl")]
    assert rows and all(corpus.is_held_out(r["source"], spec.data.eval_every) for r in rows)
    assert len(humaneval_prompts(testbed.tokenizer, limit=3)) == 3


@pytest.mark.parametrize("kind", ["dflash", "domino"])
def test_trained_drafts_are_lossless_and_beat_untrained_ones(testbed, kind):
    draft = getattr(testbed, kind)
    prompts = heldout_prompts(testbed.path, 4)
    width = min(len(p) for p in prompts)
    ids = torch.tensor([p[-width:] for p in prompts])
    eos = testbed.tokenizer.eos_token_id
    out, stats = draft.spec_generate(ids, testbed.target, max_new_tokens=24, stop_token_ids=[eos],
                                     pad_token_id=eos, return_stats=True)
    ref = testbed.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                  do_sample=False, pad_token_id=eos, eos_token_id=eos)
    assert torch.equal(out[:, :ref.shape[1]], ref)
    torch.manual_seed(0)
    untrained = type(draft)(draft.config).eval()
    _, base = untrained.spec_generate(ids, testbed.target, max_new_tokens=24, return_stats=True)
    assert stats.mean_accept_length > base.mean_accept_length + 0.3
