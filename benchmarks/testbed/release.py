"""The committed test bed: a finished build copied into the repository in bf16.

`benchmarks/testbed/checkpoints/` holds `target/` (with its tokenizer), `dflash/` and
`domino/` in the released checkpoint format, the held-out prompts and `manifest.json`
(how it was built: command, spec, seed, machine, stage times and results). Tests, the
demo, the benchmarks and CI read it; only `benchmarks/build_testbed.sh` writes it.

bf16 because the released drafts are bf16 and it halves the size; bf16 -> fp32 is exact,
so `dtype=torch.float32` (or `--dtype float32`) serves exactly these weights in fp32.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
PARTS = ("target", "dflash", "domino")
COPIED = ("manifest.json", "heldout_prompts.jsonl")


def is_complete(path: Path) -> bool:
    return all((path / p / "config.json").exists() for p in PARTS) and all((path / f).exists() for f in COPIED)


def publish(build: Path, dest: Path = CHECKPOINTS) -> Path:
    """Write `build` (a complete fp32 build) to `dest` in bf16, replacing what was there."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_domino.checkpoint import save_draft
    from sglang_domino.hf import DFlashDraftModel

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    target = AutoModelForCausalLM.from_pretrained(build / "target", dtype=torch.bfloat16)
    target.save_pretrained(tmp / "target")
    AutoTokenizer.from_pretrained(build / "target").save_pretrained(tmp / "target")
    for kind in ("dflash", "domino"):
        save_draft(DFlashDraftModel.from_pretrained(build / kind, dtype=torch.bfloat16), str(tmp / kind))
        shutil.copy(build / kind / "train_summary.json", tmp / kind / "train_summary.json")
    shutil.copy(build / "heldout_prompts.jsonl", tmp / "heldout_prompts.jsonl")
    manifest = json.loads((build / "manifest.json").read_text())
    from benchmarks.machine import machine

    manifest["published"] = {"command": "benchmarks/build_testbed.sh " + " ".join(sys.argv[1:]),
                             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dtype": "bfloat16",
                             "machine": machine(), "from": str(build)}
    for stage in manifest.get("stages", {}).values():
        stage.pop("config", None)   # the drafts' TrainConfig holds the build machine's paths
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.replace(dest)
    return dest
