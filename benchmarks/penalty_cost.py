"""What exact per-position penalties cost a verify step (`sglang_domino.penalties`).

A penalised DFLASH step penalises every row of its block with the tokens before it
(`apply_block_penalties`) and counts the committed tokens afterwards (`commit_counts`).
0.5.23's shortcut adds one penalty row broadcast over the block (`[bs, 1, V]` added to
`[bs, W, V]`), which is wrong inside the block. This times both on the logits a verify
produces (float32, Qwen3's vocabulary of 151,936 by default), each request with a
frequency, a presence and a repetition penalty and min new tokens (the worst case), on
the machine at hand. Steps without a penalty run none of this.

    python -m benchmarks.penalty_cost [--vocab 151936] [--width 16] [--out benchmarks/results/penalty-cost]

writes `penalty_cost.json` (the records and the machine) and `penalty_cost.md` (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.machine import machine
from sglang_domino.penalties import BlockPenalties, apply_block_penalties, commit_counts

BATCH_SIZES = (1, 8, 32)


def _inputs(bs: int, width: int, vocab: int, gen: torch.Generator):
    counts = torch.zeros(bs, vocab)
    counts.scatter_add_(1, torch.randint(0, vocab, (bs, 200), generator=gen), torch.ones(bs, 200))
    pen = BlockPenalties(counts=counts, generated=torch.full((bs,), 200), frequency=torch.full((bs,), 0.5),
                         presence=torch.full((bs,), 0.5), repetition=torch.full((bs,), 1.2),
                         min_new=torch.full((bs,), 210), stop_ids=torch.randint(0, vocab, (bs, 3), generator=gen),
                         stop_valid=torch.ones(bs, 3, dtype=torch.bool), repetition_at_least_one=True)
    return pen, torch.randint(0, vocab, (bs, width), generator=gen)


def _median_ms(fn, repeats: int) -> float:
    fn()   # warm
    laps = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        laps.append(time.perf_counter() - t0)
    return round(1000 * statistics.median(laps), 3)


def measure(bs: int, width: int, vocab: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(bs)
    logits = torch.randn(bs, width, vocab, generator=gen)
    pen, candidates = _inputs(bs, width, vocab, gen)
    pool, generated = torch.zeros(64, vocab), torch.zeros(64, dtype=torch.int64)
    rows, accept = torch.arange(bs), torch.randint(0, width, (bs,), generator=gen)
    broadcast = torch.randn(bs, vocab, generator=gen)
    return {
        "batch_size": bs, "width": width, "vocab": vocab,
        "per_position_ms": _median_ms(lambda: apply_block_penalties(logits, candidates, pen), repeats),
        "commit_ms": _median_ms(lambda: commit_counts(pool, generated, rows, candidates, accept), repeats),
        "broadcast_ms": _median_ms(lambda: logits.add_(broadcast[:, None, :]), repeats),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/penalty-cost")
    args = ap.parse_args(argv)
    records = [measure(bs, args.width, args.vocab, args.repeats) for bs in BATCH_SIZES]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    (out / "penalty_cost.json").write_text(json.dumps({"machine": info, "records": records}, indent=2))
    lines = [f"# Per-position penalties: cost per verify step ({info.get('cpu')}, {info.get('cpu_count')} cores, "
             f"torch threads {torch.get_num_threads()}, float32, width {args.width}, vocabulary {args.vocab})", "",
             "`python -m benchmarks.penalty_cost` (median of %d). Every request with frequency, presence and "
             "repetition penalties and min new tokens; 0.5.23's block-wide broadcast beside it." % args.repeats, "",
             "| batch | per position (ms) | commit (ms) | 0.5.23's broadcast (ms) |", "|---|---|---|---|"]
    lines += [f"| {r['batch_size']} | {r['per_position_ms']} | {r['commit_ms']} | {r['broadcast_ms']} |"
              for r in records]
    (out / "penalty_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
