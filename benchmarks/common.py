"""What the served test-bed benchmarks share (profile_step, attention_ab, interleaved_ab,
peer_ab): the SGLang benchmark's settings for the test bed, so every server is launched by
its command; the load's command-line arguments; the held-out prompts in the chat template;
which draft a config serves; the sampling every request asks for."""

from __future__ import annotations

import os
from typing import Optional

from .load import Sampling

MAX_NEW_TOKENS = 128
OUT_DIR = os.path.join("benchmarks", "results", "cpu-profile")   # the settings' out_dir; the scripts write to --out


def bench_config(prompts: int, concurrencies, temperature: float = 0.0, top_k: int = -1, top_p: float = 1.0,
                 dtype: str = "float32"):
    """The benchmark's own settings for the test bed (float32 unless `dtype`), so the launch command is its."""
    from .sglang_bench import SGLangBenchConfig

    env = {"SERVER_ARGS": f"--dtype {dtype}", "MAX_NEW_TOKENS": str(MAX_NEW_TOKENS), "TASKS": f"heldout:{prompts}",
           "CONCURRENCIES": ",".join(map(str, concurrencies)), "TEMPERATURE": str(temperature), "OUT_DIR": OUT_DIR,
           "TOP_K": str(top_k), "TOP_P": str(top_p)}
    return SGLangBenchConfig.from_env(env)


def sampling(cfg) -> Sampling:
    """What the settings `cfg` ask every request for."""
    return Sampling(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)


def add_load_arguments(ap, rounds: int) -> None:
    """The served A/B benchmarks' load: rounds, concurrencies, held-out prompts, sampling."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--top-p", type=float, default=1.0)


def render_prompts(cfg) -> list[str]:
    """The settings' one task's prompts, in the target's chat template."""
    from transformers import AutoTokenizer

    from .tasks import load_prompts, render

    tokenizer = AutoTokenizer.from_pretrained(cfg.target_model, trust_remote_code=True)
    (task, count), = cfg.tasks
    return [render(tokenizer, p, cfg.chat_template, cfg.enable_thinking) for p in load_prompts(task, count)]


def draft_for(cfg, config: str) -> Optional[str]:
    """The draft a config serves: none for plain; `<draft>+q` is the draft with the q rule."""
    from .sglang_bench import Q_SUFFIX

    if config == "plain":
        return None
    name = config[: -len(Q_SUFFIX)] if config.endswith(Q_SUFFIX) else config
    return next(d for d in cfg.draft_models if os.path.basename(d.rstrip("/")) == name)
