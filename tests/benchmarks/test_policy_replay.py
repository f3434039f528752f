"""`benchmarks.policy_replay`: the adaptive policy replayed on recorded acceptance."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.policy_replay import Request, load_traces, replay
from sglang_domino.sglang.adaptive import AdaptiveWidth, AdaptiveWidthConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVED = os.path.join(ROOT, "benchmarks", "results", "policy-replay", "trace-t1.5-fp32", "width-16")


def test_a_step_accepts_the_rest_of_the_recorded_run_it_starts_in():
    r = Request("a", [3, 0, 15], max_tokens=1000)   # runs start at positions 0, 4, 5
    assert r.accepted(16) == 3 and r.accepted(2) == 1 and r.accepted(1) == 0
    r.position = 2                                   # two tokens into the first run
    assert r.accepted(16) == 1
    r.position = 4
    assert r.accepted(16) == 0
    r.position = 9
    assert r.accepted(16) == 11 and r.accepted(8) == 7
    assert r.end == 5 + 1 + 15


def test_the_recorded_width_replays_the_recorded_tokens_and_plain_one_per_step(tmp_path):
    runs = {"a": [3, 0, 15, 2], "b": [1, 1, 1]}
    steps = [{"rids": ["a", "b"], "width": 16, "accepted": [3, 1]},
             {"rids": ["a"], "width": 8, "accepted": [0]},         # not the widest: left out
             {"rids": ["a", "b"], "width": 16, "accepted": [0, 1]},
             {"rids": ["a", "b"], "width": 16, "accepted": [15, 1]},
             {"rids": ["a"], "width": 16, "accepted": [2]}]
    with open(tmp_path / "accept-1.jsonl", "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(s) + "\n" for s in steps))
    traces = load_traces(str(tmp_path))
    assert traces == [runs["a"], runs["b"]]
    costs = {w: (10.0, 0.0) for w in (1, 2, 4, 8, 16)}
    # width 16 takes the recorded steps: 4 + 3 steps for 24 + 6 tokens, 10 ms each (no noise)
    assert replay(traces, 1, width=16, costs=costs, noise=0.0, max_tokens=1000) == pytest.approx(30 / 0.07)
    # plain decoding, both at once: one token per request and step, `plain` times a width-1
    # step's cost; 6 steps of both, then 18 of the longer one alone
    assert replay(traces, 2, plain=0.5, costs=costs, noise=0.0, max_tokens=1000) == pytest.approx(30 / (24 * 0.005))


def test_the_policy_is_fed_every_step_it_chose(monkeypatch):
    chosen, observed = [], []
    choose, observe_step = AdaptiveWidth.choose, AdaptiveWidth.observe_step

    def spy_choose(self, rids):
        chosen.append((len(rids), choose(self, rids)))
        return chosen[-1][1]

    def spy_observe(self, rids, width, accepted, expected=None):
        observed.append((len(rids), width))
        return observe_step(self, rids, width, accepted, expected)

    monkeypatch.setattr(AdaptiveWidth, "choose", spy_choose)
    monkeypatch.setattr(AdaptiveWidth, "observe_step", spy_observe)
    replay([[15] * 10, [15] * 10, [0] * 40, [0] * 40], 2, settings={}, max_tokens=64)
    assert observed == chosen
    assert {bs for bs, _ in chosen} == {1, 2}   # a group's batch shrinks as its requests finish


@pytest.mark.skipif(not os.path.isdir(SERVED), reason="the recorded trace is not in this checkout")
def test_on_the_served_temperature_1_5_trace_width_1_steps_no_longer_hold_a_low_reading():
    """The recorded float32 temperature-1.5 load (docs/adaptive-width.md): at c1, with a
    request's counts kept through its width-1 steps (before), the policy sat at width 1
    while the text it walked through would have accepted more than the drafting steps
    did; with them fading there (the defaults) it reaches the best fixed width."""
    traces = load_traces(SERVED)
    best = max(replay(traces, 1, width=w) for w in (16, 8, 4))
    before = {"unverified_decay": 1.0, "prior_weight": 4.0}
    now = sum(replay(traces, 1, settings={}, seed=s) for s in range(3)) / 3
    then = sum(replay(traces, 1, settings=before, seed=s) for s in range(3)) / 3
    assert now >= 0.97 * best
    assert then < 0.96 * best and now > 1.04 * then
    assert AdaptiveWidthConfig().unverified_decay < 1.0


def test_a_traced_policy_writes_what_the_replay_reads(tmp_path):
    policy = AdaptiveWidth(AdaptiveWidthConfig(trace=str(tmp_path / "trace")))
    policy.observe_step(["a", "b"], 16, [3, 15])
    policy.observe_step(["a"], 1, [0])
    policy.observe_step(["a", "b"], 16, [0, 2])
    assert load_traces(str(tmp_path / "trace")) == [[3, 0], [15, 2]]


def test_calibrated_estimates_choose_better_than_raw_ones_where_plain_decoding_wins():
    """On the recorded temperature-1.5 trace at c8 the policy picks width 16 for requests
    whose estimate happens to be high, and they get less than expected; scaled by what
    each width's chosen steps got (`calibrate`, the default), it serves more than with the
    raw estimates."""
    traces = load_traces(SERVED)
    calibrated = sum(replay(traces, 8, settings={}, seed=s) for s in range(4)) / 4
    raw = sum(replay(traces, 8, settings={"calibrate": False}, seed=s) for s in range(4)) / 4
    assert calibrated > 1.015 * raw   # 1.026 as recorded
    assert AdaptiveWidthConfig().calibrate
