"""Data: record formats -> (input_ids, loss_mask), batch order, regeneration by the target."""

import torch

from benchmarks.testbed.tokenizer import train_tokenizer
from sglang_domino.train.data import BatchSchedule, Example, encode, truncate
from sglang_domino.train.regenerate import regenerate


def _tokenizer():
    texts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(50)]
    return train_tokenizer(texts, vocab_size=300)


def test_loss_mask_covers_responses_and_assistant_turns_only():
    tok = _tokenizer()
    ex = encode({"prompt_ids": [1, 2, 3], "response_ids": [4, 5]})
    assert ex.input_ids == [1, 2, 3, 4, 5] and ex.loss_mask == [0, 0, 0, 1, 1]
    conv = {"conversations": [{"from": "human", "value": "def f1(x):"}, {"from": "gpt", "value": "return x + 1"},
                              {"role": "user", "content": "again"}, {"role": "assistant", "content": "x"}]}
    ex = encode(conv, tok)
    full = tok.apply_chat_template([{"role": "user", "content": "def f1(x):"},
                                    {"role": "assistant", "content": "return x + 1"},
                                    {"role": "user", "content": "again"}, {"role": "assistant", "content": "x"}],
                                   tokenize=False)
    assert tok.decode(ex.input_ids) == full
    trained = tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m])
    assert "return x + 1" in trained and "x<|im_end|>" in trained
    assert "def f1" not in trained and "again" not in trained and "user" not in trained
    assert truncate(Example([1, 2, 3], [0, 0, 1]), 8) is None  # no two consecutive loss tokens


def test_batch_order_is_a_function_of_seed_and_step():
    examples = [Example([i, i + 1, i + 2], [1, 1, 1]) for i in range(10)]
    a, b = BatchSchedule(examples, 3, seed=4, pad_id=0), BatchSchedule(examples, 3, seed=4, pad_id=0)
    assert torch.equal(a.batch(5).input_ids, b.batch(5).input_ids)
    first_epoch = torch.cat([a.batch(s).input_ids[:, 0] for s in range(3)]).tolist()
    assert len(set(first_epoch)) == 9  # one epoch draws each example at most once


def test_regeneration_is_the_targets_greedy_continuation_whatever_the_padding(target):
    prompts = [[5, 9, 11], [7, 3, 2, 8, 1, 4], [12]]
    got = regenerate(target, prompts, max_new_tokens=6, batch_size=3, pad_token_id=0, progress=False)
    for p, r in zip(prompts, got):
        ref = target.generate(input_ids=torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                              eos_token_id=None)
        assert r == ref[0, len(p):].tolist()
