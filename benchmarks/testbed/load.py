"""Loading a built test bed: target, tokenizer and both drafts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .build import read_manifest
from .release import CHECKPOINTS, is_complete


@dataclass
class Testbed:
    path: Path
    target: object
    tokenizer: object
    dflash: object
    domino: object
    manifest: dict


def committed() -> Path:
    """The test bed committed in the repository (`benchmarks/testbed/checkpoints`)."""
    if not is_complete(CHECKPOINTS):
        raise FileNotFoundError(f"{CHECKPOINTS} is incomplete: restore it with `git checkout -- {CHECKPOINTS}` "
                                "or rebuild it with benchmarks/build_testbed.sh")
    return CHECKPOINTS


def load(path: Path) -> Testbed:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_domino.hf import DFlashDraftModel

    path = Path(path)
    target = AutoModelForCausalLM.from_pretrained(path / "target", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path / "target")
    return Testbed(path, target, tokenizer, DFlashDraftModel.from_pretrained(path / "dflash", dtype=torch.float32),
                   DFlashDraftModel.from_pretrained(path / "domino", dtype=torch.float32), read_manifest(path))
