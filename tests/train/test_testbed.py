"""The test bed: its corpora and splits, the build pipeline (on the `tiny` preset, in a
temporary directory, seconds), and the committed test bed that tests, the demo and the
benchmarks use (benchmarks/testbed/checkpoints), which no test rebuilds."""

import ast
import json
import random

import pytest
import torch

from benchmarks.testbed import codechat, corpus
from benchmarks.testbed.build import build, read_manifest
from benchmarks.testbed.load import committed, load
from benchmarks.testbed.prompts import heldout_prompts, heldout_rows
from benchmarks.testbed.release import PARTS, publish
from benchmarks.testbed.spec import PRESETS


@pytest.fixture(scope="module")
def testbed():
    return load(committed())


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    return build("tiny", root=tmp_path_factory.mktemp("testbed"), threads=1)


def test_stdlib_split_is_deterministic_disjoint_and_skips_tests():
    train_a, held_a = corpus.split(0, 12)
    train_b, held_b = corpus.split(0, 12)
    assert (train_a, held_a) == (train_b, held_b)
    assert not set(train_a) & set(held_a) and held_a
    assert not [f for f in train_a + held_a if f.split("/")[0] in ("test", "idlelib")]
    # A file's side does not depend on which other files are listed.
    assert all(corpus.is_held_out(f, 12) for f in held_a)


def test_codechat_holds_out_whole_tasks_and_is_reproducible():
    train = codechat.conversations(400, seed=1, eval_every=12, held_out=False)
    held = codechat.conversations(100, seed=2, eval_every=12, held_out=True)
    assert train == codechat.conversations(400, seed=1, eval_every=12, held_out=False)
    assert {s for s, _ in train}.isdisjoint({s for s, _ in held})
    assert all(codechat.is_held_out(s, 12) for s, _ in held)
    # Every family (numbers, strings and dictionaries, classes) and the second turns occur.
    families = {s.split("/")[0] for s, _ in train}
    assert {"str", "dict", "class"} <= families and families & set(codechat.AGGREGATES)
    assert any(len(c) == 4 for _, c in train)


def test_every_generated_answer_is_valid_python_that_says_what_was_asked():
    for kind in codechat.all_task_kinds():
        for seed in range(2):
            conv = codechat.conversation(kind, random.Random(seed))
            for m in conv[1::2]:
                code = m["content"].split("```python\n", 1)[1].split("\n```", 1)[0]
                tree = ast.parse(code)
                names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                assert codechat.make_task(kind, random.Random(seed)).name in names
    text = codechat.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_build_pipeline_records_each_stage_and_publishes_a_loadable_test_bed(tiny_build, tmp_path):
    m = read_manifest(tiny_build)
    spec = PRESETS["tiny"]
    for stage in ("target", "data", "dflash", "domino"):
        assert m["stages"][stage]["digest"] == spec.stage_digest(stage)
        assert m["stages"][stage]["wall_seconds"] > 0
    assert m["stages"]["target"]["loss_curve"][-1][1] < m["stages"]["target"]["loss_curve"][0][1]
    out = publish(tiny_build, tmp_path / "published")
    bed = load(out)
    assert all(p.dtype == torch.float32 for p in bed.target.parameters())   # loaded as asked
    config = json.loads((out / "target" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "config" not in read_manifest(out)["stages"]["dflash"]
    assert json.loads((out / "domino" / "config.json").read_text())["dtype"] == "bfloat16"


def test_a_rebuild_with_the_same_recipe_and_seed_gives_the_same_weights(tiny_build, tmp_path):
    """What `benchmarks/build_testbed.sh` promises of the committed test bed (shown on the
    `tiny` preset: same machine, same thread count)."""
    from safetensors.torch import load_file

    again = build("tiny", root=tmp_path, threads=1)
    for part in PARTS:
        a, b = load_file(tiny_build / part / "model.safetensors"), load_file(again / part / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    assert (tiny_build / "train.jsonl").read_text() == (again / "train.jsonl").read_text()


def test_committed_test_bed_is_the_current_recipe_and_small(testbed):
    m = testbed.manifest
    assert m["digest"] == PRESETS["full"].digest(), "the spec changed: rebuild with benchmarks/build_testbed.sh"
    assert m["published"]["dtype"] == "bfloat16" and m["published"]["command"].startswith("benchmarks/build_testbed.sh")
    size = sum(f.stat().st_size for f in committed().rglob("*") if f.is_file())
    assert size < 60e6
    assert set(PARTS) <= {p.name for p in committed().iterdir()}


def test_tokenizer_is_chatml_and_leaves_the_mask_row_unused(testbed):
    tok, target = testbed.tokenizer, testbed.target
    vocab = target.get_input_embeddings().weight.shape[0]
    mask_id = testbed.dflash.config.mask_token_id
    assert len(tok) < vocab and mask_id == vocab - 1 and mask_id >= len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert target.generation_config.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template([{"role": "user", "content": "x = 1"}], tokenize=False, add_generation_prompt=True)
    assert text == codechat.render([{"role": "user", "content": "x = 1"}], add_generation_prompt=True)
    assert testbed.domino.config.shift_label and testbed.domino.config.is_domino


def test_heldout_prompts_are_requests_of_heldout_tasks(testbed):
    spec = PRESETS["full"]
    rows = heldout_rows(testbed.path)
    assert len(rows) == 200 and all(codechat.is_held_out(r["source"], spec.data.eval_every) for r in rows)
    rendered = testbed.tokenizer.apply_chat_template(rows[0]["messages"], tokenize=False, add_generation_prompt=True)
    assert testbed.tokenizer.decode(rows[0]["prompt_ids"]) == rendered and rows[0]["prompt"] in rendered


@pytest.mark.parametrize("kind", ["dflash", "domino"])
def test_trained_drafts_are_lossless_and_beat_untrained_ones(testbed, kind):
    draft = getattr(testbed, kind)
    prompts = heldout_prompts(testbed.path, 4)
    width = min(len(p) for p in prompts)
    ids = torch.tensor([p[-width:] for p in prompts])
    tok = testbed.tokenizer
    out, stats = draft.spec_generate(ids, testbed.target, max_new_tokens=24, stop_token_ids=[tok.eos_token_id],
                                     pad_token_id=tok.pad_token_id, return_stats=True)
    ref = testbed.target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                  do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    assert torch.equal(out[:, :ref.shape[1]], ref)
    torch.manual_seed(0)
    untrained = type(draft)(draft.config).eval()
    _, base = untrained.spec_generate(ids, testbed.target, max_new_tokens=24, return_stats=True)
    assert stats.mean_accept_length > base.mean_accept_length + 1.0


def test_the_target_answers_a_heldout_request_with_code_that_parses(testbed):
    """The committed target writes real text: a greedy answer to a request of a task it
    never saw has an opening sentence and a Python block that parses."""
    row = heldout_rows(testbed.path, 1)[0]
    ids = torch.tensor([row["prompt_ids"]])
    tok = testbed.tokenizer
    out = testbed.target.generate(input_ids=ids, max_new_tokens=200, do_sample=False,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    code = text.split("```python\n", 1)[1].split("\n```", 1)[0]
    ast.parse(code)
    assert text.split("\n", 1)[0].strip() and ("def " in code or "class " in code)
