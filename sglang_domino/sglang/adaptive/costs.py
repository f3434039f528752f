"""Step costs: the measured seconds of a decode step by batch size and width, learnt online
(never a built-in constant)."""

from __future__ import annotations

import math
from typing import Optional


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
