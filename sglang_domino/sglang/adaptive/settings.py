"""The adaptive width's settings (`--speculative-adaptive-config`), validated."""

from __future__ import annotations

import json
from typing import Optional

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
    # (`sglang_domino.sglang.adaptive.draft_context`); False: after every step, as upstream does
    defer_context: bool = True
    # width-1 steps run without the draft side (`sglang_domino.sglang.adaptive.decode_step`: the
    # target's decode path on CPU, its one-token verify on CUDA); False: upstream's step at
    # one token, as before
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
