"""The opaque ops the compiled CPU graphs call (`layers.py`, `hybrid.py`,
`step/compiled_rollout.py`): what a graph must not trace, run eagerly as upstream runs it,
with a fake (shape-only) version for tracing. Each op reads what it needs beyond tensors
from a registry here, by index: the step's batch and its attention (or delta-net) modules,
the tensor-parallel groups, the embedding modules.
"""

from __future__ import annotations

import contextlib

import torch

from . import packed_linear

# -- attention: one opaque op, the step's batch read from here --------------------------

_UNPLANNED = object()


class _Step:
    """The forward in progress: its batch, the attention modules by layer index, and how
    its attention runs (`attention.plan`, made at its first attention layer)."""
    batch = None
    layers: list = []
    plan = _UNPLANNED


@contextlib.contextmanager
def step(batch, layers):
    _Step.batch, _Step.layers, _Step.plan = batch, layers, _UNPLANNED
    try:
        yield
    finally:
        _Step.batch, _Step.layers, _Step.plan = None, [], _UNPLANNED


@torch.library.custom_op("sglang_domino::cpu_attention", mutates_args=())
def cpu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Upstream's attention of layer `layer` (`RadixAttention.forward`: writes k and v into
    the KV cache, attends) for the step in progress, or the same straight through the
    paged-attention kernel where the step's plan allows (`attention.plan`). Without a step
    (compiling at load time) it returns zeros."""
    if _Step.batch is None:
        return torch.zeros_like(q)
    if _Step.plan is _UNPLANNED:
        from .. import attention

        _Step.plan = attention.plan(_Step.batch, q)
    out = None if _Step.plan is None else _Step.plan(_Step.layers[layer], q, k, v)
    if out is None:
        out = _Step.layers[layer](q, k, v, _Step.batch)
    return out.reshape(q.shape[0], -1)


@cpu_attention.register_fake
def _(q, k, v, layer):
    return torch.empty_like(q)


@torch.library.custom_op("sglang_domino::cpu_linear_attention", mutates_args=())
def cpu_linear_attention(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor, layer: int,
                         value_dim: int) -> torch.Tensor:
    """Upstream's gated delta-net core of layer `layer` (`RadixLinearAttention.forward`:
    the causal conv and the recurrence over the layer's conv and SSM states in the mamba
    pool, the verify's per-position states) for the step in progress, as
    `[tokens, value_dim]`. Its inputs are copied first: the backend may write into them.
    Without a step (compiling at load time) it returns zeros."""
    rows = mixed_qkv.shape[0]
    if _Step.batch is None:
        return mixed_qkv.new_zeros(rows, value_dim)
    out = _Step.layers[layer](_Step.batch, mixed_qkv=mixed_qkv.clone(), a=a.clone(), b=b.clone())
    return out.reshape(rows, value_dim)


@cpu_linear_attention.register_fake
def _(mixed_qkv, a, b, layer, value_dim):
    return mixed_qkv.new_empty(mixed_qkv.shape[0], value_dim)


# -- tensor parallelism: the row-parallel projections' all-reduce, one opaque op ------------

class _Registry:
    """Objects an op is handed by index (an op's arguments are tensors and numbers)."""

    def __init__(self):
        self.items: list = []

    def index(self, obj) -> int:
        """`obj`'s index, registered on first sight (by identity)."""
        for i, known in enumerate(self.items):
            if known is obj:
                return i
        self.items.append(obj)
        return len(self.items) - 1

    def __getitem__(self, i: int):
        return self.items[i]


_groups = _Registry()   # the groups the compiled layers reduce over


@torch.library.custom_op("sglang_domino::cpu_all_reduce", mutates_args=())
def cpu_all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    """The sum of `x` over the ranks of group `group` (its `all_reduce`, as upstream's
    layer boundary reduces a row-parallel projection); a fresh tensor. Outside a step
    (compiling at load time, each rank on its own) it is `x`."""
    if _Step.batch is None:
        return x.clone()
    return _groups[group].all_reduce(x.clone())


@cpu_all_reduce.register_fake
def _(x, group):
    return torch.empty_like(x)


def reduce_group(linear) -> int:
    """The index of the group a row-parallel projection reduces over, -1 for none (one
    rank). Taken when the layers are wrapped, outside the graph: dynamo would guard the
    graph on the registry's contents otherwise."""
    group = getattr(linear, "tp_group", None)
    return _groups.index(group) if group is not None and int(group.world_size) > 1 else -1


def row_parallel(linear, group: int, x: torch.Tensor) -> torch.Tensor:
    """A row-parallel projection: this rank's product, summed over the ranks of `group`
    (`reduce_group`), then the bias (once, as rank 0 alone adds it upstream)."""
    out = packed_linear.project(x, linear, bias=False)
    if group >= 0:
        out = torch.ops.sglang_domino.cpu_all_reduce(out, group)
    return out if linear.bias is None else out + linear.bias


# -- tensor parallelism: the vocabulary-parallel embedding, one opaque op -------------------

_embeddings = _Registry()   # the embedding modules the compiled rollouts look feedback tokens up in


def embedding_index(module) -> int:
    return _embeddings.index(module)


@torch.library.custom_op("sglang_domino::cpu_embedding", mutates_args=())
def cpu_embedding(ids: torch.Tensor, weight: torch.Tensor, module: int) -> torch.Tensor:
    """Embedding module `module`'s rows for `ids` (a vocabulary-parallel embedding: this
    rank's rows, summed over the ranks), `weight` its local shard. Looked up as one row
    of ids (the target's forward looks them up so), in inference mode as the rollout runs:
    the calls upstream's compiled masking saw in the warm-up."""
    return _embeddings[module](ids.reshape(-1)).view(*ids.shape, weight.shape[1])


@cpu_embedding.register_fake
def _(ids, weight, module):
    return weight.new_empty((*ids.shape, weight.shape[1]))


__all__ = ["cpu_all_reduce", "cpu_attention", "cpu_embedding", "cpu_linear_attention", "embedding_index",
           "reduce_group", "row_parallel", "step"]
