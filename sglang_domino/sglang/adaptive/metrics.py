"""The accept rate in the scheduler's log and Prometheus under `--speculative-adaptive`, and
the steps by verify width in Prometheus (`WIDTH_STEPS`, with `--enable-metrics`).

0.5.23 reports the accept rate as accepted proposals / (requests' verify steps x
(`speculative_num_draft_tokens` - 1)) (`SchedulerMetricsReporter.report_decode_stats`),
i.e. as if every step had verified the largest width. An adaptive step at width W
proposes W - 1 tokens (width 1: none), so the reported rate fell with every narrow step
although the drafts did not get worse. The worker counts what its adaptive steps really
proposed (`DominoDFlashWorker.drafts_proposed`, from `on_verify_complete_cpu`); around the
report, the accepted count is scaled so that upstream's own division gives accepted /
proposed over the same steps. Nothing else in the report reads that count, and it is put
back when the report does not log (upstream logs and resets its counters every
`decode_log_interval` steps).

Per request, `meta_info.spec_accept_rate` is computed in the tokenizer process from the
request's verify count alone and stays relative to the largest width (docs/adaptive-width.md).
"""

from __future__ import annotations


# decode steps by verify width, exported beside 0.5.23's spec gauges with `--enable-metrics`
WIDTH_STEPS = "sglang:spec_verify_width_steps_total"
_width_counter = None


def export_widths(reporter, worker) -> None:
    """The adaptive policy's steps by width since the last export, added to the
    `WIDTH_STEPS` counter (labels: 0.5.23's scheduler labels and `width`)."""
    global _width_counter
    if not getattr(reporter, "enable_metrics", False) or worker is None:
        return
    policy = getattr(worker, "width_policy", None)
    histogram = getattr(policy, "histogram", None)
    if not histogram:
        return
    labels = dict(reporter.metrics_collector.labels)
    if _width_counter is None:
        from prometheus_client import Counter

        _width_counter = Counter(WIDTH_STEPS.removesuffix("_total"),   # prometheus_client adds _total
                                 "Decode steps by verify width (sglang-domino --speculative-adaptive).",
                                 labelnames=[*labels, "width"])
    exported = worker.__dict__.setdefault("_widths_exported", {})
    for width, steps in histogram.items():
        if steps > exported.get(width, 0):
            _width_counter.labels(**labels, width=str(width)).inc(steps - exported.get(width, 0))
            exported[width] = steps


def around_report_decode_stats(original, self, *args, **kwargs):
    worker = getattr(self.scheduler, "draft_worker", None)
    export_widths(self, worker)
    proposed = getattr(worker, "drafts_proposed", 0)
    if not proposed or not self.spec_num_forward_ct:
        return original(self, *args, **kwargs)
    from sglang.srt.runtime_context import get_spec

    accepted = self.spec_num_correct_drafts
    # what upstream divides by: every step counted at the largest width
    counted = self.spec_num_forward_ct * (int(get_spec().speculative_num_draft_tokens) - 1)
    self.spec_num_correct_drafts = accepted * counted / proposed
    try:
        return original(self, *args, **kwargs)
    finally:
        if self.spec_num_forward_ct == 0:    # logged: upstream reset its window, start ours again
            worker.drafts_proposed = 0
        else:
            self.spec_num_correct_drafts = accepted


__all__ = ["WIDTH_STEPS", "around_report_decode_stats", "export_widths"]
