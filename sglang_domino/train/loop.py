"""The training loop: one batch = one no-grad target forward (features at the draft's
`target_layer_ids`), anchors, one draft forward over all blocks, the loss, one step."""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from ..checkpoint import load_into, read_weights
from ..hf import DFlashDraftModel
from ..hf.generate import target_features
from .anchors import Anchors, block_inputs, layer_masks, sample_anchors
from .config import TrainConfig
from .data import BatchSchedule, Batch, encode, load_jsonl, truncate
from .draft_init import draft_config_for, init_weights
from .loss import LossOutput, block_targets, cosine_with_warmup, dflash_loss, domino_loss, lambda_base
from .state import latest_checkpoint, load_trainer_state, prune_checkpoints, save_checkpoint, write_summary


def _device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _use_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    return cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda")


def load_target(path: str, device: torch.device):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    target.requires_grad_(False)
    return target


def _load_tokenizer(cfg: TrainConfig):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.target)
    except (OSError, ValueError):
        if cfg.tokenizer:
            raise
        return None  # token-id data needs none


def base_model(target):
    """The decoder stack without the LM head: the features need no logits."""
    return getattr(target, target.base_model_prefix, target)


def draft_forward(draft, target, batch: Batch, anchors: Anchors) -> torch.Tensor:
    """Hidden states [b, N*B, H] of every block of `batch`."""
    cfg = draft.config
    with torch.no_grad():
        out = base_model(target)(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                 output_hidden_states=True, use_cache=False)
        feats = target_features(out.hidden_states, cfg.target_layer_ids)
    ids, positions = block_inputs(batch.input_ids, anchors, cfg.block_size, cfg.mask_token_id)
    s = batch.input_ids.shape[1]
    ctx_positions = torch.arange(s, device=ids.device).expand(ids.shape[0], s)
    context = draft.context_kv(feats, ctx_positions)
    masks = layer_masks(anchors, batch.attention_mask, cfg.block_size, draft.layer_types, cfg.sliding_window)
    with torch.no_grad():
        noise = target.get_input_embeddings()(ids)
    return draft(noise, positions, context, masks)


def compute_loss(draft, target, batch: Batch, num_anchors: int, generator: torch.Generator, gamma, lam: float
                 ) -> LossOutput:
    cfg = draft.config
    anchors = sample_anchors(batch.loss_mask * batch.attention_mask, num_anchors, generator)
    hidden = draft_forward(draft, target, batch, anchors)
    targets = block_targets(batch.input_ids, batch.loss_mask * batch.attention_mask, anchors, cfg.block_size,
                            cfg.shift_label, gamma)
    lm_head = target.get_output_embeddings()
    if cfg.is_domino:
        return domino_loss(draft, hidden, lm_head, target.get_input_embeddings(), batch.input_ids, anchors,
                           targets, lam)
    return dflash_loss(hidden, lm_head, targets, anchors.keep)


def prepare_examples(cfg: TrainConfig, target, tokenizer, output_dir: Path) -> list:
    records = load_jsonl(cfg.data)
    examples = [encode(r, tokenizer) for r in records]
    if cfg.regenerate:
        examples = _regenerated(cfg, target, tokenizer, examples, output_dir)
    return [e for e in (truncate(e, cfg.max_length) for e in examples) if e is not None]


def _regenerated(cfg: TrainConfig, target, tokenizer, examples, output_dir: Path):
    """Responses replaced by the target's greedy continuation of each prompt (the tokens
    before the first loss token); cached next to the run so a resume does not redo it."""
    from .data import Example
    from .regenerate import regenerate

    cache = output_dir / "regenerated.jsonl"
    if cache.exists():
        return [encode(r) for r in load_jsonl(str(cache))]
    prompts = []
    for e in examples:
        first = e.loss_mask.index(1) if 1 in e.loss_mask else len(e.input_ids)
        prompts.append(e.input_ids[:max(first, 1)])
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    eos = eos if eos is not None else target.generation_config.eos_token_id
    stops = [eos] if isinstance(eos, int) else list(eos or [])
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    responses = regenerate(target, prompts, cfg.regenerate_max_new_tokens, cfg.regenerate_batch_size,
                           pad_token_id=pad if pad is not None else (stops[0] if stops else 0),
                           stop_token_ids=stops, progress=cfg.progress)
    out = [Example(p + r, [0] * len(p) + [1] * len(r)) for p, r in zip(prompts, responses)]
    with open(cache, "w", encoding="utf-8") as fh:
        for p, r in zip(prompts, responses):
            fh.write(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n")
    return out


def _mean(history: list[dict], key: str, last: int) -> Optional[float]:
    vals = [h[key] for h in history[-last:] if key in h]
    return sum(vals) / len(vals) if vals else None


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) a training run; returns the summary also written to
    `output_dir/train_summary.json`. The trained draft is saved in `output_dir`."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = _device(cfg)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    target = load_target(cfg.target, device)
    tokenizer = _load_tokenizer(cfg)
    draft_cfg = draft_config_for(target.config, cfg, len(tokenizer) if tokenizer is not None else None)
    draft_cfg.check_target(target.config)
    draft = DFlashDraftModel(draft_cfg)
    init_weights(draft)
    if cfg.init_from:
        load_into(draft, read_weights(cfg.init_from))
    draft.to(device).train()

    examples = prepare_examples(cfg, target, tokenizer, output_dir)
    pad_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    schedule = BatchSchedule(examples, cfg.batch_size, cfg.seed, pad_id if pad_id is not None else 0)
    total = cfg.max_steps or cfg.epochs * schedule.steps_per_epoch
    warmup = int(cfg.warmup_ratio * total)

    resume_from = latest_checkpoint(output_dir) if cfg.resume == "auto" else (Path(cfg.resume) if cfg.resume else None)
    state = load_trainer_state(resume_from) if resume_from is not None else None
    if state is not None:
        # Before the optimizer exists: loading assigns new Parameter objects.
        load_into(draft, {k: v.to(device) for k, v in read_weights(str(resume_from)).items()})
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_with_warmup(s, warmup, total))
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    step, history = 0, []
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["anchor_rng"])
        torch.set_rng_state(state["torch_rng"])
        step, history = state["step"], state["history"]

    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if _use_bf16(cfg, device) else nullcontext())
    cfg_dict = cfg.model_dump()
    t0 = time.time()
    tokens = 0
    bar = tqdm(total=total, initial=step, desc=f"train {cfg.kind}", disable=not cfg.progress, mininterval=2)
    while step < total:
        batch = schedule.batch(step)
        batch = Batch(*(t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.loss_mask)))
        lam = lambda_base(step, total, cfg.lambda_base_start, cfg.lambda_base_decay_ratio)
        with autocast:
            out = compute_loss(draft, target, batch, cfg.anchors, generator, cfg.loss_decay_gamma, lam)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        tokens += int(batch.attention_mask.sum())
        record = {"step": step, "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm), **out.metrics}
        history.append(record)
        bar.update(1)
        bar.set_postfix(loss=f"{_mean(history, 'loss', 20):.3f}", acc=f"{_mean(history, 'acc', 20):.3f}",
                        tau=f"{_mean(history, 'tau', 20):.2f}", refresh=False)
        if cfg.save_every and step % cfg.save_every == 0 and step < total:
            save_checkpoint(output_dir / f"checkpoint-{step}", draft, optimizer, scheduler, step, generator,
                            cfg_dict, history)
            prune_checkpoints(output_dir, cfg.keep_checkpoints)
    bar.close()
    wall = time.time() - t0
    draft.eval()
    draft.save_pretrained(output_dir)
    window = max(len(history) // 10, 1)
    summary = {
        "kind": cfg.kind, "steps": step, "wall_seconds": round(wall, 1),
        "context_tokens_per_second": round(tokens / wall, 1) if wall > 0 else None,
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "final": {k: _mean(history, k, window) for k in ("loss", "acc", "tau", "base_acc", "base_tau")
                  if _mean(history, k, window) is not None},
        "config": cfg_dict,
    }
    write_summary(output_dir, summary)
    return summary
