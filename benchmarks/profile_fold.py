"""py-spy's stack samples of a served decode step folded into buckets: by phase (draft,
rollout, verify, scheduler bookkeeping, idle, ...) and by operation (attention, linear, the
sgl_kernel stand-ins, ...). Pure functions of the raw samples, so a committed profile's summary
can be recomputed from its files (`python -m benchmarks.profile_step --refold`)."""

from __future__ import annotations

import gzip
from collections import Counter
from typing import Iterable, Optional

# A frame is py-spy's "function (file.py:line)" (file shortened to its package part). Each rule
# is (bucket, needles): a frame matches when any needle occurs in it. The first rule, in list
# order, that matches any frame of a stack names its bucket, so specific rules come first.
#
# sglang is pinned (==0.5.23), so the DFLASH worker's phases are told apart by the line of
# `DFlashWorkerV2.forward_batch_generation` they run under: one function holds the prefill,
# the draft, the rollout, the verify and the accept. A changed pin shows up as a growing
# "other" share.
WORKER = "dflash_worker_v2.py"
IDLE_NEEDLES = ("recv_requests", "Scheduler.on_idle", "self_check_during_idle", "sleep_on_idle")

# What the scheduler's main thread was doing, whichever operation it ran.
PHASE_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("idle, polling for requests", IDLE_NEEDLES),
    ("rollout (Domino head)", ("domino_greedy_rollout", "around_domino_rollout", "_domino_gru_cell")),
    # `CompiledDraft.__call__`: the compiled draft's frame in the raw profiles committed before
    # 2026-12-05 (since then `_CompiledModel.__call__`, which the target shares: the worker's line tells)
    ("draft forward", ("DFlashDraftModel.forward", "CompiledDraft.__call__", f"{WORKER}:2688")),
    ("verify: target forward", (f"{WORKER}:2875",)),
    ("prefill (target, draft KV)", (f"{WORKER}:2348", f"{WORKER}:2408", "EagerRunner._execute_extend")),
    ("draft KV append (target hidden)", ("_append_target_hidden_to_draft_kv_by_loc",)),
    ("accept", ("_accept_block", "_accept_q_rule", "_commit_sampled")),
    ("sampling", ("ModelRunner.sample", "Sampler.forward")),
    ("decode: target forward", ("TpModelWorker.forward_batch_generation",)),
    ("speculative step, other", ("DFlashWorkerV2.forward_batch_generation",)),
    ("result processing, streaming", ("process_batch_result", "stream_output", "_copy_result_to_cpu")),
    ("scheduling, batch bookkeeping", ("get_next_batch_to_run", "update_running_batch", "prepare_for_decode",
                                       "ingest_requests", "publish_load_snapshot", "get_loads", "load_snapshot.py",
                                       "release_kv_cache", "radix_cache.py")),
    ("scheduler loop, other", ("Scheduler.event_loop",)),
]

# Which operation the scheduler's main thread was in, whichever phase asked for it.
OP_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("idle, polling for requests", IDLE_NEEDLES),
    ("sgl_kernel stand-ins", ("kernel_standin.py",)),
    # 0.5.23's per-request loops (torch_native_backend.py) or the plugin's batched SDPA
    # (cpu/attention.py, the default; SGLANG_DOMINO_DEBUG=upstream-cpu-attention for upstream's)
    ("attention", ("torch_native_backend.py", "cpu/attention.py", "around_torch_native_forward_extend",
                   "RadixAttention.forward")),
    ("KV cache writes", ("set_kv_buffer", "_store_kv_layer")),
    ("linear / matmul (lm head too)", ("UnquantizedLinearMethod.apply", "Linear.forward", "_compute_lm_head",
                                       "kv_proj_only", "project_target_hidden")),
    ("GRU (Domino head)", ("GRU.forward", "_domino_gru_cell")),
    ("norm, rope, activation", ("RMSNorm", "rotary_emb", "RotaryEmbedding", "SiluAndMul", "silu",
                                "apply_qk_norm")),
    # code torch.compile generated (the opt-in compiled layers and rollout, cpu/compiled/forward.py,
    # step/compiled_rollout.py) and its call wrappers; the attention they call is counted above
    ("compiled graphs (torch.compile), their calls", ("CompiledFxGraph.__call__", "compile_wrapper")),
    ("rollout (Domino head), other ops", ("domino_greedy_rollout",)),
    ("model forward, Python between ops", ("ModelRunner.forward",)),
    ("outside the forwards: scheduler, worker, streaming", ("Scheduler.event_loop",)),
]
ATTENTION_FILES = ("torch_native_backend.py", "cpu/attention.py")

OTHER = "other"


def parse_raw_line(line: str) -> Optional[tuple[str, str, list[str], int]]:
    """(process, thread, frames root first, count) of one py-spy raw line
    `process P:"cmd";[process C:"cmd";]thread (T): name;frame;...;frame COUNT`, or None."""
    stack, _, count = line.rstrip("\n").rpartition(" ")
    if not stack or not count.isdigit():
        return None
    parts = stack.split(";")
    process, thread, frames = "", "", []
    for i, part in enumerate(parts):
        if part.startswith("process "):
            process = part.split(":", 1)[1].strip('"') if ":" in part else part
        elif part.startswith("thread ("):
            thread, frames = part, parts[i + 1:]
            break
    return process, thread, frames, int(count)


def role_of(process: str) -> str:
    """Which server process a sample came from, by the title SGLang gives its processes."""
    if "scheduler" in process:
        return "scheduler"
    if "detokenizer" in process:
        return "detokenizer"
    if "resource_tracker" in process:
        return "resource tracker"
    return "tokenizer/HTTP"


def is_main_thread(thread: str) -> bool:
    return thread.endswith("MainThread")


def classify(frames: list[str], rules: list[tuple[str, tuple[str, ...]]]) -> str:
    """The first rule's bucket that matches any frame, else OTHER."""
    for bucket, needles in rules:
        if any(needle in frame for frame in frames for needle in needles):
            return bucket
    return OTHER


def fold(samples: Iterable[tuple[list[str], int]], rules) -> dict[str, float]:
    """Share of the samples in each bucket (shares sum to 1; empty input gives {})."""
    counts: Counter = Counter()
    for frames, count in samples:
        counts[classify(frames, rules)] += count
    total = sum(counts.values())
    return {bucket: n / total for bucket, n in counts.most_common()} if total else {}


def read_raw(path: str) -> list[tuple[str, str, list[str], int]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        return [parsed for parsed in map(parse_raw_line, fh) if parsed]


def scheduler_samples(parsed) -> list[tuple[list[str], int]]:
    """The scheduler main thread's stacks: the thread that runs every forward on CPU. A
    recording of one process (no `process` header: this script records only the scheduler)
    counts as the scheduler's."""
    return [(frames, n) for process, thread, frames, n in parsed
            if (not process or role_of(process) == "scheduler") and is_main_thread(thread)]


def top_leaves(samples, k: int = 12, within: tuple[str, ...] = ("",)) -> list[tuple[str, float]]:
    """The k most sampled innermost frames whose text holds one of `within`, with their shares
    of all samples: the rules' check, and the source lines an attention sample was on."""
    counts: Counter = Counter()
    for frames, n in samples:
        leaf = frames[-1] if frames else "?"
        if any(needle in leaf for needle in within):
            counts[leaf] += n
    total = sum(n for _, n in samples) or 1
    return [(leaf, round(n / total, 4)) for leaf, n in counts.most_common(k)]
