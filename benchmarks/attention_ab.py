"""0.5.23's torch_native attention loops against the CPU port's batched attention, served:
the test bed's plain and Domino servers, each started with
`SGLANG_DOMINO_DEBUG=upstream-cpu-attention` (upstream) and without it (batched) in alternating order, several rounds, output tok/s at each
concurrency (float32, greedy, the held-out requests).

    python -m benchmarks.attention_ab [--rounds 2] [--concurrencies 1 8] [--out DIR]
    python -m benchmarks.attention_ab --baseline REV [...]

With `--baseline REV` the two sides are the plugin at git revision REV (checked out into a
temporary worktree that the baseline's servers import first, through `PYTHONPATH`) and the
working tree, both with the batched attention: what a change of the plugin buys, served.
`--configs domino+q --temperature 0.6` serves the Domino draft with the q rule
(`--speculative-use-rejection-sampling`) on sampled requests.

Writes `attention_ab.json` (every run) and `attention_ab.md` (medians, second / first side,
the CPU named) to DIR.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile

from .common import add_load_arguments, bench_config, draft_for, render_prompts, sampling
from .load import Client, steady, warm_up
from .machine import machine
from .report import write_markdown

MODES = ("upstream", "batched")
MODE_ENV = {"upstream": {"SGLANG_DOMINO_DEBUG": "upstream-cpu-attention"}, "batched": {}}


@contextlib.contextmanager
def sides(baseline):
    """The two sides, (label, server environment) each: upstream's loops and the batched
    attention; with a baseline revision, the plugin at it and the working tree."""
    if baseline is None:
        yield [(mode, MODE_ENV[mode]) for mode in MODES]
        return
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                          text=True).stdout.strip()
    rev = subprocess.run(["git", "rev-parse", "--short", baseline], check=True, capture_output=True,
                         text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="attention-ab-") as tmp:
        tree = os.path.join(tmp, rev)
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", "-q", tree, rev], check=True)
        try:
            yield [(rev, {"PYTHONPATH": tree}), ("working tree", {})]
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)


def serve_and_measure(cfg, config: str, side: str, env_extra: dict, prompts: list[str], out: str) -> dict[int, float]:
    """One server of `config` (plain or domino) on one side: tok/s per concurrency."""
    from sglang_domino.launch import free_port, start

    from .records import TARGET_ONLY
    from .sglang_bench import Q_FLAG, Q_SUFFIX, check_speculated

    port = free_port()
    cmd = cfg.launch_command(port, draft_for(cfg, config), (Q_FLAG,) if config.endswith(Q_SUFFIX) else ())
    env = {**os.environ, **env_extra}
    method = TARGET_ONLY if config == "plain" else config
    result = {}
    log = os.path.join(out, f"server-{config}-{side.replace(' ', '-')}.log")
    with start(cmd, port, log, cfg.server_timeout, env=env) as server:
        client = Client(server.url, sampling(cfg))
        warm_up(client, prompts[: max(cfg.concurrencies)])
        for conc in cfg.concurrencies:
            client.flush()
            run = steady(client, prompts, conc, method=method, task="heldout")
            check_speculated(method, "heldout", conc, run.records)
            result[conc] = run.tok_per_s
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(ap, rounds=2)
    ap.add_argument("--configs", nargs="+", default=["plain", "domino"],
                    help="plain, a test-bed draft (domino, dflash), or <draft>+q for the q rule")
    ap.add_argument("--baseline", metavar="REV", help="the plugin at this git revision against the working tree")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="add to both sides' servers' environment (e.g. OMP_NUM_THREADS=1)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu-attention"))
    args = ap.parse_args(argv)
    extra_env = dict(item.split("=", 1) for item in args.server_env)
    os.makedirs(args.out, exist_ok=True)
    cfg = bench_config(args.prompts, args.concurrencies, args.temperature, args.top_k, args.top_p)
    prompts = render_prompts(cfg)
    runs = []
    with sides(args.baseline) as both:
        labels = [label for label, _ in both]
        for rnd in range(args.rounds):
            for config in args.configs:
                # alternate which side goes first, round by round
                for side, env in (both if rnd % 2 == 0 else both[::-1]):
                    tps = serve_and_measure(cfg, config, side, {**env, **extra_env}, prompts, args.out)
                    runs.append({"round": rnd, "config": config, "mode": side, "tok_per_s": tps})
                    print(json.dumps(runs[-1]), flush=True)
    info = machine()
    with open(os.path.join(args.out, "attention_ab.json"), "w", encoding="utf-8") as fh:
        json.dump({"machine": info, "dtype": "float32", "max_new_tokens": cfg.max_new_tokens, "sides": labels,
                   "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                   "prompts": args.prompts, "runs": runs}, fh, indent=1)
    first, second = labels
    title = ("0.5.23's torch_native attention loops vs the batched attention" if args.baseline is None
             else f"the CPU port at {first} vs the working tree")
    command = "python -m benchmarks.attention_ab" + (f" --baseline {args.baseline}" if args.baseline else "")
    command += f" --configs {' '.join(args.configs)}" + "".join(f" --server-env {e}" for e in args.server_env)
    if args.temperature:
        command += f" --temperature {args.temperature} --top-k {args.top_k} --top-p {args.top_p}"
    sampling = ("greedy" if args.temperature == 0
                else f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}")
    lines = [f"# Served: {title}", "",
             f"Test bed, float32, {args.prompts} held-out requests, {cfg.max_new_tokens} new tokens, {sampling}; "
             f"servers alternated, {args.rounds} rounds, median output tok/s. CPU: {info.get('cpu', 'unknown')}, "
             f"{info.get('cpu_count')} cores. Command: `{command}`.", "",
             f"| server | concurrency | {first} tok/s | {second} tok/s | {second} / {first} | per round |",
             "|---|---|---|---|---|---|"]
    for config in args.configs:
        for conc in args.concurrencies:
            per = {m: [r["tok_per_s"][conc] for r in runs if r["config"] == config and r["mode"] == m] for m in labels}
            med = {m: statistics.median(v) for m, v in per.items()}
            rounds = ", ".join(f"{b / a:.2f}" for a, b in zip(per[first], per[second]))
            lines.append(f"| {config} | {conc} | {med[first]:.1f} | {med[second]:.1f} | "
                         f"{med[second] / med[first]:.2f}x | {rounds} |")
    write_markdown(args.out, "attention_ab.md", lines)


if __name__ == "__main__":
    main()
