"""The CPU port's batched torch_native attention against 0.5.23's per-request loops, in
process: a forward's attention layers (each its own K/V caches, all the same requests and
lengths, as a server's forward calls them) for a decode step (1 row per request) and for a
verify block (W rows per request, causal) after contexts of a given length.

    python -m benchmarks.cpu_attention [--layers 6] [--out DIR]

The two are timed alternately, several rounds, median of each; the ratio is what the
change buys per forward (the test bed's target has 6 layers, the Qwen3 cards 36;
`--layers 1` gives one layer, as this benchmark measured before 2026-12-03).
Writes `cpu_attention.json` and `cpu_attention.md` (CPU named) to DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.machine import machine
from benchmarks.report import write_markdown

HEADS, KV_HEADS, DIM = 4, 2, 64     # the test bed target's attention (its config.json): GQA 2:1


def case(bs: int, context: int, rows: int, layers: int = 1, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    slots = bs * (context + rows) + 8
    caches = [(torch.randn(slots, KV_HEADS, DIM, generator=g), torch.randn(slots, KV_HEADS, DIM, generator=g))
              for _ in range(layers)]
    req_to_token = torch.randperm(slots, generator=g)[: bs * (context + rows)].view(bs, -1).to(torch.int32)
    return dict(q=torch.randn(bs * rows, HEADS, DIM, generator=g), caches=caches, req_to_token=req_to_token,
                pools=torch.arange(bs), prefix=torch.full((bs,), context), rows=rows)


def run_upstream(c: dict) -> None:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
    out = torch.empty_like(c["q"])
    for k, v in c["caches"]:
        if c["rows"] == 1:
            backend._run_sdpa_forward_decode(c["q"], out, k, v, c["req_to_token"], c["pools"],
                                             c["prefix"] + 1, None, enable_gqa=True)
        else:
            backend._run_sdpa_forward_extend(c["q"], out, k, v, c["req_to_token"], c["pools"],
                                             c["prefix"] + c["rows"], c["prefix"],
                                             torch.full_like(c["prefix"], c["rows"]), None, enable_gqa=True,
                                             causal=True)


def run_batched(c: dict) -> None:
    from sglang_domino.sglang.cpu.attention import attend

    out = torch.empty_like(c["q"])
    for k, v in c["caches"]:
        attend(c["q"], out, k, v, c["req_to_token"], c["pools"], c["prefix"] + c["rows"], c["rows"],
               enable_gqa=True, causal=c["rows"] > 1)


def time_once(fn, c: dict, reps: int) -> float:
    tic = time.perf_counter()
    for _ in range(reps):
        fn(c)
    return (time.perf_counter() - tic) / reps


def measure(bs: int, context: int, rows: int, rounds: int, reps: int, layers: int = 1) -> dict:
    c = case(bs, context, rows, layers)
    run_upstream(c), run_batched(c)   # warm
    upstream, batched = [], []
    for _ in range(rounds):   # alternated
        upstream.append(time_once(run_upstream, c, reps))
        batched.append(time_once(run_batched, c, reps))
    up, ba = statistics.median(upstream), statistics.median(batched)
    return dict(bs=bs, context=context, rows=rows, upstream_ms=1000 * up, batched_ms=1000 * ba, speedup=up / ba)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu-attention"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--layers", type=int, default=6, help="attention layers per forward (the test bed's target: 6)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    records = [measure(bs, ctx, rows, args.rounds, args.reps, args.layers)
               for rows in (1, 16) for bs in args.batch_sizes for ctx in args.contexts]
    info = machine()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_attention.json"), "w", encoding="utf-8") as fh:
        json.dump({"machine": info, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": DIM, "layers": args.layers,
                   "records": records}, fh, indent=1)
    lines = ["# torch_native attention on CPU: 0.5.23's per-request loop vs the batched call", "",
             f"{args.layers} attention layer(s) per forward, each its own K/V caches, float32, "
             f"{HEADS} query heads / {KV_HEADS} KV heads x {DIM}; medians of "
             f"{args.rounds} alternated rounds of {args.reps} calls. CPU: {info.get('cpu', 'unknown')}. "
             f"Command: `python -m benchmarks.cpu_attention --layers {args.layers}`.", "",
             "| step | batch | context | upstream ms per forward | batched ms per forward | speedup |",
             "|---|---|---|---|---|---|"]
    for r in records:
        step = "decode (1 row)" if r["rows"] == 1 else f"verify ({r['rows']} rows, causal)"
        lines.append(f"| {step} | {r['bs']} | {r['context']} | {r['upstream_ms']:.3f} | {r['batched_ms']:.3f} | "
                     f"{r['speedup']:.2f}x |")
    write_markdown(args.out, "cpu_attention.md", lines)


if __name__ == "__main__":
    main()
