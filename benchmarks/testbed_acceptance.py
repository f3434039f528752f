"""Acceptance and speed of the test bed's DFlash and Domino drafts (Transformers backend, CPU, fp32).

    python benchmarks/testbed_acceptance.py [--build DIR] [--out benchmarks/results/testbed]

Mean acceptance length = tokens committed per target verify step, bonus included, over
every step of every prompt, on the test bed's held-out requests (tasks its target never
saw). Rows: greedy at verify width 16 (bonus + 15 drafts, the block) and 8
(`num_verify_tokens=8`); temperature 0.6 and 1 at width 16 with both acceptance rules:
the point-mass rule (greedy drafts accepted with probability p(d), what SGLang 0.5.23
does for DFLASH) and the draft's own q (drafts sampled from q, accepted with
min(1, p/q)). Quality of the target's greedy answers: how many have a Python block that
parses, and how many are whitespace only. Speed: batch-1 wall clock against a plain greedy
target loop (prefill + one token per forward, same fp32 target), interleaved prompt by
prompt so that load from other processes hits every method alike; greedy outputs are
checked to be identical to the target's own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.testbed import prompts as prompt_sets  # noqa: E402
from benchmarks.machine import machine  # noqa: E402
from benchmarks.testbed.load import committed, load  # noqa: E402


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def code_parses(text: str) -> bool:
    """The answer has a ```python block that Python parses."""
    import ast

    if "```python\n" not in text:
        return False
    code = text.split("```python\n", 1)[1].split("\n```", 1)[0]
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def acceptance(draft, target, rows, *, temperature, width, rule, max_new_tokens, batch_size, pad, eos, seed,
               decode) -> dict:
    lengths: list[int] = []
    texts: list[str] = []
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, len(rows), batch_size):
        ids, mask = left_pad(rows[start:start + batch_size], pad)
        out, stats = draft.spec_generate(ids, target, max_new_tokens=max_new_tokens, temperature=temperature,
                                         attention_mask=mask, num_verify_tokens=width, stop_token_ids=[eos],
                                         pad_token_id=pad, generator=gen, greedy_draft=rule == "point-mass",
                                         return_stats=True)
        lengths += stats.accept_lengths
        texts += [decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out.tolist()]
    return {"mean_accept_length": round(sum(lengths) / len(lengths), 3), "verify_steps": len(lengths),
            "prompts": len(rows), "code_parses": sum(map(code_parses, texts)),
            # Continuations that are only whitespace: trivially predictable, they inflate acceptance.
            "whitespace_only_outputs": sum(not t.strip() for t in texts), "first_output": texts[0]}


@torch.inference_mode()
def target_greedy(target, ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
    from transformers import DynamicCache

    cache = DynamicCache()
    out = target(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1)
    new = []
    for _ in range(max_new_tokens):
        tok = int(out.logits[0, -1].argmax())
        new.append(tok)
        if tok == eos or len(new) >= max_new_tokens:
            break
        out = target(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
    return new


def speed(tb, rows, *, max_new_tokens, eos, pad) -> dict:
    methods = {"target": None, "dflash": tb.dflash, "domino": tb.domino}
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in methods}
    lossless = True
    for ids in rows:
        ref = None
        for name, draft in methods.items():
            t0 = time.perf_counter()
            if draft is None:
                new = target_greedy(tb.target, ids, max_new_tokens, eos)
                ref = new
            else:
                out = draft.spec_generate(torch.tensor([ids]), tb.target, max_new_tokens=max_new_tokens,
                                          temperature=0.0, num_verify_tokens=16, stop_token_ids=[eos],
                                          pad_token_id=pad)
                new = out[0, len(ids):].tolist()
                lossless &= new == ref
            totals[name]["seconds"] += time.perf_counter() - t0
            totals[name]["tokens"] += len(new)
    result = {}
    for name, t in totals.items():
        result[name] = {"tokens_per_second": round(t["tokens"] / t["seconds"], 1), "tokens": t["tokens"]}
    for name in ("dflash", "domino"):
        result[name]["speedup"] = round(result[name]["tokens_per_second"] / result["target"]["tokens_per_second"], 2)
    result["greedy_outputs_identical_to_target"] = lossless
    result["prompts"] = len(rows)
    return result


ROWS = [  # (temperature, verify width, acceptance rule at T > 0)
    (0.0, 16, "greedy"), (0.0, 8, "greedy"),
    (0.6, 16, "point-mass"), (0.6, 16, "q"),
    (1.0, 16, "point-mass"), (1.0, 16, "q"),
]


def markdown(report: dict) -> str:
    b = report["build"]
    lines = ["# Test bed: DFlash vs Domino acceptance (Transformers backend, CPU, float32)", "",
             f"Test bed: {b['corpus']} corpus, {b['target_params'] / 1e6:.1f}M-parameter Qwen3 target (held-out "
             f"perplexity {b['target_heldout_perplexity']}, {b['target_heldout_bits_per_byte']} bits per byte), "
             f"drafts {b['draft_params']}; build wall time {b['build_wall_seconds'] / 60:.1f} min. "
             f"{report['settings']['heldout']} held-out requests (tasks the target never saw), "
             f"{report['settings']['max_new_tokens']} new tokens at most. Mean acceptance length = tokens per "
             "verify step, bonus included.", "",
             "| T | verify | rule | DFlash | Domino | Domino / DFlash | answers whose code parses |",
             "|---|---|---|---|---|---|---|"]
    for row in report["acceptance"]:
        d, m = row["dflash"]["mean_accept_length"], row["domino"]["mean_accept_length"]
        lines.append(f"| {row['temperature']:g} | {row['width']} | {row['rule']} | {d:.2f} | {m:.2f} | {m / d:.2f}x | "
                     f"{row['domino']['code_parses']} of {row['domino']['prompts']} |")
    s = report["speed"]
    lines += ["", f"Speed, batch 1, greedy, verify 16, {s['prompts']} held-out requests (float32, "
              f"{report['settings']['threads']} thread(s), shared 2-core machine: noisy):", "",
              "| method | tokens/s | speedup |", "|---|---|---|",
              f"| target only | {s['target']['tokens_per_second']} | 1.00x |",
              f"| DFlash | {s['dflash']['tokens_per_second']} | {s['dflash']['speedup']:.2f}x |",
              f"| Domino | {s['domino']['tokens_per_second']} | {s['domino']['speedup']:.2f}x |", "",
              f"Greedy outputs identical to target-only decoding: {s['greedy_outputs_identical_to_target']}.", "",
              "Reading the numbers:",
              "- Rules at T > 0: `point-mass` drafts greedily and accepts each draft token d with probability "
              "p(d) (SGLang 0.5.23's DFLASH rule); `q` samples drafts from the draft's own distribution and "
              "accepts with min(1, p/q). Both emit exactly the target's distribution.",
              "- Verify 16 = bonus + 15 drafts for both drafts (SGLang's width); 8 = bonus + 7.",
              "- The last column counts answers (Domino's run; greedy rows equal the target's own) with a "
              "Python block that `ast.parse` accepts.",
              "", "First held-out request and the target's greedy answer (T = 0):", "", "````text",
              report["example"]["request"], "", report["example"]["answer"], "````", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, default=None, help="a build directory (default: the committed test bed)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "testbed")
    p.add_argument("--heldout", type=int, default=64, help="held-out requests (0: all 200)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--speed-prompts", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    build = args.build or committed()
    tb = load(build)
    tok = tb.tokenizer
    eos, pad = tok.eos_token_id, tok.pad_token_id
    heldout = prompt_sets.heldout_rows(build, args.heldout)
    prompts = [r["prompt_ids"] for r in heldout]
    rows = []
    for temperature, width, rule in ROWS:
        row = {"temperature": temperature, "width": width, "rule": rule}
        for kind in ("dflash", "domino"):
            t0 = time.time()
            row[kind] = acceptance(getattr(tb, kind), tb.target, prompts, temperature=temperature, width=width,
                                   rule=rule, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                   pad=pad, eos=eos, seed=args.seed, decode=tok.decode)
            row[kind]["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    spd = speed(tb, prompts[:args.speed_prompts], max_new_tokens=args.max_new_tokens, eos=eos, pad=pad)
    print(json.dumps(spd), flush=True)
    stages = tb.manifest.get("stages", {})
    target_stage = stages.get("target", {})
    report = {
        "build": {"path": os.path.relpath(build, Path(__file__).resolve().parents[1]), "preset": tb.manifest.get("preset"),
                  "corpus": tb.manifest.get("spec", {}).get("corpus", "stdlib"),
                  "build_wall_seconds": tb.manifest.get("total_wall_seconds"),
                  "stage_wall_seconds": {k: v.get("wall_seconds") for k, v in stages.items()},
                  "target_params": target_stage.get("params"),
                  "target_heldout_perplexity": target_stage.get("heldout_perplexity"),
                  "target_heldout_bits_per_byte": target_stage.get("heldout_bits_per_byte"),
                  "draft_params": {k: stages.get(k, {}).get("draft_params") for k in ("dflash", "domino")},
                  "draft_train_tau": {k: stages.get(k, {}).get("final", {}).get("tau") for k in ("dflash", "domino")},
                  "spec": tb.manifest.get("spec")},
        "settings": {k: v for k, v in vars(args).items() if k not in ("build", "out")},
        "acceptance": rows,
        "speed": spd,
        "example": {"request": heldout[0]["prompt"], "answer": rows[0]["domino"]["first_output"]},
        "machine": machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
