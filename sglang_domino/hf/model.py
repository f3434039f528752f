"""`DFlashDraftModel`: the draft model with Hugging Face style loading and `spec_generate`.

`from_pretrained` takes the keyword arguments the model cards pass to
`AutoModel.from_pretrained` (`torch_dtype`/`dtype`, `device_map`, `trust_remote_code`),
so the saved remote-code module can hand this class to `AutoModel` unchanged.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..checkpoint import load_draft, save_draft
from ..model import DraftModel
from .generate import spec_generate as _spec_generate

HUB_PATTERNS = ["*.json", "*.safetensors", "*.py"]


def _resolve_device(device_map) -> torch.device:
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, dict):
        devices = set(device_map.values())
        if len(devices) != 1:
            raise ValueError(f"device_map: got {device_map!r}, expected one device for the whole draft")
        device_map = devices.pop()
    if device_map == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    return torch.device(device_map)


class DFlashDraftModel(DraftModel):
    """DFlash or Domino draft (chosen by `config.json`), loadable from a local directory or a
    Hugging Face repo id."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, dtype=None, torch_dtype=None,
                        device_map=None, revision: Optional[str] = None, cache_dir: Optional[str] = None,
                        **kwargs) -> "DFlashDraftModel":
        # `config`, `trust_remote_code` and other AutoModel keywords carry nothing we need:
        # the checkpoint's own config.json is read by the one draft-config parser.
        path = os.fspath(pretrained_model_name_or_path)
        if not os.path.isdir(path):
            from huggingface_hub import snapshot_download

            path = snapshot_download(path, revision=revision, cache_dir=cache_dir, allow_patterns=HUB_PATTERNS)
        return load_draft(cls, path, dtype=dtype if dtype is not None else torch_dtype,
                          device=_resolve_device(device_map))

    # AutoModel calls this on remote-code classes; nothing to register for ours.
    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel"):
        return None

    def save_pretrained(self, save_directory, max_shard_bytes: Optional[int] = None, **_) -> None:
        save_draft(self, os.fspath(save_directory), max_shard_bytes=max_shard_bytes)

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def spec_generate(self, input_ids: torch.Tensor, target, max_new_tokens: int = 2048, temperature: float = 0.0,
                      stop_token_ids=None, return_stats: bool = False, **kwargs):
        """Speculative generation with `target` (a Transformers causal LM); see
        `sglang_domino.hf.generate.spec_generate` for every keyword."""
        return _spec_generate(self, target, input_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                              stop_token_ids=stop_token_ids, return_stats=return_stats, **kwargs)


# SpecForge exports name the Domino architecture `DominoDraftModel`; same class.
DominoDraftModel = DFlashDraftModel
