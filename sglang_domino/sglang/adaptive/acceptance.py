"""The acceptance estimate: per-request and server-wide per-position acceptance rates, and
the survivals S_r(k) the policy scores widths with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from .settings import AdaptiveWidthConfig


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
