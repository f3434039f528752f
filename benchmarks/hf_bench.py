"""The Transformers benchmark behind `run_hf_benchmark.sh` (model-card interface).

Environment (defaults in brackets): DRAFT_MODEL and TARGET_MODEL [the CPU test bed; a
comma-separated DRAFT_MODEL benchmarks several drafts], TASKS [gsm8k:128, or
heldout:16 on the test bed], MAX_NEW_TOKENS [2048], TEMPERATURE [0.0],
BLOCK_SIZE [16: the verify width], NUM_GPUS [8: prompts sharded over GPUs, one process
each; 1 process without CUDA], REPEATS [1], DTYPE [auto], CHAT_TEMPLATE [1],
ENABLE_THINKING [0], OUT_DIR [benchmarks/results/hf-<time>].

Peers, Transformers' own speculative decoding, greedy only (TEMPERATURE=0):
ASSISTANT_MODEL [on the test bed: benchmarks/testbed/checkpoints/assistant if it exists,
trained by `python -m benchmarks.testbed.assistant`; else off]: a small autoregressive
model with the target's vocabulary, run as `target.generate(assistant_model=...)` with
Transformers' default assistant settings (method `hf-assisted:<name>`); 0 turns it off.
PROMPT_LOOKUP [10 on the test bed, else 0 = off]: `target.generate(prompt_lookup_num_tokens=N)`
(method `hf-prompt-lookup`).

For fairness the baseline is plain target decoding (one cached forward per token) on
the same prompts, chat template, thinking setting, dtype and max_new_tokens; every
method gets a warm-up before timing. At temperature 0 every method's completion is
compared token for token with target-only decoding's on the same prompt (the records'
`equal_output` and `first_difference`; "Equal output" in summary.md).
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

PROMPT_LOOKUP_DEFAULT = 10   # Transformers' PromptLookupCandidateGenerator default
ASSISTED_PREFIX = "hf-assisted:"
PROMPT_LOOKUP_METHOD = "hf-prompt-lookup"
OFF = ("", "0", "none", "off")


class HFBenchConfig(BenchSettings):
    num_gpus: int = Field(ge=1)
    dtype: str
    assistant_model: Optional[str] = None   # Transformers' assisted generation with this model; None: off
    prompt_lookup: int = Field(0, ge=0)     # Transformers' prompt lookup with this many candidate tokens; 0: off

    @classmethod
    def from_env(cls, env=os.environ) -> "HFBenchConfig":
        try:
            common = cls.common(env, "hf")
            peers = peer_settings(env, on_testbed=not env.get("TARGET_MODEL"), temperature=common["temperature"])
            return cls(**common, **peers, num_gpus=int(env.get("NUM_GPUS", 8)), dtype=env.get("DTYPE", "auto"))
        except ValueError as err:
            raise SystemExit(str(err)) from None

    def peer_methods(self) -> list[str]:
        """The Transformers peers' method names, in the order they run (after the drafts)."""
        return ([ASSISTED_PREFIX + method_name(self.assistant_model)] if self.assistant_model else []) + \
            ([PROMPT_LOOKUP_METHOD] if self.prompt_lookup else [])


def default_assistant() -> Optional[str]:
    """The test bed's assistant (`python -m benchmarks.testbed.assistant`), if it has been trained."""
    from benchmarks.testbed.release import CHECKPOINTS

    path = CHECKPOINTS / "assistant"
    return str(path) if (path / "config.json").exists() else None


def peer_settings(env, on_testbed: bool, temperature: float) -> dict:
    """assistant_model and prompt_lookup from ASSISTANT_MODEL and PROMPT_LOOKUP: on by default
    on the test bed at temperature 0, off elsewhere; greedy only."""
    raw = env.get("ASSISTANT_MODEL")
    if raw is None:
        assistant = default_assistant() if on_testbed and temperature == 0 else None
    elif raw.strip().lower() in OFF:
        assistant = None
    else:
        assistant = raw.strip()
        is_dir = os.path.isfile(os.path.join(assistant, "config.json"))
        hub_id = assistant.count("/") == 1 and not assistant.startswith((".", "/", "~")) \
            and not os.path.exists(assistant)
        if not (is_dir or hub_id):
            raise ValueError(f"ASSISTANT_MODEL: got {raw!r}, expected a checkpoint directory with config.json or a "
                             "Hugging Face model id (owner/name), or 0 to turn assisted generation off")
    raw = env.get("PROMPT_LOOKUP")
    if raw is None:
        lookup = PROMPT_LOOKUP_DEFAULT if on_testbed and temperature == 0 else 0
    else:
        try:
            lookup = int(raw) if raw.strip() else 0
        except ValueError:
            lookup = -1
        if lookup < 0:
            raise ValueError(f"PROMPT_LOOKUP: got {raw!r}, expected a number of candidate tokens "
                             f"(e.g. {PROMPT_LOOKUP_DEFAULT}), or 0 to turn prompt lookup off")
    if temperature > 0 and (assistant or lookup):
        named = [n for n, on in (("ASSISTANT_MODEL", assistant), ("PROMPT_LOOKUP", lookup)) if on]
        raise ValueError(f"{' and '.join(named)}: the Transformers peers are measured greedy only, got "
                         f"TEMPERATURE={temperature}; set TEMPERATURE=0, or {' and '.join(n + '=0' for n in named)}")
    return {"assistant_model": assistant, "prompt_lookup": lookup}


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

    from .decode import hf_generate_decode, speculative_decode, target_only_decode
    from .sglang_numerics import first_difference

    dtype = "auto" if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    target = AutoModelForCausalLM.from_pretrained(cfg.target_model, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(cfg.target_model)
    stops = [t for t in [tokenizer.eos_token_id, tokenizer.pad_token_id] if t is not None]
    drafts = {method_name(p): DFlashDraftModel.from_pretrained(p, dtype=target.dtype, device_map=device) for p in cfg.draft_models}
    methods = {TARGET_ONLY: lambda ids, n: target_only_decode(target, ids, n, stops, cfg.temperature)}
    for name, draft in drafts.items():
        methods[name] = lambda ids, n, d=draft: speculative_decode(d, target, ids, n, stops, cfg.temperature,
                                                                   cfg.block_size)
    if cfg.assistant_model:
        assistant = load_assistant(cfg.assistant_model, tokenizer, target.dtype, device)
        methods[cfg.peer_methods()[0]] = lambda ids, n: hf_generate_decode(target, ids, n, stops,
                                                                           assistant_model=assistant)
    if cfg.prompt_lookup:
        methods[PROMPT_LOOKUP_METHOD] = lambda ids, n: hf_generate_decode(target, ids, n, stops,
                                                                          prompt_lookup_num_tokens=cfg.prompt_lookup)
    work = []
    for task, count in cfg.tasks:
        prompts = load_prompts(task, count)
        work += [(task, i, encode(tokenizer, p, cfg).to(device)) for i, p in enumerate(prompts)
                 if i % num_shards == shard]
    path = os.path.join(cfg.out_dir, f"records.shard{shard}.jsonl")
    open(path, "w").close()
    bar = tqdm(total=len(methods) * cfg.repeats * len(work), desc=f"shard {shard}", position=shard, dynamic_ncols=True)
    reference: dict[tuple[str, int], list[int]] = {}   # target-only's first completion of each prompt
    for name, run in methods.items():
        run(work[0][2], min(16, cfg.max_new_tokens))  # warm-up
        for repeat in range(cfg.repeats):
            for task, index, ids in work:
                start = time.time() - clock0
                result = run(ids, cfg.max_new_tokens)
                end = time.time() - clock0
                first, equal = None, None
                if cfg.temperature == 0:
                    if name == TARGET_ONLY and (task, index) not in reference:
                        reference[(task, index)] = result["ids"]   # the reference itself: not checked
                    else:
                        first = first_difference(reference[(task, index)], result["ids"])
                        equal = first is None
                write(path, [Record(backend="hf", method=name, task=task, concurrency=1, repeat=repeat,
                                    prompt_index=index, prompt_tokens=ids.shape[1], start_s=start, end_s=end,
                                    latency_s=end - start, tok_per_s=result["tokens"] / (end - start),
                                    completion_tokens=result["tokens"], verify_steps=result["verify_steps"],
                                    accepted_tokens=result["accepted_tokens"], accept_lengths=result["accept_lengths"],
                                    equal_output=equal, first_difference=first)])
                bar.set_postfix(method=name, task=task)
                bar.update()
    bar.close()
    return path


def load_assistant(path: str, tokenizer, dtype, device: str):
    """The assisted-generation model, in the target's dtype; refused unless it has the target's vocabulary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assistant = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    try:
        theirs = AutoTokenizer.from_pretrained(path).get_vocab()
    except (OSError, ValueError):   # no tokenizer beside the weights: nothing to compare
        return assistant
    if theirs != tokenizer.get_vocab():
        raise SystemExit(f"ASSISTANT_MODEL: {path} has another vocabulary than the target's; assisted generation "
                         "here needs an assistant with the target's tokenizer")
    return assistant


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = HFBenchConfig.from_env()
    if argv and argv[0] == "--shard":
        shard, num_shards, clock0, device = int(argv[1]), int(argv[2]), float(argv[3]), argv[4]
        run_shard(cfg, shard, num_shards, clock0, device)
        return 0
    for task, count in cfg.tasks:   # fail before any model loads if a task cannot be found
        load_prompts(task, count)
    if not os.environ.get("TARGET_MODEL") and "ASSISTANT_MODEL" not in os.environ and not cfg.assistant_model \
            and cfg.temperature == 0:
        print("no assistant at benchmarks/testbed/checkpoints/assistant: hf-assisted left out "
              "(train it with `python -m benchmarks.testbed.assistant --threads 1`)")
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
