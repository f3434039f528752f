"""The target's layer stack compiled on CPU (issue 20 part 2: a compiled CPU step).

0.5.23 runs a CPU target eagerly, one small op at a time through its layer-boundary and
residual-stream code: at the test bed's size a decode step is mostly Python and dispatch
(docs/cpu-profile.md), and `torch.compile` over `model.forward` as it stands breaks the
graph 76 times and recompiles 57 (0.5.23's residual stream, `is_host_cpu_x86`). Its own
`CPUGraphRunner` compiles only the decode step and refuses speculative servers.

Here the CPU port owns a compile-friendly forward for plain Qwen3 targets: the embedding
and the logits processor stay upstream's (eager), and the layers between them run as
one `torch.compile` graph, dynamic in the number of tokens, built from upstream's own
pieces of math (`RMSNorm.forward_native`, `RotaryEmbedding.forward_native`,
`SiluAndMul.forward_native`, the linear layers' weights). Attention stays upstream's
backend call (0.5.23's `torch_native`, batched by `attention.py`) behind one opaque
custom op, `sglang_domino::cpu_attention`, which reads the step's `ForwardBatch` from
this module (set for the duration of one forward): the graph does not break at it and
the KV cache writes stay where upstream does them.

The same forward serves decode, prefill, the speculative verify at every width and idle
batches' neighbours (an empty batch runs upstream's forward). Auxiliary hidden states
(the DFLASH draft's context features) are the residual stream entering each captured
layer, as upstream's layer boundary captures them.

Eligible: a `Qwen3ForCausalLM` on CPU, one rank (no tensor or pipeline parallelism),
unquantized linear layers, a rotary embedding of upstream's base class; the target only
(the draft is upstream's). `SGLANG_DOMINO_CPU_TARGET=compiled` switches it on (opt-in;
the default, `eager`, is upstream's forward); asked for where it cannot run, the
server refuses to start and says why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Optional

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

MODE_ENV = "SGLANG_DOMINO_CPU_TARGET"
MODES = ("eager", "compiled")   # the first is the default


def mode() -> str:
    value = os.environ.get(MODE_ENV, MODES[0]).strip().lower() or MODES[0]
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def install() -> bool:
    """Install the `cpu compiled target` group of `hooks.py` (once per process) when
    `SGLANG_DOMINO_CPU_TARGET=compiled`; returns whether it is in place."""
    if mode() != "compiled":
        return False
    from .. import hooks

    hooks.install(hooks.CPU_TARGET)
    return True


# -- attention: one opaque op, the step's batch read from here --------------------------

class _Step:
    """The forward in progress: its batch and the attention modules by layer index."""
    batch = None
    layers: list = []


@contextlib.contextmanager
def _step(batch, layers):
    _Step.batch, _Step.layers = batch, layers
    try:
        yield
    finally:
        _Step.batch, _Step.layers = None, []


@torch.library.custom_op("sglang_domino::cpu_attention", mutates_args=())
def cpu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Upstream's attention of layer `layer` (`RadixAttention.forward`: writes k and v into
    the KV cache, attends) for the step in progress. Without one (compiling at start-up)
    it returns zeros."""
    if _Step.batch is None:
        return torch.zeros_like(q)
    out = _Step.layers[layer](q, k, v, _Step.batch)
    return out.reshape(q.shape[0], -1)


@cpu_attention.register_fake
def _(q, k, v, layer):
    return torch.empty_like(q)


# -- eligibility ---------------------------------------------------------------------------

def refusal(model) -> Optional[str]:
    """Why `model` cannot run compiled here (None: it can)."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    if type(model) is not Qwen3ForCausalLM:
        return f"the target is {type(model).__name__}; only Qwen3ForCausalLM is compiled"
    inner = model.model
    if model.pp_group.world_size != 1:
        return "pipeline parallelism (--pp-size > 1)"
    for layer in inner.layers[inner.start_layer:inner.end_layer]:
        attn = layer.self_attn
        if attn.num_heads != attn.total_num_heads:
            return "tensor parallelism (--tp-size > 1)"
        linears = (attn.qkv_proj, attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        if any(type(getattr(m, "quant_method", None)) is not UnquantizedLinearMethod for m in linears):
            return "quantized linear layers"
        if type(attn.rotary_emb) is not RotaryEmbedding:
            return f"rotary embedding {type(attn.rotary_emb).__name__} (only the plain RotaryEmbedding)"
        if attn.qkv_proj.weight.device.type != "cpu":
            return "weights not on the CPU"
    return None


# -- the compiled stack ------------------------------------------------------------------

class CompiledQwen3:
    """`Qwen3ForCausalLM.forward` with its layers under one `torch.compile` graph."""

    def __init__(self, model):
        self.model = model
        inner = model.model
        self.layers = list(inner.layers[inner.start_layer:inner.end_layer])
        self.attention = [layer.self_attn.attn for layer in self.layers]
        self.eager_forward = model.forward
        self._compiled = torch.compile(self._layers, dynamic=True)

    def _capture(self) -> tuple[int, ...]:
        """The layers (indices into self.layers) whose incoming residual stream is captured."""
        if not self.model.capture_aux_hidden_states:
            return ()
        start = self.model.model.start_layer
        return tuple(i - start for i in self.model.model.layers_to_capture)

    def _layers(self, hidden: torch.Tensor, positions: torch.Tensor, capture: tuple[int, ...]):
        residual = None
        aux = []
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            if residual is None:
                residual = hidden
                hidden = layer.input_layernorm.forward_native(hidden)
            else:
                hidden, residual = layer.input_layernorm.forward_native(hidden, residual)
            if i in capture:
                aux.append(residual)
            qkv = F.linear(hidden, attn.qkv_proj.weight, attn.qkv_proj.bias)
            q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
            q = attn.q_norm.forward_native(q.reshape(-1, attn.head_dim)).view(q.shape)
            k = attn.k_norm.forward_native(k.reshape(-1, attn.head_dim)).view(k.shape)
            q, k = attn.rotary_emb.forward_native(positions, q, k)
            out = torch.ops.sglang_domino.cpu_attention(q, k, v.contiguous(), i)
            hidden = F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            hidden, residual = layer.post_attention_layernorm.forward_native(hidden, residual)
            gate_up = F.linear(hidden, mlp.gate_up_proj.weight, mlp.gate_up_proj.bias)
            hidden = F.linear(mlp.act_fn.forward_native(gate_up), mlp.down_proj.weight, mlp.down_proj.bias)
        hidden, _ = self.model.model.norm.forward_native(hidden, residual)
        return hidden, aux

    def __call__(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False,
                 pp_proxy_tensors=None):
        if get_embedding or pp_proxy_tensors is not None or int(positions.shape[0]) == 0:
            return self.eager_forward(input_ids, positions, forward_batch, input_embeds=input_embeds,
                                      get_embedding=get_embedding, pp_proxy_tensors=pp_proxy_tensors)
        hidden = self.model.model.embed_tokens(input_ids) if input_embeds is None else input_embeds
        with torch.no_grad(), _step(forward_batch, self.attention):
            hidden, aux = self._compiled(hidden, positions, self._capture())
        return self.model.logits_processor(input_ids, hidden, self.model.lm_head, forward_batch,
                                           _aux_list(aux) if self.model.capture_aux_hidden_states else None)

    def warm(self, dtype: torch.dtype, hidden_size: int) -> float:
        """Compile the graphs serving needs (one row and many rows) before the first
        request, with the attention returning zeros; seconds taken."""
        t0 = time.perf_counter()
        for rows in (1, 2):
            hidden = torch.zeros(rows, hidden_size, dtype=dtype)
            positions = torch.zeros(rows, dtype=torch.int64)
            with torch.no_grad():
                self._compiled(hidden, positions, self._capture())
        return time.perf_counter() - t0


def _aux_list(aux):
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList

    return AuxHiddenStateList(aux)


def after_load_model(result, runner, *args, **kwargs):
    """`ModelRunner.load_model`: on a CPU target with `SGLANG_DOMINO_CPU_TARGET=compiled`,
    the model's forward becomes the compiled stack, compiled before serving; refused at
    start-up with the reason where it cannot run."""
    if runner.device != "cpu" or getattr(runner, "is_draft_worker", False) or mode() != "compiled":
        return result
    model = runner.model
    reason = refusal(model)
    if reason is not None:
        raise ValueError(f"{MODE_ENV}=compiled cannot compile this target: {reason}; "
                         f"unset it or set {MODE_ENV}=eager")
    compiled = CompiledQwen3(model)
    model.forward = compiled
    config = model.config
    seconds = compiled.warm(next(model.parameters()).dtype, config.hidden_size)
    logger.info("%s=compiled: the target's %d layers compiled in %.1f s", MODE_ENV, len(compiled.layers), seconds)
    return result


__all__ = ["CompiledQwen3", "MODE_ENV", "after_load_model", "cpu_attention", "install", "mode", "refusal"]
