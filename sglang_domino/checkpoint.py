"""Draft checkpoints in the released format: config.json + safetensors (+ remote code).

Loading is strict: a missing or unexpected weight fails with the key names, a wrong
shape with the key and both shapes. Older Domino exports keep the head under
`logit_head.`; those keys are renamed on load. Sharded checkpoints
(`model.safetensors.index.json`) load like single files.
"""

from __future__ import annotations

import json
import os
from typing import Optional, TypeVar

import torch
from safetensors.torch import load_file, save_file

from .config import DraftConfig, DraftConfigError
from .model import DraftModel, Rotary

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
REMOTE_CODE_NAME = "dflash.py"
# SpecForge's older Domino exports nest the head under `logit_head.`.
LEGACY_PREFIXES = {"logit_head.prefix_gru.": "prefix_gru.", "logit_head.embed_proj.": "embed_proj."}
# Buffers some exporters write; recomputed from the config, never loaded.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

DTYPES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16, "half": torch.float16}

REMOTE_CODE = '''"""Remote-code entry of an sglang-domino draft checkpoint.

`AutoModel.from_pretrained(path, trust_remote_code=True)` resolves here and returns the
installed sglang-domino implementation (pip install sglang-domino).
"""
from sglang_domino.hf import DFlashDraftModel, DominoDraftModel

__all__ = ["DFlashDraftModel", "DominoDraftModel"]
'''


class CheckpointError(ValueError):
    """A checkpoint whose weights do not match its config."""


M = TypeVar("M", bound=DraftModel)


def resolve_dtype(dtype, config_data: dict) -> Optional[torch.dtype]:
    """`dtype` as given by a caller ('auto', a name, a torch.dtype or None)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        name = config_data.get("dtype") or config_data.get("torch_dtype")
        return DTYPES.get(str(name).removeprefix("torch.")) if name else None
    if str(dtype).removeprefix("torch.") in DTYPES:
        return DTYPES[str(dtype).removeprefix("torch.")]
    raise ValueError(f"dtype: got {dtype!r}, expected 'auto', one of {sorted(DTYPES)} or a torch.dtype")


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or sharded), keys normalised."""
    index_file = os.path.join(path, INDEX_NAME)
    if os.path.exists(index_file):
        with open(index_file, encoding="utf-8") as fh:
            shards = sorted(set(json.load(fh)["weight_map"].values()))
    elif os.path.exists(os.path.join(path, WEIGHTS_NAME)):
        shards = [WEIGHTS_NAME]
    else:
        raise CheckpointError(f"weights: neither {WEIGHTS_NAME} nor {INDEX_NAME} found in {path!r}")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(os.path.join(path, shard)))
    return normalize_keys(tensors)


def normalize_keys(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in tensors.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        key = key.removeprefix("model.")
        for old, new in LEGACY_PREFIXES.items():
            if key.startswith(old):
                key = new + key[len(old):]
        out[key] = value
    return out


def load_into(model: DraftModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `tensors` into `model` strictly (every parameter present, nothing extra)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing weights {missing}")
    if unexpected:
        problems.append(f"unexpected weights {unexpected}")
    for key in sorted(set(expected) & set(tensors)):
        if tuple(expected[key].shape) != tuple(tensors[key].shape):
            problems.append(f"{key}: checkpoint shape {tuple(tensors[key].shape)}, "
                            f"expected {tuple(expected[key].shape)} from config.json")
    if problems:
        raise CheckpointError("checkpoint does not match its config: " + "; ".join(problems))
    model.load_state_dict({k: v for k, v in tensors.items()}, strict=True, assign=True)


def load_draft(cls: type[M], path: str, dtype=None, device=None) -> M:
    """Build `cls` (a DraftModel) from a checkpoint directory."""
    path = os.fspath(path)
    config = DraftConfig.from_pretrained(path)
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        raw = json.load(fh)
    tensors = read_weights(path)
    dtype = resolve_dtype(dtype, raw) or next(iter(tensors.values())).dtype
    with torch.device("meta"):
        model = cls(config)
    tensors = {k: v.to(dtype=dtype if v.is_floating_point() else v.dtype) for k, v in tensors.items()}
    load_into(model, tensors)
    # Buffers are not in checkpoints: rebuild them off the meta device.
    model.rotary_emb = Rotary(config.head_size, config.rope_base)
    return model.to(device=device or "cpu", dtype=dtype).eval()


def save_draft(model: DraftModel, path: str, max_shard_bytes: Optional[int] = None) -> None:
    """Write config.json, safetensors weights (sharded when larger than `max_shard_bytes`)
    and the remote-code module that `trust_remote_code` loads."""
    os.makedirs(path, exist_ok=True)
    config = model.config.to_dict()
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    dtype = next(iter(tensors.values())).dtype
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.setdefault("model_type", "qwen3")
    config["auto_map"] = {"AutoModel": f"{REMOTE_CODE_NAME[:-3]}.{model.config.architectures[0]}"}
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2, sort_keys=True)
    with open(os.path.join(path, REMOTE_CODE_NAME), "w", encoding="utf-8") as fh:
        fh.write(REMOTE_CODE)
    for stale in (WEIGHTS_NAME, INDEX_NAME):
        if os.path.exists(os.path.join(path, stale)):
            os.remove(os.path.join(path, stale))
    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    with open(os.path.join(path, INDEX_NAME), "w", encoding="utf-8") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2, sort_keys=True)


def _split(tensors: dict[str, torch.Tensor], max_bytes: Optional[int]) -> list[dict[str, torch.Tensor]]:
    if not max_bytes:
        return [tensors]
    shards, current, size = [], {}, 0
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[key] = t
        size += nbytes
    shards.append(current)
    return shards


__all__ = ["CheckpointError", "DraftConfigError", "load_draft", "save_draft", "read_weights", "load_into"]
