"""The greedy Domino rollout compiled on CPU (issue 20: a compiled CPU step, the draft side).

0.5.23 runs `domino_greedy_rollout` eagerly wherever no CUDA graph holds the draft, so on
CPU every decode step pays about 75 small ops (the GRU over the bonus and first
proposal, then one correction and one GRU cell per later proposal) in Python. Here the
same rollout, the project's one (`sglang_domino.rollout.propose_domino` over
`sampled_rollout.UpstreamDominoHead`, picking argmaxes), runs under `torch.compile`:
test bed sizes, 2-core Intel Xeon, 0.85 ms against upstream's 1.7 ms at batch 1 and 2.0
against 3.1 ms at batch 8, the same proposals (`tests/sglang/test_cpu_rollout.py`).

Only proposals change hands here, never what is committed: the target verifies them, so
a different float rounding in the compiled code could cost acceptance, not exactness.

Compiled per block length (the loop over proposals unrolls), shapes dynamic in the batch
(one graph for batch 1, one for the rest): two graphs per verify width, compiled on first
use (1-12 s each at the test bed's size on 2 cores; the worker's warm-up compiles them
before the first request).

Part of the compiled CPU step (`--enable-torch-compile` with `--device cpu`, `switches.py`). An
adaptive server with it once lost up to 5-9 x in its first round: the step's inputs (the
draft's inference tensors, a strided column of bonus tokens) failed the guards of the
graphs the warm-up compiled, so every graph was compiled again while serving. It now runs
in inference mode on fresh copies (`CompiledRollout.__call__`): adaptive 1.03-1.05 x in
float32 on a 2-core Intel Xeon, width 16 up to 1.17 x, nothing measured in bfloat16 alone
(docs/cpu.md#the-domino-rollout-compiled-on-cpu).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...rollout import propose_domino
from ..cpu.compiled import graph_ops, packed_linear
from ..cpu.compiled.switches import Graph, compiled_step_serving, guarded_inputs
from ..sampling import rollout_inputs, sampled_rollout


class GreedyPick:
    """`propose_domino`'s Pick: the argmax, mapped through the candidate pool for the
    proposals after the first (as upstream's greedy pool rollout)."""

    def __init__(self, pool_ids: Optional[torch.Tensor]):
        self.pool_ids = pool_ids

    def __call__(self, logits: torch.Tensor, k: int):
        index = logits.argmax(-1)
        if k > 0 and self.pool_ids is not None:
            return self.pool_ids.gather(1, index[:, None])[:, 0], None
        return index, None


class CompiledRollout:
    """One Domino draft's greedy rollout under `torch.compile` (its modules held here, so
    that the compiled function sees no `nn.GRU`). The base logits (the lm_head over the
    block, all-gathered over a vocabulary-parallel lm_head) come first, outside the graph;
    the candidate pool and the chain are the graph."""

    def __init__(self, prefix_gru, embed_proj):
        self.head = sampled_rollout.UpstreamDominoHead(prefix_gru, embed_proj)
        # its products through the kernel library's linear op (one row per request: MKL's
        # matrix-vector products cost about 22 µs each at the test bed's size, 45 a block)
        self.head.linear = packed_linear.linear
        self._compiled = Graph(self._rollout)   # two graphs per block length

    def _rollout(self, z, base, bonus_tokens, embed_weight, vocab_size: int, candidate_pool_size: int,
                 embedding: int) -> torch.Tensor:
        first, rest, pool = rollout_inputs.split_base(base, vocab_size, candidate_pool_size)
        if embedding < 0:
            embed = lambda ids: F.embedding(ids, embed_weight)   # noqa: E731
        else:
            embed = lambda ids: torch.ops.sglang_domino.cpu_embedding(ids, embed_weight, embedding)  # noqa: E731
        return propose_domino(z, (first, rest), bonus_tokens, embed, self.head.pooled(pool), GreedyPick(pool)).tokens

    def __call__(self, *, draft_hidden, bonus_tokens, embed_weight, lm_head_weight, vocab_size, shift_label,
                 candidate_pool_size, embedding_module=None, **base_args) -> torch.Tensor:
        """Upstream's `domino_greedy_rollout` keywords (those it does not use ignored), with
        the embedding as its weight (`embedding_module`: the module itself, for a
        vocabulary-parallel embedding, `embed_weight` then its shard); [bs, n] proposals.

        Always run in inference mode on inference tensors: dynamo's guards tell inference
        tensors (the draft's hidden states, made in the draft's inference-mode forward)
        from others and the mode from grad-free mode, so a warm-up in another mode than
        the step's compiled every graph again in the middle of serving."""
        base_args.pop("in_cuda_graph", None)
        with torch.inference_mode():
            # copied with fresh strides: the step's bonus tokens are a column of its [bs, block]
            # ids, and at batch 1 `contiguous()` keeps that stride, which the guards check too
            draft_hidden, bonus_tokens = guarded_inputs((draft_hidden, bonus_tokens), fresh_strides=True)
            z, base = rollout_inputs.base_logits(draft_hidden=draft_hidden, lm_head_weight=lm_head_weight,
                                                  vocab_size=vocab_size, shift_label=shift_label, **base_args)
            z, = guarded_inputs((z,), fresh_strides=True)
            embedding = -1 if embedding_module is None else graph_ops.embedding_index(embedding_module)
            tokens = self._compiled(z, base, bonus_tokens, embed_weight, int(vocab_size), int(candidate_pool_size),
                                    embedding)
        return tokens.clone()   # an ordinary tensor again: the step writes into what it is given


_rollouts: dict[int, CompiledRollout] = {}


def rollout_for(prefix_gru, embed_proj) -> CompiledRollout:
    """The draft's compiled rollout, built once per draft (keyed by its GRU module)."""
    key = id(prefix_gru)
    if key not in _rollouts:
        _rollouts[key] = CompiledRollout(prefix_gru, embed_proj)
    return _rollouts[key]


def _parallel_embedding(module) -> bool:
    """A vocabulary-parallel embedding the compiled rollout calls as it is (one opaque op)."""
    return (int(getattr(module, "tp_size", 1)) > 1 and isinstance(getattr(module, "weight", None), torch.Tensor)
            and callable(module))


def eligible(kwargs: dict, embed_weight: Optional[torch.Tensor]) -> bool:
    """Whether this eager rollout call can run compiled: on CPU, a plain embedding (its
    weight given) or a vocabulary-parallel one, in a process serving the compiled step."""
    if not compiled_step_serving():   # decided first, every eager step asks
        return False
    hidden = kwargs.get("draft_hidden")
    embedding = embed_weight is not None or _parallel_embedding(kwargs.get("target_embedding"))
    return (embedding and hidden is not None and hidden.device.type == "cpu"
            and kwargs.get("prefix_gru") is not None)


def greedy_rollout(embed_weight: Optional[torch.Tensor], **kwargs) -> torch.Tensor:
    """Upstream's `domino_greedy_rollout` arguments and result ([bs, n] proposals), compiled."""
    module = kwargs.pop("target_embedding", None)
    rollout = rollout_for(kwargs.pop("prefix_gru"), kwargs.pop("embed_proj"))
    if embed_weight is None:
        return rollout(embed_weight=module.weight, embedding_module=module, **kwargs)
    return rollout(embed_weight=embed_weight, **kwargs)


__all__ = ["CompiledRollout", "GreedyPick", "eligible", "greedy_rollout", "rollout_for"]
