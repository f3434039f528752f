"""Prefill-decode disaggregation (`--disaggregation-mode prefill|decode`) with `--device cpu`.

0.5.23's PD path assumes CUDA in three places that a CPU server reaches on its first
request; each is handled here so that a CPU deployment needs no flag or environment
variable beyond upstream's own PD flags:

  * decode retraction backup: left unset, a decode server picks `host_pool`, a pinned
    host copy of the KV pool registered with `cudaHostRegister`. On CPU the KV pool is
    host memory already: `cpu_tensor` is declared at argument resolution, and an explicit
    `host_pool` is refused there with the value that serves (`resolve_pd_on_cpu`).
  * the prefill side's KV page indices: `MooncakeKVSender` advertises
    `supports_host_tensor_indices`, which makes the scheduler copy the indices into pinned
    memory and record a `torch.cuda.Event` for the transfer thread. CPU indices are host
    tensors already: the sender takes the plain path (`plain_page_indices`).
  * the early send of a cached prompt prefix: under overlap scheduling upstream records a
    `torch.cuda.Event` on the forward stream so that the transfer waits for the previous
    prefill's KV writes. A CPU forward has written its KV when it returns (no device
    queue), so the send runs without the event (`around_send_cached_prefix`).

Installed at scheduler start (the `cpu disaggregation` group of `hooks.py`) only in
servers that run with a disaggregation mode.
"""

from __future__ import annotations

from .. import SOURCE


def resolve_pd_on_cpu(server_args, previous):
    """After upstream's PD resolution: on CPU, a decode server's retraction backup is
    `cpu_tensor`; `host_pool` is refused at start-up."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution

    previous(server_args)
    cfg = resolving_view(server_args)
    if not str(cfg.device).startswith("cpu") or str(cfg.disaggregation_mode) != "decode":
        return
    backup = cfg.disaggregation_decode_retraction_backup
    if backup == "host_pool":
        why = ("--disaggregation-decode-host-receive-threshold below 1 needs it; "
               if cfg.disaggregation_decode_host_receive_threshold < 1 else "")
        raise ValueError(
            "--disaggregation-decode-retraction-backup host_pool is not available with --device cpu "
            f"({why}SGLang 0.5.23 pins that pool with cudaHostRegister, "
            "mem_cache/pool_host/common.py `_cuda_host_register`): use "
            "--disaggregation-decode-retraction-backup cpu_tensor (the default on CPU) and leave "
            "--disaggregation-decode-host-receive-threshold at 1")
    if backup is None:
        declare_resolution(server_args, SOURCE, disaggregation_decode_retraction_backup="cpu_tensor")


def plain_page_indices() -> None:
    """`MooncakeKVSender` hands the transfer thread the page indices as they are (on CPU
    they are host tensors), without a pinned copy and a CUDA event."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    MooncakeKVSender.supports_host_tensor_indices = False


def around_send_cached_prefix(original, self, req, *args, **kwargs):
    """The early send of a cached prefix without a CUDA event: on CPU the previous
    forward's KV writes are done when it returns, so there is nothing to wait for."""
    if not self.enable_overlap:
        return original(self, req, *args, **kwargs)
    self.enable_overlap = False
    try:
        return original(self, req, *args, **kwargs)
    finally:
        self.enable_overlap = True
