"""The target: a small `Qwen3ForCausalLM` trained from scratch on the training split.

Training text is one token stream (documents joined by `<|endoftext|>`) cut at seeded
random offsets. Weights and optimizer state are fp32; the forward and backward run under
bf16 autocast where the CPU has AMX or AVX512-BF16 (measured 1.9x faster than fp32 on a
2-core Sapphire Rapids machine), and in fp32 elsewhere (CPUs without them run bf16 about
25x slower than fp32).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .spec import TargetSpec


def cpu_has_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def make_target(spec: TargetSpec, eos_id: int, pad_id: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,  # Qwen3Config defaults head_dim to 128
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.pad_token_id)   # <|endoftext|>, the document separator
    return torch.tensor(ids, dtype=torch.long)


def lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def train_target(spec: TargetSpec, tokenizer, train_stream: torch.Tensor, eval_stream: torch.Tensor,
                 out_dir: Path, seed: int) -> dict:
    model = make_target(spec, tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
    autocast = cpu_has_bf16()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec.warmup_steps, spec.steps))
    gen = torch.Generator().manual_seed(seed + 1)
    n = spec.seq_len
    t0 = time.time()
    bar = tqdm(range(spec.steps), desc="target", mininterval=5)
    curve: list = []  # [step, train loss, seconds]: the manifest keeps the curve
    for step in bar:
        starts = torch.randint(0, len(train_stream) - n - 1, (spec.batch_size,), generator=gen)
        batch = torch.stack([train_stream[s:s + n] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % 100 == 0 or step == spec.steps - 1:
            curve.append([step, round(loss.item(), 4), round(time.time() - t0, 1)])
    train_time = time.time() - t0
    model.eval()
    ppl, bpb = eval_perplexity(model, eval_stream, n, tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "train_seconds": round(train_time, 1), "heldout_perplexity": round(ppl, 3),
            "heldout_bits_per_byte": round(bpb, 4),
            "train_tokens": spec.steps * spec.batch_size * n, "bf16_autocast": autocast,
            "loss_curve": curve}


@torch.no_grad()
def eval_perplexity(model, stream: torch.Tensor, seq_len: int, tokenizer, max_chunks: int = 64) -> tuple[float, float]:
    """(per-token perplexity, bits per UTF-8 byte) on held-out text. Perplexity depends on the
    tokenizer; bits per byte compare across tokenizers and corpora."""
    chunks = stream[: (len(stream) // seq_len) * seq_len].view(-1, seq_len)[:max_chunks]
    losses = [model(input_ids=c[None], labels=c[None]).loss.item() for c in chunks]
    nats = sum(l * (seq_len - 1) for l in losses)
    # Bytes of the predicted tokens (all but each chunk's first), special tokens as written.
    nbytes = sum(len(tokenizer.decode(c[1:]).encode()) for c in chunks)
    return math.exp(sum(losses) / max(len(losses), 1)), nats / math.log(2) / max(nbytes, 1)
