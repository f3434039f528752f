"""The SGLang benchmark behind `run_sglang_benchmark.sh` (model-card interface).

Environment (defaults in brackets): DRAFT_MODEL and TARGET_MODEL [the CPU test bed; a
comma-separated DRAFT_MODEL benchmarks several drafts], TASKS [gsm8k:128, or
heldout:16 on the test bed], MAX_NEW_TOKENS [2048], TEMPERATURE [0.0], TOP_K [-1: none] and
TOP_P [1.0] (sampled requests only; Qwen3's model cards use 20 and 0.95),
CONCURRENCIES [1,2,4,8,16,32], BLOCK_SIZE [16], VERIFY_TOKENS [= BLOCK_SIZE; 8 for "b8"],
WIDTHS [VERIFY_TOKENS; comma-separated verify widths and/or `adaptive`, one method per draft
and width: `<draft>` at BLOCK_SIZE, `<draft>-w<W>` at W, `<draft>-adaptive` with
--speculative-adaptive], ROUNDS [1; every method's server started this many times, the
methods in turn (reversed every other round), so slow drift and server-to-server variance fall on every method alike; a
round's runs are repeats], TP_SIZE [1], REPEATS [1], SERVER_ARGS [extra flags for every server], PYTHON, CHAT_TEMPLATE
[1], ENABLE_THINKING [0], OUT_DIR [benchmarks/results/sglang-<time>],
SERVER_TIMEOUT [600 s], RULES [point: sampled requests verified as point masses; q: Domino
drafts with --speculative-use-rejection-sampling, method `<draft>+q`; both].

Fair by construction: one launch recipe with identical flags for every method (the
speculative flags are the only difference), a fresh server per method, a warm-up
before timing, `/flush_cache` before every measured run, acceptance read from each
response's `meta_info` and checked non-zero so a silently disabled speculator fails
the run.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from typing import Optional, Union

from pydantic import Field

from sglang_domino.launch import free_port, start

from .common import sampling
from .hf_bench import method_name
from .load import Client, steady, warm_up
from .machine import machine
from .records import TARGET_ONLY, Record, write
from .settings import BenchSettings
from .tasks import load_prompts, render


Q_FLAG = "--speculative-use-rejection-sampling"
Q_SUFFIX = "+q"
ADAPTIVE = "adaptive"
RULES = {"point": ["point"], "q": ["q"], "both": ["point", "q"]}


class SGLangBenchConfig(BenchSettings):
    concurrencies: list[int]
    verify_tokens: int = Field(ge=2)
    widths: list[Union[int, str]]
    tp_size: int = Field(ge=1)
    rounds: int = Field(ge=1)
    server_args: list[str]
    python: str
    server_timeout: float
    on_cpu: bool
    rules: list[str]
    top_k: int = -1
    top_p: float = Field(1.0, gt=0.0, le=1.0)

    @classmethod
    def from_env(cls, env=os.environ) -> "SGLangBenchConfig":
        try:
            common = cls.common(env, "sglang")
            concs = [int(c) for c in env.get("CONCURRENCIES", "1,2,4,8,16,32").split(",") if c.strip()]
            if not concs or min(concs) < 1:
                raise ValueError(f"CONCURRENCIES: got {env.get('CONCURRENCIES')!r}, expected positive integers like '1,8,32'")
            block = common["block_size"]
            verify = int(env.get("VERIFY_TOKENS", block))
            if verify > block:
                raise ValueError(f"VERIFY_TOKENS: got {verify}, expected at most BLOCK_SIZE={block}")
            rules = RULES.get(env.get("RULES", "point"))
            if rules is None:
                raise ValueError(f"RULES: got {env.get('RULES')!r}, expected one of {sorted(RULES)}")
            widths = [_width(w, block) for w in env.get("WIDTHS", str(verify)).split(",") if w.strip()]
            return cls(**common, concurrencies=concs, verify_tokens=verify, widths=widths,
                       tp_size=int(env.get("TP_SIZE", 1)), rounds=int(env.get("ROUNDS", 1)),
                       server_args=shlex.split(env.get("SERVER_ARGS", "")), python=env.get("PYTHON") or sys.executable,
                       server_timeout=float(env.get("SERVER_TIMEOUT", 600)), on_cpu=not _has_cuda(), rules=rules,
                       top_k=int(env.get("TOP_K", -1)), top_p=float(env.get("TOP_P", 1.0)))
        except ValueError as err:
            raise SystemExit(str(err)) from None

    def methods(self) -> dict[str, tuple[Optional[str], list[str]]]:
        """method name -> (draft or None, its speculative flags beyond the shared ones)."""
        from sglang_domino.sglang.checks import read_draft_config

        out: dict[str, tuple[Optional[str], list[str]]] = {TARGET_ONLY: (None, [])}
        for draft in self.draft_models:
            for width in self.widths:
                name, flags = method_name(draft), []
                if width == ADAPTIVE:
                    name, flags = f"{name}-{ADAPTIVE}", ["--speculative-adaptive"]
                elif width != self.block_size:
                    name, flags = f"{name}-w{width}", ["--speculative-num-draft-tokens", str(width)]
                if "point" in self.rules:
                    out[name] = (draft, flags)
                if "q" in self.rules and getattr(read_draft_config(draft, None), "is_domino", False):
                    out[name + Q_SUFFIX] = (draft, flags + [Q_FLAG])
        return out

    def launch_command(self, port: int, draft: Optional[str], extra: tuple[str, ...] = ()) -> list[str]:
        cmd = [self.python, "-m", "sglang.launch_server", "--model-path", self.target_model, "--host", "127.0.0.1",
               "--port", str(port), "--tp-size", str(self.tp_size), "--trust-remote-code"]
        if self.on_cpu:
            cmd += ["--device", "cpu", "--max-total-tokens", "16384"]
        if draft:
            cmd += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft,
                    "--speculative-dflash-block-size", str(self.block_size)]
        return cmd + list(extra) + self.server_args


def _width(raw: str, block: int) -> Union[int, str]:
    raw = raw.strip().lower()
    if raw == ADAPTIVE:
        return ADAPTIVE
    if not raw.isdigit() or not 2 <= int(raw) <= block:
        raise ValueError(f"WIDTHS: got {raw!r}, expected verify widths from 2 to BLOCK_SIZE={block} or 'adaptive'")
    return int(raw)


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def check_speculated(method: str, task: str, conc: int, records: list[Record]) -> None:
    """A speculative method whose server reported no verify step did not speculate: fail the run."""
    if method != TARGET_ONLY and sum(r.verify_steps for r in records) == 0:
        raise RuntimeError(f"{method}: meta_info.spec_verify_ct is 0 on every request of {task} at concurrency {conc}: "
                           "the server did not run speculative decoding")


def main() -> int:
    cfg = SGLangBenchConfig.from_env()
    from tqdm import tqdm
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.target_model, trust_remote_code=True)
    texts = {}
    for task, count in cfg.tasks:   # every task is found before any server starts
        texts[task] = [render(tokenizer, p, cfg.chat_template, cfg.enable_thinking) for p in load_prompts(task, count)]
    os.makedirs(cfg.out_dir, exist_ok=True)
    with open(os.path.join(cfg.out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump({**cfg.model_dump(), "machine": machine()}, fh, indent=1)
    records_path = os.path.join(cfg.out_dir, "records.jsonl")
    open(records_path, "w").close()
    methods = cfg.methods()
    total = cfg.rounds * len(methods) * len(cfg.concurrencies) * cfg.repeats * sum(len(t) for t in texts.values())
    bar = tqdm(total=total, desc="requests", dynamic_ncols=True)
    clock0 = time.time()
    for round_ in range(cfg.rounds):
        order = list(methods.items())
        for method, (draft, extra) in (order if round_ % 2 == 0 else order[::-1]):
            port = free_port()
            cmd = cfg.launch_command(port, draft, tuple(extra))
            print(f"[{method}] {shlex.join(cmd)}", flush=True)
            log = f"server-{method}.log" if cfg.rounds == 1 else f"server-{method}-round{round_}.log"
            with start(cmd, port, os.path.join(cfg.out_dir, log), cfg.server_timeout) as running:
                client = Client(running.url, sampling(cfg))
                warm_up(client, next(iter(texts.values()))[: max(cfg.concurrencies)])
                for conc in cfg.concurrencies:
                    for repeat in range(cfg.repeats):
                        for task, prompts in texts.items():
                            client.flush()
                            recs = steady(client, prompts, conc, clock0, method=method, task=task,
                                          repeat=round_ * cfg.repeats + repeat).records
                            check_speculated(method, task, conc, recs)
                            write(records_path, recs)
                            bar.set_postfix(method=method, c=conc, task=task)
                            bar.update(len(recs))
    bar.close()
    from .report import main as report

    return report([records_path, "--out", cfg.out_dir, "--title", f"SGLang: {os.path.basename(cfg.target_model)}"])


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1)
