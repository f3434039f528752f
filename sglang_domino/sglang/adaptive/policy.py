"""The policy: the width maximising expected committed tokens per second (`choose_width`),
its calibration, and the fixed and adaptive width objects the worker holds."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .acceptance import AcceptanceStats
from .costs import StepCosts
from .settings import AdaptiveWidthConfig


def choose_width(widths: Sequence[int], survivals: "Sequence[Sequence[float]] | np.ndarray",
                 cost: "callable", scale: Optional[dict[int, float]] = None) -> tuple[int, dict[int, float]]:
    """The width maximising expected committed tokens per second for one batch.

    `survivals[r][k - 1]` is request r's S(k), one row per request (a list of lists or a
    2-D array); `cost(w)` the predicted seconds of the step
    at width w, or None when w was never measured; `scale[w]` (1 where absent) multiplies
    width w's expected tokens past the bonus (`Calibration`). An unmeasured width next to a measured
    one is priced by `_extrapolate`; one further away is not a candidate; with nothing
    measured the widest width is returned. Returns (width, {width: expected tokens/s})."""
    known = {w: c for w in widths if (c := cost(w)) is not None}
    if not known:
        return max(widths), {}
    order = sorted(widths)
    rows = np.asarray(survivals, dtype=float)
    bs = len(rows)
    # expected tokens at width w: one per request plus the batch's S(1) + ... + S(w - 1)
    per_position = np.zeros(max(widths) - 1)
    if rows.ndim == 2:
        summed = rows.sum(axis=0)[: per_position.size]
        per_position[: summed.size] = summed
    cumulative = [0.0] + np.cumsum(per_position).tolist()
    scores = {}
    for i, w in enumerate(order):
        price = known.get(w)
        if price is None:
            # only a neighbour of a measured width: a price extrapolated over several
            # halvings from two noisy steps would send the policy across the range
            if not any(n in known for n in order[max(i - 1, 0): i + 2]):
                continue
            price = _extrapolate(known, w)
        scores[w] = (bs + (scale or {}).get(w, 1.0) * cumulative[w - 1]) / price
    best = max(scores.values())
    # ties (within float noise) go to the narrowest width
    width = min(w for w, v in scores.items() if v >= best * (1.0 - 1e-9))
    return width, scores


def _extrapolate(known: dict[int, float], width: int) -> float:
    """The cost of an unmeasured width from the two measured widths nearest it: the same
    ratio per halving of the width (log cost linear in log width), never cheaper than
    the nearest measured width when wider nor dearer when narrower; with one measured
    width, its cost."""
    nearest = sorted(known, key=lambda k: (abs(math.log2(k / width)), k))[:2]
    if len(nearest) < 2 or nearest[0] == nearest[1]:
        return known[nearest[0]]
    (a, ca), (b, cb) = ((w, known[w]) for w in nearest)
    slope = (math.log(cb) - math.log(ca)) / (math.log2(b) - math.log2(a))
    guess = ca * math.exp(slope * (math.log2(width) - math.log2(a)))
    return max(guess, ca) if width > a else min(guess, ca)


class Calibration:
    """Per width, what its scored steps got past the bonus over what the policy expected,
    shrunk towards 1 by `PRIOR` request-steps at the expected rate; sums decayed by `decay`
    per scored step of the width, the factor bounded to [0.5, 1]. Only downwards: a narrow
    width runs (chosen or probed) for requests whose estimates are low and gets more than
    expected, and scaled up on a few such steps (1.5 on 14 steps of width 4 in a served
    greedy run) it took steps from width 16 where width 16 wins."""

    PRIOR = 16.0

    def __init__(self, decay: float):
        self.decay = float(decay)
        self.sums: dict[int, list[float]] = {}   # width -> [request-steps, expected extra, got extra]

    def observe(self, width: int, expected: float, accepted: Sequence[int]) -> None:
        n = len(accepted)
        if not n:
            return
        s = self.sums.setdefault(int(width), [0.0, 0.0, 0.0])
        s[0] = s[0] * self.decay + n
        s[1] = s[1] * self.decay + (float(expected) - 1.0) * n
        s[2] = s[2] * self.decay + float(sum(accepted))

    def factor(self, width: int) -> float:
        s = self.sums.get(int(width))
        if s is None or s[1] <= 0.0:
            return 1.0
        prior = self.PRIOR * s[1] / s[0]   # PRIOR request-steps of expected extra tokens
        return min(max((s[2] + prior) / (s[1] + prior), 0.5), 1.0)

    def factors(self) -> dict[int, float]:
        return {w: self.factor(w) for w in self.sums}


@dataclass
class FixedWidth:
    """Verify `width` positions every step (the draft block, b8's 8, the Transformers window)."""

    width: int

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.width,)

    def choose(self, rids: Sequence[str]) -> int:
        return self.width

    def observe_step(self, rids, width, accepted, expected=None) -> None:
        return None

    def observe_cost(self, bs, width, seconds) -> None:
        return None


@dataclass
class AdaptiveWidth:
    """`choose_width` over `AcceptanceStats` and `StepCosts`, with a width histogram."""

    cfg: AdaptiveWidthConfig
    stats: AcceptanceStats = field(init=False)
    costs: StepCosts = field(init=False)
    histogram: dict[int, int] = field(init=False)
    last_scores: dict[int, float] = field(init=False, default_factory=dict)
    steps: int = field(init=False, default=0)
    probes: int = field(init=False, default=0)
    settled: tuple[int, int] = field(init=False, default=(0, 1))   # (choice, batch size) probes confirm
    interval: int = field(init=False, default=0)
    next_probe: int = field(init=False, default=0)
    repeat: tuple[int, int, int] = field(init=False, default=(0, 0, 0))   # (width, batch size, steps left)
    debt: float = field(init=False, default=0.0)   # seconds probes lost, not yet earned back
    # expected tokens per request of the width `choose` returned (None: not scored, the
    # width is still being timed); against what steps got: `tally`
    last_expected: Optional[float] = field(init=False, default=None)
    tallies: dict[int, list[float]] = field(init=False, default_factory=dict)
    calibration: Calibration = field(init=False)
    _trace: Optional[object] = field(init=False, default=None, repr=False)   # `cfg.trace`'s file, once open

    def __post_init__(self):
        self.stats = AcceptanceStats(max(self.cfg.widths), self.cfg)
        self.costs = StepCosts(self.cfg.cost_ema, self.cfg.track_speed)
        self.histogram = {w: 0 for w in self.cfg.widths}
        self.calibration = Calibration(self.cfg.calibration_decay)

    @property
    def widths(self) -> list[int]:
        return self.cfg.widths

    def choose(self, rids: Sequence[str]) -> int:
        """The width for this batch; after `probe_every` steps a neighbouring one instead,
        wider and narrower in turn, then at doubling intervals while the choice holds (every
        step the wider one while the first position has fewer than `probe_until`
        measurements): a narrower width never sees the positions
        beyond it, and width 1 sees none, so without a probe a pessimistic estimate (e.g.
        from a warm-up request the draft cannot predict) would never be corrected; nor
        would the cost of a width not run at this batch size."""
        bs = len(rids)
        self.steps += 1
        if self.cfg.pin is not None:
            width = self.cfg.pin[(self.steps - 1) % len(self.cfg.pin)]
            self.histogram[width] += 1
            self.last_expected = self._expected(self.stats.survivals(rids), width, bs)
            return width
        repeat = self._repeat(bs)
        self.last_expected = None
        if repeat is not None:   # no scoring: the width is still being timed
            width = repeat
        else:
            survivals = self.stats.survivals(rids)
            scale = self.calibration.factors() if self.cfg.calibrate else None
            width, self.last_scores = choose_width(self.widths, survivals, lambda w: self.costs.predict(bs, w), scale)
            self._earn(bs, width)
            probe = self._probe(width, bs)
            width = probe if probe is not None else width
            self.last_expected = self._expected(survivals, width, bs)
            # a width whose price at this batch size is not settled (`StepCosts.missing`)
            # keeps running until it is: a probe (or a choice priced from a neighbour)
            # timed once, on a stalled step, would otherwise keep that price until the
            # next probe, hundreds of steps later once probes have backed off
            self.repeat = (width, bs, max(self.costs.missing(bs, width) - 1, 0))
        self.histogram[width] += 1
        return width

    @staticmethod
    def _expected(survivals, width: int, bs: int) -> Optional[float]:
        """Expected tokens per request at `width`: 1 + the batch's mean S(1) + ... + S(w - 1)."""
        if not bs:
            return None
        return 1.0 + float(np.asarray(survivals)[:, : width - 1].sum()) / bs

    def _repeat(self, bs: int) -> Optional[int]:
        """The width still being timed at this batch size (see `choose`), if any."""
        width, at, left = self.repeat
        if not left or at != bs:
            self.repeat = (0, 0, 0)
            return None
        self.repeat = (width, at, left - 1)
        return width

    def _probe(self, width: int, bs: int) -> Optional[int]:
        every = self.cfg.probe_every
        if not every:
            return None
        wider = min((w for w in self.widths if w > width), default=None)
        narrower = max((w for w in self.widths if w < width), default=None)
        # a fresh server's acceptance is a few requests' worth (`probe_until` measurements
        # of the first proposal, decayed): measure one position further every step
        if wider is not None and self.stats.positions and self.stats.server.tried[0] < self.cfg.probe_until:
            return self._afford(wider, width, bs)
        # width 1 never timed near this batch size (within a factor of 2): it skips the
        # draft, so its cost is not on the curve of the other widths, at this batch size
        # (priced from them, it reads about as dear as width 2, and a walk down one
        # neighbour at a time stalls wherever noisy timings make a narrower width look
        # dearer) nor across batch sizes (a drafting width's cost grows with bs x width,
        # width 1's with bs: carried over from batch 1 to 16 by width 16's ratio it read
        # several times too dear, benchmarks/results/adaptive-decode-step-bf16): timed
        # early, like an unmeasured neighbour
        if width != 1 and 1 in self.widths and not self.costs.timed_near(bs, 1):
            return self._afford(1, width, bs) if self.steps % max(every // 4, 1) == 0 else None
        # a narrower neighbour never measured at all: its cost four times as often
        if narrower is not None and narrower not in self.costs.cells:
            return self._afford(narrower, width, bs) if self.steps % max(every // 4, 1) == 0 else None
        # back off while probes confirm the choice (twice the interval each time, up to 8 x
        # `probe_every`); a new choice or a batch size twice or half the last one resets it
        if width != self.settled[0] or not 0.5 < bs / self.settled[1] < 2.0:
            self.settled, self.interval, self.next_probe = (width, bs), every, self.steps + every
        if self.steps < self.next_probe:
            return None
        # wider and narrower in turn; a probe it cannot afford yet stays due
        probe = wider if wider is not None and ((self.probes + 1) % 2 or narrower is None) else narrower
        if probe is None or self._afford(probe, width, bs) is None:
            return None
        self.next_probe = self.steps + self.interval
        self.interval = min(2 * self.interval, 8 * every)
        self.probes += 1
        return probe

    def _earn(self, bs: int, width: int) -> None:
        """Each scored step earns back `probe_budget` x the chosen width's price of the
        time probes lost (see `_afford`)."""
        if self.debt > 0.0:
            price = self.costs.predict(bs, width)
            self.debt = max(self.debt - self.cfg.probe_budget * (price or 0.0), 0.0)

    def _afford(self, probe: int, width: int, bs: int) -> Optional[int]:
        """`probe` if the time probes lost is earned back, else None (it waits).

        A probe's loss is its expected tokens/s short of the choice's over its steps (it
        runs until its price at this batch size is settled): price x (1 - its score / the
        choice's). Where a plain decode step beats every drafting width, as bfloat16 at
        batch 16 on a CPU without AVX-512, a probe of width 2 costs 3.5 x a width-1 step
        and brings 0.56 of its tokens/s, and the doubling intervals alone kept probing
        every time the batch halved. A probe of an unpriced or unscored width is free
        (the policy knows nothing to weigh it by), and so is one as good as the choice;
        what is owed is capped at the longest interval between probes (8 x `probe_every`
        steps of the choice), so no probe waits longer than probes back off to anyway."""
        budget = self.cfg.probe_budget
        ours, theirs = self.last_scores.get(width), self.last_scores.get(probe)
        price = self.costs.predict(bs, probe)
        if not budget or not ours or theirs is None or price is None or theirs >= ours:
            return probe
        if self.debt > 0.0:
            return None
        runs = max(self.costs.missing(bs, probe), 1)
        cap = budget * 8 * self.cfg.probe_every * (self.costs.predict(bs, width) or price)
        self.debt = min(price * (1.0 - theirs / ours) * runs, cap)
        return probe

    def observe_step(self, rids: Sequence[str], width: int, accepted: Sequence[int],
                     expected: Optional[float] = None) -> None:
        """The proposals each request of a step at `width` had accepted (bonus excluded);
        `expected`: `last_expected` when the step was chosen (None: not scored), tallied
        for a step that verified proposals (width > 1)."""
        self.stats.observe_batch(rids, width, accepted)
        self.stats.end_step()
        if expected is not None and width > 1:
            self.tally(width, expected, accepted)
        if self.cfg.trace:
            self._record(rids, width, accepted)

    def _record(self, rids, width, accepted) -> None:
        """One line of `trace` (see `AdaptiveWidthConfig.trace`)."""
        if self._trace is None:
            os.makedirs(self.cfg.trace, exist_ok=True)
            self._trace = open(os.path.join(self.cfg.trace, f"accept-{os.getpid()}.jsonl"), "a",
                               encoding="utf-8", buffering=1)
        self._trace.write(json.dumps({"rids": [str(r) for r in rids], "width": int(width),
                                      "accepted": [int(a) for a in accepted]}) + "\n")

    def observe_cost(self, bs: int, width: int, seconds: float) -> None:
        self.costs.observe(bs, width, seconds)

    def tally(self, width: int, expected: float, accepted: Sequence[int]) -> None:
        """A scored step's expected tokens per request (`last_expected` when it was chosen)
        against what its requests got (`accepted` proposals each, plus the bonus), summed
        over request-steps as a client counts tokens per verify step (a request the step
        overran, finished in the step before under overlap scheduling, counts here and not
        there): what `describe` reports, to tell a biased acceptance estimate from a biased
        price; and what `calibration` learns."""
        self.calibration.observe(width, expected, accepted)
        n = len(accepted)
        t = self.tallies.setdefault(int(width), [0.0, 0.0, 0.0])   # request-steps, expected, got
        t[0] += n
        t[1] += float(expected) * n
        t[2] += n + sum(accepted)

    def describe(self) -> str:
        steps = sum(self.histogram.values())
        hist = ", ".join(f"{w}: {n}" for w, n in sorted(self.histogram.items(), reverse=True))
        text = f"{steps} decode steps by verify width {{{hist}}}"
        if self.tallies:
            got = ", ".join(f"{w}: {e / n:.2f} / {r / n:.2f}" for w, (n, e, r) in sorted(self.tallies.items(), reverse=True))
            text += f"; tokens per request and step by width, expected / got, over scored steps {{{got}}}"
        if self.cfg.calibrate and self.calibration.sums:
            scale = ", ".join(f"{w}: {f:.2f}" for w, f in sorted(self.calibration.factors().items(), reverse=True))
            text += f"; calibration of the expected extra tokens {{{scale}}}"
        return text
