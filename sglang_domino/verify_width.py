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
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_WIDTHS = (16, 8, 4, 2, 1)


class AdaptiveWidthConfig(BaseModel):
    """Settings of `--speculative-adaptive` for DFLASH (JSON in `--speculative-adaptive-config`)."""

    model_config = ConfigDict(extra="forbid")

    widths: list[int] = Field(default_factory=lambda: list(DEFAULT_WIDTHS))
    prior_accept: float = Field(0.7, gt=0.0, lt=1.0)
    # 1 since 2026-12-04 (4 before): with `unverified_decay` a request's own counts lead
    # sooner (docs/adaptive-width.md, "Width-1 steps and a request's estimate")
    prior_weight: float = Field(1.0, ge=0.0)
    # a request's counts decay once per step the request is verified in; the server's once
    # per decode step, whatever the batch size (see `AcceptanceStats`)
    request_decay: float = Field(0.9, gt=0.0, le=1.0)
    # a request's counts decay once per width-1 step too, which verifies nothing: while a
    # request runs at width 1 its estimate drifts back to the server's rates, so a low
    # reading is tried again (1.0: it stays until a probe, as before 2026-12-04)
    unverified_decay: float = Field(0.9, gt=0.0, le=1.0)
    server_decay: float = Field(0.99, gt=0.0, le=1.0)
    cost_ema: float = Field(0.3, gt=0.0, le=1.0)
    # the running width's price changes are the machine's speed, which every other
    # width's price follows (`StepCosts`); false: each width keeps its own last price
    track_speed: bool = True
    probe_every: int = Field(32, ge=0)
    probe_until: float = Field(16.0, ge=0.0)
    # the share of the time probes may lose against the choice (`AdaptiveWidth._afford`);
    # 0: probes on schedule whatever they cost
    probe_budget: float = Field(0.02, ge=0.0, lt=1.0)
    log_every_steps: int = Field(200, ge=1)
    # each width's expected extra tokens (past the bonus) scaled down by what its chosen
    # steps got against what was expected (`Calibration`, never up): the policy picks the
    # width whose estimate happens to be high, so the widest width's chosen steps got less
    # than expected (3.38 against 3.78 tokens on a served temperature-1.5 load); its sums
    # decay by `calibration_decay` per scored step of the width. False: the raw estimates
    calibrate: bool = True
    calibration_decay: float = Field(0.99, gt=0.0, le=1.0)
    # width-1 steps write the draft's context when the draft next needs it
    # (`sglang_domino.sglang.draft_context`); False: after every step, as upstream does
    defer_context: bool = True
    # width-1 steps run the target's decode path (`sglang_domino.sglang.decode_step`) where
    # the target runs eagerly on CPU; False: upstream's verify at one token, as before
    decode_step: bool = True
    # for measurements and tests: decode steps at these widths in turn (each one of
    # `widths`); the policy still learns acceptance and costs but does not choose
    pin: Optional[list[int]] = None
    # for measurements: a directory where each scheduler process appends one JSON line per
    # decode step (its requests, width and accepted proposals) to `accept-<pid>.jsonl`,
    # what `benchmarks.policy_replay` replays the policy on
    trace: Optional[str] = None

    @field_validator("widths")
    @classmethod
    def _widths(cls, widths: list[int]) -> list[int]:
        if not widths or min(widths) < 1:
            raise ValueError(f"expected verify widths >= 1, got {widths}")
        return sorted(set(int(w) for w in widths), reverse=True)

    @model_validator(mode="after")
    def _pin_among_widths(self) -> "AdaptiveWidthConfig":
        if self.pin is not None and (not self.pin or not set(self.pin) <= set(self.widths)):
            raise ValueError(f"pin: got {self.pin}, expected a non-empty list of the widths {self.widths}")
        return self

    def for_window(self, window: int) -> "AdaptiveWidthConfig":
        """The widths a server whose verify window (largest width) is `window` can use."""
        usable = [w for w in self.widths if w <= window]
        if window not in usable:
            usable.insert(0, window)
        if self.pin is not None and max(self.pin) > window:
            raise ValueError(f"--speculative-adaptive-config pin: got {self.pin}, expected at most the verify "
                             f"window {window}")
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

    tried: np.ndarray
    accepted: np.ndarray


class _RequestView(Mapping):
    """`AcceptanceStats.requests`: rid -> a copy of that request's counts (the rows move
    when the arrays grow, so a view could go stale)."""

    def __init__(self, stats: "AcceptanceStats"):
        self._stats = stats

    def __getitem__(self, rid: str) -> _Counts:
        row = self._stats.rows[rid]
        return _Counts(self._stats.tried[row].copy(), self._stats.accepted[row].copy())

    def __iter__(self) -> Iterator[str]:
        return iter(self._stats.rows)

    def __len__(self) -> int:
        return len(self._stats.rows)


class AcceptanceStats:
    """Per-request and server-wide per-position acceptance, from verify results.

    A request's counts are one row of `tried` and `accepted` (rows x positions), found by
    `rows[rid]`; a step updates all its requests' rows at once. Each request's counts decay
    by `request_decay` per verify of that request, and by `unverified_decay` per width-1
    step of it (nothing verified; the server's counts do not move). The server's counts decay by
    `server_decay` once per step (one `observe_batch`), then gain the step's sums over its
    requests: a step is the time unit. (Decaying them once per request, as before, made
    the server's memory shrink with the batch: at batch 256, 0.99 ** 256 = 0.08, it was
    shorter than one step.) `observe` is a step of one request."""

    def __init__(self, max_width: int, cfg: AdaptiveWidthConfig):
        self.positions = max(int(max_width) - 1, 0)
        self.cfg = cfg
        self.server = _Counts(np.zeros(self.positions), np.zeros(self.positions))
        self.tried = np.zeros((0, self.positions))
        self.accepted = np.zeros((0, self.positions))
        self.seen = np.zeros(0, dtype=np.int64)    # per row: the step its request was last verified
        self.rows: dict[str, int] = {}
        self.owner: list[Optional[str]] = []      # per row: its request, None when free
        self.free: list[int] = []
        self.steps = 0
        self._k = np.arange(self.positions)

    @property
    def requests(self) -> Mapping:
        """rid -> `_Counts` (copies) of the requests with counts."""
        return _RequestView(self)

    def observe(self, rid: str, width: int, accepted: int) -> None:
        """One verify of `rid` at `width` that accepted `accepted` proposals (bonus excluded)."""
        self.observe_batch([rid], width, [accepted])

    def observe_batch(self, rids: Sequence[str], width: int, accepted: Sequence[int]) -> None:
        """One step's verify at `width`: `accepted[i]` proposals of (distinct) `rids[i]`."""
        rows = self._rows(rids, allocate=True)
        self.seen[rows] = self.steps
        if width <= 1:   # nothing was proposed: the evidence only ages (`unverified_decay`)
            self.tried[rows] *= self.cfg.unverified_decay
            self.accepted[rows] *= self.cfg.unverified_decay
            return
        if not self.positions or not len(rows):
            return
        # position k was verified when the k proposals before it were accepted, and
        # accepted when the request accepted more than k; positions past the width unseen
        acc = np.asarray(accepted, dtype=np.int64)[:, None]
        tried = self._k < np.minimum(acc + 1, width - 1)
        hit = self._k < np.minimum(acc, width - 1)
        self.tried[rows] = self.tried[rows] * self.cfg.request_decay + tried
        self.accepted[rows] = self.accepted[rows] * self.cfg.request_decay + hit
        decay = self.cfg.server_decay
        self.server.tried *= decay
        self.server.tried += tried.sum(axis=0)
        self.server.accepted *= decay
        self.server.accepted += hit.sum(axis=0)

    def end_step(self, horizon: int = 64) -> None:
        """Count a step; every `horizon` steps free the rows of requests unseen for
        `horizon` steps (finished or aborted: the worker is not told) for new requests."""
        self.steps += 1
        if self.steps % horizon or not self.rows:
            return
        live = np.fromiter(self.rows.values(), dtype=np.intp, count=len(self.rows))
        stale = live[self.steps - self.seen[live] > horizon]
        for row in stale.tolist():
            del self.rows[self.owner[row]]
            self.owner[row] = None
        self.tried[stale] = 0.0
        self.accepted[stale] = 0.0
        self.free.extend(stale.tolist())

    def _rows(self, rids: Sequence[str], allocate: bool = False) -> np.ndarray:
        """The rows of `rids`: -1 for a request without counts, or (`allocate`) a new row."""
        get = self.rows.get
        rows = np.fromiter((get(r, -1) for r in rids), dtype=np.intp, count=len(rids))
        if allocate and (rows < 0).any():
            for i in np.flatnonzero(rows < 0).tolist():
                rows[i] = self._new_row(rids[i])
        return rows

    def _new_row(self, rid: str) -> int:
        if not self.free:  # double the arrays; freed rows are reused first
            old = len(self.owner)
            size = max(2 * old, 64)
            pad = ((0, size - old), (0, 0))
            self.tried, self.accepted = np.pad(self.tried, pad), np.pad(self.accepted, pad)
            self.seen = np.pad(self.seen, (0, size - old))
            self.owner.extend([None] * (size - old))
            self.free.extend(range(size - 1, old - 1, -1))
        row = self.free.pop()
        self.rows[rid], self.owner[row] = row, rid
        return row

    def server_rates(self) -> list[float]:
        """Per-position rates over all requests. Each position's prior (one pseudo-count) is
        the rate of the position before it, `prior_accept` for the first: a position no
        verify has reached yet (the server ran narrower) is expected to accept like the
        last one measured, so wider widths keep a fair estimate and get tried again."""
        out, prior = [], self.cfg.prior_accept
        # a recurrence over 15 positions: plain floats are faster than numpy here
        for t, a in zip(self.server.tried.tolist(), self.server.accepted.tolist()):
            prior = (a + prior) / (t + 1.0)
            out.append(prior)
        return out

    def survivals(self, rids: Sequence[Optional[str]], server_rates: Optional[list[float]] = None) -> np.ndarray:
        """S(k) for k = 1 .. max_width - 1 of each request, (len(rids), positions): each
        position's rate is the request's own count shrunk towards the server's rate
        (`prior_weight` pseudo-counts); a request without counts (or None) takes the
        server's rates."""
        rates = np.asarray(server_rates if server_rates is not None else self.server_rates(), dtype=float)
        rows = self._rows(rids)
        own = rows >= 0
        all_own = bool(own.all())   # the usual case: no masking
        if not all_own and not own.any():
            return np.cumprod(np.broadcast_to(rates, (len(rids), self.positions)), axis=1)
        mine = rows if all_own else rows[own]
        tried, accepted = self.tried[mine], self.accepted[mine]
        weight = self.cfg.prior_weight
        if weight > 0:
            mixed = (accepted + weight * rates) / (tried + weight)
        else:  # no prior: a position the request never reached keeps the server's rate
            mixed = np.where(tried > 0, accepted / np.where(tried > 0, tried, 1.0), rates)
        if all_own:
            return np.cumprod(mixed, axis=1)
        base = np.broadcast_to(rates, (len(rids), self.positions)).copy()
        base[own] = mixed
        return np.cumprod(base, axis=1)

    def survival(self, rid: Optional[str], server_rates: Optional[list[float]] = None) -> list[float]:
        """S(k) for k = 1 .. max_width - 1: P(the first k proposals are all accepted)."""
        return self.survivals([rid], server_rates)[0].tolist()


class StepCosts:
    """Seconds per decode step by (batch size, width): per measured cell, the lowest of
    its first `settle` (1/ema, at least 2) timings but the first, then an asymmetric EMA.

    A cell's first timing is set aside (`cold`): the first step of a batch size and width
    makes what no step of that shape needed before, and in bfloat16 on the CPU that is a
    oneDNN kernel per new matrix-product shape (1.5-6.5 ms each the first time on a 2-core
    Intel Xeon with AMX, against 0.4-1.8 after): in a served bfloat16 c8 run first steps
    took 40-170 ms against 10-28 after. Kept as prices (width 16's one timing at batch 3,
    166 ms; width 8's at batch 1 the mean of 99 and 17 ms, a two-timing median) and
    carried over to batch 8, they priced width 16 there at 147 ms and width 8 at 52, and
    kept the policy at width 1 for 500 steps (docs/adaptive-width.md). A cell with only
    its cold timing has no price.

    A step's host time only gains from interference (another process on the core, a
    collection, a page fault), never loses, so a sample below the estimate is news
    (weight 2 x ema) and one above it mostly noise (weight ema / 3, the sample capped at
    1.5 x the estimate): one stalled step moves a cell by 5 % instead of doubling a rarely
    run width's price, and a real rise (longer contexts) is still followed, by up to 5 %
    a step. In a closed-loop
    simulation with one step in ten stalled by 1.5-4 x (tests/test_verify_width.py), the
    policy's tokens/s against the best fixed width rose from 0.94 to 0.99 at batch 8 and
    16 and from 0.98 to 1.00 at batch 1.

    Widths are only ever compared at one batch size. An unmeasured cell at a batch size
    where another width was measured is predicted from the nearest batch size where its
    width was measured, scaled by the ratio of a width measured at both batch sizes (the
    width running now always is): what carries over between batch sizes is how the
    widths' costs relate. A batch size where no width was measured yet is priced as the
    nearest one that was, every width there (as measured or carried over as above), so
    that no width's cost is read at one batch size and another's at a distant one: a step
    at a batch size that only occurs between a finishing request and the next prefill is
    never timed (the prefill breaks the chain), and pricing each width at its own nearest
    batch size compared, on the CPU test bed, the widest width at batch 8 with width 8 at
    batch 1 and chose width 8 at batch 7 every time. A width never measured is unknown
    (None): `choose_width` prices it from measured neighbours.

    The machine's speed drifts (on the shared 2-core test VMs by tens of percent from
    minute to minute, up to 2 x at one batch size and width within a run), and a width
    other than the running one is timed only by a probe, hundreds of steps apart once
    probes back off: a width last timed while the machine was fast would keep a price
    that the running width, timed every step, no longer gets. With `track_speed`, the
    cells of each batch size are kept in units of the machine's speed at that batch size
    (`speeds`), and a timing of the width that also ran the step before (at the same
    batch size, its cell settled) moves that speed instead of its cell: by the ratio its
    price would have moved, so every width at the batch size follows the running one.
    Any other timing (a probe, the first steps after a switch) moves its own cell. One
    speed per batch size, since widths are only compared at one: with one speed for all
    (until 2026-12-05), the running width at batch 12-16 moved every batch size's prices,
    and back at batch 1 only the width that ran there and its probed neighbour were timed
    again; widths 4, 2 and 1 at batch 1 stayed at twice their price for the rest of a
    served bfloat16 run, and width 1 never ran there again. The running width's price is
    then exactly the average above, and nothing feeds back. In the closed-loop simulation
    with the machine's speed changing to 1-2.5 x every few hundred steps, the worst of 6 seeds rose from 0.961 to
    0.988 of the best fixed width at batch 8 and from 0.936 to 0.977 at batch 16. A first
    try, which moved a shared factor by the residual of each timing while the cell kept
    learning too, ran away on the noisy CPU (the asymmetric average sits below the
    typical timing, so the factor only grew: x 35 in 400 steps) and priced a rarely run
    width 3-6 x too dear (benchmarks/results/speed-factor-runaway-fp32)."""

    def __init__(self, ema: float, track_speed: bool = False):
        self.ema = float(ema)
        self.track_speed = bool(track_speed)
        self.speeds: dict[int, float] = {}   # batch size -> seconds per cell unit there now (1 if unset)
        self.last: tuple[int, int] = (0, 0)   # (batch size, width) of the last timing
        # the timings that price a new cell, the cold one included (3 at the default weight 0.3)
        self.settle = max(2, round(1.0 / self.ema))
        self.cells: dict[int, dict[int, float]] = {}   # width -> {bs: seconds at speed 1}
        self.samples: dict[tuple[int, int], int] = {}   # timings taken, the cold one included
        self.first: dict[tuple[int, int], list[float]] = {}   # cells still settling: their warm timings

    def observe(self, bs: int, width: int, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds <= 0:
            return
        key = (int(bs), int(width))
        n = self.samples[key] = self.samples.get(key, 0) + 1
        running, self.last = self.last == key, key
        if n == 1:   # cold (see the class docstring)
            return
        row = self.cells.setdefault(int(width), {})
        speed = self.speeds.get(int(bs), 1.0)
        if n <= self.settle:
            # a new cell: the lowest of its first timings, so that one stalled step among
            # them (another process on the core, a page fault) does not price a width: a
            # step's host time only gains from interference. (Their median, as before
            # 2026-12-05, was their mean when a batch size changed after two.)
            first = self.first.setdefault(key, [])
            first.append(seconds / speed)
            row[int(bs)] = min(first)
            if n == self.settle:
                del self.first[key]
            return
        old = row[int(bs)] * speed
        new = self._moved(old, seconds)
        if running and self.track_speed:
            self.speeds[int(bs)] = speed * new / old
        else:
            row[int(bs)] = new / speed

    def _moved(self, old: float, seconds: float) -> float:
        """A price after one more timing: a timing below it is news (weight 2 x ema), one
        above it mostly noise (weight ema / 3, capped at 1.5 x the price)."""
        if seconds < old:
            return old + min(1.0, 2.0 * self.ema) * (seconds - old)
        return old + self.ema / 3.0 * (min(seconds, 1.5 * old) - old)

    def missing(self, bs: int, width: int) -> int:
        """Timings (bs, width) still takes before its price is settled, the cold one included."""
        return max(self.settle - self.samples.get((int(bs), int(width)), 0), 0)

    def timed_near(self, bs: int, width: int) -> bool:
        """Whether `width` was timed at a batch size within a factor of 2 of `bs`."""
        return any(0.5 < b / bs < 2.0 for b in self.cells.get(int(width), ()))

    def predict(self, bs: int, width: int) -> Optional[float]:
        """Seconds of a step at (bs, width) at the machine's speed now (at that batch size);
        None if `width` was never timed."""
        return self._price(int(bs), int(width))

    def _price(self, bs: int, width: int) -> Optional[float]:
        row = self.cells.get(width)
        if not row:
            return None
        speed = self.speeds.get(bs, 1.0)
        if bs in row:
            return row[bs] * speed
        here = {w: r[bs] for w, r in self.cells.items() if bs in r}
        if not here:   # nothing measured at this batch size: every width at the nearest that was
            measured = {b for r in self.cells.values() for b in r}
            return self._price(min(measured, key=lambda b: (abs(b - bs), b)), width)
        for other in sorted(row, key=lambda b: (abs(b - bs), b)):
            refs = [w for w in here if other in self.cells[w]]
            if refs:
                ref = max(refs)
                # the ratio is read at one batch size, in that batch size's units
                return here[ref] * speed * row[other] / self.cells[ref][other]
        nearest = min(row, key=lambda b: (abs(b - bs), b))
        return row[nearest] * self.speeds.get(nearest, 1.0)


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
