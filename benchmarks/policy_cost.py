"""The adaptive verify-width policy's own cost per decode step (`sglang_domino.sglang.adaptive`).

`AdaptiveWidth.choose` and `observe_step` run on the scheduler's host thread every decode
step, so their cost adds to every step. This times both at several batch sizes in the
worst case for the policy: every request has its own counts, every width has a measured
cost (all are candidates), and acceptance is random. Pure Python and numpy; no sglang.

    python -m benchmarks.policy_cost [--steps 400] [--out benchmarks/results]

writes `policy_cost.json` (the records and the machine) and `policy_cost.md` (the table).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from benchmarks.machine import machine
from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig

BATCH_SIZES = (1, 8, 32, 64, 128, 256)

# The implementation before the rows were vectorised, as the review measured it (per-request
# Python loops, 2 shared cores): kept as text, since the old code is not in the package.
PRIOR = ("Before (a Python loop per request, the server counts decayed once per request), the review "
         "measured about 1 ms `choose` + 1.5 ms `observe_step` per step at batch 256 and "
         "0.08 + 0.2 ms at batch 32, on 2 shared cores.")


def measure(bs: int, steps: int, seed: int = 0) -> dict:
    """Median milliseconds per step of `choose`, `observe_step` and the two together."""
    policy = AdaptiveWidth(AdaptiveWidthConfig())
    rng = random.Random(seed)
    rids = [f"req-{bs}-{i}" for i in range(bs)]
    # every width measured, cost growing gently with the width: all five are candidates
    # and the widest usually wins, so nearly every step has acceptance to learn from
    for w in policy.widths:
        policy.observe_cost(bs, w, 0.01 * (1 + w / 64))
    policy.observe_step(rids, 16, [rng.randrange(16) for _ in rids])  # each request's own counts
    choose, observe, total = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        width = policy.choose(rids)
        t1 = time.perf_counter()
        # a list of ints, as 0.5.23's `on_verify_complete_cpu` passes them
        accepted = [rng.randrange(width) for _ in rids]
        t2 = time.perf_counter()
        policy.observe_step(rids, width, accepted)
        t3 = time.perf_counter()
        choose.append(t1 - t0)
        observe.append(t3 - t2)
        total.append(t1 - t0 + t3 - t2)
    ms = lambda xs: round(1000 * statistics.median(xs), 4)  # noqa: E731
    return {"batch_size": bs, "steps": steps, "choose_ms": ms(choose), "observe_ms": ms(observe),
            "total_ms": ms(total)}


def table(records: list[dict]) -> str:
    lines = ["| batch size | choose (ms) | observe_step (ms) | together (ms) |", "|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['batch_size']} | {r['choose_ms']:.3f} | {r['observe_ms']:.3f} | {r['total_ms']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="timed steps per batch size (the median is kept)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"),
                        help="folder for policy_cost.json and policy_cost.md")
    args = parser.parse_args(argv)
    records = [measure(bs, args.steps) for bs in args.batch_sizes]
    info = machine()
    cpu = f"{info.get('cpu') or info['processor']}, {info['cpu_count']} cores"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy_cost.json").write_text(json.dumps({"machine": info, "records": records}, indent=2) + "\n")
    md = (f"# Adaptive verify width: the policy's cost per decode step\n\n"
          f"Median milliseconds of `AdaptiveWidth.choose` and `observe_step` per step, {args.steps} steps "
          f"per batch size; every request has its own counts, acceptance is random.\n"
          f"CPU: {cpu}. Command: `python -m benchmarks.policy_cost`.\n\n{table(records)}\n\n> {PRIOR}\n")
    (out / "policy_cost.md").write_text(md)
    print(f"CPU: {cpu}\n\n{table(records)}")
    return records


if __name__ == "__main__":
    main()
