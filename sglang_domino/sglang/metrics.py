"""The accept rate in the scheduler's log and Prometheus under `--speculative-adaptive`.

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


def around_report_decode_stats(original, self, *args, **kwargs):
    worker = getattr(self.scheduler, "draft_worker", None)
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


__all__ = ["around_report_decode_stats"]
