"""Demo: `sglang serve` with a Domino draft on the CPU, through the OpenAI-compatible API,
and its speed against the same server without speculation.

    python -m sglang_domino.demo (--testbed DIR | --target DIR --draft DIR [--dflash DIR])
                                 [--port 30000] [--prompts 8] [--tokens 128] [--transformers]

`--testbed DIR` serves a CPU test bed (`./scripts/demo.sh` passes the one committed in the
repository, benchmarks/testbed/checkpoints): its target/, domino/ and dflash/, measured on
its held-out requests. Servers are started one after the other on 127.0.0.1, each stopped
by its PID when its part is done (also on Ctrl-C), their logs in a temporary directory:
  1. Domino: a completion and a streamed chat completion through the `openai` client, then
     the measured prompts;
  2. the same server without speculation, on the same prompts;
  3. DFlash (when a DFlash draft is given), on the same prompts;
then one table: tokens/s at concurrency 1, mean acceptance length, speedup, and whether
each greedy output is identical to the plain server's. `--transformers` runs the
Transformers backend (`spec_generate`) on the same weights instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .launch import HOST, port_is_free, sglang_command, start

# float32: the committed test bed is stored in bf16, and `--dtype auto` would serve it in
# bf16, whose rounding can differ between a verify pass and a one-token decode; float32
# keeps outputs comparable token for token (bf16 -> fp32 is exact: the same weights).
DTYPE = "float32"
STARTUP_TIMEOUT = 300


@dataclass
class Run:
    name: str
    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    verify_steps: int = 0

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def accept_length(self) -> float:
        return self.tokens / self.verify_steps if self.verify_steps else 0.0


TESTBED_PARTS = ("target", "domino", "dflash")
TESTBED_FILES = ("manifest.json", "heldout_prompts.jsonl")


def read_testbed(path: str) -> tuple[str, str, str, list[dict]]:
    """A test bed directory: its target, Domino and DFlash paths and its held-out request
    rows (`heldout_prompts.jsonl`, one JSON object with a "prompt" a line)."""
    missing = [p for p in TESTBED_PARTS if not os.path.exists(os.path.join(path, p, "config.json"))]
    missing += [f for f in TESTBED_FILES if not os.path.exists(os.path.join(path, f))]
    if missing:
        raise SystemExit(f"{path} is not a complete test bed (missing {', '.join(missing)}); the repository "
                         "commits one in benchmarks/testbed/checkpoints")
    with open(os.path.join(path, "heldout_prompts.jsonl"), encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    target, domino, dflash = (os.path.join(path, p) for p in TESTBED_PARTS)
    return target, domino, dflash, rows


# Without a cap SGLang gives the KV pool all free memory: on CPU that is ~15 GB of float32
# zeros for target and draft, and 20 s of start-up spent writing them.
KV_TOKENS = 16384


def serve_command(target: str, draft: str | None, port: int) -> list[str]:
    """The model cards' command, plus `--device cpu --enable-torch-compile` (the compiled CPU
    step, its graphs cached for the next start) and the dtype, a KV pool size, host and port."""
    args = ["--model-path", target]
    if draft:
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft,
                 "--speculative-dflash-block-size", "16"]
    return sglang_command(args + ["--device", "cpu", "--enable-torch-compile", "--dtype", DTYPE,
                                  "--max-total-tokens", str(KV_TOKENS)], port)


def _progress(name: str):
    tty = sys.stdout.isatty()
    shown = [-15.0]

    def show(seconds: float) -> None:
        if tty:
            print(f"\r[demo] starting the {name} server ... {seconds:4.0f} s", end="", flush=True)
        elif seconds - shown[0] >= 15:   # a log file gets a line every 15 s, not a carriage-return stream
            shown[0] = seconds
            print(f"[demo] starting the {name} server ... {seconds:.0f} s", flush=True)
    return show


def measure(url: str, name: str, prompts: list[str], max_tokens: int) -> Run:
    """Greedy `/generate` requests one after the other (concurrency 1), after a warm-up."""
    import requests

    def generate(text: str, n: int) -> dict:
        resp = requests.post(url + "/generate", timeout=600, json={
            "text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0.0}})
        resp.raise_for_status()
        return resp.json()

    generate(prompts[0], 8)
    requests.post(url + "/flush_cache", timeout=60)
    run = Run(name)
    for text in prompts:
        t0 = time.perf_counter()
        out = generate(text, max_tokens)
        run.seconds += time.perf_counter() - t0
        meta = out["meta_info"]
        run.texts.append(out["text"])
        run.token_ids.append(out["output_ids"])
        run.tokens += meta["completion_tokens"]
        run.verify_steps += int(meta.get("spec_verify_ct") or 0)
    return run


def show_api(url: str, completion_prompt: str, chat_request: str, max_tokens: int) -> None:
    """A completion and a streamed chat completion through the `openai` client."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    print(f"\n--- POST /v1/completions (openai client), greedy, prompt in the target's chat format:\n"
          f"{completion_prompt}", end="", flush=True)
    done = client.completions.create(model=model, prompt=completion_prompt, max_tokens=max_tokens, temperature=0)
    print(done.choices[0].text)
    print(f"\n--- POST /v1/chat/completions (openai client), streamed as it is generated:\nuser: {chat_request}\n"
          "assistant: ", end="", flush=True)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": chat_request}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            print(chunk.choices[0].delta.content, end="", flush=True)
    print()


def run_sglang(args, target: str, drafts: dict[str, str], requests_: list[str]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r}], tokenize=False,
                                             add_generation_prompt=True) for r in requests_]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="sglang-domino-demo-")
    os.makedirs(log_dir, exist_ok=True)
    order = [("Domino", drafts["Domino"]), ("no speculation", None)] + \
        [(n, d) for n, d in drafts.items() if n != "Domino"]
    runs: dict[str, Run] = {}
    for name, draft in order:
        cmd = serve_command(target, draft, args.port)
        log = os.path.join(log_dir, f"server-{name.replace(' ', '-').lower()}.log")
        print(f"\n[demo] {name}: {shlex.join(cmd)}\n[demo] log: {log}")
        t0 = time.time()
        with start(cmd, args.port, log, STARTUP_TIMEOUT, on_wait=_progress(name)) as running:
            url = running.url
            print(f"\r[demo] the {name} server is healthy after {time.time() - t0:.0f} s" + " " * 10)
            if name == "Domino":
                show_api(url, prompts[0], requests_[1 % len(requests_)], args.tokens)
            print(f"[demo] measuring {len(prompts)} held-out requests, {args.tokens} new tokens each, greedy, "
                  "concurrency 1 ...", flush=True)
            runs[name] = measure(url, name, prompts, args.tokens)
    base = runs["no speculation"]
    print(f"\n=== sglang serve --device cpu --enable-torch-compile --dtype {DTYPE}, {len(prompts)} held-out requests, "
          "concurrency 1, "
          "greedy, measured in this run")
    print(f"{'method':<16} {'tok/s':>8} {'speedup':>8} {'accept length':>14}   output")
    for name in ["no speculation"] + [n for n in runs if n != "no speculation"]:
        run = runs[name]
        same = sum(a == b for a, b in zip(run.token_ids, base.token_ids))   # token for token
        accept = f"{run.accept_length:.2f}" if run.verify_steps else "1 (plain)"
        note = "" if name == "no speculation" else f"identical to no speculation: {same} of {len(base.texts)}"
        print(f"{name:<16} {run.tok_per_s:8.1f} {run.tok_per_s / base.tok_per_s:7.2f}x {accept:>14}   {note}")
    print("(acceptance length: tokens committed per verify step, bonus included; speed on a shared "
          "2-core machine moves by about 10-30 % from run to run)")
    print(f"\nfirst measured request: {requests_[0]!r}\nDomino's answer:\n{runs['Domino'].texts[0]}")


def run_transformers(args, target_path: str, drafts: dict[str, str], requests_: list[str]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import DFlashDraftModel

    torch.set_num_threads(args.threads)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    models = {name: DFlashDraftModel.from_pretrained(path, dtype=torch.float32) for name, path in drafts.items()}
    stops = [tokenizer.eos_token_id]
    with torch.inference_mode():
        for request in requests_:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": request}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=False)
            t0 = time.perf_counter()
            ref = target.generate(ids, max_new_tokens=args.tokens, do_sample=False, eos_token_id=stops,
                                  pad_token_id=tokenizer.pad_token_id)
            base_tps = (ref.shape[1] - ids.shape[1]) / (time.perf_counter() - t0)
            print("=" * 72 + f"\nuser: {request}\ntarget alone (generate): {base_tps:7.1f} tok/s")
            for name, draft in models.items():
                out, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=args.tokens,
                                                 temperature=0.0, stop_token_ids=stops, return_stats=True)
                same = "identical to the target's" if torch.equal(out, ref) else "DIFFERS from the target's"
                print(f"{name}: {stats.new_tokens / stats.total_time:7.1f} tok/s, mean accept length "
                      f"{stats.mean_accept_length:.2f} over {stats.num_verify_steps} steps, output {same}")
            print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--testbed", help="test bed directory (target/, domino/, dflash/, heldout_prompts.jsonl)")
    parser.add_argument("--target", help="target model directory (with tokenizer)")
    parser.add_argument("--draft", help="Domino draft checkpoint directory")
    parser.add_argument("--dflash", help="DFlash draft checkpoint directory (optional)")
    parser.add_argument("--request", action="append", default=None, help="user request (repeatable)")
    parser.add_argument("--prompts", type=int, default=8, help="held-out requests to measure (test bed)")
    parser.add_argument("--tokens", type=int, default=128, help="max new tokens per request")
    parser.add_argument("--port", type=int, default=30000, help="port on 127.0.0.1 for the servers")
    parser.add_argument("--log-dir", help="server logs (default: a new temporary directory)")
    parser.add_argument("--transformers", action="store_true", help="run the Transformers backend instead")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (--transformers)")
    args = parser.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together")
    if bool(args.target) == bool(args.testbed):
        parser.error("pass either --testbed DIR or --target DIR --draft DIR")
    if args.target:
        target, domino, dflash = args.target, args.draft, args.dflash
        requests_ = args.request or ["Write a Python function that returns the sum of the even numbers in a list."]
    else:
        target, domino, dflash, rows = read_testbed(args.testbed)
        requests_ = args.request or [r["prompt"] for r in rows[:args.prompts]]
        print(f"[demo] the CPU test bed: {args.testbed}")
    drafts = {"Domino": domino, **({"DFlash": dflash} if dflash else {})}
    if args.transformers:
        run_transformers(args, target, drafts, requests_)
        return 0
    if not port_is_free(args.port):
        print(f"[demo] port {args.port} on {HOST} is busy: stop what listens there or pass --port N", file=sys.stderr)
        return 1
    # SIGTERM (`kill`) unwinds like Ctrl-C, so the running server is stopped; SIGINT is set
    # explicitly because a shell starts background jobs with it ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        run_sglang(args, target, drafts, requests_)
    except KeyboardInterrupt:
        print("\n[demo] interrupted; the server was stopped", file=sys.stderr)
        return 130
    except RuntimeError as err:
        print(f"\n[demo] {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
