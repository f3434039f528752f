"""Greedy output of `sglang serve` per dtype: speculative decoding against plain decoding,
and what batching alone does to plain decoding.

    python -m benchmarks.sglang_numerics [--dtypes float32,bfloat16] [--requests 64]
                                         [--tokens 128] [--out benchmarks/results/sglang-numerics]

On the committed CPU test bed, for each dtype: the plain server (the held-out requests at
concurrency 1, then at 8), the Domino server and the DFlash server (each at 1 and 8), one
server at a time, identical flags but the speculative ones. Every greedy output is
compared by `output_ids` with the plain server's at concurrency 1: how many requests
differ, and where the first differing token is. Writes `numerics.json` (every output) and
`summary.md` into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from sglang_domino.launch import free_port, start

from .load import Client, Sampling, steady
from .testbed.load import committed
from .testbed.prompts import heldout_prompts

CONCURRENCIES = (1, 8)


def first_difference(a: list[int], b: list[int]):
    """Index of the first differing token (the shorter length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(url: str, prompts: list[list[int]], tokens: int, concurrency: int) -> list[list[int]]:
    """Every prompt's greedy output ids, `concurrency` requests in flight."""
    client = Client(url, Sampling(max_new_tokens=tokens))
    return [r.output_ids for r in steady(client, prompts, concurrency).records]


def command(bed: Path, dtype: str, draft, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(bed / "target"), "--device", "cpu",
           "--dtype", dtype, "--max-total-tokens", "16384", "--host", "127.0.0.1", "--port", str(port)]
    if draft:
        cmd += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(bed / draft),
                "--speculative-dflash-block-size", "16"]
    return cmd


def compare(reference: list[list[int]], outputs: list[list[int]]) -> dict:
    firsts = [first_difference(r, o) for r, o in zip(reference, outputs)]
    differ = [f for f in firsts if f is not None]
    return {"requests": len(outputs), "differ": len(differ), "first_difference": differ,
            "median_first_difference": sorted(differ)[len(differ) // 2] if differ else None}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sglang-numerics"))
    args = p.parse_args(argv)
    bed = committed()
    prompts = heldout_prompts(bed, args.requests)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"requests": len(prompts), "tokens": args.tokens, "runs": {}}
    for dtype in args.dtypes.split(","):
        outputs = {}
        for method, draft in (("plain", None), ("domino", "domino"), ("dflash", "dflash")):
            port = free_port()
            log = str(args.out / f"server-{dtype}-{method}.log")
            with start(command(bed, dtype, draft, port), port, log, 600, env=dict(os.environ)) as running:
                url = running.url
                run(url, prompts[:8], 16, 8)  # warm-up
                for conc in CONCURRENCIES:
                    outputs[f"{method} c{conc}"] = run(url, prompts, args.tokens, conc)
                    print(f"[{dtype}] {method} c{conc}: done", flush=True)
        reference = outputs["plain c1"]
        results["runs"][dtype] = {name: {**compare(reference, out), "outputs": out} for name, out in outputs.items()}
    with open(args.out / "numerics.json", "w") as fh:
        json.dump(results, fh)
    lines = [f"# Greedy output against the plain server at concurrency 1 ({len(prompts)} held-out requests, "
             f"{args.tokens} new tokens, CPU test bed)", "",
             "| dtype | run | requests that differ | first differing token (median; all) |", "|---|---|---|---|"]
    for dtype, runs in results["runs"].items():
        for name, r in runs.items():
            if name == "plain c1":
                continue
            firsts = ", ".join(map(str, sorted(r["first_difference"]))) or "-"
            lines.append(f"| {dtype} | {name} | {r['differ']} of {r['requests']} | "
                         f"{r['median_first_difference'] if r['differ'] else '-'}; {firsts} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
