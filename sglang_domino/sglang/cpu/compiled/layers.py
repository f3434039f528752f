"""The compiled CPU step's graph (`forward.py` wraps it around a model): pre-norm Qwen3-style
layers under one `torch.compile` graph, dynamic in the number of tokens, built from
upstream's own pieces of math; attention behind the opaque ops of `graph_ops.py`. A
hybrid target's layers are the same graph with their token mixers (`hybrid.py`)."""

from __future__ import annotations

import logging
import time

import torch

from . import graph_ops, packed_linear
from .switches import FLAG, Graph, guarded_inputs

logger = logging.getLogger(__name__)

NEW_GRAPH = "a new graph"   # logged when a graph is compiled after the warm-up


class CompiledLayers:
    """Pre-norm Qwen3-style layers (upstream's Qwen3 target and DFlash draft share their
    parts' names) under one `torch.compile` graph, dynamic in the number of tokens:
    `(hidden, positions) -> (hidden after the final norm, the residual stream entering
    each layer)` (all of them: which ones DFLASH captures is set after loading, and
    returning them costs nothing, so one graph serves either way)."""

    def __init__(self, layers, final_norm):
        self.layers = list(layers)
        self.attention = [self.mixer(layer)[0] for layer in self.layers]
        # (the mixer's output projection's, down_proj's) reduce group per layer (`reduce_group`)
        self.reduce = [tuple(graph_ops.reduce_group(m) for m in self.row_parallel(layer)) for layer in self.layers]
        self.final_norm = final_norm
        # two graphs per model (one row, many), the target's and the draft's on the same code
        self._compiled = Graph(self._forward)
        self.warmed = False

    @staticmethod
    def mixer(layer):
        """Layer `layer`'s token mixer: (the module its opaque op calls, its output projection)."""
        return layer.self_attn.attn, layer.self_attn.o_proj

    @classmethod
    def row_parallel(cls, layer) -> tuple:
        """Layer `layer`'s row-parallel projections, (the mixer's output projection,
        down_proj): each reduced over its group and its bias added after the product
        (`graph_ops.row_parallel`)."""
        return cls.mixer(layer)[1], layer.mlp.down_proj

    @staticmethod
    def projections(layer) -> list:
        """Layer `layer`'s linear modules."""
        attn = layer.self_attn
        return [attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj]

    def pack(self) -> tuple[int, int]:
        """Pack every layer's projections for oneDNN (`packed_linear`): (how many, bytes)."""
        modules = [m for layer in self.layers for m in self.projections(layer) if packed_linear.pack(m, m.weight)]
        return len(modules), sum(packed_linear.packed_bytes(m) for m in modules)

    def _forward(self, hidden: torch.Tensor, positions: torch.Tensor):
        residual = None
        streams = []
        for i, layer in enumerate(self.layers):
            if residual is None:
                residual = hidden
                hidden = layer.input_layernorm.forward_native(hidden)
            else:
                hidden, residual = layer.input_layernorm.forward_native(hidden, residual)
            streams.append(residual)
            hidden = self.mix(i, layer, hidden, positions)
            hidden, residual = layer.post_attention_layernorm.forward_native(hidden, residual)
            hidden = self.mlp(i, layer.mlp, hidden)
        hidden, _ = self.final_norm.forward_native(hidden, residual)
        return hidden, streams

    def mix(self, i: int, layer, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Layer `i`'s attention (traced into the graph)."""
        attn = layer.self_attn
        qkv = packed_linear.project(hidden, attn.qkv_proj)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = attn.q_norm.forward_native(q.reshape(-1, attn.head_dim)).view(q.shape)
        k = attn.k_norm.forward_native(k.reshape(-1, attn.head_dim)).view(k.shape)
        q, k = attn.rotary_emb.forward_native(positions, q, k)
        out = torch.ops.sglang_domino.cpu_attention(q, k, v.contiguous(), i)
        return graph_ops.row_parallel(attn.o_proj, self.reduce[i][0], out)

    def mlp(self, i: int, mlp, hidden: torch.Tensor) -> torch.Tensor:
        """Layer `i`'s gated MLP (traced into the graph)."""
        gate_up = packed_linear.project(hidden, mlp.gate_up_proj)
        return graph_ops.row_parallel(mlp.down_proj, self.reduce[i][1], mlp.act_fn.forward_native(gate_up))

    @classmethod
    def graphs(cls) -> int:
        """Graphs compiled so far for `_forward` (every instance's of this class: they share its code)."""
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        return len(_debug_get_cache_entry_list(cls._forward.__code__))

    def __call__(self, hidden, positions, forward_batch):
        graphs = self.graphs()
        # dynamo's guards tell inference tensors from others, and the caller's mode is the
        # one the outputs must be usable in: inputs of the other kind are copied into this one
        hidden, positions = guarded_inputs((hidden, positions))
        with torch.no_grad(), graph_ops.step(forward_batch, self.attention):
            out = self._compiled(hidden, positions)
        if self.warmed and self.graphs() != graphs:
            # the warm-up should have compiled every graph serving needs (tests/e2e read this line)
            logger.warning("%s: %s compiled while serving (%d rows, %s, grad %s, inference %s)", FLAG, NEW_GRAPH,
                           int(hidden.shape[0]), hidden.dtype, torch.is_grad_enabled(),
                           torch.is_inference_mode_enabled())   # the caller's modes, restored by now
        return out

    def warm(self, dtype: torch.dtype, hidden_size: int, inference: bool) -> float:
        """Compile the graphs serving needs with the attention returning zeros: one row and
        many rows, in the mode the model is called in (the target grad-free, the draft in
        inference mode: dynamo's guards tell the two apart, and a graph of the other mode
        would cost a start-up a few seconds for nothing); seconds taken."""
        t0 = time.perf_counter()
        with torch.inference_mode(inference):
            for rows in (1, 2):
                self(torch.zeros(rows, hidden_size, dtype=dtype), torch.zeros(rows, dtype=torch.int64), None)
        self.warmed = True
        return time.perf_counter() - t0


__all__ = ["CompiledLayers", "NEW_GRAPH"]
