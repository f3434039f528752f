"""Stock 0.5.23's DFLASH path on CPU: what its scheduler and argument resolution need
there. The `cpu dflash` group of `hooks.py` is installed by `DominoDFlashWorker.__init__`
when the target runs on CPU; the other pieces are applied where the rows say.
"""

from __future__ import annotations

import contextlib
import logging

import torch

logger = logging.getLogger(__name__)

def verify_width(forward_batch, rows: int):
    """The new tokens per request W of a TARGET_VERIFY batch of `rows` tokens (every request
    adds the same number); None where `rows` is not a whole number of blocks."""
    requests = int(forward_batch.batch_size)
    return rows // requests if requests > 0 and rows % requests == 0 else None


def around_torch_native_forward_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs):
    """TARGET_VERIFY batches (the DFLASH draft block and the target verify) reach
    `TorchNativeAttnBackend.forward_extend` (routed there by `AttentionBackend.forward`)
    without `extend_prefix_lens` / `extend_seq_lens`, which its `_run_sdpa_forward_extend`
    needs. For those batches every request has the same number of new tokens
    W = tokens / batch size, already written at `req_to_token[seq_len : seq_len + W]`:
    run them as an extend with prefix = `seq_lens`, extend length W, total
    `seq_lens + W`. The backend then attends causally for the target verify and
    non-causally for the draft's `AttentionType.ENCODER_ONLY` layers."""
    if not forward_batch.forward_mode.is_target_verify() or forward_batch.extend_seq_lens is not None:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    width = verify_width(forward_batch, int(q.shape[0]))
    if width is None:
        raise RuntimeError(f"TARGET_VERIFY batch of {int(q.shape[0])} tokens is not a whole number of blocks for "
                           f"{int(forward_batch.batch_size)} requests")
    prefix = forward_batch.seq_lens
    saved = (forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens)
    forward_batch.seq_lens = prefix + width
    forward_batch.extend_prefix_lens = prefix
    forward_batch.extend_seq_lens = torch.full_like(prefix, width)
    try:
        return original(self, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        forward_batch.seq_lens, forward_batch.extend_prefix_lens, forward_batch.extend_seq_lens = saved


_upstream_record_stream = torch.Tensor.record_stream


def _record_stream(self, stream):
    # `DFlashWorkerV2.forward_batch_generation` calls `batch.seq_lens.record_stream(
    # torch.get_device_module(device).current_stream())` unconditionally; on CPU that is
    # a `torch.cpu.Stream`, which `record_stream` rejects ("unknown parameter type").
    # A CPU tensor has no stream to record against: a no-op there, upstream otherwise.
    if self.device.type == "cpu":
        return None
    return _upstream_record_stream(self, stream)


def skip_record_stream_on_cpu() -> None:
    """Process-wide: `torch.Tensor.record_stream` is a no-op for CPU tensors."""
    torch.Tensor.record_stream = _record_stream


def allow_torch_native_draft_backend() -> None:
    """`torch_native` accepted as `--speculative-draft-attention-backend`: the draft worker
    otherwise falls back to `flashinfer`, which has no CPU path."""
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES, add_draft_attention_backend_choices

    if "torch_native" not in DRAFT_ATTENTION_BACKEND_CHOICES:
        add_draft_attention_backend_choices(["torch_native"])


@contextlib.contextmanager
def domino_device_gate_lifted():
    """While `DFlashWorkerV2.__init__` runs on CPU: `domino_utils.validate_domino_runtime`
    (bound by name in `dflash_worker_v2`, called from `DFlashWorkerV2.__init__`) keeps
    every check except two: the device must be CUDA (its first check) and the weights BF16
    (its last check). The rollout itself is plain PyTorch and runs
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
    """`DFlashAttention.__init__` sets `use_table_qk_norm_rope` for bf16, which makes
    `DFlashAttention.forward` call the Triton `table_qk_norm_rope_`. There is no Triton
    driver on CPU. Returns how many layers were switched."""
    n = 0
    for module in model.modules():
        if getattr(module, "use_table_qk_norm_rope", False):
            module.use_table_qk_norm_rope = False
            n += 1
    return n


def keep_input_embeds_dtype(model_runner) -> None:
    """`ModelRunner._extend_forward_kwargs` casts `input_embeds` to bf16 unconditionally.
    `DFlashWorkerV2.forward_batch_generation` passes the DFLASH draft block as
    `input_embeds`, so a fp16/fp32 draft gets a dtype mismatch. On this
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


class CpuDFlashPlatform:
    """Stands in for `speculative_hook.current_platform` while DFLASH's arguments are
    resolved for `--device cpu` only: `_handle_dflash` refuses any device but CUDA/NPU/
    XPU unless an out-of-tree platform says yes, and the draft backend fallback
    (`speculative_hook._resolve_dflash_draft_attention_backend`) asks the same platform.
    Everything else is delegated to the real platform."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def is_out_of_tree(self) -> bool:
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return algorithm == "DFLASH" and backend == "torch_native"

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return "torch_native"


@contextlib.contextmanager
def dflash_allowed_on_cpu():
    """While DFLASH's arguments are resolved for `--device cpu`: `CpuDFlashPlatform` stands
    in for `speculative_hook.current_platform`."""
    import sglang.srt.arg_groups.speculative_hook as spec_hook

    real = spec_hook.current_platform
    spec_hook.current_platform = CpuDFlashPlatform(real)
    try:
        yield
    finally:
        spec_hook.current_platform = real
