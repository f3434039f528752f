"""Servers side by side, taking turns: the test bed's plain server and Domino servers with
adaptive settings, on a machine whose speed drifts by tens of percent from minute to minute.

The servers run at once (`--sleep-on-idle`: an idle one does not poll) and each group of
`concurrency` requests goes to every server in turn, the order rotated from group to group;
a server's throughput is its tokens over the summed wall time of its own groups. Every
output is compared with the plain server's (greedy: equal texts).

A group is sent at once and ends with its slowest request, so its last steps run a
shrinking batch (`--turn`'s default, the concurrency). `--turn N` (a multiple of the
concurrency) gives each server N requests per turn with at most `concurrency` in flight, a
new one sent as soon as one ends: a steady load, as SGLang's `bench_serving
--max-concurrency` and `benchmarks.peer_ab` measure, the batch refilled until the turn's
last requests.

Servers (`--servers`): `plain`; Domino pinned to one width (`--speculative-adaptive` with
`{"widths": [16, W], "pin": [W]}`): `width 1, context late` (the draft's context written
when the draft next needs it, `draft_context`, the default), `width 1, context every step`
(`defer_context: false`, as 0.5.23 writes it), `width 1, verify path` (width 1 through
0.5.23's verify at one token, `decode_step: false`, instead of the target's decode path),
`width 16` and `width 8`; `adaptive` (the
default policy) and `adaptive, prices as timed` (`track_speed: false`: each width keeps the
price of its own last timings, not following the machine's speed). Float32 unless `--dtype`, the held-out requests, greedy unless `--temperature`.

    python -m benchmarks.interleaved_ab [--rounds 3] [--concurrencies 1 8] [--prompts 16]
        [--servers plain "width 1, context late" ...] [--temperature T --top-k K --top-p P]
        [--max-new-tokens N] [--turn N] [--out DIR]

Writes `interleaved_ab.json` (every group) and `interleaved_ab.md` (each server / plain
overall and per round; the CPU named) to DIR (default benchmarks/results/width1-step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from typing import Optional

from .common import add_load_arguments, bench_config, render_prompts, sampling
from .load import Client, steady
from .machine import cpu_label, machine
from .report import write_markdown

DRAFT = "domino"
# server -> adaptive settings (None: the plain target)
SERVERS = {
    "plain": None,
    "width 1, context late": {"widths": [16, 1], "pin": [1]},
    "width 1, context every step": {"widths": [16, 1], "pin": [1], "defer_context": False},
    "width 1, verify path": {"widths": [16, 1], "pin": [1], "decode_step": False},
    "width 16": {"widths": [16, 1], "pin": [16]},
    "width 8": {"widths": [16, 8], "pin": [8]},
    "adaptive": {},
    "adaptive, prices as timed": {"track_speed": False},
    # each request's acceptance pulled harder towards the server's (32 pseudo-counts, not 4)
    "adaptive, prior weight 32": {"prior_weight": 32.0},
    "adaptive, prior weight 32, slow decay": {"prior_weight": 32.0, "request_decay": 0.97},
    # the defaults before 2026-12-04: a request's counts kept through its width-1 steps,
    # 4 pseudo-counts of the server's rates behind them; then the width-1 fade alone, and
    # the fade with 1 pseudo-count (the defaults since)
    "adaptive, before width-1 fade": {"unverified_decay": 1.0, "prior_weight": 4.0},
    "adaptive, width-1 fade": {"unverified_decay": 0.9, "prior_weight": 4.0},
    "adaptive, width-1 fade, prior weight 1": {"unverified_decay": 0.9, "prior_weight": 1.0},
    "adaptive, uncalibrated": {"calibrate": False},
}
# the same servers with one OpenMP thread (docs/cpu-profile.md: on 2 cores the second
# thread waits on the first at every small op)
ONE_THREAD = ", 1 thread"
# the same servers with the compiled CPU step: layers, context write and Domino rollout under
# torch.compile (`--enable-torch-compile`, sglang_domino/sglang/cpu/compiled/forward.py)
COMPILED = ", compiled"
# the plain server in the scheduler's synchronous loop, the loop DFLASH runs on CPU (docs/cpu.md)
SYNC_LOOP = ", synchronous loop"
SERVERS.update({name + ONE_THREAD: SERVERS[name] for name in ("plain", "width 16", "adaptive")})
SERVERS.update({name + COMPILED: SERVERS[name] for name in ("plain", "width 16", "adaptive")})
SERVERS["plain" + SYNC_LOOP] = None


def server_env(name: str) -> Optional[dict]:
    """The environment of server `name` (None: this process's)."""
    if name.endswith(ONE_THREAD):
        return {**os.environ, "OMP_NUM_THREADS": "1"}
    return None


def server_flags(name: str) -> tuple[str, ...]:
    """`sglang serve` flags of server `name` beyond the benchmark's command and its draft."""
    extra: tuple[str, ...] = ("--sleep-on-idle",)
    if name.endswith(SYNC_LOOP):
        extra += ("--disable-overlap-schedule",)
    if name.endswith(COMPILED):
        extra += ("--enable-torch-compile",)
    return extra


@contextlib.contextmanager
def serve(cfg, name: str, out: str, trace: Optional[str] = None):
    """One server of SERVERS, healthy; its URL. `trace`: a directory where an adaptive
    server records its steps' acceptance (`AdaptiveWidthConfig.trace`, one subdirectory
    per server) for `benchmarks.policy_replay`."""
    from sglang_domino.launch import free_port, start

    settings = SERVERS[name]
    slug = name.replace(" ", "-").replace(",", "")
    extra = server_flags(name)
    draft = None
    if settings is not None:
        if trace:
            settings = {**settings, "trace": os.path.join(os.path.abspath(trace), slug)}
        path = os.path.join(out, f"adaptive-{slug}.json")
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(settings, fh)
        draft = next(d for d in cfg.draft_models if os.path.basename(d.rstrip("/")) == DRAFT)
        extra += ("--speculative-adaptive", "--speculative-adaptive-config", path)
    port = free_port()
    with start(cfg.launch_command(port, draft, extra), port, os.path.join(out, f"server-{slug}.log"),
               cfg.server_timeout, env=server_env(name)) as server:
        yield server.url


def turns(prompts: int, concurrency: int, turn: Optional[int] = None) -> list[tuple[int, int]]:
    """[first, end) of each turn's prompts: `turn` requests a turn (default: one group of
    `concurrency`), the last turn shorter where they do not divide."""
    turn = concurrency if turn is None else turn
    if turn < concurrency or turn % concurrency:
        raise ValueError(f"--turn must be a multiple of the concurrency {concurrency}, got {turn}")
    return [(first, min(first + turn, prompts)) for first in range(0, prompts, turn)]


def run_group(client: Client, prompts: list[str], in_flight: Optional[int] = None) -> dict:
    """`prompts`, at most `in_flight` at a time (default: all at once), the next sent as
    soon as one ends (`benchmarks.load.steady`); wall time, tokens, verify steps, texts."""
    run = steady(client, prompts, min(len(prompts), in_flight or len(prompts)))
    return {"wall_s": run.wall_s, "tokens": run.tokens, "verify_steps": run.verify_steps,
            "texts": [r.text for r in run.records]}


def summary(runs: list[dict], servers: list[str], concurrencies: list[int], rounds: int, header: list[str],
            compare_texts: bool = True) -> list[str]:
    """The markdown table: per server and concurrency its tok/s (tokens over its own summed
    wall time), over plain's overall and per round, tokens per verify step, and whether
    every output equals plain's of the same group."""
    def tps(name, conc, rnd=None):
        mine = [r for r in runs if r["server"] == name and r["concurrency"] == conc and rnd in (None, r["round"])]
        return sum(r["tokens"] for r in mine) / sum(r["wall_s"] for r in mine)

    has_plain = "plain" in servers
    lines = ["# Served side by side, taking turns", "", *header, "",
             "| server | concurrency | tok/s | / plain | per round / plain | tokens per step | outputs = plain |",
             "|---|---|---|---|---|---|---|"]
    for name in servers:
        for conc in concurrencies:
            mine = [r for r in runs if r["server"] == name and r["concurrency"] == conc]
            plain = {(r["round"], r["group"]): r["texts"] for r in runs
                     if r["server"] == "plain" and r["concurrency"] == conc}
            same = (all(r["texts"] == plain[(r["round"], r["group"])] for r in mine)
                    if plain and compare_texts else None)
            steps = sum(r["verify_steps"] for r in mine)
            per_step = f"{sum(r['tokens'] for r in mine) / steps:.2f}" if steps else "-"
            vs = f"{tps(name, conc) / tps('plain', conc):.2f}x" if has_plain else "-"
            per_round = (", ".join(f"{tps(name, conc, k) / tps('plain', conc, k):.2f}" for k in range(rounds))
                         if has_plain else "-")
            lines.append(f"| {name} | {conc} | {tps(name, conc):.1f} | {vs} | {per_round} | {per_step} | "
                         f"{'-' if same is None else 'yes' if same else 'NO'} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_load_arguments(ap, rounds=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tp-size", type=int, default=1, help="every server's --tp-size (ranks over gloo on CPU)")
    ap.add_argument("--max-new-tokens", type=int, default=128,
                    help="a longer generation gives the adaptive policy more steps per request group")
    ap.add_argument("--servers", nargs="+", default=["plain", "width 1, context late", "width 1, context every step",
                                                      "width 16"], choices=list(SERVERS))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "width1-step"))
    ap.add_argument("--report", action="store_true", help="rewrite the markdown from DIR/interleaved_ab.json")
    ap.add_argument("--turn", type=int, help="requests a server is given per turn, at most the concurrency in "
                                             "flight (default: one group of the concurrency, sent at once)")
    ap.add_argument("--trace", help="a directory where the adaptive and pinned servers record each decode step's "
                                    "acceptance (for benchmarks.policy_replay)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.report:
        with open(os.path.join(args.out, "interleaved_ab.json"), encoding="utf-8") as fh:
            saved = json.load(fh)
        write_markdown(args.out, "interleaved_ab.md", summary(
            saved["runs"], list(saved["servers"]), saved["concurrencies"], saved["rounds"], saved["header"],
            compare_texts=not saved["temperature"]))
        return
    cfg = bench_config(args.prompts, args.concurrencies, args.temperature, args.top_k, args.top_p, args.dtype)
    cfg = cfg.model_copy(update={"max_new_tokens": args.max_new_tokens, "tp_size": args.tp_size})
    prompts = render_prompts(cfg)
    runs = []
    with contextlib.ExitStack() as stack:
        clients = {name: Client(stack.enter_context(serve(cfg, name, args.out, args.trace)), sampling(cfg))
                   for name in args.servers}
        for client in clients.values():
            run_group(client.with_tokens(16), prompts[: max(args.concurrencies)])
        turn = 0
        for rnd in range(args.rounds):
            for conc in args.concurrencies:
                for first, end in turns(len(prompts), conc, args.turn):
                    group = prompts[first: end]
                    order = args.servers[turn % len(args.servers):] + args.servers[: turn % len(args.servers)]
                    turn += 1
                    for name in order:
                        runs.append({"round": rnd, "concurrency": conc, "group": first, "server": name,
                                     **run_group(clients[name], group, in_flight=conc)})
                print(json.dumps({"round": rnd, "concurrency": conc, **{
                    name: round(sum(r["tokens"] for r in runs if r["server"] == name and r["round"] == rnd
                                    and r["concurrency"] == conc)
                                / sum(r["wall_s"] for r in runs if r["server"] == name and r["round"] == rnd
                                      and r["concurrency"] == conc), 1) for name in args.servers}}), flush=True)
    info = machine()
    sampling = ("greedy" if args.temperature == 0
                else f"temperature {args.temperature}, top-k {args.top_k}, top-p {args.top_p}")
    servers = " ".join(f'"{s}"' if " " in s else s for s in args.servers)
    command = (f"python -m benchmarks.interleaved_ab --rounds {args.rounds} --concurrencies "
               f"{' '.join(map(str, args.concurrencies))} --prompts {args.prompts} --servers {servers}")
    if args.temperature:
        command += f" --temperature {args.temperature} --top-k {args.top_k} --top-p {args.top_p}"
    if args.dtype != "float32":
        command += f" --dtype {args.dtype}"
    if args.max_new_tokens != 128:
        command += f" --max-new-tokens {args.max_new_tokens}"
    if args.tp_size != 1:
        command += f" --tp-size {args.tp_size}"
    if args.turn:
        command += f" --turn {args.turn}"
    taking = ("taking turns group by group" if not args.turn else
              f"taking turns every {args.turn} requests, each turn a steady load (at most the concurrency in flight)")
    header = [f"Test bed, {args.dtype}{f', --tp-size {args.tp_size}' if args.tp_size != 1 else ''}, "
              f"{args.prompts} held-out requests, {cfg.max_new_tokens} new tokens, {sampling}; "
              f"the servers side by side, {taking} ({args.rounds} rounds); output tok/s over each "
              f"server's own wall time. CPU: {cpu_label(info)}, {info.get('cpu_count')} cores. "
              f"Command: `{command}`."]
    with open(os.path.join(args.out, "interleaved_ab.json"), "w", encoding="utf-8") as fh:
        json.dump({"machine": info, "dtype": args.dtype, "max_new_tokens": cfg.max_new_tokens,
                   "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                   "prompts": args.prompts, "rounds": args.rounds, "turn": args.turn, "concurrencies": args.concurrencies,
                   "servers": {s: SERVERS[s] for s in args.servers}, "header": header, "runs": runs}, fh, indent=1)
    lines = summary(runs, args.servers, args.concurrencies, args.rounds, header, compare_texts=not args.temperature)
    write_markdown(args.out, "interleaved_ab.md", lines)


if __name__ == "__main__":
    main()
