"""The adaptive width policy replayed on a served acceptance trace.

A server pinned to the widest width with `AdaptiveWidthConfig.trace` set (for example
`python -m benchmarks.interleaved_ab --servers "width 16" --trace DIR`) records, for every
decode step, each request's accepted proposals. Read in order, one request's records give
the accepted run at each point of its text where a step started. This replays groups of
such requests (`--concurrencies`, a group sent at once, as `benchmarks.interleaved_ab`
does) under a fixed width, plain decoding, or the policy with given settings:

* a step at width W of a request at text position p commits 1 + min(a, W - 1) tokens,
  where a is the recorded run that covers p, shortened by how far into it p is (a
  rejection stays where it was in the text); width 1 commits one token;
* a step at batch size b and width W costs `a_W + b_W * b` milliseconds (`--costs`, fitted
  on a served run's step timings, see the default), times a lognormal-ish noise, and the
  policy is fed that time as its measured cost, as the worker feeds it a step's lap;
* plain decoding is a width-1 step times `--plain` (a plain server's step is cheaper than
  a speculative server's width-1 step).

It reproduces the served ranking of the servers closely enough to compare policy
settings in seconds instead of an hour of served rounds (docs/adaptive-width.md), but it
is a model: the text at width 1 does not change with the width, costs do not drift, and
prefill is left out.
"""

from __future__ import annotations

import argparse
import bisect
import glob
import json
import os
import random
from collections import OrderedDict
from typing import Optional

from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig

# ms per decode step = a + b * batch size, per width: least squares over the step laps of an
# adaptive float32 server on the temperature-1.5 load (2-core Intel Xeon with AMX, 2026-12-04;
# 600 width-1 laps, 690 at width 16, 85 at width 8, fewer at 2 and 4)
DEFAULT_COSTS = {1: (7.0, 0.36), 2: (12.8, 0.88), 4: (13.0, 0.9), 8: (13.6, 1.36), 16: (15.0, 2.2)}
# a plain server's step over a width-1 step of the speculative server: a server pinned to
# width 1 served 0.87 / 0.84 of plain's tok/s side by side at c8 / c16 on that load
# (benchmarks/results/width1-floor-t1.5-fp32)
DEFAULT_PLAIN = 0.85


def load_traces(directory: str) -> list[list[int]]:
    """Per request (in order of first appearance), its accepted proposals step by step, from
    the steps at the widest width recorded in `directory`'s `accept-*.jsonl`."""
    steps = []
    for path in sorted(glob.glob(os.path.join(directory, "accept-*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            steps.extend(json.loads(line) for line in fh if line.strip())
    if not steps:
        raise ValueError(f"{directory}: no accept-*.jsonl records (AdaptiveWidthConfig.trace)")
    widest = max(s["width"] for s in steps)
    runs: "OrderedDict[str, list[int]]" = OrderedDict()
    for step in steps:
        if step["width"] != widest:
            continue
        for rid, accepted in zip(step["rids"], step["accepted"]):
            runs.setdefault(rid, []).append(int(accepted))
    return [r for r in runs.values() if r]


class Request:
    """One request of a replay: its recorded runs laid out over its text."""

    def __init__(self, rid: str, runs: list[int], max_tokens: int):
        self.rid, self.runs = rid, runs
        self.starts = [0]
        for a in runs[:-1]:
            self.starts.append(self.starts[-1] + 1 + a)
        self.end = min(self.starts[-1] + 1 + runs[-1], max_tokens)
        self.position = 0

    def accepted(self, width: int) -> int:
        """Proposals a step at `width` accepts from here."""
        if width <= 1:
            return 0
        i = bisect.bisect_right(self.starts, self.position) - 1
        left = max(self.runs[i] - (self.position - self.starts[i]), 0)
        return min(left, width - 1)


def step_seconds(costs: dict, bs: int, width: int) -> float:
    a, b = costs[width]
    return (a + b * bs) / 1000.0


def replay(traces: list[list[int]], concurrency: int, width: Optional[int] = None,
           settings: Optional[dict] = None, costs: Optional[dict] = None, plain: Optional[float] = None,
           max_tokens: int = 128, noise: float = 0.08, seed: int = 0) -> float:
    """Tokens per second of one replay: a fixed `width`, plain decoding (`plain`: its step
    over a width-1 step), or the policy with `settings`; groups of `concurrency` requests
    in a seeded order."""
    costs = costs or DEFAULT_COSTS
    rng = random.Random(seed)
    order = list(range(len(traces)))
    rng.shuffle(order)
    policy = AdaptiveWidth(AdaptiveWidthConfig(**(settings or {}))) if width is None and plain is None else None
    tokens = seconds = 0.0
    for first in range(0, len(order), concurrency):
        group = [Request(f"{seed}-{i}", traces[i], max_tokens) for i in order[first: first + concurrency]]
        while group:
            rids = [r.rid for r in group]
            w = 1 if plain is not None else (width if policy is None else policy.choose(rids))
            accepted = [r.accepted(w) for r in group]
            cost = step_seconds(costs, len(group), w) * (plain if plain is not None else 1.0)
            cost *= max(0.5, 1.0 + noise * rng.gauss(0.0, 1.0))
            if policy is not None:
                policy.observe_cost(len(group), w, cost)
                policy.observe_step(rids, w, accepted, policy.last_expected)
            for r, a in zip(group, accepted):
                r.position += 1 + a
                tokens += 1 + a
            seconds += cost
            group = [r for r in group if r.position < r.end]
    return tokens / seconds


def compare(traces, concurrencies, variants: dict, costs=None, plain=DEFAULT_PLAIN, seeds=6,
            widths=(16, 8, 4)) -> list[dict]:
    """Per concurrency: plain and the fixed widths (tok/s) and each policy variant's mean
    and range over `seeds` replays as a share of the best of them."""
    rows = []
    for conc in concurrencies:
        fixed = {"plain": replay(traces, conc, plain=plain, costs=costs)}
        fixed.update({f"width {w}": replay(traces, conc, width=w, costs=costs) for w in widths})
        best = max(fixed, key=fixed.get)
        row = {"concurrency": conc, "fixed": fixed, "best": best, "variants": {}}
        for name, settings in variants.items():
            runs = [replay(traces, conc, settings=settings, costs=costs, seed=s) / fixed[best] for s in range(seeds)]
            row["variants"][name] = {"mean": sum(runs) / len(runs), "min": min(runs), "max": max(runs)}
        rows.append(row)
    return rows


def markdown(rows: list[dict], header: str) -> str:
    names = list(rows[0]["variants"])
    fixed = list(rows[0]["fixed"])
    lines = [header, "", "| concurrency | " + " | ".join(fixed) + " | best | " + " | ".join(names) + " |",
             "|---" * (len(fixed) + len(names) + 2) + "|"]
    for row in rows:
        cells = [f"{row['fixed'][k]:.1f}" for k in fixed]
        cells += [row["best"]]
        cells += [f"{v['mean']:.3f} ({v['min']:.2f}-{v['max']:.2f})" for v in row["variants"].values()]
        lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a directory of accept-*.jsonl from a server pinned to its widest width")
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help='policy settings to replay, e.g. \'before={"unverified_decay": 1.0, "prior_weight": 4}\'')
    ap.add_argument("--costs", help="JSON {width: [a_ms, b_ms_per_request]} (default: DEFAULT_COSTS)")
    ap.add_argument("--plain", type=float, default=DEFAULT_PLAIN)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--out", help="a directory for replay.md and replay.json")
    args = ap.parse_args(argv)
    costs = {int(k): tuple(v) for k, v in json.loads(args.costs).items()} if args.costs else None
    variants = {"defaults": {}}
    for item in args.variant:
        name, _, raw = item.partition("=")
        variants[name] = json.loads(raw)
    traces = load_traces(args.trace)
    rows = compare(traces, args.concurrencies, variants, costs=costs, plain=args.plain, seeds=args.seeds)
    header = (f"Policy replayed on {len(traces)} recorded requests ({args.trace}); fixed servers in tok/s, "
              f"policy variants as a share of the best fixed server (mean over {args.seeds} seeds, range).")
    text = markdown(rows, header)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "replay.md"), "w", encoding="utf-8") as fh:
            fh.write(text)
        with open(os.path.join(args.out, "replay.json"), "w", encoding="utf-8") as fh:
            json.dump({"trace": args.trace, "variants": variants, "costs": costs or DEFAULT_COSTS,
                       "plain": args.plain, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
