"""How wide to verify at each decode step: the adaptive width policy (pure; no sglang).

A speculative step drafts a block and the target verifies its first W positions (the
bonus token and W - 1 proposals). Wider verification commits more tokens per step and
costs more target compute; under load the target's cost grows with batch x width while
acceptance does not. `AdaptiveWidth` picks, for the whole batch, the width W of the
configured set that maximises expected committed tokens per second:

    W* = argmax_W  sum_r E_r(W) / cost(bs, W),   E_r(W) = 1 + sum_{k < W} S_r(k)

where S_r(k) is request r's probability of accepting its first k proposals (the product
of per-position acceptance rates, counted from the request's own verify results and
shrunk towards the server-wide rates, so a new request starts at the server's rates) and
cost(bs, W) is the measured seconds of a decode step at that batch size and width
(`StepCosts`, learnt online on the running machine; never a built-in constant). Width 1
verifies the bonus token alone: a plain decode step that skips the draft.

Ties go to the narrower width (same throughput for less work). A fresh server starts at
the widest width; after `probe_every` steps one step verifies a neighbouring width instead
(wider and narrower in turn, at doubling intervals while the choice holds; a neighbour
never measured is probed sooner, and so is width 1 at a batch size far from any it was
timed at), so acceptance
beyond the chosen width and the cost of the next narrower one keep being measured, and
the choice walks to a better width one neighbour at a time without a costly sweep of
every width on a loaded server.

`FixedWidth` is the same interface for the fixed cases (the draft block, b8, the
Transformers window).

The policy runs on the scheduler's host thread every decode step, so its own cost is kept
small at large batch: per-request counts are rows of two numpy arrays, and a step's
requests are read (`choose`) and updated (`observe_step`) as one block of rows
(`benchmarks/policy_cost.py` measures it).

The package's modules, one concern each: `settings` (the validated configuration),
`acceptance` (the acceptance estimate), `costs` (the measured step costs) and `policy`
(the choice of width, and the objects the worker holds).
"""

from .acceptance import AcceptanceStats
from .costs import StepCosts
from .policy import AdaptiveWidth, Calibration, FixedWidth, choose_width
from .settings import DEFAULT_WIDTHS, AdaptiveWidthConfig

__all__ = ["DEFAULT_WIDTHS", "AcceptanceStats", "AdaptiveWidth", "AdaptiveWidthConfig", "Calibration", "FixedWidth",
           "StepCosts", "choose_width"]
