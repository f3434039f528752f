"""The per-width target verify graphs of `--speculative-adaptive` (`verify_graphs.VerifyGraphs`),
with upstream's own `DecodeCudaGraphRunner.can_run_graph` deciding replay; graph capture
is recorded by a stub runner (no device here)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner  # noqa: E402

from sglang_domino.sglang.seam.hooks import WIDTH_STATE  # noqa: E402
from sglang_domino.sglang.adaptive.verify_graphs import VerifyGraphs  # noqa: E402
from sglang_domino.sglang.adaptive.width_switch import WidthSwitch  # noqa: E402

WIDTHS = (16, 8, 4, 2, 1)
HOME = 16


class Spec:
    """The spec bag's `speculative_num_draft_tokens`, scoped like `_ConfigBag.override`."""

    def __init__(self, width):
        self.width = width

    @contextlib.contextmanager
    def override(self, width):
        saved, self.width = self.width, int(width)
        try:
            yield
        finally:
            self.width = saved


class RecordingRunner(DecodeCudaGraphRunner):
    """Upstream's runner class with capture replaced by a record of what it was built with;
    `can_run_graph` is upstream's own."""

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_steps=None,
                 speculative_num_draft_tokens=None, record_nolora_graph=False):
        self.model_runner = model_runner
        self.attn_backend = attn_backend
        self.speculative_num_steps = speculative_num_steps
        self.captured_req_width = int(speculative_num_draft_tokens)
        self.spec_width_at_capture = model_runner.spec.width
        model_runner.built.append(("runner", self.captured_req_width))
        # the fields upstream's can_run_graph reads, as a TP-only server sets them
        self.ragged_verify_mode = False
        self.require_mlp_tp_gather = self.require_mlp_sync = False
        self.disable_padding = False
        self.max_bs = 32
        self.is_encoder_decoder = False
        self.enable_two_batch_overlap = False
        self.enable_pdmux = False
        self.record_nolora_graph = False


class ModelRunner:
    def __init__(self, spec):
        self.spec = spec
        self.built = []
        self.init_new_workspace = False
        self.spec_algorithm = SimpleNamespace(is_ngram=lambda: False)
        self.eager_runner = object()
        self.attn_backend = ("backend", HOME)
        self.decode_cuda_graph_runner = RecordingRunner(self, attn_backend=self.attn_backend, speculative_num_steps=1,
                                                        speculative_num_draft_tokens=HOME)
        self.built.clear()

    def _get_attention_backend(self, init_new_workspace=False):
        assert init_new_workspace and self.init_new_workspace is False
        self.init_new_workspace = True   # upstream's factory sets it; the registry restores it
        self.built.append(("backend", self.spec.width))
        return ("backend", self.spec.width)


def verify_batch(width: int, bs: int = 4):
    return SimpleNamespace(replace_embeds=None, spec_info=SimpleNamespace(num_tokens_per_req=width),
                           batch_size=bs, lora_ids=None, input_ids=torch.zeros(bs * width, dtype=torch.int64))


def replays(model_runner, width: int) -> bool:
    """What `DFlashVerifyInput.prepare_for_verify` asks the target model runner."""
    runner = model_runner.decode_cuda_graph_runner
    return bool(runner and runner.can_run_graph(verify_batch(width)))


def build(model_runner):
    return VerifyGraphs.build(model_runner, HOME, WIDTHS, spec_override=model_runner.spec.override)


def test_without_the_registry_only_the_home_width_replays_its_graph():
    model_runner = ModelRunner(Spec(HOME))
    assert [w for w in WIDTHS if replays(model_runner, w)] == [HOME]


def test_every_width_is_captured_once_under_its_own_width_and_replays():
    model_runner = ModelRunner(Spec(HOME))
    graphs = build(model_runner)
    # one backend and one runner per narrower width, each built while the spec bag said that width
    assert model_runner.built == [(kind, w) for w in WIDTHS[1:] for kind in ("backend", "runner")]
    assert all(graphs.states[w].graph_runner.spec_width_at_capture == w for w in WIDTHS)
    assert model_runner.spec.width == HOME and model_runner.init_new_workspace is False
    assert graphs.states[4].graph_runner.speculative_num_steps == 1   # the home runner's
    for width in WIDTHS:
        with graphs.at(width):
            assert model_runner.attn_backend == ("backend", width)
            assert replays(model_runner, width)
            # a batch of another width still falls back, by upstream's own check
            assert not any(replays(model_runner, w) for w in WIDTHS if w != width)
        assert model_runner.attn_backend == ("backend", HOME) and replays(model_runner, HOME)


def test_the_home_pair_is_restored_when_a_step_raises():
    model_runner = ModelRunner(Spec(HOME))
    graphs = build(model_runner)
    home_runner = model_runner.decode_cuda_graph_runner
    with pytest.raises(RuntimeError):
        with graphs.at(2):
            assert model_runner.decode_cuda_graph_runner is graphs.states[2].graph_runner
            raise RuntimeError("verify failed")
    assert model_runner.decode_cuda_graph_runner is home_runner
    assert model_runner.attn_backend == ("backend", HOME)
    with pytest.raises(KeyError, match="width 3"):
        with graphs.at(3):
            pass


def test_nothing_is_built_without_a_home_decode_graph():
    model_runner = ModelRunner(Spec(HOME))
    model_runner.decode_cuda_graph_runner = None           # CPU, --disable-cuda-graph
    assert build(model_runner) is None and model_runner.built == []
    model_runner.decode_cuda_graph_runner = model_runner.eager_runner
    assert build(model_runner) is None and model_runner.built == []


class Worker:
    """The attributes `WidthSwitch` swaps on a `DFlashWorkerV2`."""

    def __init__(self):
        for name in WIDTH_STATE:
            setattr(self, name, ("home", name))
        self.block_size = self.speculative_num_draft_tokens = HOME
        self._draft_sampler = "in-graph sampler"
        self.device = "cpu"


def test_the_width_switch_swaps_the_target_graphs_with_the_worker_state_and_restores_both():
    model_runner, worker = ModelRunner(Spec(HOME)), Worker()
    switch = WidthSwitch(worker)
    switch.graphs = build(model_runner)
    with pytest.raises(ValueError):
        with switch.at(4):
            assert worker.block_size == 4 and worker._draft_sampler is None
            assert model_runner.attn_backend == ("backend", 4) and replays(model_runner, 4)
            raise ValueError("step failed")
    assert worker.block_size == worker.speculative_num_draft_tokens == HOME
    assert worker._draft_sampler == "in-graph sampler"
    assert all(getattr(worker, name) == ("home", name) for name in WIDTH_STATE)
    assert model_runner.attn_backend == ("backend", HOME) and replays(model_runner, HOME)
    with switch.at(HOME):   # home: nothing swapped
        assert model_runner.decode_cuda_graph_runner is switch.graphs.states[HOME].graph_runner


def test_the_memory_estimate_follows_the_widths_captured(caplog):
    """Each width other than home is estimated before capture (its own workspace and a graph
    set scaled by width from 0.5.23's home reserve), logged, and kept for the summary."""
    from sglang_domino.sglang.adaptive.verify_graphs import HOME_GRAPH_MB_PER_BS, estimate_gb

    ws = 384 << 20
    est = estimate_gb([16, 8, 4, 1], 16, 64, ws)
    assert list(est) == [8, 4, 1]                      # home is captured by the target worker
    assert est[8] == pytest.approx((384 + HOME_GRAPH_MB_PER_BS * 64 * 8 / 16) / 1024)
    assert est[8] > est[4] > est[1] > 384 / 1024
    assert estimate_gb([16, 8], 16, 64, ws).keys() == {8}
    assert estimate_gb([16], 16, 64, ws) == {}
    model_runner = ModelRunner(Spec(HOME))
    with caplog.at_level("INFO", logger="sglang_domino.sglang.adaptive.verify_graphs"):
        graphs = build(model_runner)
    assert set(graphs.estimate) == set(WIDTHS) - {HOME}
    assert graphs.estimate == estimate_gb(WIDTHS, HOME, 32, 0)    # the stub has max_bs 32, no workspace
    assert f"capturing widths {sorted(set(WIDTHS) - {HOME}, reverse=True)}" in caplog.text
    assert "estimated" in graphs.describe()


def _resolved(fraction=0.85, backend="full", device="cuda", raw=None):
    decode = SimpleNamespace(backend=backend, max_bs=160)
    cfg = SimpleNamespace(speculative_num_draft_tokens=HOME, device=device, mem_fraction_static=fraction,
                          cuda_graph_config=SimpleNamespace(decode=decode))
    return SimpleNamespace(_raw_input=raw or {}), cfg


def test_resolution_takes_the_widths_captures_out_of_the_kv_pools_share(monkeypatch):
    """The per-width graphs are captured after the KV pool is sized from
    mem_fraction_static: where 0.5.23 derived the fraction, resolution lowers it by the
    estimate of the widths captured; a fraction the user gave, a single width, no decode
    graphs or a CPU server change nothing."""
    from sglang.srt.arg_groups import overrides
    from sglang.srt.utils import common

    from sglang_domino.sglang.adaptive.verify_graphs import estimate_gb, lowered_fraction, reserve_for_widths

    monkeypatch.setattr(common, "get_device_memory_capacity", lambda device=None: 81559.0)
    monkeypatch.setattr(overrides, "post_capture_kv_sizing_planned", lambda server_args: False)
    server_args, cfg = _resolved()
    fraction = reserve_for_widths(server_args, cfg, [HOME, 8, 4, 1], "test")
    expected = lowered_fraction(0.85, 81559.0, estimate_gb([HOME, 8, 4, 1], HOME, 160, 384 << 20))
    assert fraction == expected and 0.82 < fraction < 0.84
    assert server_args._resolved_overrides == [("test", {"mem_fraction_static": expected})]
    more = reserve_for_widths(*_resolved(), [HOME, 12, 8, 4, 2, 1], "test")
    assert more < fraction                                     # follows the widths captured
    assert reserve_for_widths(*_resolved(raw={"mem_fraction_static": 0.85}), [HOME, 8], "test") is None
    assert reserve_for_widths(*_resolved(), [HOME], "test") is None
    assert reserve_for_widths(*_resolved(backend="disabled"), [HOME, 8], "test") is None
    assert reserve_for_widths(*_resolved(device="cpu"), [HOME, 8], "test") is None
