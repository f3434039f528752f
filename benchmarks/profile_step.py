"""Where a decode step's wall time goes on CPU: a live `sglang serve` sampled with py-spy.

    python -m benchmarks.profile_step                      # test bed, plain and Domino, c1 and c8
    python -m benchmarks.profile_step --tag omp1 --server-env OMP_NUM_THREADS=1    # a variant
    python -m benchmarks.profile_step --refold [--out DIR] # recompute the summary from the raw samples

For each server (plain target, then Domino; the benchmark's launch command, float32) and each
concurrency it
- runs the held-out prompts once unprofiled (the throughput to compare against);
- runs them again while `py-spy record --idle --threads --nonblocking` samples the scheduler;
- reads each server process's CPU time (scheduler, tokenizer/HTTP, detokenizer), the client's,
  py-spy's and the whole machine's from /proc before and after each run.
The scheduler's main thread does every forward on CPU, so its samples are its wall time:
they are folded into buckets twice, by phase (draft, rollout, verify, scheduler bookkeeping,
idle, ...) and by operation (attention, linear, the sgl_kernel stand-ins, ...).

Writes into --out (default benchmarks/results/cpu-profile): `raw-<config>-c<N>.txt.gz` (py-spy's
collapsed stacks), `server-<config>.log.gz`, `runs.json` (throughput, steps, cores per process,
per run; a --tag run adds its own), `summary.json` and `summary.md`. The server is stopped by
its own PID (`sglang_domino.launch`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

from .common import MAX_NEW_TOKENS, bench_config, draft_for, render_prompts, sampling
from .load import Client, steady, warm_up
from .machine import cpu_description, git_commit, machine, machine_busy_seconds
from .profile_fold import (ATTENTION_FILES, OP_RULES, OTHER, PHASE_RULES, fold, read_raw, role_of, scheduler_samples,
                           top_leaves)

OUT_DIR = os.path.join("benchmarks", "results", "cpu-profile")
CONFIGS = ("plain", "domino")
CONCURRENCIES = (1, 8)
RATE = 200

# -- measuring: server, load, py-spy, /proc ----------------------------------------------
def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU time of a process (all its threads), from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


MACHINE = "machine, every process"
OTHERS = "other work on this machine"
QUIET_CORES = 0.3     # other work below this is quiet enough to measure
# How long a run waits for the machine to be quiet (--quiet-wait). 0 by default: the idle
# scheduler busy-polls a core meanwhile (the benchmark's launch has no --sleep-on-idle), and
# the cores other work used are recorded beside every number anyway.
QUIET_WAIT_S = 0.0


def snapshot_cpu(pids: dict[str, int]) -> dict[str, float]:
    return {**{role: cpu_seconds(pid) or 0.0 for role, pid in pids.items()}, MACHINE: machine_busy_seconds()}


def cores_used(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """CPU seconds per wall second of each role, and of whatever else ran on the machine: on a
    shared 2-core machine another job's load changes every number here, so it is recorded."""
    used = {role: (after[role] - before[role]) / wall for role in before}
    busy = used.pop(MACHINE)
    used[OTHERS] = max(0.0, busy - sum(used.values()))
    return {role: round(cores, 3) for role, cores in used.items()}


def wait_for_quiet(pids: dict[str, int], limit_s: float = QUIET_WAIT_S) -> float:
    """Wait (up to limit_s) for a 2 s window in which other work uses under QUIET_CORES;
    returns the other work's cores in the last window."""
    deadline = time.time() + limit_s
    while True:
        before = snapshot_cpu(pids)
        time.sleep(2)
        others = cores_used(before, snapshot_cpu(pids), 2)[OTHERS]
        if others < QUIET_CORES or time.time() > deadline:
            return others
        print(f"waiting: other work uses {others:.2f} cores", flush=True)


def server_processes(server) -> dict[str, int]:
    """role -> PID for the server's processes, plus this client process."""
    pids = {"client (this script)": os.getpid()}
    for pid in server.group():
        role = "tokenizer/HTTP" if pid == server.pid else role_of(process_title(pid))
        if role != "resource tracker":   # multiprocessing's helper: it sleeps
            pids.setdefault(role, pid)
    return pids


def start_spy(pid: int, raw_path: str, rate: int) -> tuple[subprocess.Popen, str]:
    """py-spy recording PID; returns once it samples. --idle keeps the samples of waiting
    threads, so the scheduler's samples cover its wall time, not only its CPU time;
    --nonblocking does not stop the server for each sample. Only the scheduler is recorded:
    sampling every process of the server cost a further third of a core on 2 cores, and the
    tokenizer's and detokenizer's share is read from /proc instead."""
    spy_bin = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not spy_bin:
        raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
    log_path = raw_path + ".spy.log"
    log = open(log_path, "w")
    spy = subprocess.Popen([spy_bin, "record", "--pid", str(pid), "--idle", "--threads",
                            "--nonblocking", "--rate", str(rate), "--format", "raw", "--output", raw_path],
                           stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while "Sampling process" not in open(log_path).read():
        if spy.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"py-spy could not attach to {pid}: {open(log_path).read()[-2000:]}")
        time.sleep(0.05)
    return spy, log_path


def stop_spy(spy: subprocess.Popen, log_path: str) -> str:
    """SIGINT makes py-spy write its file; returns its log (sample and error counts)."""
    spy.send_signal(signal.SIGINT)
    spy.wait(timeout=120)
    with open(log_path) as fh:
        text = fh.read()
    os.remove(log_path)
    return text


def summarise_records(records, wall: float) -> dict:
    """Throughput and steps of one run. A plain server makes one forward per token; ms per step
    is the requests' summed latency over their summed steps: per request, the time it waits
    for each step it takes (prefill and HTTP included, amortised)."""
    tokens = sum(r.completion_tokens for r in records)
    steps = sum(r.verify_steps or r.completion_tokens for r in records)
    latency = sum(r.latency_s for r in records)
    return {"requests": len(records), "tokens": tokens, "steps": steps, "wall_s": round(wall, 3),
            "tok_per_s": round(tokens / wall, 1), "tokens_per_step": round(tokens / steps, 2),
            "ms_per_step": round(1000 * latency / steps, 2)}


def measured_run(client: Client, method: str, conc: int, prompts: list[str], pids: dict[str, int],
                 quiet_wait: float = QUIET_WAIT_S) -> dict:
    """The prompts at concurrency `conc` once the machine is quiet: throughput, steps, and the
    cores each process used meanwhile."""
    from .sglang_bench import check_speculated

    others_before = wait_for_quiet(pids, quiet_wait)
    client.flush()
    cpu0 = snapshot_cpu(pids)
    run = steady(client, prompts, conc, method=method, task="heldout")
    check_speculated(method, "heldout", conc, run.records)
    return {**summarise_records(run.records, run.wall_s), "cpu_cores": cores_used(cpu0, snapshot_cpu(pids), run.wall_s),
            "other_cores_before": round(others_before, 3)}


def server_command(cfg, port: int, config: str, server_flags=()) -> list[str]:
    """The benchmark's `sglang serve` command for `config`, with `server_flags` (e.g.
    `--enable-torch-compile`) after the draft's arguments."""
    return cfg.launch_command(port, draft_for(cfg, config), tuple(server_flags))


def profile_config(config: str, cfg, prompts: list[str], out: str, rate: int, tag: str = "",
                   server_env: Optional[dict] = None, quiet_wait: float = QUIET_WAIT_S,
                   server_flags=()) -> list[dict]:
    """One server: per concurrency an unprofiled run, then a profiled one. `server_env` is
    added to the server's environment and `server_flags` to its command (a variant, named
    by `tag`)."""
    from sglang_domino.launch import free_port, start

    from .records import TARGET_ONLY

    port = free_port()
    cmd = server_command(cfg, port, config, server_flags)
    print(f"[{config}] {' '.join(cmd)}", flush=True)
    name = config + (f"-{tag}" if tag else "")
    log_path = os.path.join(out, f"server-{name}.log")
    runs = []
    env = {**os.environ, **server_env} if server_env else None
    with start(cmd, port, log_path, cfg.server_timeout, env=env) as server:
        method = TARGET_ONLY if config == "plain" else config
        client = Client(server.url, sampling(cfg))
        warm_up(client, prompts[: max(cfg.concurrencies)])
        pids = server_processes(server)
        for conc in cfg.concurrencies:
            unprofiled = measured_run(client, method, conc, prompts, pids, quiet_wait)
            raw_path = os.path.join(out, f"raw-{name}-c{conc}.txt")
            spy, spy_log = start_spy(pids["scheduler"], raw_path, rate)
            profiled = measured_run(client, method, conc, prompts, {**pids, "py-spy": spy.pid}, quiet_wait)
            spy_text = stop_spy(spy, spy_log)
            compress(raw_path)
            runs.append({"config": name, "concurrency": conc, "rate_hz": rate, "server_env": server_env or {},
                         "server_flags": list(server_flags),
                         "commit": git_commit(), "cpu": cpu_description(), "machine": machine(),
                         "unprofiled": unprofiled, "profiled": profiled,
                         "py_spy": [line for line in spy_text.splitlines() if "Samples:" in line]})
            print(json.dumps(runs[-1]), flush=True)
    compress(log_path)
    return runs


def compress(path: str) -> None:
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)


# -- summary -----------------------------------------------------------------------------
def summarise(out: str, runs: list[dict]) -> dict:
    """Per run, the scheduler main thread's bucket shares (phase and op) from its raw file. The
    machine is the one the runs were measured on (recorded in them), not the one refolding."""
    rows = []
    for run in runs:
        parsed = read_raw(os.path.join(out, f"raw-{run['config']}-c{run['concurrency']}.txt.gz"))
        sched = scheduler_samples(parsed)
        rows.append({**run, "scheduler_samples": sum(n for _, n in sched),
                     "phase": fold(sched, PHASE_RULES), "op": fold(sched, OP_RULES), "top_leaves": top_leaves(sched),
                     "attention_lines": top_leaves(sched, 6, ATTENTION_FILES)})
    first = runs[0] if runs else {}
    return {"machine": first.get("machine"), "cpu": first.get("cpu") or {}, "rate_hz": first.get("rate_hz", RATE),
            "max_new_tokens": MAX_NEW_TOKENS,
            "runs": rows}


def column(run: dict) -> str:
    return f"{run['config']} c{run['concurrency']}"


def share_table(rows: list[dict], key: str, rules) -> list[str]:
    buckets = [b for b, _ in rules] + [OTHER]
    lines = ["| bucket | " + " | ".join(column(r) for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for bucket in buckets:
        cells = [f"{100 * r[key].get(bucket, 0):.1f} %" for r in rows]
        if any(r[key].get(bucket, 0) for r in rows):
            lines.append(f"| {bucket} | " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict) -> str:
    rows = summary["runs"]
    cpu = summary["cpu"]
    head = "| | " + " | ".join(column(r) for r in rows) + " |"
    rule = "|---|" + "---|" * len(rows)
    lines = [f"# CPU profile of a decode step: {cpu.get('model name')} ({cpu.get('cores')} cores)", "",
             f"Test bed, float32, {rows[0]['profiled']['requests'] if rows else 0} held-out requests, "
             f"{summary['max_new_tokens']} new tokens, greedy. py-spy at {summary['rate_hz']} Hz on the scheduler.", "",
             "ms per step: the requests' summed latency over their summed steps (verify steps; one per token "
             "without a draft), so prefill and HTTP are spread over the steps.", "",
             "## Throughput and step time", "", head, rule]
    for label, fn in [("tok/s, unprofiled", lambda r: r["unprofiled"]["tok_per_s"]),
                      ("tok/s, under py-spy", lambda r: r["profiled"]["tok_per_s"]),
                      ("tokens per step", lambda r: r["unprofiled"]["tokens_per_step"]),
                      ("ms per step, unprofiled", lambda r: r["unprofiled"]["ms_per_step"]),
                      ("ms per step, under py-spy", lambda r: r["profiled"]["ms_per_step"])]:
        lines.append(f"| {label} | " + " | ".join(str(fn(r)) for r in rows) + " |")
    lines += ["", "## Cores used per process (CPU seconds per wall second): unprofiled / under py-spy", "",
              head, rule]
    roles = list(dict.fromkeys(role for r in rows for run in ("unprofiled", "profiled") for role in r[run]["cpu_cores"]))
    for role in roles:
        cells = [" / ".join(f"{r[run]['cpu_cores'][role]:.2f}" if role in r[run]["cpu_cores"] else "-"
                            for run in ("unprofiled", "profiled")) for r in rows]
        lines.append(f"| {role} | " + " | ".join(cells) + " |")
    lines += ["", "## Scheduler main thread's wall time by phase", ""] + share_table(rows, "phase", PHASE_RULES)
    lines += ["", "## Scheduler main thread's wall time by operation", ""] + share_table(rows, "op", OP_RULES)
    lines += ["", "## Attention by source line (innermost Python frame), share of the scheduler's wall time", "",
              "| line | " + " | ".join(column(r) for r in rows) + " |", "|---|" + "---|" * len(rows)]
    leaves = list(dict.fromkeys(leaf for r in rows for leaf, _ in r["attention_lines"][:4]))
    for leaf in leaves:
        cells = [f"{100 * dict(r['attention_lines']).get(leaf, 0):.1f} %" for r in rows]
        lines.append(f"| `{leaf}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def save_runs(path: str, runs: list[dict]) -> None:
    """Add `runs` to the file's, replacing those of the same configuration and concurrency
    (so a variant run with --tag adds its columns)."""
    old = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
    keys = {(r["config"], r["concurrency"]) for r in runs}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([r for r in old if (r["config"], r["concurrency"]) not in keys] + runs, fh, indent=1)


def write_summary(out: str, runs: list[dict]) -> dict:
    summary = summarise(out, runs)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as fh:
        fh.write(markdown(summary))
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=OUT_DIR)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="plain and/or domino (or dflash)")
    parser.add_argument("--concurrencies", default=",".join(map(str, CONCURRENCIES)))
    parser.add_argument("--prompts", type=int, default=16, help="held-out requests per run")
    parser.add_argument("--rate", type=int, default=RATE, help="py-spy samples per second")
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="add to the servers' environment (a variant; give it a --tag)")
    parser.add_argument("--server-flag", action="append", default=[], metavar="FLAG",
                        help="add to the servers' command, e.g. --server-flag=--enable-torch-compile "
                             "(a variant; give it a --tag)")
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S,
                        help="seconds each run may wait for other work to use under %.1f cores" % QUIET_CORES)
    parser.add_argument("--tag", default="", help="suffix of this variant's config names and files")
    parser.add_argument("--refold", action="store_true", help="only recompute the summary from --out's files")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs_path = os.path.join(args.out, "runs.json")
    if not args.refold:
        concs = [int(c) for c in args.concurrencies.split(",")]
        cfg = bench_config(args.prompts, concs)
        prompts = render_prompts(cfg)
        server_env = dict(item.split("=", 1) for item in args.server_env)
        runs = []
        for config in args.configs.split(","):
            runs += profile_config(config, cfg, prompts, args.out, args.rate, args.tag, server_env, args.quiet_wait,
                                   args.server_flag)
        save_runs(runs_path, runs)
    with open(runs_path, encoding="utf-8") as fh:
        runs = json.load(fh)
    print(markdown(write_summary(args.out, runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
