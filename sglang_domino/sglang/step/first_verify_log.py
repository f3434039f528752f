"""The target worker's first verify, logged: what the target computed per request (for
operators, and for the end-to-end tests of b8). An instance patch of one worker (row
`first_verify_log` of `seam/patches.py`)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class FirstVerifyLog:
    """Stands in for the target worker's `forward_batch_generation` on one
    `DominoDFlashWorker`: logs the width of the first verify (what the target computed per
    request, for operators and for the end-to-end tests of b8). It changes nothing: a
    verify narrower than the width the target's decode graphs were captured at runs
    eagerly by 0.5.23's own width check (`DecodeCudaGraphRunner.can_run`), decided in
    `prepare_for_verify` before this call. (`forward_batch.can_run_decode_cuda_graph`,
    which an earlier version cleared here, is read only under DP attention, and clearing
    it on a batch already loaded for replay would run it eagerly on stale metadata.)"""

    def __init__(self, worker):
        self.worker = worker
        self.target = worker._target_worker
        self.forward = self.target.forward_batch_generation
        self.logged = False

    def install(self) -> "FirstVerifyLog":
        self.target.forward_batch_generation = self
        return self

    def __call__(self, *args, **kwargs):
        forward_batch = kwargs.get("forward_batch")
        if kwargs.get("is_verify") and forward_batch is not None and int(forward_batch.batch_size) > 0:
            if not self.logged:
                self.logged = True
                logger.info("sglang-domino first verify: the target computed %d tokens for %d request(s)",
                            int(forward_batch.input_ids.numel()), int(forward_batch.batch_size))
        return self.forward(*args, **kwargs)
