"""The HF benchmark's peers, Transformers' own assisted generation and prompt lookup: greedy
completions equal to target-only decoding's, records under their method names with the
equality check, the settings' defaults and errors, and the test bed's assistant trainer
(on toy sizes, seconds)."""

import json
import time

import pytest
import torch

from benchmarks import hf_bench, report
from benchmarks.decode import hf_generate_decode, target_only_decode


@pytest.fixture(scope="module")
def tiny_pair():
    from sglang_domino.testing import tiny_target

    return tiny_target(seed=0, vocab_size=512), tiny_target(seed=3, vocab_size=512, hidden_size=32, num_layers=1)


def test_assisted_and_prompt_lookup_are_greedy_exact(tiny_pair):
    target, assistant = tiny_pair
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, 500, (1, 12), generator=g)
        ids = torch.cat([ids, ids[:, :6]], dim=1)     # a repeated n-gram for prompt lookup to find
        ref = target_only_decode(target, ids, 20)
        # Stop mid-completion, at a token that comes no earlier: every method must end there.
        stop = next(t for i, t in enumerate(ref["ids"]) if i >= 6 and t not in ref["ids"][:i])
        ref = target_only_decode(target, ids, 20, [stop])
        for kwargs in ({"assistant_model": assistant}, {"assistant_model": target}, {"prompt_lookup_num_tokens": 4}):
            out = hf_generate_decode(target, ids, 20, [stop], **kwargs)
            assert out["ids"] == ref["ids"] and len(ref["ids"]) > 6 and out["ids"][-1] == stop, kwargs
            assert out["tokens"] == len(out["ids"]) == sum(out["accept_lengths"]) == out["accepted_tokens"]
            assert out["verify_steps"] == len(out["accept_lengths"]) >= 1
            if kwargs.get("assistant_model") is target:              # a perfect assistant: candidates accepted
                assert max(out["accept_lengths"]) > 1
    with pytest.raises(ValueError, match="exactly one"):
        hf_generate_decode(target, ids, 4)


def test_hf_bench_records_the_peers_with_the_equality_check(tiny_pair, tmp_path, monkeypatch):
    from sglang_domino.testing import save_tiny_draft, save_tiny_target, tiny_tokenizer

    target = save_tiny_target(str(tmp_path / "target"))
    save_tiny_draft(str(tmp_path / "dflash"), target, "dflash")
    tiny_pair[1].save_pretrained(tmp_path / "assistant")
    tiny_tokenizer().save_pretrained(tmp_path / "assistant")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["the quick brown fox", "count to ten"]))
    monkeypatch.setenv("GSM8K_PATH", str(prompts))
    out = tmp_path / "out"
    out.mkdir()
    cfg = hf_bench.HFBenchConfig.from_env({
        "TARGET_MODEL": str(tmp_path / "target"), "DRAFT_MODEL": str(tmp_path / "dflash"), "TASKS": "gsm8k:2",
        "MAX_NEW_TOKENS": "8", "BLOCK_SIZE": "8", "OUT_DIR": str(out), "DTYPE": "float32",
        "ASSISTANT_MODEL": str(tmp_path / "assistant"), "PROMPT_LOOKUP": "4"})
    assert cfg.peer_methods() == ["hf-assisted:assistant", "hf-prompt-lookup"]
    path = hf_bench.run_shard(cfg, 0, 1, time.time(), "cpu")
    rows = [json.loads(line) for line in open(path)]
    assert [r["method"] for r in rows] == ["target-only"] * 2 + ["dflash"] * 2 + ["hf-assisted:assistant"] * 2 \
        + ["hf-prompt-lookup"] * 2
    assert all(r["equal_output"] is None for r in rows[:2])             # the reference itself
    assert all(r["equal_output"] is True and r["first_difference"] is None for r in rows[2:])
    assert all(r["completion_tokens"] == 8 and r["verify_steps"] > 0 for r in rows[4:])
    assert report.main([path, "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "## Equal output" in summary
    assert "| gsm8k | 1 | 2 of 2 | 2 of 2 | 2 of 2 |" in summary
    assert report.main([path, "--check", str(out / "summary.md")]) == 0
    rows[-1].update(equal_output=False, first_difference=3)              # a peer that differed: reported
    (out / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "| 1 of 2 (first at 3) |" in report.summarize(report.read(str(out / "bad.jsonl")), "x")


def test_peer_settings_defaults_and_errors(monkeypatch, tmp_path):
    settings = hf_bench.peer_settings
    monkeypatch.setattr(hf_bench, "default_assistant", lambda: "/bed/assistant")
    assert settings({}, on_testbed=True, temperature=0.0) == {"assistant_model": "/bed/assistant", "prompt_lookup": 10}
    assert settings({}, on_testbed=True, temperature=0.6) == {"assistant_model": None, "prompt_lookup": 0}
    assert settings({}, on_testbed=False, temperature=0.0) == {"assistant_model": None, "prompt_lookup": 0}
    assert settings({"ASSISTANT_MODEL": "0", "PROMPT_LOOKUP": "0"}, True, 0.0) == \
        {"assistant_model": None, "prompt_lookup": 0}
    assert settings({"ASSISTANT_MODEL": "Qwen/Qwen3-0.6B", "PROMPT_LOOKUP": "3"}, False, 0.0) == \
        {"assistant_model": "Qwen/Qwen3-0.6B", "prompt_lookup": 3}
    for env, needle in [({"PROMPT_LOOKUP": "ten"}, "PROMPT_LOOKUP: got 'ten', expected a number of candidate tokens"),
                        ({"PROMPT_LOOKUP": "-2"}, "PROMPT_LOOKUP: got '-2'"),
                        ({"ASSISTANT_MODEL": str(tmp_path)}, "ASSISTANT_MODEL: got .* expected a checkpoint directory"),
                        ({"PROMPT_LOOKUP": "4", "ASSISTANT_MODEL": "0"}, None)]:
        if needle is None:
            with pytest.raises(ValueError, match="PROMPT_LOOKUP: the Transformers peers are measured greedy only, "
                                                 "got TEMPERATURE=0.6; set TEMPERATURE=0, or PROMPT_LOOKUP=0"):
                settings(env, False, 0.6)
            continue
        with pytest.raises(ValueError, match=needle):
            settings(env, False, 0.0)
    with pytest.raises(SystemExit, match="PROMPT_LOOKUP: got 'x'"):
        hf_bench.HFBenchConfig.from_env({"TARGET_MODEL": "t", "DRAFT_MODEL": "d", "PROMPT_LOOKUP": "x"})


def test_assistant_trainer_writes_a_checkpoint_with_the_targets_vocabulary(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.testbed.assistant import ASSISTANT, SUMMARY, train_assistant
    from benchmarks.testbed.release import CHECKPOINTS
    from benchmarks.testbed.spec import PRESETS

    bed = PRESETS["full"]
    small = bed.data.model_copy(update={"train_conversations": 40, "eval_conversations": 4})
    bed = bed.model_copy(update={"data": small})
    spec = ASSISTANT.model_copy(update=dict(hidden_size=32, intermediate_size=64, num_layers=1, head_dim=16,
                                            seq_len=64, batch_size=2, steps=2, warmup_steps=1))
    summary = train_assistant(tmp_path / "assistant", spec=spec, bed=bed, threads=1)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "assistant")
    target_tok = AutoTokenizer.from_pretrained(CHECKPOINTS / "target")
    assert model.config.vocab_size == ASSISTANT.vocab_size == 1280 and model.config.num_hidden_layers == 1
    assert model.dtype == torch.bfloat16                                   # saved like the committed test bed
    assert AutoTokenizer.from_pretrained(tmp_path / "assistant").get_vocab() == target_tok.get_vocab()
    written = json.loads((tmp_path / "assistant" / SUMMARY).read_text())
    assert written["params"] == summary["params"] == sum(p.numel() for p in model.parameters())
    assert written["spec"]["steps"] == 2 and written["heldout_perplexity"] > 1 and written["wall_seconds"] > 0
    assert not (tmp_path / "assistant.fp32").exists()
    assert ASSISTANT.num_layers == 2 and ASSISTANT.hidden_size == 128 and ASSISTANT.seq_len == 256
