"""The target's and the draft's layers compiled on CPU (issue 20 part 2: a compiled CPU step).

0.5.23 runs a CPU model eagerly, one small op at a time through its layer-boundary and
residual-stream code: at the test bed's size a step is mostly Python and dispatch
(docs/cpu-profile.md), and `torch.compile` over `model.forward` as it stands breaks the
graph 76 times and recompiles 57 (0.5.23's residual stream, `is_host_cpu_x86`). Its own
`CPUGraphRunner` compiles only the decode step and refuses speculative servers.

Here the CPU port owns a compile-friendly forward for a plain Qwen3 target, a dense
text-only Qwen3.5 target (gated delta-net and gated attention layers, `hybrid.py`) and a
plain DFlash (or Domino) draft: the embedding and what follows the final norm stay
upstream's (eager), and the layers between them run as one `torch.compile` graph
(`layers.py`), dynamic in the number of tokens, built from upstream's own pieces of math
(`RMSNorm.forward_native`, `RotaryEmbedding.forward_native`, `SiluAndMul.forward_native`,
the linear layers' weights). Attention stays upstream's backend call (0.5.23's `torch_native`, batched by
`attention.py`) behind one opaque custom op, `sglang_domino::cpu_attention`, which reads
the step's `ForwardBatch` from `graph_ops.py` (set for the duration of one forward): the
graph does not break at it, and the KV cache is written where upstream writes it.

One forward serves every batch a server runs (decode, prefill, the verify at every width,
the draft block); an empty batch runs upstream's. The target's auxiliary hidden states
(the DFLASH draft's context features) are the residual stream entering each captured
layer, as upstream's layer boundary captures them. Graphs for one row and for many are
compiled when the model is loaded, before the first request.

Switched on by SGLang's own `--enable-torch-compile` with `--device cpu` (`switches.py`),
for the target and the draft alike. Under `--tp-size N` each rank compiles its shard: the
row-parallel projections' all-reduce is one opaque op (`sglang_domino::cpu_all_reduce`,
the linear layer's own group), where upstream's layer boundary reduces. Where a model
cannot run compiled (another architecture, pipeline parallelism, quantized linears, a
scaled rotary embedding, a draft with convolutions, value scales or attention sinks),
the server refuses to start and says why.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from . import hybrid, packed_linear, switches
from .layers import CompiledLayers
from .switches import FLAG

logger = logging.getLogger(__name__)


def around_capture_decode_graph(original, *args, model_runner=None, **kwargs):
    """`--enable-torch-compile` on CPU makes 0.5.23 build its `CPUGraphRunner` for the decode
    step, which needs the intel_amx attention backend (with the torch_native backend the
    CPU port serves it fails: `'TorchNativeAttnBackend' object has no attribute
    'init_cpu_graph_state'`) and refuses speculative servers. Here the compiled layers
    serve every step instead, so upstream captures nothing: its rule for a CPU runner
    without the flag (`capture_decode_graph` returns no capture) is what runs."""
    from sglang.srt.runtime_context import get_flags

    if getattr(model_runner, "device", None) != "cpu":
        return original(*args, model_runner=model_runner, **kwargs)
    flags = get_flags().capture
    previous, flags.enable_torch_compile = flags.enable_torch_compile, False
    try:
        return original(*args, model_runner=model_runner, **kwargs)
    finally:
        flags.enable_torch_compile = previous


# -- eligibility ---------------------------------------------------------------------------

def _layer_refusal(layers) -> Optional[str]:
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    for layer in layers:
        attn = layer.self_attn
        if any(type(getattr(m, "quant_method", None)) is not UnquantizedLinearMethod
               for m in CompiledLayers.projections(layer)):
            return "quantized linear layers"
        if type(attn.rotary_emb) is not RotaryEmbedding:
            return f"rotary embedding {type(attn.rotary_emb).__name__} (only the plain RotaryEmbedding)"
        norms = (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)
        if any(type(n) is not RMSNorm for n in norms):
            return "norms other than RMSNorm"
        if type(layer.mlp.act_fn) is not SiluAndMul:
            return "an MLP activation other than SiluAndMul"
        if attn.qkv_proj.weight.device.type != "cpu":
            return "weights not on the CPU"
    return None


def refusal(model, draft: bool) -> Optional[str]:
    """Why `model` (the target, or a draft) cannot run compiled here (None: it can)."""
    if draft:
        from sglang.srt.models.dflash import DFlashAttention, DFlashDraftModel

        if type(model) is not DFlashDraftModel:
            return f"the draft is {type(model).__name__}; only DFlashDraftModel is compiled"
        for layer in model.layers:
            attn = layer.self_attn
            if layer.attention_conv is not None or layer.mlp_conv is not None:
                return "a draft with grouped convolutions"
            if type(attn) is not DFlashAttention or attn.v_scale is not None or attn.attention_sink_bias is not None:
                return "a draft with value scales, attention sinks or its own attention output"
        from sglang.srt.layers.layernorm import RMSNorm
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

        if type(model.hidden_norm) is not RMSNorm:
            return "a context norm (hidden_norm) other than RMSNorm"
        if type(getattr(model.fc, "quant_method", None)) not in (type(None), UnquantizedLinearMethod):
            return "a quantized context projection (fc)"
        return _layer_refusal(model.layers)
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    if hybrid.is_hybrid_target(model):
        return hybrid.refusal(model)
    if type(model) is not Qwen3ForCausalLM:
        return (f"the target is {type(model).__name__}; only Qwen3ForCausalLM and the dense text-only "
                "Qwen3_5ForCausalLM are compiled")
    if model.pp_group.world_size != 1:
        return "pipeline parallelism (--pp-size > 1)"
    inner = model.model
    return _layer_refusal(inner.layers[inner.start_layer:inner.end_layer])


class _CompiledModel:
    """A model's `forward` with its layers compiled: upstream's eager forward where the
    subclass says so (`eager_only`) or for an empty batch; otherwise the embedding, the
    compiled layers and the subclass's `finish`."""

    def __init__(self, model, embed_tokens, layers, final_norm, layers_class=CompiledLayers):
        self.model = model
        self.embed_tokens = embed_tokens
        self.layers = layers_class(layers, final_norm)
        self.eager_forward = model.forward

    def eager_only(self, input_embeds, get_embedding, pp_proxy_tensors, forward_batch=None) -> bool:
        raise NotImplementedError

    def finish(self, input_ids, hidden, streams, forward_batch):
        raise NotImplementedError

    def pack(self) -> tuple[int, int]:
        """Pack the compiled projections for oneDNN (`packed_linear`): (how many, bytes)."""
        return self.layers.pack()

    def warm_embedding(self) -> None:
        """Under tensor parallelism, the embedding at one row and at many, in each mode a
        step calls it in (grad enabled, grad-free, inference), before the first request:
        upstream's vocabulary-parallel embedding compiles its masking per such
        kind of call (`get_masked_input_and_mask`); every rank makes the same calls (each
        all-reduces)."""
        if int(getattr(self.embed_tokens, "tp_size", 1)) <= 1:   # none, or one rank: nothing compiled
            return
        device = next(self.model.parameters()).device
        modes = (torch.enable_grad, torch.no_grad, torch.inference_mode)
        for mode in modes:
            with mode():
                for rows in (1, 2):
                    self.embed_tokens(torch.zeros(rows, dtype=torch.int64, device=device))

    def __call__(self, input_ids, positions, forward_batch, **kwargs):
        input_embeds = kwargs.get("input_embeds")
        if int(positions.shape[0]) == 0 or self.eager_only(input_embeds, kwargs.get("get_embedding", False),
                                                           kwargs.get("pp_proxy_tensors"), forward_batch):
            return self.eager_forward(input_ids, positions, forward_batch, **kwargs)
        hidden = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        hidden, streams = self.layers(hidden, positions, forward_batch)
        return self.finish(input_ids, hidden, streams, forward_batch)


class CompiledTarget(_CompiledModel):
    """`Qwen3ForCausalLM.forward` with its layers compiled, or the text-only
    `Qwen3_5ForCausalLM.forward` (`srt/models/qwen3_5_text.py`) with `hybrid.HybridLayers`.
    That one's rotary embedding is an `MRotaryEmbedding` where the checkpoint keeps
    `mrope_section`; upstream then rotates by `mrope_positions`, whose three rows are the
    token positions for text (its own comment: equivalent to 1-D RoPE): here the 1-D
    positions."""

    def __init__(self, model, layers_class=CompiledLayers):
        inner = model.model
        super().__init__(model, inner.embed_tokens, inner.layers[inner.start_layer:inner.end_layer], inner.norm,
                         layers_class)

    def aux(self, streams):
        """The residual streams of the layers DFLASH captures (set after loading), in
        upstream's container; None when it captures none."""
        if not self.model.capture_aux_hidden_states:
            return None
        from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList

        start = self.model.model.start_layer
        return AuxHiddenStateList(streams[i - start] for i in self.model.model.layers_to_capture)

    def eager_only(self, input_embeds, get_embedding, pp_proxy_tensors, forward_batch=None) -> bool:
        return bool(get_embedding) or pp_proxy_tensors is not None

    def finish(self, input_ids, hidden, streams, forward_batch):
        return self.model.logits_processor(input_ids, hidden, self.model.lm_head, forward_batch, self.aux(streams))


class CompiledDraft(_CompiledModel):
    """`DFlashDraftModel.forward` with its layers compiled; `context`: the draft's context
    write compiled (`compiled_context`, read by the worker)."""

    def __init__(self, model):
        from .context import CompiledContext

        super().__init__(model, model.embed_tokens, model.layers, model.norm)
        self.context = CompiledContext(model)

    def pack(self) -> tuple[int, int]:
        (layers, layer_bytes), (context, context_bytes) = super().pack(), self.context.pack()
        return layers + context, layer_bytes + context_bytes

    def eager_only(self, input_embeds, get_embedding, pp_proxy_tensors, forward_batch=None) -> bool:
        return input_embeds is None and self.embed_tokens is None   # no embedding of its own: upstream's

    def finish(self, input_ids, hidden, streams, forward_batch):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        return LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden)


# The most requests a shape warm-up covers per verify width (the scheduler's batch cap above
# this is warmed up to here only: a bigger batch's first step pays its shapes).
WARM_BATCH_CAP = 64


def serving_widths(server_args, draft: bool) -> set[int]:
    """The tokens per request the model's forward serves in decode steps: the target's verify
    (or plain decode) at every width, a draft's block."""
    from ...settings import current

    if not getattr(server_args, "speculative_algorithm", None):
        return {1}
    settings = current()
    window = int(getattr(server_args, "speculative_num_draft_tokens", None) or 16)
    if draft:
        return {int(settings.draft_block or window)}
    return {window} | (set(settings.adaptive.widths) if settings.adaptive is not None else set())


def serving_rows(server_args, draft: bool) -> list[int]:
    """The row counts the model's forward serves in decode steps (`serving_widths`), for 1 to
    `max_running_requests` requests (at most WARM_BATCH_CAP)."""
    batch = min(int(getattr(server_args, "max_running_requests", None) or WARM_BATCH_CAP), WARM_BATCH_CAP)
    widths = serving_widths(server_args, draft)
    return sorted({b * w for b in range(1, batch + 1) for w in widths})


def warm_shapes(layers: CompiledLayers, dtype: torch.dtype, hidden_size: int, rows: list[int],
                inference: bool, packed: bool) -> float:
    """oneDNN's kernels for every row count of `rows`, built before serving; seconds taken.
    oneDNN builds a kernel (a "primitive", cached by shape) for each new matrix shape on
    first use: in bfloat16 (40-170 ms steps against 10-28 ms warm on the 2-core test bed,
    docs/results.md), and in float32 for projections `packed` for it (about 0.6 ms a
    projection). In float32 the packed projections are the graph's only such products:
    each distinct one is run once per row count above the linear op's few rows
    (`warm_products`), without the rest of the layers. In bfloat16, where inductor's own
    products may go through oneDNN too, every row count runs through the compiled layers
    once (attention returning zeros), in the mode the model is called in. Unpacked
    float32 matmuls (MKL) build nothing per shape and are not warmed."""
    if dtype == torch.float32 and not packed:
        return 0.0
    t0 = time.perf_counter()
    if dtype == torch.float32:
        warm_products(layers, rows)
        return time.perf_counter() - t0
    with torch.inference_mode(inference):
        for n in rows:
            layers(torch.zeros(n, hidden_size, dtype=dtype), torch.zeros(n, dtype=torch.int64), None)
    return time.perf_counter() - t0


def warm_products(layers: CompiledLayers, rows: list[int]) -> int:
    """Each distinct product of the packed projections of `layers` (weight shape, with or
    without a bias in it: oneDNN keys its kernels on shapes) at every row count of `rows`
    that goes through oneDNN (above `cpu_linear.small_rows()`), on zeros; how many
    products were run. The row-parallel projections (`CompiledLayers.row_parallel`) add
    their bias after the product, the others in it."""
    from ....kernels import cpu_linear

    cut = cpu_linear.small_rows()
    wanted = [n for n in rows if n > cut]
    seen, runs = set(), 0
    with torch.no_grad():
        for layer in layers.layers:
            bias_after = layers.row_parallel(layer)
            for module in layers.projections(layer):
                index = getattr(module, packed_linear.ATTR, None)
                bias = None if any(module is m for m in bias_after) else module.bias
                key = (tuple(module.weight.shape), module.weight.dtype, bias is not None)
                if index is None or key in seen:
                    continue
                seen.add(key)
                for n in wanted:
                    x = module.weight.new_zeros(n, module.weight.shape[1])
                    packed_linear.linear(x, module.weight, bias, index)
                    runs += 1
    return runs


def build_kernels() -> float:
    """Build this process's CPU kernel library (`kernels/cpu_build`: the paged-attention
    kernel and the linear op), compiled into the compile cache on the first start on a
    machine and loaded from it after, and serve attention with it (`attention.use_kernel`,
    unless a debug check asks for upstream's); seconds taken. A library that cannot be
    built refuses the start (the compiled step needs the same compiler)."""
    import os

    from ....kernels import cpu_build, cpu_paged_attention
    from .. import attention

    t0 = time.perf_counter()
    try:
        cpu_build.build(os.path.join(switches.cache_dir(), "kernels"))
    except Exception as exc:   # the compiler's or the loader's message
        raise RuntimeError(f"{FLAG} with --device cpu: the CPU kernels could not be built: {exc}") from exc
    if attention.wanted():   # SGLANG_DOMINO_DEBUG=upstream-cpu-attention: upstream's loops, for comparisons
        attention.use_kernel(cpu_paged_attention.op())
    return time.perf_counter() - t0


def after_load_model(result, runner, *args, **kwargs):
    """`ModelRunner.load_model`: on CPU with `--enable-torch-compile`, the model's forward
    becomes the compiled one (compiled before serving); refused at start-up with the
    reason where it cannot run."""
    draft = bool(getattr(runner, "is_draft_worker", False))
    if runner.device != "cpu" or not switches.compiled_step(runner.server_args):
        return result
    model = runner.model
    kind = "draft" if draft else "target"
    reason = refusal(model, draft)
    if reason is not None:
        raise ValueError(f"{FLAG} with --device cpu cannot compile this {kind}: {reason}; "
                         f"serve it without {FLAG}")
    switches.set_compiled_step()
    kernel_seconds = build_kernels()
    if draft:
        compiled = CompiledDraft(model)
    else:
        compiled = CompiledTarget(model, hybrid.HybridLayers if hybrid.is_hybrid_target(model) else CompiledLayers)
    model.forward = compiled
    packed, packed_bytes = compiled.pack()
    packed_linear.declare(model, packed, packed_bytes)
    dtype = next(model.parameters()).dtype
    # the draft is called in inference mode, the target without
    seconds = compiled.layers.warm(dtype, model.config.hidden_size, inference=draft)
    rows = serving_rows(runner.server_args, draft)
    seconds += warm_shapes(compiled.layers, dtype, model.config.hidden_size, rows, inference=draft,
                           packed=packed > 0)
    compiled.warm_embedding()
    if draft:
        seconds += compiled.context.warm(dtype, int(model.fc.weight.shape[1]))
    elif hybrid.is_hybrid_target(model):
        seconds += hybrid.warm_delta_rule(model, serving_widths(runner.server_args, draft), dtype)
    # a graph compiled after this is a missed warm-up: the log says which guard failed
    torch._logging.set_logs(recompiles=True)
    logger.info("%s: the %s's %d layers compiled in %.1f s, %d projections packed for oneDNN (%.1f MB), "
                "CPU kernels ready in %.1f s (compile cache %s)", FLAG, kind, len(compiled.layers.layers),
                seconds, packed, packed_bytes / 2**20, kernel_seconds, switches.cache_dir())
    return result


__all__ = ["CompiledDraft", "CompiledTarget", "WARM_BATCH_CAP", "after_load_model", "build_kernels",
           "around_capture_decode_graph", "refusal", "serving_rows", "serving_widths", "warm_products", "warm_shapes"]
