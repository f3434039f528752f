"""The Transformers benchmark behind `run_hf_benchmark.sh` (model-card interface).

Environment (defaults in brackets): DRAFT_MODEL and TARGET_MODEL [the CPU test bed; a
comma-separated DRAFT_MODEL benchmarks several drafts], TASKS [gsm8k:128, or
heldout:16 on the test bed], MAX_NEW_TOKENS [2048], TEMPERATURE [0.0],
BLOCK_SIZE [16: the verify width], NUM_GPUS [8: prompts sharded over GPUs, one process
each; 1 process without CUDA], REPEATS [1], DTYPE [auto], CHAT_TEMPLATE [1],
ENABLE_THINKING [0], OUT_DIR [benchmarks/results/hf-<time>].

For fairness the baseline is plain target decoding (one cached forward per token) on
the same prompts, chat template, thinking setting, dtype and max_new_tokens; every
method gets a warm-up before timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Optional

from pydantic import Field

from .machine import machine
from .records import TARGET_ONLY, Record, read, write
from .settings import BenchSettings
from .tasks import load_prompts, render


class HFBenchConfig(BenchSettings):
    num_gpus: int = Field(ge=1)
    dtype: str

    @classmethod
    def from_env(cls, env=os.environ) -> "HFBenchConfig":
        try:
            return cls(**cls.common(env, "hf"), num_gpus=int(env.get("NUM_GPUS", 8)), dtype=env.get("DTYPE", "auto"))
        except ValueError as err:
            raise SystemExit(str(err)) from None


def method_name(path: str) -> str:
    return os.path.basename(os.path.normpath(path))


def encode(tokenizer, prompt: str, cfg: "HFBenchConfig"):
    text = render(tokenizer, prompt, cfg.chat_template, cfg.enable_thinking)
    return tokenizer(text, return_tensors="pt", add_special_tokens=not cfg.chat_template).input_ids


def run_shard(cfg: HFBenchConfig, shard: int, num_shards: int, clock0: float, device: str) -> str:
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_domino.hf import DFlashDraftModel

    from .decode import speculative_decode, target_only_decode

    dtype = "auto" if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    target = AutoModelForCausalLM.from_pretrained(cfg.target_model, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(cfg.target_model)
    stops = [t for t in [tokenizer.eos_token_id, tokenizer.pad_token_id] if t is not None]
    drafts = {method_name(p): DFlashDraftModel.from_pretrained(p, dtype=target.dtype, device_map=device) for p in cfg.draft_models}
    methods = {TARGET_ONLY: None, **drafts}
    work = []
    for task, count in cfg.tasks:
        prompts = load_prompts(task, count)
        work += [(task, i, encode(tokenizer, p, cfg).to(device)) for i, p in enumerate(prompts)
                 if i % num_shards == shard]
    path = os.path.join(cfg.out_dir, f"records.shard{shard}.jsonl")
    open(path, "w").close()
    bar = tqdm(total=len(methods) * cfg.repeats * len(work), desc=f"shard {shard}", position=shard, dynamic_ncols=True)
    for name, draft in methods.items():
        def run(ids, n):
            if draft is None:
                return target_only_decode(target, ids, n, stops, cfg.temperature)
            return speculative_decode(draft, target, ids, n, stops, cfg.temperature, cfg.block_size)

        run(work[0][2], min(16, cfg.max_new_tokens))  # warm-up
        for repeat in range(cfg.repeats):
            for task, index, ids in work:
                start = time.time() - clock0
                result = run(ids, cfg.max_new_tokens)
                end = time.time() - clock0
                write(path, [Record(backend="hf", method=name, task=task, concurrency=1, repeat=repeat,
                                    prompt_index=index, prompt_tokens=ids.shape[1], start_s=start, end_s=end,
                                    latency_s=end - start, tok_per_s=result["tokens"] / (end - start),
                                    completion_tokens=result["tokens"], verify_steps=result["verify_steps"],
                                    accepted_tokens=result["accepted_tokens"], accept_lengths=result["accept_lengths"])])
                bar.set_postfix(method=name, task=task)
                bar.update()
    bar.close()
    return path


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = HFBenchConfig.from_env()
    if argv and argv[0] == "--shard":
        shard, num_shards, clock0, device = int(argv[1]), int(argv[2]), float(argv[3]), argv[4]
        run_shard(cfg, shard, num_shards, clock0, device)
        return 0
    for task, count in cfg.tasks:   # fail before any model loads if a task cannot be found
        load_prompts(task, count)
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({**cfg.model_dump(), "machine": machine()}, fh, indent=1)
    import torch

    gpus = torch.cuda.device_count()
    shards = min(cfg.num_gpus, gpus) if gpus else 1
    if not gpus:
        print(f"no CUDA device: running 1 process on the CPU (NUM_GPUS={cfg.num_gpus} ignored)")
    clock0 = time.time()
    procs = []
    for shard in range(shards):
        # The shards must write where this process reads: without OUT_DIR each one would
        # name its own timestamped directory, a second later.
        env = {**os.environ, "OUT_DIR": cfg.out_dir}
        device = "cpu"
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(shard)
            device = "cuda:0"
        procs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.hf_bench", "--shard", str(shard),
                                       str(shards), repr(clock0), device], env=env))
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        print(f"{len(failed)} shard(s) failed", file=sys.stderr)
        return 1
    records = [r for s in range(shards) for r in read(os.path.join(cfg.out_dir, f"records.shard{s}.jsonl"))]
    write(os.path.join(cfg.out_dir, "records.jsonl"), records, append=False)
    for s in range(shards):
        os.remove(os.path.join(cfg.out_dir, f"records.shard{s}.jsonl"))
    from .report import main as report

    return report([os.path.join(cfg.out_dir, "records.jsonl"), "--out", cfg.out_dir,
                   "--title", f"Transformers backend: {os.path.basename(cfg.target_model)}"])


if __name__ == "__main__":
    raise SystemExit(main())
