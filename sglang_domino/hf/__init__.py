"""Transformers backend: `DFlashDraftModel.from_pretrained(...).spec_generate(...)`."""

from .generate import SpecStats, spec_generate
from .model import DFlashDraftModel, DominoDraftModel

__all__ = ["DFlashDraftModel", "DominoDraftModel", "SpecStats", "spec_generate"]
