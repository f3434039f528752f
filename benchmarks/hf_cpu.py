"""Transformers backend on CPU: target-only decoding vs DFlash vs Domino.

Prints and records, per method: output tokens/s, mean acceptance length (bonus
included) and the share of decode time spent outside the target's forward passes
(drafting, rollout, acceptance, bookkeeping).

    python -m benchmarks.hf_cpu                       # tiny random models (plumbing only)
    python -m benchmarks.hf_cpu --target T --draft D1 --draft D2 [--task heldout]
    python -m benchmarks.hf_cpu --testbed                # the CPU test bed, held-out requests

The baseline is plain greedy decoding with a KV cache (one target forward per token),
never the speculative loop with a block of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from .decode import speculative_decode, target_only_decode
from .machine import machine
from .settings import resolve_models
from .tasks import load_prompts, render


def measure(result: dict) -> dict:
    decode = result["decode_s"]
    return {"tokens": result["tokens"], "seconds": result["seconds"],
            "accept_length": result["accepted_tokens"] / result["verify_steps"] if result["verify_steps"] else 1.0,
            "accept_lengths": result["accept_lengths"],
            "outside_target_share": (decode - result["target_forward_s"]) / decode if decode else 0.0}


def load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_domino.hf import DFlashDraftModel
    from sglang_domino.testing import tiny_draft, tiny_target

    if not args.target:
        target = tiny_target()
        drafts = {"dflash": tiny_draft(target, "dflash", block_size=16), "domino": tiny_draft(target, "domino", block_size=16)}
        g = torch.Generator().manual_seed(0)
        return target, drafts, [torch.randint(0, 250, (1, 32), generator=g) for _ in range(args.num_prompts)], []
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(args.target)
    drafts = {os.path.basename(os.path.normpath(p)): DFlashDraftModel.from_pretrained(p, dtype=torch.float32) for p in args.draft}
    texts = [render(tok, t, chat=True, enable_thinking=False) for t in load_prompts(args.task, args.num_prompts)]
    return target, drafts, [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts], \
        [tok.eos_token_id]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target")
    parser.add_argument("--draft", action="append", default=[])
    parser.add_argument("--task", default="heldout", help="a task of benchmarks/tasks.py (in the target's chat template)")
    parser.add_argument("--testbed", action="store_true", help="run the CPU test bed's target and drafts")
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/hf_cpu.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.testbed:
        args.target, args.draft, _ = resolve_models({})
    target, drafts, prompts, stops = load(args)
    methods = {"target-only": lambda ids: measure(target_only_decode(target, ids, args.max_new_tokens, stops, args.temperature))}
    for name, draft in drafts.items():
        methods[name] = lambda ids, d=draft: measure(speculative_decode(d, target, ids, args.max_new_tokens, stops,
                                                                        args.temperature))
    results = {}
    with torch.inference_mode():
        for name, run in methods.items():
            run(prompts[0])  # warm-up
            runs = [run(ids) for ids in prompts]
            tps = [r["tokens"] / r["seconds"] for r in runs]
            results[name] = {
                "tok_per_s": statistics.mean(tps), "tok_per_s_stdev": statistics.pstdev(tps),
                "accept_length": statistics.mean(r["accept_length"] for r in runs),
                "outside_target_share": statistics.mean(r["outside_target_share"] for r in runs),
                "runs": runs,
            }
    base = results["target-only"]["tok_per_s"]
    print(f"{'method':<16}{'tok/s':>10}{'speedup':>9}{'accept':>8}{'outside target':>16}")
    for name, r in results.items():
        print(f"{name:<16}{r['tok_per_s']:>10.1f}{r['tok_per_s'] / base:>8.2f}x{r['accept_length']:>8.2f}"
              f"{100 * r['outside_target_share']:>15.1f}%")
    record = {"machine": machine(),
              "target": args.target or "tiny random Qwen3 (sglang_domino.testing)", "drafts": list(drafts),
              "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "results": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    print(f"recorded in {args.out}")


if __name__ == "__main__":
    main()
