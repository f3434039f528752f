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

Ties go to the narrower width (same throughput for less work); a width whose cost at
this batch size cannot be predicted yet is tried first (widest first), which is how the
table fills on a fresh server.

`FixedWidth` is the same interface for the fixed cases (the draft block, b8, the
Transformers window).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

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
        prior = self.cfg.prior_accept
        return [(a + prior) / (t + 1.0) for t, a in zip(self.server.tried, self.server.accepted)]

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
    """Seconds per decode step by (batch size, width): an EMA per measured cell, and for an
    unmeasured batch size a straight line through the two nearest measured batch sizes
    of the same width (never below zero). A width measured at one batch size only is
    predicted there alone, so it is tried at a second one before it is extrapolated."""

    def __init__(self, ema: float):
        self.ema = float(ema)
        self.cells: dict[int, dict[int, float]] = {}   # width -> {bs: seconds}
        self.samples: dict[tuple[int, int], int] = {}

    def observe(self, bs: int, width: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        row = self.cells.setdefault(int(width), {})
        old = row.get(int(bs))
        row[int(bs)] = seconds if old is None else old + self.ema * (seconds - old)
        self.samples[(int(bs), int(width))] = self.samples.get((int(bs), int(width)), 0) + 1

    def predict(self, bs: int, width: int) -> Optional[float]:
        row = self.cells.get(int(width))
        if not row:
            return None
        if bs in row:
            return row[bs]
        sizes = sorted(row)
        if len(sizes) < 2:
            return None
        i = bisect.bisect_left(sizes, bs)
        lo, hi = (sizes[0], sizes[1]) if i == 0 else (sizes[-2], sizes[-1]) if i >= len(sizes) else (sizes[i - 1], sizes[i])
        slope = (row[hi] - row[lo]) / (hi - lo)
        return max(row[lo] + slope * (bs - lo), min(row.values()) * 0.5)


class WidthPolicy(Protocol):
    widths: Sequence[int]

    def choose(self, rids: Sequence[str]) -> int: ...

    def observe_step(self, rids: Sequence[str], width: int, accepted: Sequence[int]) -> None: ...

    def observe_cost(self, bs: int, width: int, seconds: float) -> None: ...


def choose_width(widths: Sequence[int], survivals: Sequence[Sequence[float]],
                 cost: "callable") -> tuple[int, dict[int, float]]:
    """The width maximising expected committed tokens per second for one batch.

    `survivals[r][k - 1]` is request r's S(k); `cost(w)` the predicted seconds of the step
    at width w, or None when unknown. Returns (width, {width: expected tokens/s}); a width
    of unknown cost is returned first (the widest), with an empty score table."""
    unknown = [w for w in widths if cost(w) is None]
    if unknown:
        return max(unknown), {}
    scores = {}
    for w in widths:
        tokens = sum(1.0 + sum(s[: w - 1]) for s in survivals)
        scores[w] = tokens / cost(w)
    best = max(scores.values())
    # ties (within float noise) go to the narrowest width
    width = min(w for w, v in scores.items() if v >= best * (1.0 - 1e-9))
    return width, scores


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

    def __post_init__(self):
        self.stats = AcceptanceStats(max(self.cfg.widths), self.cfg)
        self.costs = StepCosts(self.cfg.cost_ema)
        self.histogram = {w: 0 for w in self.cfg.widths}

    @property
    def widths(self) -> list[int]:
        return self.cfg.widths

    def choose(self, rids: Sequence[str]) -> int:
        bs = len(rids)
        rates = self.stats.server_rates()
        survivals = [self.stats.survival(r, rates) for r in rids]
        width, self.last_scores = choose_width(self.widths, survivals, lambda w: self.costs.predict(bs, w))
        self.histogram[width] += 1
        return width

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
