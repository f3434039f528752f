"""Stock SGLang 0.5.23 on CPU: what its CPU engine lacks on a machine without Intel AMX or a
CPU build of `sgl_kernel`, supplied without a fork. Nothing here knows Domino but
`dflash` and `rollout`.

  * `platform`: the `sglang.srt.platforms` entry point; `--device cpu` switches the CPU
    engine on and serves `kernel_standin` as `sgl_kernel` when the real one cannot load.
  * `kernel_standin`, `gdn_ops`, `qwen3_5_ops`: pure-PyTorch `sgl_kernel` ops.
  * `parallel`: `--tp-size N` over gloo (thread binding, no PyNccl).
  * `hybrid`: gated delta-net targets (gated norms, the state commit after a verify).
  * `dflash`: the DFLASH path of stock 0.5.23 on CPU (device gates, torch_native verify).
  * `attention`: the torch_native attention loops batched.
  * `compiled_forward`, `compiled_context`, `rollout`: `--enable-torch-compile`, the layers, the
    draft's context write and the Domino rollout under torch.compile.
  * `switches`: the flag read, the removed environment switches refused, the compile cache.
  * `resolve`: CPU-only argument rules.

Importing this package imports nothing from SGLang (the platform entry point runs while
`sglang` is half-imported).
"""
