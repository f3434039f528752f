"""The adaptive policy's step costs under overlap scheduling (`width_switch.StepTimer`),
in a discrete-event imitation of 0.5.23's `event_loop_overlap`: launch step N, process
step N-1's results (waiting for the device), schedule, launch N+1. A fake device runs
each step for a known time per width; its timing events read the device's clock, as CUDA
events do."""

from __future__ import annotations

import pytest

from sglang_domino.sglang.adaptive import width_switch
from sglang_domino.sglang.adaptive.width_switch import StepTimer

STEP_S = {16: 0.010, 4: 0.004}       # device time of a step, per width
LAUNCH_S, SCHEDULE_S = 0.0005, 0.001  # host time to launch a step and to schedule the next


class Machine:
    def __init__(self):
        self.host = 0.0         # host clock
        self.device_free = 0.0  # when the device finishes what is queued

    def launch(self, width):
        self.device_free = max(self.device_free, self.host) + STEP_S[width]
        self.host += LAUNCH_S
        return self.device_free

    def wait(self, until):
        self.host = max(self.host, until)


class FakeEvent:
    """Records the device clock at the point of the queue it is recorded at."""

    def __init__(self, machine):
        self.machine, self.t = machine, None

    def record(self):
        self.t = max(self.machine.device_free, self.machine.host)

    def query(self):
        return self.t is not None and self.machine.host >= self.t

    def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event's
        return (end.t - self.t) * 1000.0


def run_overlap_loop(make_timer, widths, monkeypatch):
    """The loop's order with the timer `make_timer(machine)`; returns the (width, seconds)
    samples it gave."""
    machine = Machine()
    timer = make_timer(machine)
    monkeypatch.setattr(width_switch.time, "perf_counter", lambda: machine.host)
    samples, in_flight = [], []
    for width in widths + [None]:
        if width is not None:
            lap = timer.lap()                     # the worker's `_choose_width`
            if lap is not None:
                samples.append((lap[1], lap[2]))
            timer.label(1, width)
            with timer.around_launch() as marks:
                done = machine.launch(width)
            in_flight.append((width, marks, done))
        if len(in_flight) > 1 or width is None:   # process the previous step's results
            step_width, marks, done = in_flight.pop(0)
            machine.wait(done)
            seconds = timer.elapsed(marks)       # `on_verify_complete_cpu`
            if seconds is not None:
                samples.append((step_width, seconds))
            machine.host += SCHEDULE_S
    return samples


WIDTHS = [16] * 6 + [4] + [16] * 6 + [4, 4, 4] + [16] * 4


def test_device_events_charge_each_step_its_own_device_time(monkeypatch):
    samples = run_overlap_loop(lambda machine: StepTimer(events=lambda: FakeEvent(machine)), WIDTHS, monkeypatch)
    assert len(samples) == len(WIDTHS)
    for width, seconds in samples:
        assert seconds == pytest.approx(STEP_S[width]), (width, seconds)


def test_host_laps_under_overlap_charge_a_probe_the_previous_step(monkeypatch):
    """Why the device timer exists: host laps measure the step before, so the isolated
    width-4 probe is charged a width-16 step's time (and the step after it the probe's)."""
    samples = run_overlap_loop(lambda machine: StepTimer(), WIDTHS, monkeypatch)
    probe = [seconds for width, seconds in samples if width == 4][0]
    assert probe > 2 * STEP_S[4]
    assert probe == pytest.approx(STEP_S[16], rel=0.2)


def test_inline_steps_keep_host_laps_and_breaks(monkeypatch):
    clock = {"t": 0.0}
    monkeypatch.setattr(width_switch.time, "perf_counter", lambda: clock["t"])
    timer = StepTimer()
    assert timer.lap() is None
    timer.label(8, 16)
    clock["t"] = 0.25
    assert timer.lap() == (8, 16, 0.25)
    timer.break_chain()
    assert timer.lap() is None
    with timer.around_launch() as marks:
        pass
    assert marks == [] and timer.elapsed(marks) is None


def test_the_device_timer_is_chosen_for_an_overlapped_device_only():
    assert not StepTimer.for_device("cpu", overlap=True).on_device
    assert StepTimer.for_device("cuda", overlap=True).on_device
    assert not StepTimer.for_device("cuda", overlap=False).on_device
    # a device timer gives no host laps: its samples come with the step's results
    assert StepTimer.for_device("cuda", overlap=True).lap() is None
