"""The accept rate the scheduler logs under `--speculative-adaptive` (`metrics.py`): upstream's
formula (accepted / (requests' steps x (window - 1))) given the accepted count scaled by the
hook reads accepted / proposals the adaptive steps verified."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang_domino.sglang import metrics  # noqa: E402

WINDOW = 16


class Reporter:
    """The counters of `SchedulerMetricsReporter` that the rate reads."""

    def __init__(self, worker):
        self.scheduler = SimpleNamespace(draft_worker=worker)
        self.spec_num_correct_drafts = 0
        self.spec_num_forward_ct = 0
        self.logged = []

    def step(self, accepted):       # `update_spec_metrics` for one decode batch
        self.spec_num_correct_drafts += sum(accepted)
        self.spec_num_forward_ct += len(accepted)


def upstream_report(self, log: bool):
    """0.5.23's rate, logged and reset every `decode_log_interval` steps."""
    if not log:
        return
    total = self.spec_num_forward_ct * (WINDOW - 1)
    self.logged.append(self.spec_num_correct_drafts / total)
    self.spec_num_correct_drafts = self.spec_num_forward_ct = 0


@pytest.fixture(autouse=True)
def spec(monkeypatch):
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_spec", lambda: SimpleNamespace(speculative_num_draft_tokens=WINDOW))


def test_the_logged_rate_is_accepted_over_proposed_across_widths():
    worker = SimpleNamespace(drafts_proposed=0)
    reporter = Reporter(worker)
    steps = [(16, [15, 3]), (4, [3, 1]), (1, [0, 0]), (8, [7, 7])]   # (width, accepted per request)
    for i, (width, accepted) in enumerate(steps):
        reporter.step(accepted)
        worker.drafts_proposed += len(accepted) * (width - 1)        # the worker's count
        metrics.around_report_decode_stats(upstream_report, reporter, log=i == len(steps) - 1)
        if i < len(steps) - 1:   # no log: the count is upstream's own again
            assert reporter.spec_num_correct_drafts == sum(sum(a) for _, a in steps[: i + 1])
    proposed = sum(len(a) * (w - 1) for w, a in steps)
    accepted = sum(sum(a) for _, a in steps)
    assert reporter.logged == [pytest.approx(accepted / proposed)]
    assert accepted / (len(steps) * 2 * (WINDOW - 1)) < reporter.logged[0]     # what upstream alone reported
    assert worker.drafts_proposed == 0                                        # a new window starts


def test_fixed_widths_and_other_workers_are_left_to_upstream():
    for worker in (SimpleNamespace(drafts_proposed=0), None, SimpleNamespace()):
        reporter = Reporter(worker)
        reporter.step([15, 5])
        metrics.around_report_decode_stats(upstream_report, reporter, log=True)
        assert reporter.logged == [pytest.approx(20 / 30)]
