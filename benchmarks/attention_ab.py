"""0.5.23's torch_native attention loops against the CPU port's batched attention, served:
the test bed's plain and Domino servers, each started with `SGLANG_DOMINO_CPU_ATTENTION`
= upstream and = batched in alternating order, several rounds, output tok/s at each
concurrency (float32, greedy, the held-out requests).

    python -m benchmarks.attention_ab [--rounds 2] [--concurrencies 1 8] [--out DIR]

Writes `attention_ab.json` (every run) and `attention_ab.md` (medians, batched / upstream,
the CPU named) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from .machine import machine
from .report import write_markdown
from .profile_step import bench_config, draft_for, render_prompts

MODES = ("upstream", "batched")


def serve_and_measure(cfg, config: str, mode: str, prompts: list[str], out: str) -> dict[int, float]:
    """One server of `config` (plain or domino) with the attention `mode`: tok/s per concurrency."""
    from sglang_domino.launch import free_port, start

    from .records import TARGET_ONLY
    from .sglang_bench import generate, measure

    port = free_port()
    cmd = cfg.launch_command(port, draft_for(cfg, config))
    env = {**os.environ, "SGLANG_DOMINO_CPU_ATTENTION": mode}
    method = TARGET_ONLY if config == "plain" else config
    result = {}
    with start(cmd, port, os.path.join(out, f"server-{config}-{mode}.log"), cfg.server_timeout, env=env) as server:
        warm = prompts[: max(cfg.concurrencies)]
        with ThreadPoolExecutor(len(warm)) as pool:
            list(pool.map(lambda t: generate(server.url, t, cfg.model_copy(update={"max_new_tokens": 16})), warm))
        for conc in cfg.concurrencies:
            t0 = time.time()
            records = measure(server.url, method, "heldout", conc, 0, prompts, cfg, t0)
            result[conc] = sum(r.completion_tokens for r in records) / (time.time() - t0)
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--configs", nargs="+", default=["plain", "domino"])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu-attention"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    cfg = bench_config(args.prompts, args.concurrencies)
    prompts = render_prompts(cfg)
    runs = []
    for rnd in range(args.rounds):
        for config in args.configs:
            # alternate which mode goes first, round by round
            for mode in (MODES if rnd % 2 == 0 else MODES[::-1]):
                tps = serve_and_measure(cfg, config, mode, prompts, args.out)
                runs.append({"round": rnd, "config": config, "mode": mode, "tok_per_s": tps})
                print(json.dumps(runs[-1]), flush=True)
    info = machine()
    with open(os.path.join(args.out, "attention_ab.json"), "w", encoding="utf-8") as fh:
        json.dump({"machine": info, "dtype": "float32", "max_new_tokens": cfg.max_new_tokens,
                   "prompts": args.prompts, "runs": runs}, fh, indent=1)
    lines = ["# Served: 0.5.23's torch_native attention loops vs the batched attention", "",
             f"Test bed, float32, {args.prompts} held-out requests, {cfg.max_new_tokens} new tokens, greedy; "
             f"servers alternated, {args.rounds} rounds, median output tok/s. CPU: {info.get('cpu', 'unknown')}, "
             f"{info.get('cpu_count')} cores. Command: `python -m benchmarks.attention_ab`.", "",
             "| server | concurrency | upstream tok/s | batched tok/s | batched / upstream |", "|---|---|---|---|---|"]
    for config in args.configs:
        for conc in args.concurrencies:
            med = {m: statistics.median(r["tok_per_s"][conc] for r in runs if r["config"] == config and r["mode"] == m)
                   for m in MODES}
            lines.append(f"| {config} | {conc} | {med['upstream']:.1f} | {med['batched']:.1f} | "
                         f"{med['batched'] / med['upstream']:.2f}x |")
    write_markdown(args.out, "attention_ab.md", lines)


if __name__ == "__main__":
    main()
