"""A small autoregressive draft for the test bed's target: the "assistant" of Transformers'
assisted generation (`target.generate(..., assistant_model=...)`), a peer in the HF benchmark.

    python -m benchmarks.testbed.assistant [--out benchmarks/testbed/checkpoints/assistant] [--threads 1]

Trained by the target's own recipe (`target.train_target`, as in `build.stage_target`):
the same codechat training split and held-out documents, the same seed and batch order,
the same optimizer, schedule and bf16 autocast, only a smaller `Qwen3ForCausalLM`
(`ASSISTANT`: 2 layers, hidden 128, 0.7M parameters). It uses the committed target's
tokenizer as it is (never retrained), so the two share their vocabulary exactly.

Writes a checkpoint directory that `AutoModelForCausalLM.from_pretrained` loads (weights in
`--dtype`, bf16 by default like the committed test bed, with the tokenizer) and
`train_summary.json`: spec, wall time, threads, parameters, held-out perplexity and the
loss curve. Not a build stage: `build.py` and `manifest.json` do not know about it, and a
rebuild of the test bed (`release.publish`) replaces the checkpoints directory without it.
Measured on a 2-core Sapphire Rapids, one thread: 468 s in all (428 s of training), held-out
perplexity 3.47 against the target's 3.18 (`checkpoints/assistant/train_summary.json`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from . import corpus
from .release import CHECKPOINTS
from .spec import PRESETS, TargetSpec, TestbedSpec

# The full target's recipe (vocabulary, sequence length, batch, learning rate, warm-up),
# at a tenth of the non-embedding size.
ASSISTANT = PRESETS["full"].target.model_copy(update=dict(
    hidden_size=128, intermediate_size=384, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=64, steps=1500))
SUMMARY = "train_summary.json"


def train_assistant(out: Path, target_dir: Path = CHECKPOINTS / "target", spec: TargetSpec = ASSISTANT,
                    bed: TestbedSpec = PRESETS["full"], dtype: str = "bfloat16", threads: int = 0,
                    command: str = "") -> dict:
    """Train the assistant into `out` (replaced) and return what `train_summary.json` holds.
    `bed` names the corpus and seed (the test bed's own by default); a test passes a smaller
    one, and a smaller `spec`."""
    from transformers import AutoModelForCausalLM

    from .build import _threads
    from .target import eval_perplexity, token_stream, train_target
    from .tokenizer import load_tokenizer

    t0 = time.time()
    torch.set_num_threads(_threads(threads))
    tok = load_tokenizer(target_dir)
    target_vocab = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"]
    if spec.vocab_size != target_vocab:
        raise SystemExit(f"vocab_size: the assistant spec has {spec.vocab_size}, the target {target_dir} "
                         f"{target_vocab}; they must be equal")
    if len(tok) > spec.vocab_size:
        raise SystemExit(f"the tokenizer of {target_dir} has {len(tok)} tokens, more than vocab_size {spec.vocab_size}")
    train_texts = corpus.documents(bed, held_out=False)
    held_texts = corpus.documents(bed, held_out=True)
    train_stream, eval_stream = token_stream(tok, train_texts), token_stream(tok, held_texts)
    prepare_seconds = time.time() - t0

    out = Path(out)
    work = out.with_name(out.name + ".fp32")   # train_target's own output: fp32 weights
    shutil.rmtree(work, ignore_errors=True)
    stats = train_target(spec, tok, train_stream, eval_stream, work, bed.seed)
    model = AutoModelForCausalLM.from_pretrained(work, dtype=getattr(torch, dtype))
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    shutil.rmtree(work)
    # What the benchmark runs: the saved weights (after rounding to `dtype`), in fp32.
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ppl, bpb = eval_perplexity(saved, eval_stream, spec.seq_len, tok)

    from benchmarks.machine import machine

    summary = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "spec": spec.model_dump(), "corpus": bed.corpus, "seed": bed.seed,
        "train_documents": len(train_texts), "held_out_documents": len(held_texts),
        "corpus_tokens": len(train_stream), "tokenizer": str(target_dir), "tokenizer_size": len(tok),
        "dtype": dtype, "threads": torch.get_num_threads(),
        "prepare_seconds": round(prepare_seconds, 1), "wall_seconds": round(time.time() - t0, 1),
        **stats,
        "heldout_perplexity_fp32": stats["heldout_perplexity"],   # the fp32 weights, before saving
        "heldout_perplexity": round(ppl, 3), "heldout_bits_per_byte": round(bpb, 4),   # the saved weights
        "machine": machine(),
    }
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=CHECKPOINTS / "assistant", help="checkpoint directory (replaced)")
    p.add_argument("--target", type=Path, default=CHECKPOINTS / "target",
                   help="the target whose tokenizer the assistant uses (default: the committed test bed's)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: 2 on an idle machine, else 1)")
    p.add_argument("--steps", type=int, default=ASSISTANT.steps)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="of the saved weights")
    args = p.parse_args(argv)
    spec = ASSISTANT.model_copy(update={"steps": args.steps})
    command = "python -m benchmarks.testbed.assistant " + " ".join(sys.argv[1:] if argv is None else argv)
    summary = train_assistant(args.out, args.target, spec, dtype=args.dtype, threads=args.threads, command=command)
    shown = {k: v for k, v in summary.items() if k not in ("loss_curve", "machine", "spec")}
    print(f"[assistant] {args.out}: {json.dumps(shown)}", flush=True)


if __name__ == "__main__":
    main()
