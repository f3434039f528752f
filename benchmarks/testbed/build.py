"""Build (or complete) the test bed: `python -m benchmarks.testbed.build [--preset full]`.

Stages run in order and each one is cached in the build directory, so an interrupted
build resumes at the first missing stage:
  target   tokenizer + Qwen3 target trained on the corpus's training split
  data     training prompts continued greedily by the target (the drafts' training text),
           and the held-out evaluation prompts
  dflash   DFlash draft trained against the target
  domino   Domino draft trained against the target
`manifest.json` records the spec, its digest and each stage's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from . import corpus
from .spec import PRESETS, TestbedSpec, build_dir

STAGES = ("target", "data", "dflash", "domino")
MANIFEST = "manifest.json"


def _threads(requested: int) -> int:
    # With other processes on the two cores, a second OpenMP thread spins and loses far
    # more than it gains (measured 10x slower); use both only on an idle machine.
    if requested > 0:
        return requested
    return 2 if os.getloadavg()[0] < 1.0 else 1


def read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def is_complete(out: Path, spec: TestbedSpec | None = None) -> bool:
    stages = read_manifest(out).get("stages", {})
    if spec is None:
        return all(s in stages for s in STAGES)
    return all(stages.get(s, {}).get("digest") == spec.stage_digest(s) for s in STAGES)


def _write_manifest(out: Path, manifest: dict) -> None:
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    tmp.replace(out / MANIFEST)


def stage_target(spec: TestbedSpec, out: Path) -> dict:
    from .target import token_stream, train_target
    from .tokenizer import EOS, IM_END, train_tokenizer

    train_texts = corpus.documents(spec, held_out=False)
    tok = train_tokenizer(train_texts, spec.target.tokenizer_vocab, eos=IM_END if spec.corpus == "codechat" else EOS)
    assert len(tok) < spec.target.vocab_size, "the mask token needs an embedding row the tokenizer never emits"
    train_stream = token_stream(tok, train_texts)
    held_texts = corpus.documents(spec, held_out=True)
    eval_stream = token_stream(tok, held_texts)
    stats = train_target(spec.target, tok, train_stream, eval_stream, out / "target", spec.seed)
    stats.update(train_documents=len(train_texts), held_out_documents=len(held_texts), tokenizer_size=len(tok),
                 corpus_tokens=len(train_stream))
    return stats


def stage_data(spec: TestbedSpec, out: Path) -> dict:
    from sglang_domino.train.regenerate import regenerate
    from transformers import AutoModelForCausalLM

    from .tokenizer import load_tokenizer

    tok = load_tokenizer(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    d = spec.data
    records = corpus.prompts(spec, tok, held_out=False, count=d.num_prompts, seed=spec.seed + 2)
    t0 = time.time()
    responses = regenerate(target, [r["prompt_ids"] for r in records], d.response_tokens, d.gen_batch_size,
                           pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id])
    with open(out / "train.jsonl", "w") as fh:
        for r, resp in zip(records, responses):
            fh.write(json.dumps({"prompt_ids": r["prompt_ids"], "response_ids": resp}) + "\n")
    held = corpus.prompts(spec, tok, held_out=True, count=200, seed=spec.seed + 3)
    with open(out / "heldout_prompts.jsonl", "w") as fh:
        for r in held:
            fh.write(json.dumps(r) + "\n")
    return {"train_records": len(records), "response_tokens": sum(map(len, responses)),
            "regenerate_seconds": round(time.time() - t0, 1), "heldout_prompts": len(held)}


def stage_draft(spec: TestbedSpec, out: Path, kind: str) -> dict:
    from sglang_domino.train.config import TrainConfig
    from sglang_domino.train.loop import train

    d = spec.draft
    t = spec.target
    cfg = TrainConfig(
        target=str(out / "target"), data=str(out / "train.jsonl"), output_dir=str(out / kind), kind=kind,
        num_draft_layers=d.num_layers, draft_intermediate_size=d.intermediate_size, block_size=d.block_size,
        mask_token_id=t.vocab_size - 1, target_layer_ids=_layer_ids(t.num_layers, d.num_layers),
        gru_hidden_dim=d.gru_hidden_dim, emb_dim=d.emb_dim, shift_label=True,
        max_steps=d.steps, batch_size=d.batch_size, num_anchors=d.num_anchors, learning_rate=d.lr,
        dtype="float32", seed=spec.seed + (11 if kind == "dflash" else 12), save_every=0,
        max_length=_longest_record(out / "train.jsonl"),
    )
    return train(cfg)


def _longest_record(path: Path) -> int:
    with open(path) as fh:
        return max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in map(json.loads, fh))


def _layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    # Evenly spaced below the last layer: HF returns the last layer after the final norm,
    # which SGLang's layer capture would not reproduce.
    usable = max(num_target_layers - 1, 1)
    k = min(num_draft_layers, usable)
    return sorted({round((i + 1) * usable / k) - 1 for i in range(k)})


def build(preset: str = "full", root: Path | None = None, until: str = "domino", threads: int = 0,
          spec: TestbedSpec | None = None) -> Path:
    spec = spec or PRESETS[preset]
    out = build_dir(preset, root)
    manifest = read_manifest(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest.update(preset=preset, digest=spec.digest(), spec=spec.model_dump())
    manifest.setdefault("stages", {})
    stale = False  # once a stage reruns, every later stage must rerun too
    torch.set_num_threads(_threads(threads))
    runners = {"target": stage_target, "data": stage_data,
               "dflash": lambda s, o: stage_draft(s, o, "dflash"),
               "domino": lambda s, o: stage_draft(s, o, "domino")}
    for stage in STAGES:
        recorded = manifest["stages"].get(stage, {})
        if stale or recorded.get("digest") != spec.stage_digest(stage):
            stale = True
            for later in STAGES[STAGES.index(stage):]:
                manifest["stages"].pop(later, None)
            t0 = time.time()
            result = runners[stage](spec, out)
            result["digest"] = spec.stage_digest(stage)
            result["wall_seconds"] = round(time.time() - t0, 1)
            result["threads"] = torch.get_num_threads()
            manifest["stages"][stage] = result
            manifest["total_wall_seconds"] = round(sum(s["wall_seconds"] for s in manifest["stages"].values()), 1)
            _write_manifest(out, manifest)
            print(f"[testbed] {stage}: {json.dumps(result)}", flush=True)
        if stage == until:
            break
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="full", choices=sorted(PRESETS))
    p.add_argument("--dir", type=Path, default=None, help="cache root (default $DOMINO_TESTBED_DIR or "
                   "~/.cache/sglang-domino/testbed); the build goes to <dir>/<preset>")
    p.add_argument("--until", default="domino", choices=STAGES, help="stop after this stage")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: 2 on an idle machine, else 1)")
    p.add_argument("--no-publish", action="store_true", help="keep the build in the cache; by default a complete "
                   "`full` build replaces the committed test bed (benchmarks/testbed/checkpoints) in bf16")
    args = p.parse_args(argv)
    t0 = time.time()
    out = build(args.preset, args.dir, args.until, args.threads)
    m = read_manifest(out)
    print(f"[testbed] {out}: stages {sorted(m.get('stages', {}))}, stage total {m.get('total_wall_seconds')} s, "
          f"this run {time.time() - t0:.0f} s", flush=True)
    if args.preset == "full" and not args.no_publish and is_complete(out, PRESETS["full"]):
        from .release import publish

        print(f"[testbed] published to {publish(out)} (bf16); `git diff --stat` shows what changed", flush=True)


if __name__ == "__main__":
    main()
