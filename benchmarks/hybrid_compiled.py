"""A hybrid target (Qwen3.5: gated delta-net and gated attention layers) served eagerly and with
`--enable-torch-compile`, side by side (issue 44: "a hybrid target served with the flag: faster
than the same server eager").

The target is `hybrid_replay`'s tiny Qwen3.5 (its `Geometry`: 8 layers, every 4th gated
attention, the others gated delta-net; its recurrent state matters), with a random Domino
draft; the requests are `hybrid_replay`'s tie-free prompts, with Transformers' greedy
continuations as the oracle. Four servers run at once (`--sleep-on-idle`: an idle one does
not poll), every one with `--tp-size` (default 1):

- `plain`, `plain, compiled`: no speculation, eager and with the flag;
- `domino`, `domino, compiled`: DFLASH with the Domino draft (width 16), eager and with the flag.

Each group of `concurrency` requests goes to every server in turn, the order rotated from group
to group (as `benchmarks.interleaved_ab`); a server's throughput is its tokens over the summed
wall time of its own groups. Every output of a compiled server is compared with its eager twin's, and
each server's with the oracle's tokens.

    python -m benchmarks.hybrid_compiled [--rounds 3] [--concurrencies 1 8] [--requests 16]
        [--max-new-tokens 64] [--tp-size 1] [--out DIR]

Writes `hybrid_compiled.json` (every group) and `hybrid_compiled.md` (each compiled server over
its eager twin, overall and per round; the CPU named) to DIR (default
benchmarks/results/hybrid-compiled/); `--from-json JSON` rewrites the table from a record alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

from .hybrid_replay import (BLOCK, HYBRID_ARGS, MAMBA_RATIO, STARTUP_TIMEOUT, Geometry, build_models,
                            tie_free_requests)
from .load import Client, Sampling, steady, warm_up
from .machine import cpu_label, machine
from .report import write_markdown

SERVERS = ("plain", "plain, compiled", "domino", "domino, compiled")
COMPILED = ", compiled"
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results", "hybrid-compiled")


def server_args(name: str, paths: dict, common: list[str]) -> list[str]:
    """`sglang serve` arguments of server `name`."""
    args = ["--model-path", paths["target"], "--device", "cpu", "--dtype", "float32", "--sleep-on-idle",
            *HYBRID_ARGS, *common]
    if name.startswith("domino"):
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", paths["domino"],
                 "--speculative-dflash-block-size", str(BLOCK)]
    if name.endswith(COMPILED):
        args += ["--enable-torch-compile"]
    return args


@contextlib.contextmanager
def serve(name: str, paths: dict, common: list[str], out: str):
    """Server `name`, healthy; yields (its URL, its start-up seconds)."""
    from sglang_domino.launch import free_port, isolated_env, sglang_command, start

    port = free_port()
    t0 = time.time()
    log = os.path.join(out, f"server-{name.replace(', ', '-')}.log")
    with start(sglang_command(server_args(name, paths, common), port), port, log, STARTUP_TIMEOUT,
               env=isolated_env(paths["work"]), tail_lines=60) as server:
        yield server.url, time.time() - t0


def tps(runs: list[dict], name: str, conc: int, rnd=None) -> float:
    mine = [r for r in runs if r["server"] == name and r["concurrency"] == conc and rnd in (None, r["round"])]
    return sum(r["tokens"] for r in mine) / sum(r["wall_s"] for r in mine)


def outputs(runs: list[dict], name: str, conc: int) -> dict:
    """{(round, request index): output ids} of server `name` at `conc`."""
    return {(r["round"], r["group"] + i): ids for r in runs if r["server"] == name and r["concurrency"] == conc
            for i, ids in enumerate(r["output_ids"])}


def summarize(data: dict) -> list[str]:
    """The markdown: per server and concurrency its tok/s, a compiled server over its eager
    twin overall and per round, tokens per verify step, whether every output equals the eager
    twin's, and how many requests give Transformers' greedy tokens (the oracle) in every round."""
    runs, s = data["runs"], data["settings"]
    info = data["machine"]
    lines = ["# A hybrid target eager and with `--enable-torch-compile`, side by side", "",
             f"Tiny Qwen3.5 target ({data['geometry']['layers']} layers, every {data['geometry']['interval']}th gated "
             f"attention, the others gated delta-net; hidden {data['geometry']['hidden']}), float32, "
             f"--tp-size {s['tp_size']}, {s['requests']} tie-free requests of {s['prompt_len']} tokens, "
             f"{s['max_new_tokens']} new tokens, greedy; the servers side by side, taking turns group by group "
             f"({s['rounds']} rounds), one OpenMP thread per server process (`launch.isolated_env`); output tok/s "
             f"over each server's own wall time. CPU: {cpu_label(info)}, "
             f"{info.get('cpu_count')} cores. Command: `{s['command']}`.", "",
             "| server | concurrency | tok/s | compiled / eager | per round | tokens per step | outputs = eager "
             "| requests = Transformers |",
             "|---|---|---|---|---|---|---|---|"]
    for name in s["servers"]:
        twin = name[: -len(COMPILED)] if name.endswith(COMPILED) else None
        for conc in s["concurrencies"]:
            mine = [r for r in runs if r["server"] == name and r["concurrency"] == conc]
            steps = sum(r["verify_steps"] for r in mine)
            per_step = f"{sum(r['tokens'] for r in mine) / steps:.2f}" if steps else "1"
            ratio, per_round = "-", "-"
            if twin in s["servers"]:
                ratio = f"{tps(runs, name, conc) / tps(runs, twin, conc):.2f}x"
                per_round = ", ".join(f"{tps(runs, name, conc, k) / tps(runs, twin, conc, k):.2f}"
                                      for k in range(s["rounds"]))
            got = outputs(runs, name, conc)
            same = "-" if twin not in s["servers"] else "yes" if got == outputs(runs, twin, conc) else "NO"
            oracle = sum(all(got[(k, i)] == want for k in range(s["rounds"])) for i, want in enumerate(data["oracle"]))
            lines.append(f"| {name} | {conc} | {tps(runs, name, conc):.1f} | {ratio} | {per_round} | {per_step} | "
                         f"{same} | {oracle} of {len(data['oracle'])} |")
    starts = ", ".join(f"{name} {data['startup_s'][name]:.0f} s" for name in s["servers"])
    lines += ["", "A request whose tokens differ from Transformers' in every server alike, the eager plain server "
                  "included, differs by the float32 kernels (the CPU stand-ins against Transformers' own), not by the "
                  "compiled step.",
              "", f"Start-up (command to healthy, the four started one after another, compiling on a cold cache): "
                  f"{starts}."]
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tp-size", type=int, default=1, help="every server's --tp-size (ranks over gloo on CPU)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--from-json", help="run nothing: rewrite hybrid_compiled.md in --out from this JSON")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as fh:
            write_markdown(args.out, "hybrid_compiled.md", summarize(json.load(fh)))
        return
    work = tempfile.mkdtemp(prefix="hybrid-compiled-")
    try:
        _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args, work: str) -> None:
    from sglang_domino.testing import save_tiny_draft

    mrr = max(args.concurrencies)
    # the mamba pool capped as `hybrid_replay` caps it: sized from free memory, four servers' pools
    # at --tp-size 2 (8 GB a rank) ran this 24 GB machine out of memory
    common = ["--max-running-requests", str(mrr), "--max-total-tokens", str(max(4096, 4 * mrr * 128)),
              "--max-mamba-cache-size", str(MAMBA_RATIO * mrr), "--tp-size", str(args.tp_size)]
    geom = Geometry()
    paths, target = build_models(work, geom)
    paths["domino"] = os.path.join(work, "domino")
    save_tiny_draft(paths["domino"], target, "domino", block_size=BLOCK, seed=1)
    prompts, oracle, _ = tie_free_requests(target, args.requests, args.max_new_tokens)
    del target
    sampling = Sampling(args.max_new_tokens, ignore_eos=True)
    runs, startup = [], {}
    logs = tempfile.mkdtemp(prefix="hybrid-compiled-logs-")   # kept: a failed server's whole log
    print(f"server logs in {logs}", flush=True)
    with contextlib.ExitStack() as stack:
        clients = {}
        for name in SERVERS:
            url, startup[name] = stack.enter_context(serve(name, paths, common, logs))
            clients[name] = Client(url, sampling, timeout=1200)
            warm_up(clients[name], prompts[:mrr], 8)
        turn = 0
        for rnd in range(args.rounds):
            for conc in args.concurrencies:
                for first in range(0, len(prompts), conc):
                    group = prompts[first: first + conc]
                    order = SERVERS[turn % len(SERVERS):] + SERVERS[: turn % len(SERVERS)]
                    turn += 1
                    for name in order:
                        run = steady(clients[name], group, len(group))
                        runs.append(dict(round=rnd, concurrency=conc, group=first, server=name, wall_s=run.wall_s,
                                         tokens=run.tokens, verify_steps=run.verify_steps,
                                         output_ids=[r.output_ids for r in run.records]))
                print(json.dumps({"round": rnd, "concurrency": conc,
                                  **{n: round(tps(runs, n, conc, rnd), 1) for n in SERVERS}}), flush=True)
    command = " ".join(["python -m benchmarks.hybrid_compiled", *args.argv])
    data = dict(machine=machine(), geometry=asdict(geom),
                settings=dict(rounds=args.rounds, concurrencies=args.concurrencies, requests=len(prompts),
                              prompt_len=len(prompts[0]), max_new_tokens=args.max_new_tokens, tp_size=args.tp_size,
                              servers=list(SERVERS), common_args=common, command=command.strip()),
                oracle=oracle, startup_s=startup, runs=runs)
    with open(os.path.join(args.out, "hybrid_compiled.json"), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    write_markdown(args.out, "hybrid_compiled.md", summarize(data))


if __name__ == "__main__":
    main()
