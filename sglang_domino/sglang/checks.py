"""Draft/target checks shared by argument resolution (main process, fails before any
scheduler is spawned) and the worker (each scheduler). No sglang imports.

Drafts are read through the project's one parser, `sglang_domino.config.DraftConfig`,
so a checkpoint is accepted or refused by SGLang exactly as by the other backends.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any, Optional

from ..config import ARCHITECTURES, DraftConfig, DraftConfigError


def _config_file(path: str, revision: Optional[str] = None) -> Optional[str]:
    if os.path.isdir(path):
        file = os.path.join(path, "config.json")
        return file if os.path.exists(file) else None
    if os.path.isfile(path):
        return path
    try:  # a hub id: only what is already cached (never a download from here)
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json", revision=revision)
        return cached if isinstance(cached, str) else None
    except Exception:
        return None


def _architectures(file: str) -> list[str]:
    with open(file, encoding="utf-8") as fh:
        return list(json.load(fh).get("architectures") or [])


def draft_architectures(path: str, revision: Optional[str] = None) -> Optional[list[str]]:
    """The draft's `architectures`, or None when its config.json is not available locally."""
    file = _config_file(path, revision)
    return None if file is None else _architectures(file)


def is_own_draft(architectures: list[str]) -> bool:
    """A DFlash or Domino draft of this project (not another member of SGLang's DFLASH family)."""
    return any(a in ARCHITECTURES for a in architectures)


def read_draft_config(path: str, revision: Optional[str] = None) -> Optional[DraftConfig]:
    """The draft's `DraftConfig`, or None when its config.json is not available locally
    or it is another member of SGLang's DFLASH family (DFlash2, Laguna, MuseGlimmer, ...:
    architectures this project does not own, left to SGLang's own checks)."""
    file = _config_file(path, revision)
    if file is None or not is_own_draft(_architectures(file)):
        return None
    return DraftConfig.from_pretrained(file)


def read_target_config(path: str, revision: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The target's text config as a plain dict (nested `text_config` lifted)."""
    file = _config_file(path, revision)
    if file is None:
        return None
    with open(file, encoding="utf-8") as fh:
        data = json.load(fh)
    return data.get("text_config") or data


def check_draft_against_target(draft: DraftConfig, target: dict[str, Any],
                               target_vocab_size: Optional[int] = None) -> None:
    """Raise `DraftConfigError` when `draft` cannot run on `target` under SGLang 0.5.23:
    everything `DraftConfig.check_target` checks (the mask id against `target_vocab_size`,
    the served vocabulary, when given), plus the SGLang capture rule."""
    draft.check_target(SimpleNamespace(**target), target_vocab_size=target_vocab_size)
    layers = target.get("num_hidden_layers")
    if layers is not None and layers - 1 in draft.target_layer_ids:
        # SGLang captures a target layer's output as the input of the next layer
        # (`Qwen3ForCausalLM.set_dflash_layers_to_capture`, `layers_to_capture` in the
        # model's layer loop): the last layer is never
        # captured, which would surface as a feature-dim mismatch at the first request.
        raise DraftConfigError(
            f"dflash_config.target_layer_ids: got {draft.target_layer_ids}, expected ids below the target's "
            f"last layer {layers - 1} (SGLang cannot capture the last layer's output)"
        )


def check_verify_width(block_size: int, verify_width: int) -> None:
    if verify_width > block_size:
        raise ValueError(
            f"--speculative-num-draft-tokens (verify width) is {verify_width}, larger than "
            f"--speculative-dflash-block-size {block_size}: the target can verify at most the draft block "
            f"(bonus + {block_size - 1} proposals)"
        )
    if verify_width < 2:
        raise ValueError(f"--speculative-num-draft-tokens (verify width) is {verify_width}, expected >= 2")
