"""What the end-to-end tests ask a server, through its HTTP API (`launch.Server.post`)."""

from __future__ import annotations

import json
import threading
import urllib.request

PROMPTS = [
    "the quick brown fox",
    "hello world",
    "people write programs that print hello world then count from one to ten",
    "a",
]
MAX_TOKENS = 32
CHAT = [{"role": "user", "content": "sing about rivers and mountains"}]
# token ids for /generate, compared with the Transformers backend's output
HF_PROMPTS = [[5, 77, 300, 41, 9], [100, 200], [7] * 6, [300, 301, 300]]
STREAM_PROMPTS = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(8)]
STREAM_LENGTHS = [8 + 5 * i for i in range(8)]


def completion(server, prompt, n=MAX_TOKENS) -> tuple[str, int]:
    """Greedy /v1/completions: (text, completion tokens)."""
    status, body = server.post("/v1/completions", {"model": "default", "prompt": prompt, "max_tokens": n,
                                                    "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


def chat(server, messages) -> str:
    status, body = server.post("/v1/chat/completions", {"model": "default", "messages": messages,
                                                         "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def generate_ids(server, input_ids, n=MAX_TOKENS) -> dict:
    """Greedy /generate of `n` tokens (EOS ignored): the response body."""
    status, body = server.post("/generate", {"input_ids": input_ids,
                                             "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                                 "ignore_eos": True}})
    assert status == 200, body
    return body


def streams_expected(server) -> list[str]:
    """What `check_streams_and_abort` compares with: the STREAM_PROMPTS' texts, one at a time."""
    return [completion(server, p, n)[0] for p, n in zip(STREAM_PROMPTS, STREAM_LENGTHS)]


def free_tokens(server) -> tuple[int, int]:
    """(free, used) KV slots after a cache flush, over every data-parallel worker."""
    status, _ = server.post("/flush_cache", {})
    assert status == 200
    loads = server.get("/v1/loads")["loads"]  # one entry per data-parallel worker
    total = sum(load["max_total_num_tokens"] for load in loads)
    used = sum(load["num_used_tokens"] for load in loads)
    return total - used, used


def _events(server, path, payload):
    """The JSON events of a streamed (server-sent events) response."""
    req = urllib.request.Request(server.url + path, data=json.dumps(payload).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                yield json.loads(line[5:])


def _stream(server, prompt, n, results, i):
    payload = {"model": "default", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
    text, chunks = "", 0
    for chunk in _events(server, "/v1/completions", payload):
        if chunk.get("choices"):
            text += chunk["choices"][0].get("text") or ""
            chunks += 1
    results[i] = (text, chunks)


def _stream_and_abort(server, results):
    """A long streamed /generate request, aborted through `/abort_request` (its rid) after
    its first chunks, while the other streams run."""
    rid = "sglang-domino-abort-me"
    payload = {"rid": rid, "input_ids": [5, 77, 300, 41, 9], "stream": True,
               "sampling_params": {"max_new_tokens": 1000, "temperature": 0, "ignore_eos": True}}
    chunks, last = 0, None
    for last in _events(server, "/generate", payload):
        chunks += 1
        if chunks == 3:
            status, _ = server.post("/abort_request", {"rid": rid})
            assert status == 200
    results["abort"] = (chunks, last["meta_info"])


def check_streams_and_abort(server, want: list[str]) -> None:
    """8 streams of different lengths plus one aborted mid-stream: the 8 give `want`
    (`streams_expected` of a plain server), the aborted one ends early with an abort, and
    every KV slot comes back."""
    free_before, used_before = free_tokens(server)
    results = [None] * 8
    aborted = {}
    threads = [threading.Thread(target=_stream, args=(server, p, n, results, i))
               for i, (p, n) in enumerate(zip(STREAM_PROMPTS, STREAM_LENGTHS))]
    threads.append(threading.Thread(target=_stream_and_abort, args=(server, aborted)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert all(r is not None for r in results)
    assert [r[0] for r in results] == want
    assert all(r[1] >= 1 for r in results)
    chunks, meta = aborted["abort"]
    assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
    assert meta["completion_tokens"] < 1000
    free_after, used_after = free_tokens(server)
    assert used_after == used_before == 0
    assert free_after == free_before
