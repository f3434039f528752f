"""Remote-code entry of an sglang-domino draft checkpoint.

`AutoModel.from_pretrained(path, trust_remote_code=True)` resolves here and returns the
installed sglang-domino implementation (pip install sglang-domino).
"""
from sglang_domino.hf import DFlashDraftModel, DominoDraftModel

__all__ = ["DFlashDraftModel", "DominoDraftModel"]
