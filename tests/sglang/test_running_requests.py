"""The effective `max_running_requests` (`running_requests.py`, issue 21): the handshake a
scheduler sends the launcher (merged into `/server_info`) carries the value it admits and
the request; one warning names both and the cause when the first is below the second.
In process, on stub schedulers; 0.5.23's own `resolve_max_num_reqs` computes the caps."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang_domino.sglang.seam import hooks, scheduler_start
from sglang_domino.sglang.serving import running_requests  # noqa: E402

LOGGER = running_requests.__name__


@pytest.fixture(autouse=True)
def runtime(monkeypatch):
    """The runtime context bags the hooks read, and fresh per-process records."""
    import sglang.srt.runtime_context as rc

    ctx = SimpleNamespace(schedule=SimpleNamespace(max_running_requests=16, max_mamba_cache_size=4),
                          parallel=SimpleNamespace(attn_dp_size=1, tp_rank=0))
    monkeypatch.setattr(rc, "get_schedule", lambda: ctx.schedule)
    monkeypatch.setattr(rc, "get_parallel", lambda: ctx.parallel)
    monkeypatch.setattr(running_requests, "_bounds", None)
    monkeypatch.setattr(running_requests, "_warned", False)
    return ctx


class Configurator:
    """What 0.5.23's `KVCacheConfigurator.resolve_max_num_reqs` reads of its instance."""

    def __init__(self, hybrid: bool, ratio: int = 1):
        self.model_config = SimpleNamespace(context_len=4096)
        self.attn_dp_size = 1
        self.mambaish_config = object() if hybrid else None
        self._ratio = ratio

    def _calculate_mamba_ratio(self):
        return self._ratio


def upstream_resolve(monkeypatch, runtime):
    """0.5.23's method, reading the test's schedule bag (it imports `get_schedule` by name)."""
    from sglang.srt.mem_cache import kv_cache_configurator as kvc

    monkeypatch.setattr(kvc, "get_schedule", lambda: runtime.schedule)
    return kvc.KVCacheConfigurator.resolve_max_num_reqs


def start_scheduler(monkeypatch, runtime, configurator, token_capacity):
    """A scheduler start as 0.5.23 runs it: the pools sized through the hooked method,
    then the scheduler takes the runner's value and answers the launcher."""
    per_rank = running_requests.around_resolve_max_num_reqs(
        upstream_resolve(monkeypatch, runtime), configurator, token_capacity)
    scheduler = SimpleNamespace(max_running_requests=per_rank)
    return scheduler, running_requests.after_get_init_info({"status": "ready"}, scheduler)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_hybrid_target_capped_by_its_state_slots_reports_4_of_16_and_says_why(monkeypatch, runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    scheduler, info = start_scheduler(monkeypatch, runtime, Configurator(hybrid=True, ratio=1), token_capacity=3072)
    assert info["max_running_requests"] == 4
    assert info["requested_max_running_requests"] == 16
    assert info["status"] == "ready"                     # upstream's keys kept
    assert warnings_of(caplog) == [
        "sglang-domino: max_running_requests is 4, below the requested 16: capped by the mamba state pool "
        "(max_mamba_cache_size=4, 1 slot per request)"]
    running_requests.after_get_init_info({}, scheduler)  # asked again: reported, not warned again
    assert len(warnings_of(caplog)) == 1


def test_the_kv_cache_cap_is_named_with_the_token_count(monkeypatch, runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    _, info = start_scheduler(monkeypatch, runtime, Configurator(hybrid=False), token_capacity=20)
    assert (info["max_running_requests"], info["requested_max_running_requests"]) == (10, 16)
    assert warnings_of(caplog) == ["sglang-domino: max_running_requests is 10, below the requested 16: capped by "
                                   "the KV cache (20 tokens hold at most 10 requests)"]


def test_both_caps_are_named_when_both_are_below_the_request(monkeypatch, runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime.schedule.max_mamba_cache_size = 9
    _, info = start_scheduler(monkeypatch, runtime, Configurator(hybrid=True, ratio=3), token_capacity=20)
    assert info["max_running_requests"] == 3
    (line,) = warnings_of(caplog)
    assert "(max_mamba_cache_size=9, 3 slots per request)" in line and "(20 tokens hold at most 10 requests)" in line


def test_no_warning_when_the_request_is_served(monkeypatch, runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime.schedule.max_mamba_cache_size = 16
    _, info = start_scheduler(monkeypatch, runtime, Configurator(hybrid=True), token_capacity=3072)
    assert (info["max_running_requests"], info["requested_max_running_requests"]) == (16, 16)
    assert warnings_of(caplog) == []


def test_no_request_no_warning(runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime.schedule.max_running_requests = None
    info = running_requests.after_get_init_info({}, SimpleNamespace(max_running_requests=2048))
    assert info["max_running_requests"] == 2048 and info["requested_max_running_requests"] is None
    assert warnings_of(caplog) == []


def test_only_tp_rank_0_warns(runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime.parallel.tp_rank = 1
    info = running_requests.after_get_init_info({}, SimpleNamespace(max_running_requests=4))
    assert info["max_running_requests"] == 4
    assert warnings_of(caplog) == []


def test_attention_dp_reports_the_total_and_names_the_split(runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    runtime.schedule.max_running_requests = 10
    runtime.parallel.attn_dp_size = 4
    info = running_requests.after_get_init_info({}, SimpleNamespace(max_running_requests=2))
    assert info["max_running_requests"] == 8
    assert warnings_of(caplog) == [
        "sglang-domino: max_running_requests is 8 (2 per attention-DP rank x 4), below the requested 10: "
        "split over 4 attention-DP ranks (10 // 4 = 2 each)"]


def test_a_cap_the_hook_did_not_see_is_still_reported(runtime, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    running_requests.after_get_init_info({}, SimpleNamespace(max_running_requests=12))
    assert warnings_of(caplog) == ["sglang-domino: max_running_requests is 12, below the requested 16: "
                                   "cause not recorded (see the warnings above)"]


def test_every_scheduler_start_installs_the_group(monkeypatch):
    installed = []
    monkeypatch.setattr(hooks, "install", lambda group: installed.append(group) or True)
    scheduler_start.before_init_parallel_runtime(server_args=SimpleNamespace(
        disaggregation_mode="null", speculative_num_draft_tokens=None, speculative_algorithm=None))
    assert installed == [hooks.RUNNING_REQUESTS]
    assert {p.name for p in hooks.rows(hooks.RUNNING_REQUESTS)} == {"running_requests_bounds",
                                                                   "running_requests_report"}
