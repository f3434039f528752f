"""The per-request parameters that change tokens, one row each, asked of a server through
its HTTP API and reduced to what a user sees (`answer`), so that a speculative server's
answer can be compared with the plain server's. A new sampling parameter upstream adds is
one more `Row`.

Each row is built so its parameter changes the plain server's answer on the committed
test bed (`without` names the keys whose removal gives the answer it must differ from;
`test_request_matrix.py` checks that on the plain server): a row whose parameter has no
effect would assert nothing.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(ROOT, "benchmarks", "testbed", "checkpoints")


def heldout(i: int) -> dict:
    """Held-out test-bed prompt `i` (`prompt`, `messages`, `prompt_ids`)."""
    with open(os.path.join(TESTBED, "heldout_prompts.jsonl"), encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if n == i:
                return json.loads(line)
    raise IndexError(i)


def chat(i: int, **params) -> dict:
    return {"model": "default", "messages": heldout(i)["messages"], "temperature": 0, **params}


def completion(i: int, **params) -> dict:
    """A completion of the prompt's chat-templated token ids (the test bed is a chat model:
    its raw text ends at once)."""
    return {"model": "default", "prompt": heldout(i)["prompt_ids"], "temperature": 0, **params}


def generate(i: int, **params) -> dict:
    return {"input_ids": heldout(i)["prompt_ids"], "sampling_params": {"temperature": 0, **params}}


@dataclass(frozen=True)
class Row:
    name: str
    path: str                       # /v1/chat/completions, /v1/completions or /generate
    body: dict[str, Any]
    without: tuple[str, ...] = ()   # keys (of `body`, or of `sampling_params` for /generate) the effect is measured against
    extra: dict[str, Any] = field(default_factory=dict)   # top-level /generate fields (logprobs, grammars)

    def request(self, drop: tuple[str, ...] = ()) -> dict:
        body = json.loads(json.dumps(self.body))
        if self.path == "/generate":
            body.update(json.loads(json.dumps(self.extra)))
            if body.get("custom_logit_processor") == "deepseek_ocr_no_repeat_ngram":
                from sglang.srt.sampling.custom_logit_processor import DeepseekOCRNoRepeatNGramLogitProcessor

                body["custom_logit_processor"] = DeepseekOCRNoRepeatNGramLogitProcessor.to_str()
            for key in drop:
                body["sampling_params"].pop(key, None)
                body.pop(key, None)
        else:
            for key in drop:
                body.pop(key, None)
        return body


def _logprobs(items) -> list:
    """[[token, logprob rounded, top [(token, logprob rounded)]], ...] of an OpenAI choice."""
    out = []
    for item in items or []:
        top = [(t["token"], round(t["logprob"], 2)) for t in item.get("top_logprobs") or []]
        out.append([item["token"], round(item["logprob"], 2), top])
    return out


def _generate_logprobs(entries) -> list:
    return [[t, None if lp is None else round(lp, 2)] for lp, t, *_ in entries or []]


def answer(server, row: Row, drop: tuple[str, ...] = ()) -> dict:
    """What the user sees: per choice the text (or the token ids), why it finished, the
    token count and the log-probabilities (rounded to 0.01: the verify's and the decode
    step's float32 sums differ in the last digits)."""
    body = row.request(drop)
    if body.get("stream"):
        return _streamed(server, row.path, body)
    status, resp = server.post(row.path, body)
    assert status == 200, (row.name, status, resp)
    if row.path == "/generate":
        meta = resp["meta_info"]
        return {"ids": resp["output_ids"], "finish": meta["finish_reason"], "n": meta["completion_tokens"],
                "out_lp": _generate_logprobs(meta.get("output_token_logprobs")),
                "in_lp": _generate_logprobs(meta.get("input_token_logprobs")),
                "top": [[_generate_logprobs(t)] for t in meta.get("output_top_logprobs") or []]}
    choices = sorted(resp["choices"], key=lambda c: c["index"])
    texts = [c["message"]["content"] if "message" in c else c["text"] for c in choices]
    lps = [_logprobs((c.get("logprobs") or {}).get("content")) if "message" in c
           else (c.get("logprobs") or {}).get("tokens") for c in choices]
    return {"texts": texts, "finish": [c["finish_reason"] for c in choices], "n": resp["usage"]["completion_tokens"],
            "logprobs": lps}


def _streamed(server, path: str, body: dict) -> dict:
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    text, finish = [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices", []):
                delta = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                text.append(delta or "")
                finish = choice.get("finish_reason") or finish
    return {"texts": ["".join(text)], "finish": [finish]}


JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                "count": {"type": "integer"}},
               "required": ["name", "count"]}

ROWS = [
    # penalties: each row of a verified block penalised with the tokens before it
    # (presence_penalty never changes the test bed's greedy answers, at most 2.0: the tiny
    # target's matrix in test_e2e_cpu.py has it)
    Row("frequency_penalty", "/v1/chat/completions", chat(17, max_tokens=96, frequency_penalty=2.0),
        without=("frequency_penalty",)),
    Row("repetition_penalty", "/v1/completions", completion(5, max_tokens=96, repetition_penalty=2.0),
        without=("repetition_penalty",)),
    # the issue's case (its capitalize-words answer): the plain server answers 152 tokens, 0.5.23's DFLASH
    # its unconstrained 76
    Row("min_tokens", "/v1/chat/completions", chat(3, max_tokens=200, min_tokens=150), without=("min_tokens",)),
    Row("min_new_tokens with stop_token_ids", "/generate",
        generate(9, max_new_tokens=64, min_new_tokens=40, stop_token_ids=[201]), without=("min_new_tokens",)),
    Row("logit_bias", "/v1/chat/completions", chat(3, max_tokens=64, logit_bias={"201": -100}),
        without=("logit_bias",)),
    # stopping
    Row("stop strings, streamed", "/v1/completions",
        completion(0, max_tokens=96, stop=["return"], stream=True), without=("stop",)),
    Row("stop_token_ids", "/v1/chat/completions", chat(0, max_tokens=96, stop_token_ids=[65]),
        without=("stop_token_ids",)),
    Row("ignore_eos", "/generate", generate(3, max_new_tokens=200, ignore_eos=True), without=("ignore_eos",)),
    Row("max_tokens 1", "/v1/completions", completion(0, max_tokens=1), without=("max_tokens",)),
    Row("n", "/v1/chat/completions", chat(5, max_tokens=48, n=2), without=("n",)),
    # log-probabilities of the output and of the prompt
    Row("logprobs, top_logprobs", "/v1/chat/completions", chat(0, max_tokens=32, logprobs=True, top_logprobs=3),
        without=("logprobs", "top_logprobs")),
    Row("completion logprobs", "/v1/completions", completion(5, max_tokens=32, logprobs=2), without=("logprobs",)),
    Row("prompt and output logprobs", "/generate", generate(0, max_new_tokens=32),
        extra={"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2},
        without=("return_logprob", "logprob_start_len", "top_logprobs_num")),
    # a custom logit processor that reads the request's output (servers started with
    # --enable-custom-logit-processor): every row of a block sees the drafts before it
    Row("custom logit processor (n-gram blocker)", "/generate",
        generate(0, max_new_tokens=64, custom_params={"ngram_size": 3, "window_size": 64}),
        extra={"custom_logit_processor": "deepseek_ocr_no_repeat_ngram"}, without=("custom_logit_processor",)),
    # grammars: every position of the chain constrained
    Row("json_schema", "/v1/chat/completions",
        chat(5, max_tokens=64, response_format={"type": "json_schema",
                                                "json_schema": {"name": "thing", "schema": JSON_SCHEMA}}),
        without=("response_format",)),
    Row("regex", "/generate", generate(5, max_new_tokens=48, regex=r"(def|class) [a-z_]{3,12}\(\)"),
        without=("regex",)),
    Row("ebnf", "/generate", generate(5, max_new_tokens=48, ebnf='root ::= "Answer: " ("push" | "pop" | "peek") " " [a-z]+'),
        without=("ebnf",)),
]
