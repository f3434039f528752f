"""The accept rate the scheduler logs under `--speculative-adaptive` (`metrics.py`): upstream's
formula (accepted / (requests' steps x (window - 1))) given the accepted count scaled by the
hook reads accepted / proposals the adaptive steps verified."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang_domino.sglang.adaptive import metrics  # noqa: E402

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


# -- per request, in meta_info (`request_accept.py`) -----------------------------------


class Req(SimpleNamespace):
    def finished(self):
        return self.done


def test_each_requests_rate_in_meta_info_is_accepted_over_proposed():
    """Scheduler: the worker counts W - 1 per step for the requests 0.5.23 counts a verify
    for, the output streamer (a subclass of 0.5.23's) sends the running count; tokenizer
    process: 0.5.23's own metrics, with the count kept out of meta_info and the rate
    divided by it."""
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from sglang_domino.sglang.adaptive import request_accept

    a, b = Req(rid="a", is_retracted=False, done=False), Req(rid="b", is_retracted=False, done=False)
    steps = [(16, [a, b]), (4, [a, b]), (1, [a, b]), (8, [a])]
    for width, reqs in steps:
        request_accept.count_proposals(reqs, width)
    b.done = True                                  # an overshoot tick after b finished: not counted
    request_accept.count_proposals([a, b], 2)
    assert getattr(a, request_accept.KEY) == 15 + 3 + 0 + 7 + 1
    assert getattr(b, request_accept.KEY) == 15 + 3 + 0

    streamer_cls = request_accept.proposal_streamer(SchedulerOutputStreamer)
    assert issubclass(streamer_cls, SchedulerOutputStreamer) and streamer_cls.has_additional_customized_info
    assert request_accept.proposal_streamer(SchedulerOutputStreamer) is streamer_cls   # one class per base
    streamer = object.__new__(streamer_cls)        # the hook reads only the requests
    info = streamer.build_additional_customized_info([a, b])
    assert info == {request_accept.KEY: [[26], [18]]}

    # tokenizer process: two outputs of request a (a running total each), other customized info intact
    tokenizer = SimpleNamespace(rid_to_state={}, _accumulate_request_meta_info=TokenizerManager._accumulate_request_meta_info)
    state = SimpleNamespace(customized_info_accumulated={}, customized_info_reported_keys=set())
    tokenizer.rid_to_state["a"] = state
    meta = {}
    for total, mine in ((18, [1, 2]), (26, [3])):
        request_accept.around_update_request_meta_info(
            TokenizerManager.update_request_meta_info, tokenizer, meta, state,
            {request_accept.KEY: [[total]], "user_key": [mine]}, 0, None)
    assert meta == {"user_key": [1, 2, 3]} and getattr(state, request_accept.KEY) == 26

    correct, verify_ct = 20, 5
    recv = SimpleNamespace(rids=["a"], spec_verify_ct=[verify_ct], spec_num_correct_drafts=[correct],
                           completion_tokens=[26], spec_num_cap_tokens=None,
                           spec_correct_drafts_histogram=None, spec_cap_lens_histogram=None)
    request_accept.around_calculate_spec_decoding_metrics(
        TokenizerManager._calculate_spec_decoding_metrics, tokenizer, meta, recv, 0)
    assert meta["spec_num_proposed_drafts"] == 26
    assert meta["spec_accept_rate"] == pytest.approx(correct / 26)
    assert meta["spec_verify_ct"] == verify_ct and meta["spec_accept_length"] == pytest.approx(26 / verify_ct)

    # a request of width-1 steps only proposed nothing: no rate; without the count upstream's stands
    setattr(state, request_accept.KEY, 0)
    zero = {}
    request_accept.around_calculate_spec_decoding_metrics(
        TokenizerManager._calculate_spec_decoding_metrics, tokenizer, zero,
        SimpleNamespace(**{**vars(recv), "spec_num_correct_drafts": [0]}), 0)
    assert zero["spec_num_proposed_drafts"] == 0 and "spec_accept_rate" not in zero
    fixed = {}
    tokenizer.rid_to_state["a"] = SimpleNamespace()
    request_accept.around_calculate_spec_decoding_metrics(
        TokenizerManager._calculate_spec_decoding_metrics, tokenizer, fixed, recv, 0)
    assert fixed["spec_accept_rate"] == pytest.approx(correct / (verify_ct * (WINDOW - 1)))


def test_the_rust_egress_keeps_upstreams_streamer(caplog):
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

    from sglang_domino.sglang.adaptive import request_accept

    def original(self):
        return SchedulerOutputStreamer

    assert request_accept.around_get_output_streamer_class(original, SimpleNamespace(rust_server=None)) \
        is request_accept.proposal_streamer(SchedulerOutputStreamer)
    with caplog.at_level("WARNING"):
        assert request_accept.around_get_output_streamer_class(original, SimpleNamespace(rust_server=object())) \
            is SchedulerOutputStreamer
    assert "SGLANG_RUST_SERVER" in caplog.text
