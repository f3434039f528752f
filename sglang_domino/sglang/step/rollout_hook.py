"""Around upstream's Domino rollout (`domino_greedy_rollout` as `dflash_worker_v2` binds it),
installed for every Domino draft (the `domino rollout` group of `hooks.py`).

One hook, because `HookRegistry` patches a target once; four concerns:
  * `no_proposals`: an adaptive width-1 step has nothing to propose (upstream raises);
  * `embedding_weight`: the eager rollout's feedback embedding looked up plainly;
  * the q rule's sampled rollout (`sampled_rollout`), while a sampled step is current;
  * on CPU, opt-in, the greedy rollout compiled (`compiled_rollout`).
Calls from the captured draft graph (`in_cuda_graph=True`) go to upstream unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import compiled_rollout as cpu_rollout
from ..sampling.sampled_rollout import active_step, domino_sampled_rollout


def around_domino_rollout(original, *args, **kwargs):
    hidden = kwargs.get("draft_hidden")
    if hidden is not None and hidden.shape[1] <= 1:
        return no_proposals(hidden)
    if kwargs.get("in_cuda_graph"):
        return original(*args, **kwargs)
    weight = embedding_weight(kwargs.get("target_embedding"))
    if weight is not None:
        kwargs["target_embedding"] = lambda ids: F.embedding(ids, weight)
    step = active_step()
    if step is not None:
        return domino_sampled_rollout(step, **kwargs)
    if not args and cpu_rollout.eligible(kwargs, weight):
        return cpu_rollout.greedy_rollout(weight, **kwargs)
    return original(*args, **kwargs)


def no_proposals(draft_hidden: torch.Tensor) -> torch.Tensor:
    """A block of one slot: [bs, 0] proposals."""
    return torch.empty((draft_hidden.shape[0], 0), dtype=torch.int64, device=draft_hidden.device)


def embedding_weight(module) -> "torch.Tensor | None":
    """The eager rollout embeds one feedback token per step (14 calls a step at block 16).
    A single-rank, unquantized `VocabParallelEmbedding` is `F.embedding` on its weight
    behind a bounds check and context managers that cost more than the lookup on CPU; the
    ids here are argmax or sampled ids of the vocabulary. Its weight then (None for
    anything else, which is used as it is)."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    if (getattr(module, "tp_size", None) == 1 and getattr(module, "output_dtype", "x") is None
            and type(getattr(module, "quant_method", None)) is UnquantizedEmbeddingMethod):
        return module.weight
    return None
