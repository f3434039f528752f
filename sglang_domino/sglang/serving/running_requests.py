"""The effective `max_running_requests`, reported where users read it (issue 21).

0.5.23 can lower the requested `--max-running-requests` while a scheduler builds its
memory pools (`KVCacheConfigurator.resolve_max_num_reqs`, run at pool sizing and again
after graph capture): to half the KV tokens, and on a hybrid target to the recurrent-state
slots (`max_mamba_cache_size // slots per request`); with attention DP each rank gets
`requested // ranks`. It logs each cap where it happens, but `/server_info`,
`/get_server_info` and `Engine.get_server_info()` report the resolved *request* as the
top-level `max_running_requests`: a server that admits 4 requests says 16.

Two hooks of the `running requests` group (installed in every scheduler at start):
  * around `resolve_max_num_reqs`: records the bounds each call applied, so the summary
    can name its cause;
  * after `Scheduler.get_init_info` (sent once to the launcher after `Scheduler.__init__`,
    every cap done): the top-level `max_running_requests` becomes the value the scheduler
    admits, the request moves to `requested_max_running_requests`, and TP rank 0 logs one
    warning when the first is below the second.

With more than one DP rank the launcher talks to the DP controller, whose own
`get_init_info` forwards three keys only: there the top-level value stays the request
(each rank's value is under `internal_states[i].effective_max_running_requests_per_dp`),
and the warning is still logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

PREFIX = "sglang-domino"
REQUESTED_KEY = "requested_max_running_requests"


@dataclass(frozen=True)
class Bounds:
    """What one `resolve_max_num_reqs` call capped with (per attention-DP rank)."""
    token_capacity: int
    kv_cap: int                            # 0.5.23 gives each request at least 2 KV tokens
    mamba_cache_size: Optional[int] = None  # hybrid targets: recurrent-state slots
    mamba_ratio: Optional[int] = None      # slots one request holds

    @property
    def mamba_cap(self) -> Optional[int]:
        if self.mamba_cache_size is None or not self.mamba_ratio:
            return None
        return self.mamba_cache_size // self.mamba_ratio


# one scheduler per process: the last call's bounds (the post-capture one when it ran)
_bounds: Optional[Bounds] = None
_warned = False


def around_resolve_max_num_reqs(original, self, token_capacity, *args, **kwargs):
    """Record the bounds upstream applies; its result is returned unchanged."""
    global _bounds
    result = original(self, token_capacity, *args, **kwargs)
    _bounds = bounds_of(self, int(token_capacity))
    return result


def bounds_of(configurator, token_capacity: int) -> Bounds:
    """The bounds as 0.5.23's method computes them: KV tokens // 2; on a hybrid target,
    state slots // slots per request (the ratio is read after the original ran, which
    raised already if it could not be computed)."""
    size = ratio = None
    if getattr(configurator, "mambaish_config", None) is not None:
        from sglang.srt.runtime_context import get_schedule

        size = get_schedule().max_mamba_cache_size
        ratio = int(configurator._calculate_mamba_ratio())
    return Bounds(token_capacity=token_capacity, kv_cap=token_capacity // 2, mamba_cache_size=size,
                  mamba_ratio=ratio)


@dataclass(frozen=True)
class Report:
    """The effective value against the request, both over all attention-DP ranks."""
    requested: Optional[int]
    per_rank: int
    dp_ranks: int = 1
    bounds: Optional[Bounds] = None

    @property
    def effective(self) -> int:
        return self.per_rank * self.dp_ranks

    @property
    def below(self) -> bool:
        return self.requested is not None and self.effective < self.requested

    def causes(self) -> list[str]:
        """Each bound below the per-rank request, as 0.5.23 applied it."""
        if self.requested is None:
            return []
        wanted = max(1, self.requested // self.dp_ranks)
        out = []
        if wanted * self.dp_ranks < self.requested:
            out.append(f"split over {self.dp_ranks} attention-DP ranks ({self.requested} // {self.dp_ranks} = "
                       f"{wanted} each)")
        b = self.bounds
        if b is not None and b.mamba_cap is not None and b.mamba_cap < wanted:
            slots = "slot" if b.mamba_ratio == 1 else "slots"
            out.append(f"capped by the mamba state pool (max_mamba_cache_size={b.mamba_cache_size}, "
                       f"{b.mamba_ratio} {slots} per request)")
        if b is not None and b.kv_cap < wanted:
            out.append(f"capped by the KV cache ({b.token_capacity} tokens hold at most {b.kv_cap} requests)")
        return out

    def message(self) -> str:
        value = str(self.effective)
        if self.dp_ranks > 1:
            value += f" ({self.per_rank} per attention-DP rank x {self.dp_ranks})"
        causes = "; ".join(self.causes()) or "cause not recorded (see the warnings above)"
        return f"{PREFIX}: max_running_requests is {value}, below the requested {self.requested}: {causes}"


def report_for(scheduler) -> Report:
    """The scheduler's own value (every cap done) against the resolved request."""
    from sglang.srt.runtime_context import get_parallel, get_schedule

    requested = get_schedule().max_running_requests
    return Report(requested=None if requested is None else int(requested),
                  per_rank=int(scheduler.max_running_requests),
                  dp_ranks=max(1, int(get_parallel().attn_dp_size)), bounds=_bounds)


def after_get_init_info(result, self, *args, **kwargs):
    """The handshake the launcher merges over the resolved arguments in `/server_info`:
    the effective value replaces the request at the top level; the request stays
    visible. One warning (TP rank 0) when the effective value is below the request."""
    global _warned
    report = report_for(self)
    result[REQUESTED_KEY] = report.requested
    result["max_running_requests"] = report.effective
    if report.below and not _warned:
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().tp_rank == 0:
            logger.warning(report.message())
        _warned = True
    return result


__all__ = ["Bounds", "REQUESTED_KEY", "Report", "after_get_init_info", "around_resolve_max_num_reqs", "bounds_of",
           "report_for"]
