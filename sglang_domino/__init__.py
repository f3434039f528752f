"""sglang-domino: DFlash / Domino block speculative decoding drafts.

Importing this package is cheap and never imports SGLang.
"""

from .config import DraftConfig, DraftConfigError

__version__ = "0.1.0"
__all__ = ["DraftConfig", "DraftConfigError", "__version__"]
