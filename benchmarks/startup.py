"""How long a CPU server takes to start: seconds from the command to `/health`, and to the
first token of one request, for the test bed's Domino server eager and with
`--enable-torch-compile`, its scheduler and detokenizer forked (the default) or spawned
(`SGLANG_DOMINO_DEBUG=spawn-cpu-processes`, 0.5.23's way).

    python -m benchmarks.startup --rounds 3 --out benchmarks/results/startup-<cpu>-<date>
    python -m benchmarks.startup --refold --out DIR      # startup.md again from DIR/runs.json

The compile cache is warmed by one unrecorded start of each compiled server first: every
recorded start is a restart on a warm cache, what a user gets from the second start on.
The servers take turns (reversed every other round), one at a time. Each round also times
a fresh interpreter importing `sglang.srt.entrypoints.http_server` and nothing else, what
`sglang serve` imports before it logs anything: the floor under every start, 0.5.23's own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from sglang_domino.demo import KV_TOKENS, read_testbed
from sglang_domino.launch import Server, free_port, sglang_command

from .machine import cpu_label, git_commit, machine

TESTBED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testbed", "checkpoints")
SPAWN_ENV = {"SGLANG_DOMINO_DEBUG": "spawn-cpu-processes"}
CONFIGS = {
    "eager, forked": ((), {}),
    "eager, spawned": ((), SPAWN_ENV),
    "compiled, forked": (("--enable-torch-compile",), {}),
    "compiled, spawned": (("--enable-torch-compile",), SPAWN_ENV),
}
# what the server's log says it spent, and where its children came from
LOG_TIMES = {"target graphs": r"the target's \d+ layers compiled in ([\d.]+) s",
             "draft graphs": r"the draft's \d+ layers compiled in ([\d.]+) s",
             "rollout graphs": r"the compiled Domino rollout at blocks \[[\d, ]+\] in ([\d.]+) s"}
START_METHOD = r"sglang-domino: the CPU scheduler processes (forked|spawned)"
SCHEDULER = r"scheduler_e2e=([\d.]+)"   # 0.5.23's own start-up line: the scheduler's start, in s
IMPORT = "import sglang.srt.entrypoints.http_server"


def server_args(flags: tuple[str, ...]) -> list[str]:
    """`sglang serve` arguments of the measured server with `flags`."""
    target, domino, _, _ = read_testbed(TESTBED)
    return ["--model-path", target, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", domino,
            "--speculative-dflash-block-size", "16", "--device", "cpu", "--dtype", "float32", "--max-total-tokens",
            str(KV_TOKENS), *flags]


def command(port: int, flags: tuple[str, ...]) -> list[str]:
    return sglang_command(server_args(flags), port)


def read_log(text: str) -> dict:
    """The compile times and the start method a server's log reports."""
    found = {name: float(m.group(1)) for name, pattern in LOG_TIMES.items() if (m := re.search(pattern, text))}
    method = re.search(START_METHOD, text)
    found["children"] = method.group(1) if method else "not logged"
    if scheduler := re.search(SCHEDULER, text):
        found["scheduler_s"] = float(scheduler.group(1))
    return found


def import_once() -> float:
    """Seconds a fresh interpreter takes to import what `sglang serve` imports first."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORT], check=True, capture_output=True)
    return round(time.perf_counter() - t0, 2)


def start_once(name: str, logs: str, tag: str) -> dict:
    """One start of config `name`: seconds to `/health` and to one request's first token
    (its log in the directory `logs`)."""
    flags, extra = CONFIGS[name]
    port = free_port()
    log = os.path.join(logs, f"{tag}.log")
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_DOMINO_DEBUG"} | extra
    t0 = time.perf_counter()
    server = Server(command(port, flags), port, log, env)
    try:
        server.wait_healthy(600, poll=0.1)
        healthy = time.perf_counter() - t0
        body = json.dumps({"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 1}}).encode()
        request = urllib.request.Request(server.url + "/generate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            json.load(r)
        first = time.perf_counter() - t0
    finally:
        server.stop()
    with open(log, encoding="utf-8") as fh:
        return {"config": name, "health_s": round(healthy, 2), "first_token_s": round(first, 2), **read_log(fh.read())}


def summarize(runs: dict) -> str:
    """startup.md: each config's median over its starts, and every start."""
    starts = runs["starts"]
    lines = [f"# Start-up of the test bed's Domino server ({runs['cpu']}, {runs['date']})", "",
             f"Command: `{runs['command']}`; commit {runs['commit']}. Each server started {runs['rounds']} times, "
             "taking turns, on a warm compile cache; seconds from the command.", "",
             "| server | to /health (median) | to the first token (median) | starts to /health | "
             "scheduler's own start (median) | children |",
             "|---|---|---|---|---|---|"]
    for name in runs["configs"]:
        mine = [s for s in starts if s["config"] == name]
        health = [s["health_s"] for s in mine]
        scheduler = [s["scheduler_s"] for s in mine if "scheduler_s" in s]
        lines.append(f"| {name} | {statistics.median(health):.1f} | "
                     f"{statistics.median(s['first_token_s'] for s in mine):.1f} | "
                     f"{', '.join(f'{h:.1f}' for h in health)} | "
                     f"{f'{statistics.median(scheduler):.1f}' if scheduler else '-'} | "
                     f"{', '.join(sorted({s['children'] for s in mine}))} |")
    if runs.get("imports"):
        lines += ["", f"`python -c \"{IMPORT}\"` alone (what `sglang serve` imports before its first log line; "
                  f"no server): median {statistics.median(runs['imports']):.1f} s "
                  f"({', '.join(f'{t:.1f}' for t in runs['imports'])}). The scheduler's own start is 0.5.23's "
                  "`scheduler_e2e` of its start-up timings line."]
    compiled = [s for s in starts if "target graphs" in s]
    if compiled:
        lines += ["", "Graphs of the compiled starts (their logs, median s): " + ", ".join(
            f"{k} {statistics.median(s[k] for s in compiled if k in s):.1f}" for k in LOG_TIMES)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default=os.path.join("benchmarks", "results", f"startup-{time.strftime('%Y-%m-%d')}"))
    ap.add_argument("--refold", action="store_true", help="only write startup.md again from --out's runs.json")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "runs.json")
    if args.refold:
        with open(path, encoding="utf-8") as fh:
            runs = json.load(fh)
    else:
        info = machine()
        runs = {"cpu": cpu_label(info), "machine": info, "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
                "rounds": args.rounds, "configs": args.configs, "starts": [], "imports": [],
                "command": "sglang serve " + " ".join(server_args(())).replace(TESTBED, os.path.relpath(TESTBED))}
        with tempfile.TemporaryDirectory(prefix="startup-logs-") as logs:
            for name in sorted({n for n in args.configs if CONFIGS[n][0]}):   # warm the compile cache, unrecorded
                start_once(name, logs, "warm-" + name.replace(", ", "-"))
            for r in range(args.rounds):
                runs["imports"].append(import_once())
                print(json.dumps({"import_s": runs["imports"][-1]}), flush=True)
                for name in (args.configs if r % 2 == 0 else args.configs[::-1]):
                    runs["starts"].append(start_once(name, logs, f"round{r}-" + name.replace(", ", "-")))
                    print(json.dumps(runs["starts"][-1]), flush=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(runs, fh, indent=1)
    with open(os.path.join(args.out, "startup.md"), "w", encoding="utf-8") as fh:
        fh.write(summarize(runs))
    print(summarize(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
