"""Per-call state of the Transformers speculative loop: the two KV caches.

Rows of a batch accept different numbers of tokens per step. Instead of re-packing
caches every step, both caches grow by the widest row and keep a validity mask: a
rejected slot stays in the cache but no query may attend to it. Finished rows are
dropped from every tensor at once (`select`).
"""

from __future__ import annotations

import torch


class TargetCache:
    """A Transformers `DynamicCache` plus the mask of cache slots that hold committed tokens."""

    def __init__(self, cache, valid: torch.Tensor):
        self.cache = cache
        self.valid = valid  # [b, L] bool

    def attention_mask(self, new_tokens: int) -> torch.Tensor:
        ones = torch.ones(self.valid.shape[0], new_tokens, dtype=torch.long, device=self.valid.device)
        return torch.cat([self.valid.long(), ones], dim=1)

    def commit(self, keep: torch.Tensor) -> None:
        """The last verify appended keep.shape[1] slots; keep [b, n+1] marks the committed
        ones. Slots past the widest row's commit are cropped away."""
        width = int(keep.sum(1).max())
        if width < keep.shape[1]:
            self.cache.crop(width - keep.shape[1])  # negative: drop that many trailing slots
        self.valid = torch.cat([self.valid, keep[:, :width]], dim=1)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]


class DraftContext:
    """Context K/V of every draft layer (projected target features), with their absolute
    positions and validity. Block K/V are never cached: they are recomputed each step."""

    def __init__(self):
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.valid: torch.Tensor | None = None      # [b, S] bool
        self.positions: torch.Tensor | None = None  # [b, S] int64

    def append(self, kv: list[tuple[torch.Tensor, torch.Tensor]], valid: torch.Tensor, positions: torch.Tensor) -> None:
        if self.valid is None:
            self.kv, self.valid, self.positions = kv, valid, positions
            return
        self.kv = [(torch.cat([k0, k1], dim=2), torch.cat([v0, v1], dim=2)) for (k0, v0), (k1, v1) in zip(self.kv, kv)]
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.positions = torch.cat([self.positions, positions], dim=1)

    def select(self, rows: torch.Tensor) -> None:
        self.kv = [(k[rows], v[rows]) for k, v in self.kv]
        self.valid = self.valid[rows]
        self.positions = self.positions[rows]

    def masks(self, block_positions: torch.Tensor, layer_types: set[str], window: int | None) -> dict[str, torch.Tensor]:
        """Boolean attention masks [b, 1, B, S+B] for the block queries at `block_positions`.

        Full-attention layers see every valid context slot and the whole block
        (bidirectional). Sliding layers are causal inside the block and see context
        within the window, as SGLang and SpecForge's training mask define them."""
        b, width = block_positions.shape
        ctx = self.valid[:, None, :].expand(b, width, -1)
        ones = torch.ones(b, width, width, dtype=torch.bool, device=ctx.device)
        masks = {}
        if "full_attention" in layer_types:
            masks["full_attention"] = torch.cat([ctx, ones], dim=2)[:, None]
        if "sliding_attention" in layer_types:
            near = (block_positions[:, :, None] - self.positions[:, None, :]) < window
            masks["sliding_attention"] = torch.cat([ctx & near, ones.tril()], dim=2)[:, None]
        return masks
