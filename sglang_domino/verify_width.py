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
never measured is probed sooner), so acceptance
beyond the chosen width and the cost of the next narrower one keep being measured, and
the choice walks to a better width one neighbour at a time without a costly sweep of
every width on a loaded server.

`FixedWidth` is the same interface for the fixed cases (the draft block, b8, the
Transformers window).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_WIDTHS = (16, 8, 4, 2, 1)


class AdaptiveWidthConfig(BaseModel):
    """Settings of `--speculative-adaptive` for DFLASH (JSON in `--speculative-adaptive-config`)."""

    model_config = ConfigDict(extra="forbid")

    widths: list[int] = Field(default_factory=lambda: list(DEFAULT_WIDTHS))
    prior_accept: float = Field(0.7, gt=0.0, lt=1.0)
    prior_weight: float = Field(4.0, ge=0.0)
    request_decay: float = Field(0.9, gt=0.0, le=1.0)
    server_decay: float = Field(0.99, gt=0.0, le=1.0)
    cost_ema: float = Field(0.3, gt=0.0, le=1.0)
    probe_every: int = Field(32, ge=0)
    probe_until: float = Field(16.0, ge=0.0)
    log_every_steps: int = Field(200, ge=1)

    @field_validator("widths")
    @classmethod
    def _widths(cls, widths: list[int]) -> list[int]:
        if not widths or min(widths) < 1:
            raise ValueError(f"expected verify widths >= 1, got {widths}")
        return sorted(set(int(w) for w in widths), reverse=True)

    def for_window(self, window: int) -> "AdaptiveWidthConfig":
        """The widths a server whose verify window (largest width) is `window` can use."""
        usable = [w for w in self.widths if w <= window]
        if window not in usable:
            usable.insert(0, window)
        return self.model_copy(update={"widths": usable})

    @classmethod
    def load(cls, path: Optional[str]) -> "AdaptiveWidthConfig":
        """`--speculative-adaptive-config` (None: the defaults); errors name the file and field."""
        if not path:
            return cls()
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"--speculative-adaptive-config {path}: cannot read a JSON object ({err})") from None
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
                                 for e in err.errors())
            raise ValueError(f"--speculative-adaptive-config {path} (DFLASH verify widths): {problems}; "
                             f"fields: {', '.join(cls.model_fields)}") from None


@dataclass
class _Counts:
    """Decayed per-position counts: tried[k] (position k + 1 was verified after k accepted
    proposals) and accepted[k]."""

    tried: list[float]
    accepted: list[float]

    @classmethod
    def empty(cls, positions: int) -> "_Counts":
        return cls([0.0] * positions, [0.0] * positions)

    def add(self, width: int, accepted: int, decay: float) -> None:
        if width <= 1:  # nothing was proposed
            return
        for k in range(len(self.tried)):
            self.tried[k] *= decay
            self.accepted[k] *= decay
        for k in range(min(accepted + 1, width - 1, len(self.tried))):
            self.tried[k] += 1.0
            if k < accepted:
                self.accepted[k] += 1.0


class AcceptanceStats:
    """Per-request and server-wide per-position acceptance, from verify results."""

    def __init__(self, max_width: int, cfg: AdaptiveWidthConfig):
        self.positions = max(int(max_width) - 1, 0)
        self.cfg = cfg
        self.server = _Counts.empty(self.positions)
        self.requests: dict[str, _Counts] = {}
        self.last_seen: dict[str, int] = {}
        self.steps = 0

    def observe(self, rid: str, width: int, accepted: int) -> None:
        """One verify of `rid` at `width` that accepted `accepted` proposals (bonus excluded)."""
        counts = self.requests.setdefault(rid, _Counts.empty(self.positions))
        counts.add(width, accepted, self.cfg.request_decay)
        self.server.add(width, accepted, self.cfg.server_decay)
        self.last_seen[rid] = self.steps

    def end_step(self, horizon: int = 64) -> None:
        """Count a step; every `horizon` steps drop requests unseen for `horizon` steps
        (finished or aborted: the worker is not told)."""
        self.steps += 1
        if self.steps % horizon == 0:
            for rid in [r for r, seen in self.last_seen.items() if self.steps - seen > horizon]:
                del self.requests[rid], self.last_seen[rid]

    def server_rates(self) -> list[float]:
        """Per-position rates over all requests. Each position's prior (one pseudo-count) is
        the rate of the position before it, `prior_accept` for the first: a position no
        verify has reached yet (the server ran narrower) is expected to accept like the
        last one measured, so wider widths keep a fair estimate and get tried again."""
        out, prior = [], self.cfg.prior_accept
        for t, a in zip(self.server.tried, self.server.accepted):
            prior = (a + prior) / (t + 1.0)
            out.append(prior)
        return out

    def survival(self, rid: Optional[str], server_rates: Optional[list[float]] = None) -> list[float]:
        """S(k) for k = 1 .. max_width - 1: P(the first k proposals are all accepted)."""
        rates = server_rates if server_rates is not None else self.server_rates()
        own = self.requests.get(rid) if rid is not None else None
        weight = self.cfg.prior_weight
        out, s = [], 1.0
        for k, base in enumerate(rates):
            if own is not None and own.tried[k] + weight > 0:
                base = (own.accepted[k] + weight * base) / (own.tried[k] + weight)
            s *= base
            out.append(s)
        return out


class StepCosts:
    """Seconds per decode step by (batch size, width): a running mean per measured cell,
    an EMA once it has 1/ema samples. An
    unmeasured cell is predicted from the nearest batch size where its width was
    measured, scaled by the ratio of a width measured at both batch sizes (the width
    running now always is): widths are compared at one batch size, and what carries over
    between neighbouring batch sizes is how their costs relate. With no width measured at
    this batch size yet, the nearest batch size's cost is taken as it is. A width never
    measured is unknown (None): `choose_width` prices it from measured neighbours."""

    def __init__(self, ema: float):
        self.ema = float(ema)
        self.cells: dict[int, dict[int, float]] = {}   # width -> {bs: seconds}
        self.samples: dict[tuple[int, int], int] = {}

    def observe(self, bs: int, width: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        row = self.cells.setdefault(int(width), {})
        key = (int(bs), int(width))
        n = self.samples[key] = self.samples.get(key, 0) + 1
        old = row.get(int(bs))
        # the mean of the first 1/ema samples, an EMA after: a rarely run cell (a probe) is
        # not set by one noisy step
        row[int(bs)] = seconds if old is None else old + max(self.ema, 1.0 / n) * (seconds - old)

    def predict(self, bs: int, width: int) -> Optional[float]:
        row = self.cells.get(int(width))
        if not row:
            return None
        if bs in row:
            return row[bs]
        here = {w: r[bs] for w, r in self.cells.items() if bs in r}
        best = None
        for other in sorted(row, key=lambda b: (abs(b - bs), b)):
            refs = [w for w in here if other in self.cells[w]]
            if refs:
                ref = max(refs)
                best = here[ref] * row[other] / self.cells[ref][other]
                break
        if best is None:
            best = row[min(row, key=lambda b: (abs(b - bs), b))]
        return best


def choose_width(widths: Sequence[int], survivals: Sequence[Sequence[float]],
                 cost: "callable") -> tuple[int, dict[int, float]]:
    """The width maximising expected committed tokens per second for one batch.

    `survivals[r][k - 1]` is request r's S(k); `cost(w)` the predicted seconds of the step
    at width w, or None when w was never measured. An unmeasured width next to a measured
    one is priced by `_extrapolate`; one further away is not a candidate; with nothing
    measured the widest width is returned. Returns (width, {width: expected tokens/s})."""
    known = {w: c for w in widths if (c := cost(w)) is not None}
    if not known:
        return max(widths), {}
    order = sorted(widths)
    # expected tokens at width w: one per request plus the batch's S(1) + ... + S(w - 1)
    cumulative = [0.0]
    for k in range(max(widths) - 1):
        cumulative.append(cumulative[-1] + sum(s[k] for s in survivals if k < len(s)))
    scores = {}
    for i, w in enumerate(order):
        price = known.get(w)
        if price is None:
            # only a neighbour of a measured width: a price extrapolated over several
            # halvings from two noisy steps would send the policy across the range
            if not any(n in known for n in order[max(i - 1, 0): i + 2]):
                continue
            price = _extrapolate(known, w)
        scores[w] = (len(survivals) + cumulative[w - 1]) / price
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


@dataclass
class FixedWidth:
    """Verify `width` positions every step (the draft block, b8's 8, the Transformers window)."""

    width: int

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.width,)

    def choose(self, rids: Sequence[str]) -> int:
        return self.width

    def observe_step(self, rids, width, accepted) -> None:
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

    def __post_init__(self):
        self.stats = AcceptanceStats(max(self.cfg.widths), self.cfg)
        self.costs = StepCosts(self.cfg.cost_ema)
        self.histogram = {w: 0 for w in self.cfg.widths}

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
        rates = self.stats.server_rates()
        survivals = [self.stats.survival(r, rates) for r in rids]
        width, self.last_scores = choose_width(self.widths, survivals, lambda w: self.costs.predict(bs, w))
        self.steps += 1
        probe = self._probe(width, bs)
        width = probe if probe is not None else width
        self.histogram[width] += 1
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
            return wider
        # a narrower neighbour never measured at all: its cost four times as often
        if narrower is not None and narrower not in self.costs.cells:
            return narrower if self.steps % max(every // 4, 1) == 0 else None
        # back off while probes confirm the choice (twice the interval each time, up to 8 x
        # `probe_every`); a new choice or a batch size twice or half the last one resets it
        if width != self.settled[0] or not 0.5 < bs / self.settled[1] < 2.0:
            self.settled, self.interval, self.next_probe = (width, bs), every, self.steps + every
        if self.steps < self.next_probe:
            return None
        self.next_probe = self.steps + self.interval
        self.interval = min(2 * self.interval, 8 * every)
        self.probes += 1  # wider and narrower in turn
        if wider is not None and (self.probes % 2 or narrower is None):
            return wider
        return narrower

    def observe_step(self, rids: Sequence[str], width: int, accepted: Sequence[int]) -> None:
        """The proposals each request of a step at `width` had accepted (bonus excluded)."""
        for rid, a in zip(rids, accepted):
            self.stats.observe(rid, width, int(a))
        self.stats.end_step()

    def observe_cost(self, bs: int, width: int, seconds: float) -> None:
        self.costs.observe(bs, width, seconds)

    def describe(self) -> str:
        steps = sum(self.histogram.values())
        hist = ", ".join(f"{w}: {n}" for w, n in sorted(self.histogram.items(), reverse=True))
        return f"{steps} decode steps by verify width {{{hist}}}"
