"""Each request's accept rate in `meta_info` under `--speculative-adaptive`.

0.5.23 computes `meta_info.spec_accept_rate` in the tokenizer process as accepted
proposals / (the request's verify steps x (`speculative_num_draft_tokens` - 1))
(`TokenizerManager._calculate_spec_decoding_metrics`): every step counted at the largest
width. An adaptive step at width W proposes W - 1 tokens (width 1: none), so the rate read
lower than the drafts were. The scheduler knows what each request's steps proposed; the
tokenizer process is told through 0.5.23's own channel for extra per-request output,
`customized_info`:

  * the worker adds W - 1 to the request's count when a step's results reach the host
    (`count_proposals`, from `on_verify_complete_cpu`), for the requests whose verify
    0.5.23 counts (`spec_verify_ct`: neither retracted nor finished before the step);
  * the scheduler's output streamer is the subclass 0.5.23's `get_output_streamer_class`
    is there for, which adds the count to every output it sends (one value per request:
    the running total);
  * in the tokenizer process the count is taken out of the customized info before 0.5.23
    accumulates it into `meta_info` (it is not user output), kept on the request's state,
    and `spec_num_proposed_drafts` / `spec_accept_rate` are computed from it when the
    request finishes.

Not with `SGLANG_RUST_SERVER` (its egress refuses extra output fields): there the
per-request rate stays relative to the largest width, with a warning at start-up. At a
fixed width (b16, b8, the Transformers window) 0.5.23's rate is already exact and nothing
here runs.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# the customized-info key, the attribute on a scheduler `Req` and on a tokenizer `ReqState`
KEY = "sglang_domino_proposed_drafts"


def count_proposals(reqs, width: int) -> None:
    """One adaptive step at `width` verified W - 1 proposals of each request 0.5.23 counts
    a verify for (`batch_result_processor.py` skips retracted and finished requests)."""
    proposed = int(width) - 1
    for req in reqs:
        if req.is_retracted or req.finished():
            continue
        setattr(req, KEY, getattr(req, KEY, 0) + proposed)


_STREAMERS: dict = {}


def proposal_streamer(base: type) -> type:
    """`base` (0.5.23's `SchedulerOutputStreamer` or a subclass) that adds each request's
    proposal count to its outputs."""
    if base not in _STREAMERS:
        class ProposalCountStreamer(base):
            has_additional_customized_info = True

            def build_additional_customized_info(self, reqs):
                info = dict(super().build_additional_customized_info(reqs))
                info[KEY] = [[getattr(req, KEY, 0)] for req in reqs]
                return info

        _STREAMERS[base] = ProposalCountStreamer
    return _STREAMERS[base]


def around_get_output_streamer_class(original, self):
    base = original(self)
    if getattr(self, "rust_server", None) is not None:
        logger.warning("sglang-domino adaptive verify: with SGLANG_RUST_SERVER the per-request "
                       "meta_info.spec_accept_rate stays relative to the largest width (the Rust egress "
                       "takes no extra output fields); the log and Prometheus rates are exact")
        return base
    return proposal_streamer(base)


def around_update_request_meta_info(original, self, meta_info, state, customized_info, index, finish_reason):
    """The count is kept on the request's state, not accumulated into `meta_info`."""
    if KEY not in customized_info:
        return original(self, meta_info, state, customized_info, index, finish_reason)
    values = customized_info[KEY][index]
    if values:
        setattr(state, KEY, values[-1])   # a running total: the last value is the current one
    rest = {k: v for k, v in customized_info.items() if k != KEY}
    return original(self, meta_info, state, rest, index, finish_reason)


def around_calculate_spec_decoding_metrics(original, self, meta_info, recv_obj, i):
    """0.5.23's per-request metrics, then the accept rate over the proposals the request's
    steps really verified."""
    original(self, meta_info, recv_obj, i)
    if "spec_num_proposed_drafts" not in meta_info:
        return
    state = self.rid_to_state.get(recv_obj.rids[i])
    proposed = getattr(state, KEY, None)
    if proposed is None:
        return
    meta_info["spec_num_proposed_drafts"] = proposed
    if proposed > 0:
        meta_info["spec_accept_rate"] = meta_info["spec_num_correct_drafts"] / proposed
    else:   # every step verified the bonus token alone (width 1): nothing was proposed
        meta_info.pop("spec_accept_rate", None)


__all__ = ["KEY", "around_calculate_spec_decoding_metrics", "around_get_output_streamer_class",
           "around_update_request_meta_info", "count_proposals", "proposal_streamer"]
