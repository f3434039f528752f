"""The target: a small `Qwen3ForCausalLM` trained from scratch on the training split.

Training text is one token stream (files joined by EOS) cut at seeded random offsets.
fp32 throughout: CPUs without AVX512-BF16/AMX (like the 2-core build machines) run bf16
autocast about 25x slower than fp32.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .spec import TargetSpec


def make_target(spec: TargetSpec, eos_id: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,  # Qwen3Config defaults head_dim to 128
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_target(spec: TargetSpec, tokenizer, train_stream: torch.Tensor, eval_stream: torch.Tensor,
                 out_dir: Path, seed: int) -> dict:
    model = make_target(spec, tokenizer.eos_token_id, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec.warmup_steps, spec.steps))
    gen = torch.Generator().manual_seed(seed + 1)
    n = spec.seq_len
    t0 = time.time()
    bar = tqdm(range(spec.steps), desc="target", mininterval=5)
    for _ in bar:
        starts = torch.randint(0, len(train_stream) - n - 1, (spec.batch_size,), generator=gen)
        batch = torch.stack([train_stream[s:s + n] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    train_time = time.time() - t0
    model.eval()
    ppl = eval_perplexity(model, eval_stream, n)
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "train_seconds": round(train_time, 1), "heldout_perplexity": round(ppl, 2),
            "train_tokens": spec.steps * spec.batch_size * n}


@torch.no_grad()
def eval_perplexity(model, stream: torch.Tensor, seq_len: int, max_chunks: int = 64) -> float:
    chunks = stream[: (len(stream) // seq_len) * seq_len].view(-1, seq_len)[:max_chunks]
    losses = [model(input_ids=c[None], labels=c[None]).loss.item() for c in chunks]
    return math.exp(sum(losses) / max(len(losses), 1))
