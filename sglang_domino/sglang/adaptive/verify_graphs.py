"""One target verify graph per adaptive width (`--speculative-adaptive` on a device with
decode graphs).

0.5.23 captures the target's TARGET_VERIFY graphs once, at the verify window
(`DecodeCudaGraphRunner.captured_req_width`), and `can_run_graph` refuses a batch of any
other per-request width. A narrower adaptive step would therefore verify eagerly: a
FlashInfer plan that reads its index arrays back to the host, then every layer's kernels
launched from Python, which on a GPU costs more than the tokens the narrow width saves
(`../shared/reference/gpu-path-review.md`, finding 1).

`VerifyGraphs` builds, at start-up, one target attention backend and one graph runner of
the home runner's own class per width of the adaptive set, each captured with the spec
bag's `speculative_num_draft_tokens` scoped to that width (the way 0.5.23's EAGLE adaptive
mode builds its per-step states, `EAGLEWorkerV2.build_adaptive_runtime_state`; DFLASH
needs only the target side: the draft runs on its whole block at every width). `at(w)`
installs width w's pair on the target model runner for one decode step and restores the
home pair afterwards, also when the step raises. Upstream's code then decides replay
exactly as it does at home (`prepare_for_verify` -> `can_run_graph`).

Capture sizes: each width captures the batch sizes of the same decode graph config as
home (`get_batch_sizes_to_capture` only drops sizes for alignment), so a narrower width
needs at most max_bs x width rows of the process-wide logits buffer, fewer than home's
max_bs x window: the buffer sized for home holds every width.

Memory. Each extra width costs what its capture allocates after the KV pool was sized:
a backend of its own (FlashInfer's float workspace, `SGLANG_FLASHINFER_WORKSPACE_SIZE`,
384 MiB by default, when the home backend has one) and a graph set whose activations hold
max_bs x width rows, estimated from the reserve 0.5.23 sets aside for the home graphs
(`arg_groups/memory_hook.py:368`: max_bs x 2 MB at the window) scaled by width / window.
`estimate_gb` computes it before any capture and the start-up line prints it beside what
each capture measured. The KV pool is sized before these captures, from
`mem_fraction_static`; where 0.5.23 derived that fraction itself (the user gave none, no
post-capture sizing), argument resolution lowers it by the estimate
(`reserve_for_widths`), so the captures take memory the pool left, not the activations'
headroom. A fraction the user gave is kept, and the log names the estimate.

Without a home decode graph (CPU, `--disable-cuda-graph`) nothing is built: every width
verifies eagerly on the one backend, whose metadata is planned per batch.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VerifyState:
    """What the target model runner verifies a width with."""
    width: int
    attn_backend: Any
    graph_runner: Any
    seconds: float = 0.0      # capture time
    gb: float = 0.0           # device memory the capture took, GB (0 when unknown)


# 0.5.23's reserve for the home decode graphs, per captured batch size (MB): memory_hook.py:368
HOME_GRAPH_MB_PER_BS = 2.0


def estimate_gb(widths: Sequence[int], home: int, max_bs: int, workspace_bytes: int) -> dict[int, float]:
    """Device memory each width other than `home` is expected to take when captured (GB):
    its own attention workspace plus a graph set scaled from the home graphs' reserve."""
    graph_mb = lambda w: HOME_GRAPH_MB_PER_BS * max_bs * w / max(int(home), 1)   # noqa: E731
    return {int(w): (workspace_bytes / 2**20 + graph_mb(int(w))) / 1024
            for w in sorted({int(w) for w in widths} - {int(home)}, reverse=True)}


def lowered_fraction(fraction: float, gpu_mem_mb: float, estimate: dict[int, float]) -> float:
    """`mem_fraction_static` less the per-width captures' estimate (GB) of a `gpu_mem_mb` card."""
    return round(float(fraction) - sum(estimate.values()) * 1024 / float(gpu_mem_mb), 3)


def reserve_for_widths(server_args, cfg, widths: Sequence[int], source: str) -> Optional[float]:
    """Argument resolution (main process), DFLASH with adaptive widths on CUDA: lower an
    auto-derived `mem_fraction_static` by the estimate of the captures `VerifyGraphs.build`
    will make after the KV pool is sized. Returns the new fraction, None where nothing is
    lowered (no widths besides the window, no decode graphs, a fraction the user gave,
    post-capture KV sizing, no known card size)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, post_capture_kv_sizing_planned
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.utils.common import get_device_memory_capacity

    window = int(cfg.speculative_num_draft_tokens)
    decode = cfg.cuda_graph_config.decode
    if str(cfg.device or "cuda") != "cuda" or decode.backend == Backend.DISABLED or not decode.max_bs:
        return None
    estimate = estimate_gb(widths, window, int(decode.max_bs), int(envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get()))
    if not estimate or cfg.mem_fraction_static is None:
        return None
    total = sum(estimate.values())
    explicit = (getattr(server_args, "_raw_input", None) or {}).get("mem_fraction_static") is not None
    if explicit or post_capture_kv_sizing_planned(server_args):
        logger.info("sglang-domino adaptive verify graphs: widths %s will take about %.2f GB after the KV pool "
                    "is sized; mem_fraction_static %.3f kept (%s)", list(estimate), total,
                    cfg.mem_fraction_static, "given" if explicit else "post-capture KV sizing")
        return None
    gpu_mem = get_device_memory_capacity(cfg.device)
    if not gpu_mem:
        return None
    fraction = lowered_fraction(cfg.mem_fraction_static, gpu_mem, estimate)
    declare_resolution(server_args, source, mem_fraction_static=fraction)
    logger.info("sglang-domino adaptive verify graphs: mem_fraction_static %.3f -> %.3f for widths %s "
                "(about %.2f GB of captures after the KV pool is sized)", cfg.mem_fraction_static, fraction,
                list(estimate), total)
    return fraction


def _workspace_bytes(model_runner) -> int:
    """The home backend's float workspace, which a width's own backend allocates again."""
    buf = getattr(model_runner.attn_backend, "workspace_buffer", None)
    return int(buf.numel() * buf.element_size()) if hasattr(buf, "element_size") else 0


def home_graph_runner(model_runner) -> Optional[Any]:
    """The target's decode graph runner, None when it has none (eager runner or no graph)."""
    runner = getattr(model_runner, "decode_cuda_graph_runner", None)
    if runner is None or runner is getattr(model_runner, "eager_runner", None):
        return None
    return runner


class VerifyGraphs:
    """Per-width (attention backend, verify graph runner) pairs of one target model runner."""

    def __init__(self, model_runner, home: int, states: dict[int, VerifyState],
                 estimate: Optional[dict[int, float]] = None):
        self.model_runner = model_runner
        self.home = int(home)
        self.states = states
        self.estimate = estimate or {}

    @classmethod
    def build(cls, model_runner, home: int, widths: Sequence[int], *,
              spec_override: Callable[[int], contextlib.AbstractContextManager],
              free_memory: Optional[Callable[[], float]] = None) -> Optional["VerifyGraphs"]:
        """Capture every width of `widths` other than `home`; None without a home graph.

        `spec_override(w)`: a scope in which the spec bag's `speculative_num_draft_tokens`
        is w (attention backends size their verify buffers from it); `free_memory()`: free
        device memory in GB, for the capture's cost in the log."""
        home_runner = home_graph_runner(model_runner)
        if home_runner is None:
            return None
        states = {int(home): VerifyState(int(home), model_runner.attn_backend, home_runner)}
        runner_cls = type(home_runner)
        steps = getattr(home_runner, "speculative_num_steps", None)
        estimate = estimate_gb(widths, home, int(getattr(home_runner, "max_bs", 0) or 0),
                               _workspace_bytes(model_runner))
        logger.info("sglang-domino adaptive verify graphs: capturing widths %s, estimated %.2f GB in all {%s}",
                    list(estimate), sum(estimate.values()),
                    ", ".join(f"{w}: {gb:.2f} GB" for w, gb in estimate.items()))
        for width in estimate:
            states[width] = cls._capture(model_runner, runner_cls, width, steps, spec_override, free_memory)
        graphs = cls(model_runner, home, states, estimate)
        logger.info("sglang-domino adaptive verify graphs: %s", graphs.describe())
        return graphs

    @staticmethod
    def _capture(model_runner, runner_cls, width: int, steps, spec_override, free_memory) -> VerifyState:
        before = free_memory() if free_memory else 0.0
        tic = time.perf_counter()
        with spec_override(width):
            # A backend of its own: its verify buffers are planned for this width, and a
            # graph keeps pointers into the workspace it was captured with.
            saved = getattr(model_runner, "init_new_workspace", False)
            try:
                backend = model_runner._get_attention_backend(init_new_workspace=True)
            finally:
                model_runner.init_new_workspace = saved
            runner = runner_cls(model_runner, attn_backend=backend, speculative_num_steps=steps,
                                speculative_num_draft_tokens=width)
        used = (before - free_memory()) if free_memory else 0.0
        return VerifyState(width, backend, runner, time.perf_counter() - tic, max(used, 0.0))

    @property
    def widths(self) -> list[int]:
        return sorted(self.states, reverse=True)

    @contextlib.contextmanager
    def at(self, width: int):
        """Width `width`'s backend and graph runner on the target model runner for one step."""
        width = int(width)
        state = self.states.get(width)
        if state is None:
            raise KeyError(f"sglang-domino: no verify graph captured at width {width}; "
                           f"captured: {self.widths}")
        runner = self.model_runner
        home = self.states[self.home]
        runner.attn_backend, runner.decode_cuda_graph_runner = state.attn_backend, state.graph_runner
        try:
            yield state
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = home.attn_backend, home.graph_runner

    def describe(self) -> str:
        parts = []
        for w in self.widths:
            s = self.states[w]
            if w == self.home:
                parts.append(f"{w}: home")
            else:
                mem = f", {s.gb:.2f} GB" if s.gb else ""
                if w in self.estimate:
                    mem += f" (estimated {self.estimate[w]:.2f} GB)"
                parts.append(f"{w}: {s.seconds:.1f} s{mem}")
        return "captured by width {" + ", ".join(parts) + "}"


__all__ = ["VerifyGraphs", "VerifyState", "estimate_gb", "home_graph_runner", "lowered_fraction",
           "reserve_for_widths"]
