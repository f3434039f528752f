"""Replay rollback against per-position snapshots, served on CPU: a tiny Qwen3.5 hybrid target
(gated delta-net + attention) with a recurrent state that matters, three `sglang serve --device cpu`
servers on it, started in alternating order over several rounds (issue 21, part 4):

- plain: no speculation;
- snapshot: DFLASH as 0.5.23 serves it, a recurrent state per verified position (`intermediate_ssm`);
- replay: DFLASH with `--enable-linear-replayssm-spec --linear-replayssm-cache-len 32` (the plugin's
  `sglang_domino/sglang/serving/hybrid_replay.py`).

All three run with the same `--max-mamba-cache-size` and `--max-running-requests`, float32, greedy,
the same requests. Measured per server:

- memory: 0.5.23's mamba pool lines and the plugin's replay line in the server log, against the
  bytes 0.5.23's CPU pool layout gives for this geometry (`pool_layout`);
- the concurrency cap (`/server_info`: effective max running requests, max_mamba_cache_size);
- output tok/s and the mean decode step time at each concurrency (steps: `spec_verify_ct`, or the
  decode tokens of the plain server);
- outputs: every request's output_ids against the plain server's and Transformers'.

And, with `--budget-gb` > 0, the cap a memory budget decides: snapshot and replay servers with no
`--max-mamba-cache-size` and the same small `--mem-fraction-static` (0.5.23's ratio-based sizing,
`srt/mem_cache/kv_cache_configurator.py`), started and stopped without requests.

    python -m benchmarks.hybrid_replay [--rounds 2] [--concurrencies 1 8 16] [--requests 16]
        [--max-new-tokens 64] [--budget-gb 1.0] [--out DIR]

Writes `hybrid_replay.json` (every run and every request) and `hybrid_replay.md` (medians over
rounds, replay / snapshot, the CPU named) to DIR (default benchmarks/results/hybrid-replay/);
`--from-json JSON` rewrites the table from a record alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from .load import Client, Sampling, steady, warm_up
from .machine import machine
from .report import write_markdown
from .sglang_numerics import first_difference

GIB = 1 << 30  # 0.5.23's `GB` in its pool lines (srt/mem_cache/memory_pool.py)
SERVERS = ("plain", "snapshot", "replay")
BLOCK = 16  # the draft block = the verify window (speculative_num_draft_tokens)
RING = 32
PROMPT_LEN = 24
# fp32 kernels that differ in summation order agree to ~1e-5 in the logits: prompts whose greedy path
# passes a top-2 margin below this would compare rounding, not the serving paths
MIN_MARGIN = 0.02
HYBRID_ARGS = ["--mamba-scheduler-strategy", "no_buffer", "--disable-overlap-schedule"]
STARTUP_TIMEOUT = 600
# state slots per running request with the radix cache on (0.5.23's MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO,
# no_buffer, no overlap): every server here keeps it on
MAMBA_RATIO = 3
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results", "hybrid-replay")


# -- the target ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """The tiny Qwen3.5 text target: every `interval`-th layer full attention, the others gated
    delta-net (GDN) with HV value heads and HK key heads of V x K."""

    layers: int = 8
    interval: int = 4
    hidden: int = 128
    value_heads: int = 8
    key_heads: int = 4
    head_dim: int = 64  # K = V
    conv_kernel: int = 4
    attn_heads: int = 4
    kv_heads: int = 2
    attn_head_dim: int = 32

    @property
    def gdn_layers(self) -> int:
        return self.layers - self.layers // self.interval

    @property
    def conv_dim(self) -> int:
        return (self.value_heads + 2 * self.key_heads) * self.head_dim


def build_target(path: str, geom: Geometry = Geometry(), seed: int = 0):
    """Save the target (float32) and the tiny tokenizer to `path`; returns the HF model.

    Output head: two opposite rows (+w, -w) at HYBRID_LIVE_TOKENS, the others zero, so greedy output is a
    context-dependent sequence over two tokens and a random draft is right about half the time.
    The delta-net layers barely decay (A_log = -4) and write louder into the residual stream, so
    the output depends on the recurrent state (a wrong rollback changes the tokens)."""
    from sglang_domino.testing import save_tiny_hybrid_target

    return save_tiny_hybrid_target(
        path, seed, num_layers=geom.layers, full_attention_interval=geom.interval, hidden_size=geom.hidden,
        attn_heads=geom.attn_heads, kv_heads=geom.kv_heads, attn_head_dim=geom.attn_head_dim,
        key_heads=geom.key_heads, value_heads=geom.value_heads, head_dim=geom.head_dim,
        conv_kernel=geom.conv_kernel, a_log=-4.0, linear_out_scale=4.0)


def build_models(root: str, geom: Geometry = Geometry()) -> tuple[dict, object]:
    from sglang_domino.testing import save_tiny_draft

    paths = {"target": os.path.join(root, "target"), "draft": os.path.join(root, "draft"), "work": root}
    target = build_target(paths["target"], geom)
    save_tiny_draft(paths["draft"], target, "dflash", block_size=BLOCK, seed=1)
    return paths, target


def tie_free_requests(target, n: int, max_new_tokens: int, seed: int = 0) -> tuple[list, list, list]:
    """`n` random prompts of PROMPT_LEN tokens whose greedy continuation never passes a top-2
    margin below MIN_MARGIN, their Transformers continuations and margins."""
    import random

    import torch

    from sglang_domino.testing import HYBRID_LIVE_TOKENS as LIVE_TOKENS

    rng = random.Random(seed)
    prompts, oracle, margins = [], [], []
    while len(prompts) < n:
        batch = [[rng.randrange(3, 490) for _ in range(PROMPT_LEN)] for _ in range(max(2 * (n - len(prompts)), 4))]
        with torch.no_grad():
            out = target.generate(torch.tensor(batch), max_new_tokens=max_new_tokens, do_sample=False)
            logits = target(out).logits[:, PROMPT_LEN - 1:-1]
        margin = (logits[..., LIVE_TOKENS[0]] - logits[..., LIVE_TOKENS[1]]).abs().min(-1).values
        for prompt, row, m in zip(batch, out[:, PROMPT_LEN:].tolist(), margin.tolist()):
            if m >= MIN_MARGIN and len(prompts) < n:
                prompts.append(prompt)
                oracle.append(row)
                margins.append(m)
    return prompts, oracle, margins


# -- 0.5.23's state pool on CPU for this geometry --------------------------------------------------
def pool_layout(geom: Geometry, window: int = BLOCK, ring_len: int = RING) -> dict:
    """Bytes of 0.5.23's `MambaPool` on CPU (srt/mem_cache/memory_pool.py), per state slot and per
    request row: ssm state fp32 [HV, V, K] and conv state bf16 [conv_dim, k-1] per GDN layer and
    slot; per row, the per-position states fp32 [window, HV, V, K] (snapshot), the conv windows in
    the dense CPU layout bf16 [window, conv_dim, k-1] (both), the GDN replay ring (replay): d and
    normalised k with their bf16 low parts, g fp32, `ring_len` records
    (`Mamba2CacheParams.replayssm_ring_bytes_per_req`)."""
    g, hv, hk, d = geom.gdn_layers, geom.value_heads, geom.key_heads, geom.head_dim
    ssm = g * hv * d * d * 4
    conv = g * geom.conv_dim * (geom.conv_kernel - 1) * 2
    return dict(ssm_per_slot=ssm, conv_per_slot=conv, state_per_slot=ssm + conv,
                snapshot_per_row=window * ssm, conv_window_per_row=window * conv,
                ring_per_row=ring_len * g * (2 * (hv * d + hk * d) * 2 + hv * 4))


def reserved(layout: dict, server: str, slots_per_request: float) -> dict:
    """Per running request: its state slots (3 with the radix cache on: 0.5.23's mamba ratio) and,
    speculative, one request row of per-position states or replay ring plus conv windows."""
    state = slots_per_request * layout["state_per_slot"]
    spec = {"plain": 0, "snapshot": layout["snapshot_per_row"] + layout["conv_window_per_row"],
            "replay": layout["ring_per_row"] + layout["conv_window_per_row"]}[server]
    rec = {"plain": 0, "snapshot": layout["snapshot_per_row"], "replay": layout["ring_per_row"]}[server]
    return dict(state=int(state), speculative=spec, recurrent_speculative=rec, total=int(state + spec))


# -- server logs ---------------------------------------------------------------------------------
_POOL = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, "
                   r"ssm_state size: ([\d.]+)GB(?: intermediate_ssm_state_cache size: ([\d.]+)GB "
                   r"intermediate_conv_window_cache size: ([\d.]+)GB)?")
_RINGS = re.compile(r"GDN ReplaySSM ring buffers allocated \(record_len=(\d+), fold=(\w+)\): (.*)")
_RING_PART = re.compile(r"(\w+)=([\d.]+)GB")
_PLUGIN = re.compile(r"hybrid replay: GDN ReplaySSM verify for DFLASH, ring L=(\d+) for a (\d+)-token window over "
                     r"(\d+) request rows; .*?snapshots would take (\d+) bytes, (\d+) per request row\); replay rings "
                     r"(\d+) bytes \((\d+) per request row\); checkpoint folded (.*)")
_CAPPED = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache \(max_mamba_cache_size=(\d+), "
                     r"(\d+) state slots per request\)")
_TOTALS = re.compile(r"max_total_num_tokens=(\d+), .*?max_running_requests=(\d+)")


def parse_log(text: str) -> dict:
    """0.5.23's mamba pool lines and the plugin's replay line (the first of each: rank 0)."""
    out: dict = {}
    m = _POOL.search(text)
    if m:
        out["pool"] = dict(max_mamba_cache_size=int(m[1]), conv_state_gb=float(m[2]), ssm_state_gb=float(m[3]),
                           intermediate_ssm_gb=None if m[4] is None else float(m[4]),
                           intermediate_conv_window_gb=None if m[5] is None else float(m[5]))
    m = _RINGS.search(text)
    if m:
        parts = {k: float(v) for k, v in _RING_PART.findall(m[3])}
        out["rings"] = dict(record_len=int(m[1]), fold=m[2] == "True", parts_gb=parts,
                            total_gb=round(sum(parts.values()), 3))
    m = _PLUGIN.search(text)
    if m:
        out["replay"] = dict(ring_len=int(m[1]), window=int(m[2]), rows=int(m[3]), snapshot_bytes=int(m[4]),
                             snapshot_per_row=int(m[5]), ring_bytes=int(m[6]), ring_per_row=int(m[7]),
                             folds=m[8].strip())
    m = _CAPPED.search(text)
    if m:
        out["capped"] = dict(cap=int(m[1]), max_mamba_cache_size=int(m[2]), slots_per_request=int(m[3]))
    m = _TOTALS.search(text)
    if m:
        out["totals"] = dict(max_total_num_tokens=int(m[1]), max_running_requests=int(m[2]))
    return out


def check_log(parsed: dict, layout: dict, server: str, slots: int, rows: int) -> list[str]:
    """Differences between the log and `pool_layout` for `slots` state slots (the pool's padding
    slot included) and `rows` request rows; empty when they agree (GB lines to their 2 decimals)."""
    problems = []
    pool = parsed.get("pool")

    def gb(name, value, want_bytes, places=2):
        if value is None or abs(value - want_bytes / GIB) > 0.5 * 10 ** -places + 1e-9:
            problems.append(f"{name}: log {value} GB, layout {want_bytes / GIB:.4f} GB")

    if pool is None:
        return ["no `Mamba Cache is allocated` line"]
    gb("ssm_state", pool["ssm_state_gb"], slots * layout["ssm_per_slot"])
    gb("conv_state", pool["conv_state_gb"], slots * layout["conv_per_slot"])
    if server != "plain":
        gb("intermediate_ssm", pool["intermediate_ssm_gb"], rows * layout["snapshot_per_row"] if server == "snapshot"
           else 0)
        gb("intermediate_conv_window", pool["intermediate_conv_window_gb"], rows * layout["conv_window_per_row"])
    if server == "replay":
        rep = parsed.get("replay")
        if rep is None:
            problems.append("no plugin replay line")
        else:
            for key in ("snapshot_per_row", "ring_per_row"):
                if rep[key] != layout[key]:
                    problems.append(f"{key}: log {rep[key]} B, layout {layout[key]} B")
            if rep["rows"] != rows:
                problems.append(f"rows: log {rep['rows']}, expected {rows}")
        rings = parsed.get("rings")
        if rings is None:
            problems.append("no ring-buffer line")
        elif abs(rings["total_gb"] - rows * layout["ring_per_row"] / GIB) > 0.0005 * len(rings["parts_gb"]) + 1e-9:
            problems.append(f"rings: log {rings['total_gb']} GB, layout {rows * layout['ring_per_row'] / GIB:.4f} GB")
    return problems


# -- the memory budget ---------------------------------------------------------------------------
def budget_from_pool(server: str, k: int, state: int, window: int, ratio: int, ring_per_row: int = 0,
                     max_running: int = 0) -> float:
    """The mamba budget (bytes) 0.5.23's ratio-based sizing had, from the pool size it chose
    (`kv_cache_configurator.py`, `mamba_pool.memory_budget[_spec]`; lower end of the interval the
    floor leaves): snapshot K = (B - S (1 + D)) // (S (1 + D / ratio)); replay K = (B - rings
    for max_running + 1 rows - S) // S."""
    if server == "snapshot":
        return k * state * (1 + window / ratio) + state * (1 + window)
    return (k + 1) * state + ring_per_row * (max_running + 1)


def replay_fixed_point(budget: float, state: int, ring_per_row: int, ratio: int) -> int:
    """The largest --max-running-requests m a replay server fits in `budget`: its rings (m + 1 rows)
    leave a pool of K = (B - ring (m + 1) - S) // S slots with K // ratio >= m."""
    m = 0
    while ((budget - ring_per_row * (m + 2) - state) // state) // ratio >= m + 1:
        m += 1
    return m


# -- servers -------------------------------------------------------------------------------------
def server_args(server: str, paths: dict, extra: list[str]) -> list[str]:
    args = ["--model-path", paths["target"], "--device", "cpu", "--dtype", "float32", "--sleep-on-idle",
            *HYBRID_ARGS, *extra]
    if server != "plain":
        args += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", paths["draft"],
                 "--speculative-dflash-block-size", str(BLOCK)]
    if server == "replay":
        args += ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", str(RING)]
    return args


def start_server(server: str, paths: dict, extra: list[str], out: str, tag: str):
    from sglang_domino.launch import free_port, isolated_env, sglang_command, start

    port = free_port()
    log_path = os.path.join(out, f"server-{tag}.log")
    t0 = time.time()
    handle = start(sglang_command(server_args(server, paths, extra), port), port, log_path, STARTUP_TIMEOUT,
                   env=isolated_env(paths["work"]), tail_lines=60)
    return handle, time.time() - t0


def cap_info(handle) -> dict:
    state = handle.get("/server_info")["internal_states"][0]
    usage = state.get("memory_usage") or {}
    return dict(cap=state.get("effective_max_running_requests_per_dp"),
                max_total_num_tokens=state.get("max_total_num_tokens") or usage.get("token_capacity"),
                max_mamba_cache_size=state.get("max_mamba_cache_size"),
                max_running_requests=state.get("max_running_requests"))


def measure(client: Client, prompts: list, concurrency: int) -> dict:
    """All prompts, `concurrency` in flight at a time (closed loop); the radix cache flushed
    first. Each request as hybrid_replay.json has always recorded it."""
    client.flush()
    run = steady(client, prompts, concurrency)
    return dict(wall_s=run.wall_s, requests=[dict(output_ids=r.output_ids, completion_tokens=r.completion_tokens,
                                                  verify_ct=r.verify_steps, e2e_latency=r.server_latency_s)
                                             for r in run.records])


def run_server(server: str, paths: dict, extra: list[str], prompts: list, args, out: str, rnd: int) -> dict:
    handle, startup = start_server(server, paths, extra, out, f"{server}-r{rnd}")
    try:
        info = cap_info(handle)
        client = Client(handle.url, Sampling(args.max_new_tokens, ignore_eos=True), timeout=1200)
        # warm-up: the first requests of a server take the lazy initialisations
        warm_up(client, prompts[: max(args.concurrencies)], 8)
        runs = {}
        for conc in args.concurrencies:
            runs[str(conc)] = measure(client, prompts, conc)
            print(json.dumps({"round": rnd, "server": server, "concurrency": conc,
                              **conc_stats(runs[str(conc)], server, conc)}), flush=True)
    finally:
        handle.stop()
    log = parse_log(_read(handle.log_path))
    return dict(round=rnd, server=server, args=server_args(server, paths, extra), startup_s=startup,
                log=os.path.basename(handle.log_path), server_info=info, memory_log=log, concurrency=runs)


def pool_rows(info: dict, ratio: int = MAMBA_RATIO) -> tuple[int, int]:
    """(state slots, request rows) of a server's pool: max_mamba_cache_size + the padding slot; the
    running requests its pool serves + the padding row (`kv_cache_configurator.py`, `memory_pool.py`)."""
    k = info["max_mamba_cache_size"]
    return k + 1, min(info["cap"], k // ratio) + 1


def probe(server: str, paths: dict, extra: list[str], out: str, tag: str) -> dict:
    """Start, read the cap, stop: no requests."""
    handle, startup = start_server(server, paths, extra, out, tag)
    try:
        info = cap_info(handle)
    finally:
        handle.stop()
    return dict(server=server, args=server_args(server, paths, extra), startup_s=startup,
                log=os.path.basename(handle.log_path), server_info=info, memory_log=parse_log(_read(handle.log_path)))


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


# -- numbers from the records --------------------------------------------------------------------
def decode_steps(request: dict, server: str) -> int:
    """Forward steps after the prefill: verifies, or one per decoded token (the prefill gives the first)."""
    return request["verify_ct"] if server != "plain" else request["completion_tokens"] - 1


def conc_stats(run: dict, server: str, concurrency: int) -> dict:
    """tok/s = completion tokens / wall; step ms = wall x in-flight requests / decode steps (a batch
    step serves every request in flight; the prefills are inside the wall time); accept length =
    tokens / verifies (the prefill's token counted)."""
    reqs = run["requests"]
    tokens = sum(r["completion_tokens"] for r in reqs)
    steps = sum(decode_steps(r, server) for r in reqs)
    in_flight = min(concurrency, len(reqs))
    out = dict(tok_per_s=tokens / run["wall_s"], step_ms=1000 * run["wall_s"] * in_flight / max(steps, 1))
    if server != "plain":
        out["accept_len"] = tokens / max(steps, 1)
    return out


def mismatches(runs: list[dict], oracle: list) -> dict:
    """Requests whose output_ids differ from the plain server's first run (same concurrency index
    order), and from Transformers' greedy continuation."""
    ref = next((r for r in runs if r["server"] == "plain"), None)
    reference = None if ref is None else next(iter(ref["concurrency"].values()))["requests"]
    total = vs_plain = vs_hf = 0
    detail = []
    hf_differs: dict[int, dict] = {}  # request -> the servers and first token that differ from Transformers
    for run in runs:
        for conc, res in run["concurrency"].items():
            for i, req in enumerate(res["requests"]):
                total += 1
                if reference is not None and req["output_ids"] != reference[i]["output_ids"]:
                    vs_plain += 1
                    detail.append(dict(round=run["round"], server=run["server"], concurrency=conc, request=i))
                if oracle and req["output_ids"] != oracle[i][: len(req["output_ids"])]:
                    vs_hf += 1
                    at = first_difference(req["output_ids"], oracle[i][: len(req["output_ids"])])
                    seen = hf_differs.setdefault(i, dict(servers=[], token=at))
                    if run["server"] not in seen["servers"]:
                        seen["servers"].append(run["server"])
    return dict(requests=total, vs_plain=vs_plain, vs_transformers=vs_hf, detail=detail[:50],
                transformers_detail={str(i): v for i, v in sorted(hf_differs.items())})


def _med(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt_bytes(n) -> str:
    return "—" if n is None else f"{int(n):,} B"


def _ratio(a, b) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def summarize(data: dict) -> list[str]:
    """The markdown report, from the JSON record alone."""
    s, info, geom = data["settings"], data["machine"], data["geometry"]
    layout, runs, concs = data["layout"], data["runs"], [str(c) for c in data["settings"]["concurrencies"]]
    servers = [x for x in SERVERS if any(r["server"] == x for r in runs)]
    lines = ["# Replay rollback against per-position snapshots: a tiny hybrid target on CPU", "",
             f"Target: Qwen3.5 text, {geom['layers']} layers ({geom['layers'] - geom['layers'] // geom['interval']} "
             f"gated delta-net, {geom['layers'] // geom['interval']} attention), hidden {geom['hidden']}, "
             f"{geom['value_heads']} value / {geom['key_heads']} key heads of {geom['head_dim']} x {geom['head_dim']} "
             f"(fp32 state); a random DFlash draft, block {BLOCK} = the verify window; replay ring "
             f"L = {s['ring_len']}. {s['dtype']}, greedy, {s['requests']} requests of {s['prompt_len']} tokens, "
             f"{s['max_new_tokens']} new tokens each (ignore_eos), concurrency {', '.join(concs)}; the three "
             f"servers alternated over {s['rounds']} round(s), medians over rounds. Common flags: "
             f"`{' '.join(s['common_args'])}`. CPU: {info.get('cpu', 'unknown')}, {info.get('cpu_count')} cores "
             f"(OMP_NUM_THREADS=1 per server). Command: `{s['command']}`.", ""]
    # -- memory, fixed pool
    lines += ["## Memory and concurrency cap, fixed `--max-mamba-cache-size`", "",
              f"`--max-mamba-cache-size {s['max_mamba_cache_size']} --max-running-requests {s['max_running_requests']}`"
              ", radix cache on (0.5.23 keeps 3 state slots per running request). Bytes from 0.5.23's CPU pool "
              "layout for this geometry; every figure checked against the server's log (the plugin's replay line "
              "in bytes, 0.5.23's pool lines in GB to 2 decimals): see the checks below.", "",
              "| server | cap (effective max running requests) | state slots per request | their bytes | per-position "
              "states | replay ring | conv windows | reserved per running request |",
              "|---|---|---|---|---|---|---|---|"]
    res = {}
    for server in servers:
        rs = [r for r in runs if r["server"] == server]
        cap = _med(r["server_info"]["cap"] for r in rs)
        k = _med(r["server_info"]["max_mamba_cache_size"] for r in rs)
        slots = k / cap if cap and k else None
        res[server] = reserved(layout, server, slots or 0) if slots else None
        spec = server != "plain"
        per_position = _fmt_bytes(layout["snapshot_per_row"]) if server == "snapshot" else "0 B" if spec else "—"
        lines.append(f"| {server} | {cap if cap is None else int(cap)} | "
                     f"{'—' if slots is None else f'{slots:g}'} | "
                     f"{_fmt_bytes(res[server] and res[server]['state'])} | "
                     f"{per_position} | "
                     f"{_fmt_bytes(layout['ring_per_row']) if server == 'replay' else '—'} | "
                     f"{_fmt_bytes(layout['conv_window_per_row']) if spec else '—'} | "
                     f"{_fmt_bytes(res[server] and res[server]['total'])} |")
    if res.get("snapshot") and res.get("replay"):
        lines += ["", f"Replay / snapshot: speculative recurrent state per request "
                  f"{layout['ring_per_row'] / layout['snapshot_per_row']:.3f}x "
                  f"({layout['ring_per_row']:,} B against {layout['snapshot_per_row']:,} B); reserved per running "
                  f"request {res['replay']['total'] / res['snapshot']['total']:.3f}x. With a fixed pool the cap is "
                  "the same: the pool size, not the memory, decides it."]
    checks = [f"{r['server']} r{r['round']}: {'; '.join(r['log_check']) or 'agrees'}" for r in runs]
    checks += [f"budget {p['kind']} r{p['round']}: {'; '.join(p['log_check']) or 'agrees'}"
               for p in data.get("probes") or [] if "log_check" in p]
    lines += ["", "Log checks: " + " · ".join(checks) + ".", ""]
    # -- memory budget
    probes = data.get("probes") or []
    if probes:
        b = data["budget"]
        lines += ["## Concurrency cap under a memory budget", "",
                  f"No `--max-mamba-cache-size`, radix cache on, the same `--mem-fraction-static "
                  f"{b['mem_fraction_static']}` for every server (0.5.23's ratio-based sizing: the mamba pool gets "
                  f"`mamba_full_memory_ratio / (1 + ratio)` of what the weights leave; snapshot budgets D = {BLOCK} "
                  "states per running request beside its slots, replay its rings for `--max-running-requests` + 1 "
                  "rows). On CPU the budget is a fraction of the free system memory at start-up, so it moves with "
                  "whatever else runs: the mamba budget each server had is inferred from the pool size it chose "
                  "(0.5.23's formula), and requests per GiB of that budget compare the two schemes across that "
                  "noise.", "",
                  "| server | --max-running-requests | max_mamba_cache_size | cap | inferred mamba budget | "
                  "cap per GiB of budget |", "|---|---|---|---|---|---|"]
        per_gib = {}
        for kind in ("snapshot", "replay", "replay-fit"):
            ps = [p for p in probes if p["kind"] == kind]
            if not ps:
                continue
            cap = _med(p["server_info"]["cap"] for p in ps)
            k = _med(p["server_info"]["max_mamba_cache_size"] for p in ps)
            mrr = _med(p["max_running_requests"] for p in ps)
            bud = _med(p["budget_bytes"] for p in ps)
            per_gib[kind] = _med(p["server_info"]["cap"] / (p["budget_bytes"] / GIB) for p in ps)
            label = {"replay-fit": "replay, --max-running-requests at its fit"}.get(kind, kind)
            lines.append(f"| {label} | {int(mrr)} | {int(k)} | {int(cap)} | {bud / GIB:.3f} GiB | "
                         f"{per_gib[kind]:.1f} |")
        best = per_gib.get("replay-fit") or per_gib.get("replay")
        same = _ratio(per_gib.get("replay"), per_gib.get("snapshot"))
        lines += ["", f"Replay / snapshot, cap per GiB of mamba budget: {_ratio(best, per_gib.get('snapshot'))} "
                  f"(replay at the same --max-running-requests: {same})."
                  " 0.5.23 budgets the replay rings for --max-running-requests + 1 rows (and allocates them for the "
                  "requests the pool can serve + 1), so a --max-running-requests above what fits costs replay slots. "
                  "The fit is the largest --max-running-requests whose rings still leave that many requests' slots "
                  "in the budget the first replay server had (0.5.23's formula); a second replay server is then "
                  "started with it (its cap can only reach that value: a conservative figure).", ""]
    # -- speed
    lines += ["## Throughput and decode step time", "",
              "tok/s: completion tokens / wall time of the batch of requests. Step: wall time x requests in flight "
              "/ decode steps (verifies for DFLASH, decoded tokens after the first for plain; the prefills are "
              "inside the wall time). Accept: tokens per verify, the prefill's included.", "",
              "| concurrency | plain tok/s | snapshot tok/s | replay tok/s | replay / snapshot | plain step ms | "
              "snapshot step ms | replay step ms | replay / snapshot | accept snapshot / replay |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for conc in concs:
        med = {}
        for server in SERVERS:
            stats = [conc_stats(r["concurrency"][conc], server, int(conc)) for r in runs
                     if r["server"] == server and conc in r["concurrency"]]
            med[server] = {key: _med(x.get(key) for x in stats) for key in ("tok_per_s", "step_ms", "accept_len")}

        def cell(server, key, fmt):
            v = med[server][key]
            return "—" if v is None else format(v, fmt)

        lines.append(f"| {conc} | {cell('plain', 'tok_per_s', '.1f')} | {cell('snapshot', 'tok_per_s', '.1f')} | "
                     f"{cell('replay', 'tok_per_s', '.1f')} | "
                     f"{_ratio(med['replay']['tok_per_s'], med['snapshot']['tok_per_s'])} | "
                     f"{cell('plain', 'step_ms', '.1f')} | {cell('snapshot', 'step_ms', '.1f')} | "
                     f"{cell('replay', 'step_ms', '.1f')} | "
                     f"{_ratio(med['replay']['step_ms'], med['snapshot']['step_ms'])} | "
                     f"{cell('snapshot', 'accept_len', '.2f')} / {cell('replay', 'accept_len', '.2f')} |")
    mm = data["mismatches"]
    lines += ["", f"Outputs: {mm['vs_plain']} of {mm['requests']} requests differ from the plain server's first run, "
              f"{mm['vs_transformers']} from Transformers' greedy continuation (every server, round and concurrency; "
              f"prompts chosen with a top-2 margin >= {MIN_MARGIN} on Transformers' path)."]
    margins = data.get("margins") or []
    for i, seen in (mm.get("transformers_detail") or {}).items():
        margin = f" (its smallest top-2 margin on Transformers' path: {margins[int(i)]:.3f})" if margins else ""
        lines.append(f"Request {i}{margin} differs from Transformers from new token {seen['token']} on: "
                     f"{', '.join(seen['servers'])}. Where the plain server is among them, the serving path is not the "
                     "cause: 0.5.23 keeps the gated delta-net conv state in bfloat16 by default "
                     "(`SGLANG_MAMBA_CONV_DTYPE`), which Transformers' float32 run does not round.")
    return lines


# -- main ----------------------------------------------------------------------------------------
def budget_probes(paths: dict, layout: dict, args, out: str, rnd: int, fraction: float) -> list[dict]:
    """Snapshot, then replay at the same --max-running-requests, then replay at its fit."""
    common = ["--mem-fraction-static", str(fraction), "--max-total-tokens", str(args.probe_max_total_tokens)]
    results = []

    def one(kind: str, server: str, mrr: int) -> dict:
        p = probe(server, paths, [*common, "--max-running-requests", str(mrr)], out, f"budget-{kind}-r{rnd}")
        k = p["server_info"]["max_mamba_cache_size"]
        ratio = (p["memory_log"].get("capped") or {}).get("slots_per_request", MAMBA_RATIO)
        p.update(round=rnd, kind=kind, max_running_requests=mrr, ratio=ratio,
                 log_check=check_log(p["memory_log"], layout, server, *pool_rows(p["server_info"], ratio)),
                 budget_bytes=budget_from_pool(server, k, layout["state_per_slot"], BLOCK, ratio,
                                               layout["ring_per_row"], mrr))
        print(json.dumps({k2: p[k2] for k2 in ("round", "kind", "max_running_requests", "budget_bytes")}
                         | {"cap": p["server_info"]["cap"], "max_mamba_cache_size": k}), flush=True)
        results.append(p)
        return p

    order = ("snapshot", "replay") if rnd % 2 == 0 else ("replay", "snapshot")
    for server in order:
        one(server, server, args.probe_max_running)
    rep = next(p for p in results if p["kind"] == "replay")
    fit = replay_fixed_point(rep["budget_bytes"], layout["state_per_slot"], layout["ring_per_row"], rep["ratio"])
    if fit > 0:
        one("replay-fit", "replay", fit)
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--max-mamba-cache-size", type=int, default=None,
                    help="state slots of the fixed pool (default: 3 x --max-running-requests, 0.5.23's ratio)")
    ap.add_argument("--max-running-requests", type=int, default=None, help="default: the largest concurrency")
    ap.add_argument("--budget-gb", type=float, default=1.0,
                    help="static memory (GiB) the budget probes leave after the weights; 0 skips them")
    ap.add_argument("--probe-max-running", type=int, default=256)
    ap.add_argument("--probe-max-total-tokens", type=int, default=65536)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--from-json", help="run nothing: rewrite hybrid_replay.md in --out from this hybrid_replay.json")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.out, exist_ok=True)
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as fh:
            data = json.load(fh)
        data["mismatches"] = mismatches(data["runs"], data.get("oracle") or [])  # recounted from the records
        write_markdown(args.out, "hybrid_replay.md", summarize(data))
        return
    work = tempfile.mkdtemp(prefix="hybrid-replay-")
    try:
        _run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args, work: str) -> None:
    mrr = args.max_running_requests or max(args.concurrencies)
    pool_slots = args.max_mamba_cache_size or MAMBA_RATIO * mrr
    max_total = max(4096, 2 * mrr * (PROMPT_LEN + args.max_new_tokens + 2 * BLOCK))
    common = ["--max-mamba-cache-size", str(pool_slots), "--max-running-requests", str(mrr),
              "--max-total-tokens", str(max_total)]
    geom = Geometry()
    layout = pool_layout(geom)
    t0 = time.time()
    paths, target = build_models(work, geom)
    prompts, oracle, margins = tie_free_requests(target, args.requests, args.max_new_tokens)
    del target
    print(f"models and {len(prompts)} tie-free requests in {time.time() - t0:.0f} s ({work})", flush=True)
    import psutil

    fraction = None
    if args.budget_gb > 0:
        fraction = round((args.budget_gb + 0.05) / (psutil.virtual_memory().available / GIB), 4)
    runs, probes = [], []
    for rnd in range(args.rounds):
        for server in (SERVERS if rnd % 2 == 0 else SERVERS[::-1]):
            run = run_server(server, paths, common, prompts, args, args.out, rnd)
            run["log_check"] = check_log(run["memory_log"], layout, server, *pool_rows(run["server_info"]))
            runs.append(run)
        if fraction:
            probes += budget_probes(paths, layout, args, args.out, rnd, fraction)
    data = dict(
        machine=machine(),
        settings=dict(rounds=args.rounds, concurrencies=args.concurrencies, requests=len(prompts),
                      prompt_len=PROMPT_LEN, max_new_tokens=args.max_new_tokens, dtype="float32", window=BLOCK,
                      ring_len=RING, max_mamba_cache_size=pool_slots, max_running_requests=mrr,
                      max_total_tokens=max_total, common_args=[*common, *HYBRID_ARGS, "--sleep-on-idle"],
                      command="python -m benchmarks.hybrid_replay " + " ".join(args.argv)),
        geometry=asdict(geom), layout=layout, prompts=prompts, oracle=oracle, margins=margins, runs=runs,
        budget=dict(budget_gb=args.budget_gb, mem_fraction_static=fraction) if fraction else None, probes=probes,
        wall_s=time.time() - t0)
    data["mismatches"] = mismatches(runs, oracle)
    with open(os.path.join(args.out, "hybrid_replay.json"), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
    write_markdown(args.out, "hybrid_replay.md", summarize(data))


if __name__ == "__main__":
    main()
