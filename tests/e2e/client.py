"""What the end-to-end tests ask a server, through its HTTP API (`launch.Server.post`)."""

from __future__ import annotations

import json
import threading
import time
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
# Greedy /generate requests whose penalty changes the tiny target's answer to HF_PROMPTS[2]
# (it repeats its top live token, which each penalty pushes under the zero-logit tokens;
# min_new_tokens holds that token back as a stop id for 20 tokens). A repetition penalty
# alone changes nothing here (the top token stays positive; the test bed's matrix has
# one); combined with an additive one its order is process-dependent in 0.5.23's
# synchronous plain server (docs/sampling.md).
PENALISED = {
    "frequency_penalty": {"frequency_penalty": 0.4},
    "presence_penalty": {"presence_penalty": 1.0},
    "min_new_tokens": {"min_new_tokens": 20, "stop_token_ids": [300]},
}
STREAM_PROMPTS = [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(8)]
STREAM_LENGTHS = [8 + 5 * i for i in range(8)]


def completion(server, prompt, n=MAX_TOKENS, model="default") -> tuple[str, int]:
    """Greedy /v1/completions: (text, completion tokens). A gateway routes by `model`, the
    served name."""
    status, body = server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n,
                                                    "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


def chat(server, messages) -> str:
    status, body = server.post("/v1/chat/completions", {"model": "default", "messages": messages,
                                                         "max_tokens": MAX_TOKENS, "temperature": 0})
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def generate_ids(server, input_ids, n=MAX_TOKENS, model=None) -> dict:
    """Greedy /generate of `n` tokens (EOS ignored): the response body."""
    status, body = server.post("/generate", {"input_ids": input_ids, **({"model": model} if model else {}),
                                             "sampling_params": {"max_new_tokens": n, "temperature": 0,
                                                                 "ignore_eos": True}})
    assert status == 200, body
    return body


def generate_penalised(server, params: dict) -> list[int]:
    """Greedy /generate of HF_PROMPTS[2] with `params` added: the output ids."""
    status, body = server.post("/generate", {"input_ids": HF_PROMPTS[2], "sampling_params": {
        "max_new_tokens": MAX_TOKENS, "temperature": 0, **params}})
    assert status == 200, body
    return body["output_ids"]


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


def _stream(server, prompt, n, results, i, model="default"):
    payload = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
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


def _stream_and_disconnect(server, results, model):
    """A long streamed completion whose client goes away after its first chunks, while
    the other streams run (a gateway has no `/abort_request`: the disconnect is the abort)."""
    # short enough to finish in the settle window even if the gateway only lets it drain
    payload = {"model": model, "prompt": PROMPTS[0], "max_tokens": 200, "temperature": 0, "stream": True,
               "ignore_eos": True}
    chunks = 0
    for _ in _events(server, "/v1/completions", payload):
        chunks += 1
        if chunks == 3:
            break  # leaving the generator closes the connection
    results["abort"] = (chunks, None)


def check_streams_and_abort(server, want: list[str], model: str = "default", workers=None) -> None:
    """8 streams of different lengths plus one aborted mid-stream: the 8 give `want`
    (`streams_expected` of a plain server), the aborted one ends early with an abort, and
    every KV slot comes back. With `workers` (the servers behind a gateway `server`), the
    abort is a client disconnect and the KV slots are counted on the workers."""
    kv = workers or [server]
    before = [free_tokens(w) for w in kv]
    results = [None] * 8
    aborted = {}
    threads = [threading.Thread(target=_stream, args=(server, p, n, results, i, model))
               for i, (p, n) in enumerate(zip(STREAM_PROMPTS, STREAM_LENGTHS))]
    if workers:
        threads.append(threading.Thread(target=_stream_and_disconnect, args=(server, aborted, model)))
    else:
        threads.append(threading.Thread(target=_stream_and_abort, args=(server, aborted)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert all(r is not None for r in results), results
    assert [r[0] for r in results] == want
    assert all(r[1] >= 1 for r in results)
    chunks, meta = aborted["abort"]
    if meta is not None:
        assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
        assert meta["completion_tokens"] < 1000
    assert [used for _, used in before] == [0] * len(kv)
    assert _settled(kv) == before


def _settled(servers, timeout: float = 300):
    """`free_tokens` of each server once none holds a KV slot (a disconnected request is
    aborted by its server a moment after the client goes), or as it is at `timeout`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        # a server refuses to flush its cache while a request still runs
        if all(s.post("/flush_cache", {})[0] == 200 for s in servers):
            now = [free_tokens(s) for s in servers]
            if all(used == 0 for _, used in now):
                return now
        time.sleep(0.5)
    return [free_tokens(s) for s in servers]


def transformers_spec(models, kind, input_ids, width=16):
    """What a server should answer, from the Transformers backend in this process: the
    greedy tokens and the stats of `spec_generate` with draft `models[kind]` on the tiny
    target, verifying `width` positions (BLOCK + 1: the backend's own window for
    shift-label drafts)."""
    import torch

    from sglang_domino.hf import DFlashDraftModel
    from tests.helpers.servers import BLOCK

    draft = DFlashDraftModel.from_pretrained(models[kind])
    out, stats = draft.spec_generate(torch.tensor([input_ids]), models["hf_target"], max_new_tokens=MAX_TOKENS,
                                     return_stats=True, num_verify_tokens=None if width == BLOCK + 1 else width)
    return out[0, len(input_ids):].tolist(), stats


def check_compiled_before_serving(log: str, rollout_blocks: str | None = "16, 8, 4, 2", draft: bool = True) -> None:
    """A `--enable-torch-compile` server's log: the target's, the draft's (with `draft`) and
    the Domino rollout's graphs (at `rollout_blocks`; None: no Domino draft) compiled while
    it started, none while it served (dynamo logs any recompile once the forwards are warm;
    the compiled forward logs a graph compiled after its warm-up). With TP every rank logs
    its own."""
    import re

    from sglang_domino.sglang.cpu.compiled.layers import NEW_GRAPH

    warm = []
    expected = [r"the target's \d+ layers compiled in"]
    expected += [r"the draft's \d+ layers compiled in"] if draft else []
    expected += [rf"the compiled Domino rollout at blocks \[{rollout_blocks}\]"] if rollout_blocks else []
    for compiled in expected:
        found = list(re.finditer(compiled, log))
        assert found, (compiled, log[-3000:])
        warm.append(found[-1].end())
    assert NEW_GRAPH not in log
    served = log[max(warm):]   # the warm-ups compile on code dynamo has seen: "recompiling" there
    # ours only: under TP upstream's vocabulary-parallel embedding compiles its own masking
    # (`get_masked_input_and_mask`) per kind of call, eager servers alike
    ours = [m for m in re.finditer(r"Recompiling function (\w+) in (\S+)", served) if "sglang_domino" in m.group(2)]
    assert not ours, served[ours[0].start() - 200:][:3000] if ours else ""
    # with oneDNN's creation log on (ONEDNN_VERBOSE=profile_create): every kernel of the
    # packed products built once (the start-up builds every decode step's row count; none
    # evicted from oneDNN's cache and built again, while starting or serving)
    from collections import Counter

    built = Counter(onednn_kernels(log))
    again = sorted(k for k, n in built.items() if n > 1)
    assert not again, (len(built), again[:10])


def onednn_kernels(log: str) -> list[str]:
    """The matrix products oneDNN's creation log says it built (`mb<rows>ic<in>oc<out>`), in order."""
    import re

    return list(re.findall(r"create:cache_miss,cpu,inner_product,.*,(mb\d+ic\d+oc\d+),", log))
