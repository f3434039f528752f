"""The PD draft check's verdicts (`sglang_domino.sglang.serving.disaggregation`): which pairs of
decode and prefill settings serve, warn or are refused, and what the message names."""

from __future__ import annotations

from sglang_domino.sglang.serving.disaggregation import check_prefill_server, draft_of, mismatch

DOMINO = {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": "/models/Qwen3-8B-Domino/"}
PLAIN = {"speculative_algorithm": None, "speculative_draft_model_path": None}
URL = "http://10.0.0.2:30000"


def test_the_same_checkpoint_at_another_path_drafts_alike():
    elsewhere = {**DOMINO, "speculative_draft_model_path": "/mnt/ckpt/Qwen3-8B-Domino"}
    assert draft_of(DOMINO) == draft_of(elsewhere) == "Qwen3-8B-Domino"
    assert mismatch(DOMINO, elsewhere, URL) is None
    assert mismatch(PLAIN, PLAIN, URL) is None
    # EAGLE and other algorithms carry no DFLASH draft context
    assert draft_of({"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "x"}) is None


def test_decode_only_draft_names_the_prefill_flags():
    message = mismatch(DOMINO, PLAIN, URL)
    assert f"the prefill server {URL} serves without a DFLASH draft" in message
    assert ("Fix: start the prefill server with --speculative-algorithm DFLASH --speculative-draft-model-path "
            "/models/Qwen3-8B-Domino/") in message


def test_another_draft_names_both():
    other = {**DOMINO, "speculative_draft_model_path": "/models/Qwen3-8B-DFlash"}
    message = mismatch(DOMINO, other, URL)
    assert "drafts with Qwen3-8B-Domino" in message and "with Qwen3-8B-DFlash" in message


def test_prefill_only_draft_is_the_one_refusal(monkeypatch):
    answers = {"a": PLAIN, "b": DOMINO}

    import io
    import json
    import urllib.request

    def urlopen(url, timeout):
        return io.BytesIO(json.dumps(answers[url.split("//")[1][0]]).encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    refusal = check_prefill_server("http://b", PLAIN, log=False)
    assert refusal.startswith("PD draft mismatch, refused: the prefill server http://b sends a DFLASH draft context")
    assert "Fix: start this decode server with --speculative-algorithm DFLASH" in refusal
    # a decode-only draft is served (with a warning): outputs stay exact
    assert check_prefill_server("http://a", DOMINO, log=False) is None
    assert check_prefill_server("http://b", DOMINO, log=False) is None


def test_an_unreachable_prefill_server_is_served(monkeypatch):
    import urllib.request

    def urlopen(url, timeout):
        raise OSError("connection refused")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    assert check_prefill_server("http://x", PLAIN) is None
