"""Summary tables and plots from raw JSONL records, laid out like the model cards.

    python -m benchmarks.report RECORDS.jsonl --out DIR        # write summary.md + PNG plots
    python -m benchmarks.report RECORDS.jsonl --check SUMMARY.md  # recompute, fail on any difference

Definitions (all from the records alone):
- throughput of one run (method, task, concurrency, repeat) = its completion tokens / (last
  end - first start); a cell is the mean over repeats, with the spread (population stdev);
- speedup = a method's throughput / target-only throughput on the same task and concurrency;
- macro speedup = arithmetic mean of the per-workload speedups;
- accept length = tokens committed by verification steps / verification steps (bonus included);
- equal output (where records carry the HF benchmark's `equal_output`): requests whose greedy
  completion equals target-only decoding's on the same prompt, token for token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from typing import Optional

from .records import TARGET_ONLY, Record, read


def write_markdown(out_dir: str, name: str, lines: list[str]) -> str:
    """A benchmark's markdown result: `lines` written to `out_dir/name` and printed."""
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return text


def run_throughputs(records: list[Record]) -> dict[tuple[str, str, int], list[float]]:
    runs: dict[tuple, list[Record]] = defaultdict(list)
    for r in records:
        runs[(r.method, r.task, r.concurrency, r.repeat)].append(r)
    out: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for (method, task, conc, _), rs in sorted(runs.items()):
        wall = max(r.end_s for r in rs) - min(r.start_s for r in rs)
        out[(method, task, conc)].append(sum(r.completion_tokens for r in rs) / wall if wall > 0 else 0.0)
    return out


def accept_lengths(records: list[Record]) -> dict[tuple[str, str, int], float]:
    steps: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        acc = steps[(r.method, r.task, r.concurrency)]
        acc[0] += r.accepted_tokens
        acc[1] += r.verify_steps
    return {k: a / s for k, (a, s) in steps.items() if s}


def equal_outputs(records: list[Record]) -> dict[tuple[str, str, int], list[Optional[int]]]:
    """(method, task, concurrency) -> per checked request, where its completion first differs
    from target-only decoding's (None: equal), from the records' `equal_output`."""
    out: dict[tuple[str, str, int], list[Optional[int]]] = defaultdict(list)
    for r in records:
        if r.equal_output is not None:
            out[(r.method, r.task, r.concurrency)].append(None if r.equal_output else r.first_difference or 0)
    return dict(out)


def summarize(records: list[Record], title: str = "Benchmark") -> str:
    tps = run_throughputs(records)
    acc = accept_lengths(records)
    methods = [m for m in dict.fromkeys(r.method for r in records)]
    methods.sort(key=lambda m: (m != TARGET_ONLY, m))
    tasks = list(dict.fromkeys(r.task for r in records))
    concs = sorted({r.concurrency for r in records})
    lines = [f"# {title}", "", "Each cell: output tok/s (speedup vs target-only); `±` is the spread over repeats.", ""]
    for conc in concs:
        lines += [f"## Concurrency {conc}", "", "| workload | " + " | ".join(methods) + " |",
                  "|---|" + "---|" * len(methods)]
        ratios: dict[str, list[float]] = defaultdict(list)
        for task in tasks:
            base = statistics.mean(tps[(TARGET_ONLY, task, conc)]) if (TARGET_ONLY, task, conc) in tps else None
            cells = []
            for m in methods:
                vals = tps.get((m, task, conc))
                if not vals:
                    cells.append("—")
                    continue
                mean = statistics.mean(vals)
                spread = f" ± {statistics.pstdev(vals):.1f}" if len(vals) > 1 else ""
                if base:
                    ratios[m].append(mean / base)
                    cells.append(f"{mean:.1f}{spread} ({mean / base:.2f}×)")
                else:
                    cells.append(f"{mean:.1f}{spread}")
            lines.append(f"| {task} | " + " | ".join(cells) + " |")
        lines.append("| **macro speedup** | " + " | ".join(
            f"{statistics.mean(ratios[m]):.2f}×" if ratios[m] else "—" for m in methods) + " |")
        lines.append("")
    spec = [m for m in methods if m != TARGET_ONLY]
    if spec:
        lines += ["## Accept length", "", "Tokens per target verification step, bonus included.", "",
                  "| workload | concurrency | " + " | ".join(spec) + " |", "|---|---|" + "---|" * len(spec)]
        for conc in concs:
            for task in tasks:
                lines.append(f"| {task} | {conc} | " + " | ".join(
                    f"{acc[(m, task, conc)]:.2f}" if (m, task, conc) in acc else "—" for m in spec) + " |")
        lines.append("")
    lines += _adaptive_section(tps, methods, tasks, concs)
    lines += _equal_section(equal_outputs(records), methods, tasks, concs)
    return "\n".join(lines)


def _equal_section(equal, methods, tasks, concs) -> list[str]:
    checked = [m for m in methods if any(k[0] == m for k in equal)]
    if not checked:
        return []
    lines = ["## Equal output", "",
             "Requests whose greedy completion equals target-only decoding's on the same prompt, token for token "
             "(target-only: its repeats against its first run); where some differ, the first differing token "
             "index (smallest).", "",
             "| workload | concurrency | " + " | ".join(checked) + " |", "|---|---|" + "---|" * len(checked)]
    for conc in concs:
        for task in tasks:
            cells = []
            for m in checked:
                firsts = equal.get((m, task, conc))
                if not firsts:
                    cells.append("—")
                    continue
                differ = [f for f in firsts if f is not None]
                cells.append(f"{len(firsts) - len(differ)} of {len(firsts)}"
                             + (f" (first at {min(differ)})" if differ else ""))
            lines.append(f"| {task} | {conc} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


ADAPTIVE_SUFFIX = "-adaptive"


def _adaptive_section(tps, methods, tasks, concs) -> list[str]:
    """`<draft>-adaptive` against the best of target-only and the same draft's fixed widths
    (`<draft>`, `<draft>-w<W>`) at each concurrency, per workload."""
    adaptive = [m for m in methods if m.endswith(ADAPTIVE_SUFFIX)]
    if not adaptive:
        return []
    lines = ["## Adaptive verify width", "",
             "Adaptive tok/s / the best of target-only and the same draft's fixed widths (which one in brackets).", "",
             "| workload | concurrency | " + " | ".join(adaptive) + " |", "|---|---|" + "---|" * len(adaptive)]
    for conc in concs:
        for task in tasks:
            cells = []
            for m in adaptive:
                draft = m[: -len(ADAPTIVE_SUFFIX)]
                rivals = [r for r in methods if r == TARGET_ONLY or r == draft or r.startswith(draft + "-w")]
                scored = {r: statistics.mean(tps[(r, task, conc)]) for r in rivals if tps.get((r, task, conc))}
                mine = tps.get((m, task, conc))
                if not scored or not mine:
                    cells.append("—")
                    continue
                best = max(scored, key=scored.get)
                cells.append(f"{statistics.mean(mine) / scored[best]:.2f}× ({best})")
            lines.append(f"| {task} | {conc} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def plot(records: list[Record], out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps, acc = run_throughputs(records), accept_lengths(records)
    tasks = list(dict.fromkeys(r.task for r in records))
    spec = sorted({r.method for r in records} - {TARGET_ONLY})
    files = []
    for conc in sorted({r.concurrency for r in records}):
        for kind in ("speedup", "accept_length"):
            fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(tasks)), 3.2))
            width = 0.8 / max(len(spec), 1)
            for i, m in enumerate(spec):
                vals = []
                for t in tasks:
                    if kind == "speedup":
                        base = tps.get((TARGET_ONLY, t, conc))
                        mine = tps.get((m, t, conc))
                        vals.append(statistics.mean(mine) / statistics.mean(base) if base and mine else 0.0)
                    else:
                        vals.append(acc.get((m, t, conc), 0.0))
                ax.bar([x + i * width for x in range(len(tasks))], vals, width, label=m)
            if kind == "speedup":
                ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks([x + width * (len(spec) - 1) / 2 for x in range(len(tasks))], tasks)
            ax.set_ylabel("speedup vs target-only" if kind == "speedup" else "accept length")
            ax.set_title(f"{kind.replace('_', ' ')}, concurrency {conc}")
            files.append(_save(plt, fig, ax, os.path.join(out_dir, f"{kind}_c{conc}.png")))
    concs = sorted({r.concurrency for r in records})
    if len(concs) > 1:
        files += _plot_throughput(plt, tps, tasks, concs, [TARGET_ONLY] + spec, out_dir)
    return files


def _plot_throughput(plt, tps, tasks, concs, methods, out_dir) -> list[str]:
    """Output tokens/s against concurrency, one line per method, one figure per workload."""
    files = []
    for task in tasks:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in methods:
            xs = [c for c in concs if tps.get((m, task, c))]
            if xs:
                style = "--" if m == TARGET_ONLY else "-"
                ax.plot(xs, [statistics.mean(tps[(m, task, c)]) for c in xs], style, marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"throughput, {task}")
        ax.grid(alpha=0.3)
        files.append(_save(plt, fig, ax, os.path.join(out_dir, f"throughput_{task}.png")))
    return files


def _save(plt, fig, ax, path: str) -> str:
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records")
    parser.add_argument("--out", help="directory for summary.md and the plots")
    parser.add_argument("--check", help="a summary.md to reproduce exactly from the records")
    parser.add_argument("--title", default="Benchmark")
    args = parser.parse_args(argv)
    records = read(args.records)
    if args.check:
        with open(args.check, encoding="utf-8") as fh:
            stored = fh.read()
        title = stored.splitlines()[0].removeprefix("# ") if stored else args.title
        fresh = summarize(records, title)
        if fresh.strip() != stored.strip():
            import difflib

            sys.stdout.writelines(difflib.unified_diff(stored.splitlines(True), fresh.splitlines(True),
                                                       "stored", "recomputed"))
            print(f"\n{args.check} does not match what {args.records} gives", file=sys.stderr)
            return 1
        print(f"{args.check}: every cell reproduced from {args.records}")
        return 0
    out = args.out or os.path.dirname(args.records) or "."
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(summarize(records, args.title) + "\n")
    for path in plot(records, out):
        print(f"wrote {path}")
    print(f"wrote {os.path.join(out, 'summary.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
