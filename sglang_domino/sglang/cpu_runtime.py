"""What the DFLASH path needs on CPU in a 0.5.23 scheduler, installed by
`DominoDFlashWorker.__init__` only when the target runs on CPU. Each piece names the
upstream symbol it depends on (listed in UPSTREAM.md and checked by the tests).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from . import apply_hooks_once

logger = logging.getLogger(__name__)

TORCH_NATIVE_FORWARD_EXTEND = (
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"
)


def _around_torch_native_forward_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """TARGET_VERIFY batches (the DFLASH draft block and the target verify) reach
    `TorchNativeAttnBackend.forward_extend` (`torch_native_backend.py:279`, routed by
    `base_attn_backend.py:355`) without `extend_prefix_lens` / `extend_seq_lens`, which it
    needs (`:101`). For those batches every request has the same number of new tokens
    W = tokens / batch size, already written at `req_to_token[seq_len : seq_len + W]`:
    run them as an extend with prefix = `seq_lens`, extend length W, total
    `seq_lens + W`. The backend then attends causally for the target verify and
    non-causally for the draft's ENCODER_ONLY layers (`:308-310`)."""
    fb = forward_batch
    if not fb.forward_mode.is_target_verify() or fb.extend_seq_lens is not None:
        return original(self, q, k, v, layer, fb, *args, **kwargs)
    bs = int(fb.batch_size)
    n = int(q.shape[0])
    if bs <= 0 or n % bs:
        raise RuntimeError(f"TARGET_VERIFY batch of {n} tokens is not a whole number of blocks for {bs} requests")
    width = n // bs
    prefix = fb.seq_lens
    saved = (fb.seq_lens, fb.extend_prefix_lens, fb.extend_seq_lens)
    fb.seq_lens = prefix + width
    fb.extend_prefix_lens = prefix
    fb.extend_seq_lens = torch.full_like(prefix, width)
    try:
        return original(self, q, k, v, layer, fb, *args, **kwargs)
    finally:
        fb.seq_lens, fb.extend_prefix_lens, fb.extend_seq_lens = saved


_around_torch_native_forward_extend._sglang_domino = True


_upstream_record_stream = torch.Tensor.record_stream


def _record_stream(self, stream):
    # `dflash_worker_v2.py:2481` calls `batch.seq_lens.record_stream(
    # torch.get_device_module(device).current_stream())` unconditionally; on CPU that is
    # a `torch.cpu.Stream`, which `record_stream` rejects ("unknown parameter type").
    # A CPU tensor has no stream to record against: a no-op there, upstream otherwise.
    if self.device.type == "cpu":
        return None
    return _upstream_record_stream(self, stream)


def install() -> None:
    """Once per (CPU scheduler) process."""
    if apply_hooks_once("cpu runtime", [(TORCH_NATIVE_FORWARD_EXTEND, _around_torch_native_forward_extend,
                                          "AROUND")]):
        torch.Tensor.record_stream = _record_stream


@contextlib.contextmanager
def domino_device_gate_lifted():
    """While `DFlashWorkerV2.__init__` runs on CPU: `validate_domino_runtime`
    (`domino_utils.py:133`, bound by name in `dflash_worker_v2.py:74`, called at `:479`)
    keeps every check except two: the device must be CUDA (`:147`) and the weights BF16
    (`:293-308`, the function's last check). The rollout itself is plain PyTorch and runs
    in the server's dtype."""
    import sglang.srt.speculative.dflash_worker_v2 as w2

    upstream = w2.validate_domino_runtime

    def validate_on_cpu(*, device, **kwargs):
        try:
            upstream(device=torch.device("cuda"), **kwargs)
        except ValueError as err:
            if not str(err).startswith("DFLASH Domino currently requires BF16"):
                raise

    w2.validate_domino_runtime = validate_on_cpu
    try:
        yield
    finally:
        w2.validate_domino_runtime = upstream


def disable_triton_qk_norm_rope(model: torch.nn.Module) -> int:
    """`srt/models/dflash.py:283` turns on a Triton `table_qk_norm_rope_` for bf16
    (`:383-388`); there is no Triton driver on CPU. Returns how many layers were switched."""
    n = 0
    for module in model.modules():
        if getattr(module, "use_table_qk_norm_rope", False):
            module.use_table_qk_norm_rope = False
            n += 1
    return n


def keep_input_embeds_dtype(model_runner) -> None:
    """`ModelRunner._extend_forward_kwargs` (`model_runner.py:1772`) casts `input_embeds`
    to bf16 unconditionally; the DFLASH draft block is passed as `input_embeds`
    (`dflash_worker_v2.py:2582`), so a fp16/fp32 draft gets a dtype mismatch. On this
    runner instance only, hand the embeddings over in the runner's own dtype."""
    if getattr(model_runner, "_sglang_domino_embeds", False):
        return
    original = model_runner._extend_forward_kwargs
    dtype = model_runner.dtype

    def _extend_forward_kwargs(forward_batch, pp_proxy_tensors):
        kwargs = original(forward_batch, pp_proxy_tensors)
        if (forward_batch.input_embeds is not None and "input_embeds" in kwargs
                and getattr(forward_batch, "replace_embeds", None) is None):
            kwargs["input_embeds"] = forward_batch.input_embeds.to(dtype)
        return kwargs

    model_runner._extend_forward_kwargs = _extend_forward_kwargs
    model_runner._sglang_domino_embeds = True
