"""The one load harness of the served benchmarks: a client for one request, and one loop.

Every script that measures a server sends its requests through here, so every number is
taken the same way: one HTTP connection per request (as SGLang's `bench_serving` opens
them), the clock read around the whole request, the reply parsed into a `Record`.

- `Client`: one request to an SGLang server (`/generate`, a text or token ids) or a vLLM
  server (its OpenAI `/v1/completions`, the same prompt), with the same sampling; the reply
  as a `Record` (tokens, output ids and text, latency, verify steps where SGLang reports
  them). `flush()` empties the server's prefix cache before a measured run.
- `steady`: a closed loop, `concurrency` requests in flight until the prompts run out, the
  next sent as soon as one ends (a steady load; all at once when it is the number of prompts).
- `open_loop`: requests arriving at `rate` per second (Poisson or evenly spaced) whatever
  the server's pace, optionally capped at `max_in_flight` (then late ones wait for a slot).

Both return a `Run`: the records in prompt order and the wall time of the whole batch.
A failed request is a record with `error` set; unless `keep_errors`, the loop raises
`RequestFailed` once every request has ended (a failure is never a silently short run).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence, Union

from .peers.vllm_server import SERVED_NAME as VLLM_MODEL   # the model name our vLLM servers answer to
from .records import Record

SGLANG = "sglang"
VLLM = "vllm"
Prompt = Union[str, Sequence[int]]


class RequestFailed(RuntimeError):
    """A request the server refused or never answered."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    """What every request asks for. Greedy (temperature 0) is sent to SGLang as top_k 1, as
    the SGLang benchmark always has; top_k / top_p only go with sampled requests."""

    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False

    def sglang(self) -> dict:
        params = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}
        if self.temperature == 0:
            params["top_k"] = 1
        else:
            params.update({"top_k": self.top_k, "top_p": self.top_p})
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params

    def vllm(self) -> dict:
        params = {"max_tokens": self.max_new_tokens, "temperature": self.temperature}
        if self.temperature != 0:
            params.update({"top_k": self.top_k, "top_p": self.top_p})
        if self.ignore_eos:
            params["ignore_eos"] = True
        return params


@dataclasses.dataclass(frozen=True)
class Client:
    """One server's requests: `kind` is SGLANG or VLLM."""

    url: str
    sampling: Sampling
    kind: str = SGLANG
    timeout: float = 3600
    model: str = VLLM_MODEL

    def __post_init__(self):
        if self.kind not in (SGLANG, VLLM):
            raise ValueError(f"kind: got {self.kind!r}, expected {SGLANG!r} or {VLLM!r}")

    def with_tokens(self, max_new_tokens: int) -> "Client":
        """The same client asking for another length (warm-ups)."""
        return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, max_new_tokens=max_new_tokens))

    def request(self, prompt: Prompt) -> tuple[str, dict]:
        """(path, JSON body) of one request: a text goes as text, token ids as ids."""
        if self.kind == VLLM:
            return "/v1/completions", {"model": self.model, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                       **self.sampling.vllm(), "return_token_ids": True}
        key = ("text", prompt) if isinstance(prompt, str) else ("input_ids", list(prompt))
        return "/generate", {key[0]: key[1], "sampling_params": self.sampling.sglang()}

    def parse(self, body: dict) -> dict:
        """The Record fields a reply gives: output ids and text, token counts, verify steps,
        the server's own latency (SGLang's meta_info; vLLM reports neither per request)."""
        if self.kind == VLLM:
            choice = body["choices"][0]
            if choice.get("token_ids") is None:
                raise RequestFailed("/v1/completions returned no token_ids (return_token_ids unsupported?)")
            usage = body.get("usage") or {}
            return dict(output_ids=list(choice["token_ids"]), text=choice.get("text"),
                        prompt_tokens=int(usage.get("prompt_tokens") or 0),
                        completion_tokens=int(usage["completion_tokens"]), verify_steps=0)
        meta = body["meta_info"]
        latency = meta.get("e2e_latency")
        return dict(output_ids=body.get("output_ids"), text=body.get("text"),
                    prompt_tokens=int(meta.get("prompt_tokens") or 0), completion_tokens=int(meta["completion_tokens"]),
                    verify_steps=int(meta.get("spec_verify_ct") or 0),
                    server_latency_s=None if latency is None else float(latency))

    def send(self, prompt: Prompt, clock0: Optional[float] = None, **fields) -> Record:
        """One request, timed; `fields` fill the record's labels (method, task, repeat,
        concurrency, prompt_index, ...). Raises RequestFailed on an error status or no reply."""
        import requests

        path, body = self.request(prompt)
        clock0 = time.time() if clock0 is None else clock0
        start = time.time() - clock0
        try:
            resp = requests.post(self.url + path, json=body, timeout=self.timeout)
        except requests.RequestException as err:
            raise RequestFailed(f"{path}: {type(err).__name__}: {err}") from err
        if resp.status_code != 200:
            raise RequestFailed(f"{path} answered {resp.status_code}: {resp.text[:300]}")
        reply = self.parse(resp.json())
        end = time.time() - clock0
        tokens, steps = reply["completion_tokens"], reply["verify_steps"]
        labels = {"method": "", "task": "", "repeat": 0, "concurrency": 1, "prompt_index": 0, **fields}
        return Record(backend=self.kind, **labels, **reply, accepted_tokens=tokens if steps else 0,
                      start_s=start, end_s=end, latency_s=end - start,
                      tok_per_s=tokens / (end - start) if end > start else 0.0)

    def flush(self, attempts: int = 20) -> None:
        """The server's prefix cache emptied (SGLang's /flush_cache, vLLM's
        /reset_prefix_cache), so a run does not reuse the last one's prefixes. SGLang refuses
        a flush (400) while a finished request is still leaving its batch, a moment after its
        reply: retried for a few seconds."""
        import requests

        path = "/reset_prefix_cache" if self.kind == VLLM else "/flush_cache"
        for attempt in range(attempts):
            resp = requests.post(self.url + path, timeout=60)
            if resp.status_code == 200:
                return
            if resp.status_code != 400 or attempt == attempts - 1:
                break
            time.sleep(0.25)
        raise RequestFailed(f"POST {path} answered {resp.status_code}: {resp.text[:200]}")


@dataclasses.dataclass
class Run:
    """One batch of requests: their records in prompt order, and its wall time (first
    send to last reply)."""

    records: list[Record]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.records)

    @property
    def verify_steps(self) -> int:
        return sum(r.verify_steps for r in self.records)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def peak_in_flight(self) -> int:
        return max((r.in_flight or 0 for r in self.records), default=0)

    @property
    def errors(self) -> list[Record]:
        return [r for r in self.records if r.error is not None]


class _InFlight:
    """Counts the requests between send and reply (the concurrency actually reached)."""

    def __init__(self):
        self._lock, self.now, self.peak = threading.Lock(), 0, 0

    def enter(self) -> int:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            return self.now

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def steady(client: Client, prompts: Sequence[Prompt], concurrency: int, clock0: Optional[float] = None,
           keep_errors: bool = False, **labels) -> Run:
    """Closed loop: at most `concurrency` requests in flight, the next sent as soon as one
    ends. `labels` go into every record (method, task, repeat)."""
    if concurrency < 1:
        raise ValueError(f"concurrency: got {concurrency}, expected at least 1")
    run = _drive(client, prompts, [0.0] * len(prompts), concurrency, clock0, labels)
    for rec in run.records:
        rec.concurrency = concurrency
    return _checked(run, keep_errors)


def arrival_times(n: int, rate: float, poisson: bool = True, seed: int = 0) -> list[float]:
    """Seconds from the run's start at which each of `n` requests arrives: the first at 0,
    then gaps of 1 / rate on average (exponential, seeded, when `poisson`; else even)."""
    if rate <= 0:
        raise ValueError(f"rate: got {rate}, expected requests per second above 0")
    rng = random.Random(seed)
    times, at = [], 0.0
    for i in range(n):
        times.append(at)
        at += rng.expovariate(rate) if poisson else 1.0 / rate
    return times


def open_loop(client: Client, prompts: Sequence[Prompt], rate: float, poisson: bool = True, seed: int = 0,
              max_in_flight: Optional[int] = None, clock0: Optional[float] = None, keep_errors: bool = False,
              **labels) -> Run:
    """Open loop: request i is sent at `arrival_times(...)[i]` whether or not earlier ones
    have ended (at most `max_in_flight` at once when given; a late one then waits for a slot,
    its record's start_s after its scheduled_s). Each record's concurrency is the most in
    flight during the run."""
    due = arrival_times(len(prompts), rate, poisson, seed)
    run = _drive(client, prompts, due, max_in_flight or max(len(prompts), 1), clock0,
                 {**labels, "arrival_rate": rate})
    for rec in run.records:
        rec.concurrency = max(run.peak_in_flight, 1)
    return _checked(run, keep_errors)


def warm_up(client: Client, prompts: Sequence[Prompt], max_new_tokens: int = 16) -> None:
    """Every prompt at once, short: a fresh server's lazy initialisations and its batch
    sizes up to len(prompts) taken before anything is timed."""
    steady(client.with_tokens(max_new_tokens), prompts, max(len(prompts), 1))


def _drive(client: Client, prompts: Sequence[Prompt], due: list[float], workers: int, clock0: Optional[float],
           labels: dict) -> Run:
    """The one loop: request i is handed to a pool of `workers` threads at `due[i]` seconds
    after the start (all at 0: a closed loop of `workers`)."""
    counter = _InFlight()
    t0 = time.time()
    clock0 = t0 if clock0 is None else clock0
    open_ = "arrival_rate" in labels

    def one(index: int, prompt: Prompt) -> Record:
        fields = {**labels, "prompt_index": index}
        if open_:
            fields["scheduled_s"] = t0 + due[index] - clock0
        fields["in_flight"] = counter.enter()
        begin = time.time()
        try:
            return client.send(prompt, clock0, **fields)
        except Exception as err:   # any failure is the request's, recorded and raised after the batch
            end = time.time()
            return Record(backend=client.kind, **{"method": "", "task": "", "repeat": 0, "concurrency": 1, **fields},
                          prompt_tokens=0, completion_tokens=0, verify_steps=0, accepted_tokens=0,
                          start_s=begin - clock0, end_s=end - clock0, latency_s=end - begin, tok_per_s=0.0,
                          error=f"{type(err).__name__}: {err}")
        finally:
            counter.leave()

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(prompts)))) as pool:
        futures = []
        for index, (prompt, at) in enumerate(zip(prompts, due)):
            delay = t0 + at - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, index, prompt))
        records = [f.result() for f in futures]
    return Run(records=records, wall_s=time.time() - t0)


def _checked(run: Run, keep_errors: bool) -> Run:
    if run.errors and not keep_errors:
        first = run.errors[0]
        raise RequestFailed(f"{len(run.errors)} of {len(run.records)} requests failed; request {first.prompt_index}: "
                            f"{first.error}")
    return run
