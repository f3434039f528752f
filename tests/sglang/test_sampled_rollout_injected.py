"""The plugin's per-step draft tails without sglang, as `benchmarks/gpu_check.py` section 5
runs them on a GPU that cannot install it: `SampledStep` with an injected `to_probs`,
held equal to the plugin's own rollouts (`domino_sampled_rollout`, 0.5.23's
`domino_greedy_rollout`), and sync-free on fake CUDA tensors."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_check
from sglang_domino.sampling import SamplingParams, to_probs

BS, POOL = 4, 64
CPU = torch.device("cpu")


@pytest.fixture
def no_sglang(monkeypatch):
    """Every `import sglang...` fails, as on the GPU check machine (modules already
    imported by other tests included)."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "sglang", None)


def _modules(dtype=torch.float32, pool=POOL) -> gpu_check.DraftModules:
    torch.manual_seed(0)
    return gpu_check.build_modules(gpu_check.draft_config(gpu_check.SMALL), CPU, dtype, pool)


def _case(mods, seed=1) -> dict:
    return gpu_check.rollout_case(mods, BS, torch.Generator().manual_seed(seed))


def test_an_injected_to_probs_replaces_upstreams(no_sglang):
    from sglang_domino.sglang.sampled_rollout import SampledStep

    with pytest.raises(ImportError):
        SampledStep(None, torch.zeros(BS)).to_probs(torch.randn(BS, 9))
    logits = torch.randn(BS, 9)
    params = SamplingParams(temperature=0.5, top_k=3)
    step = SampledStep(None, torch.zeros(BS), probs_fn=lambda x: to_probs(x, params), rollout_coins=torch.rand(BS, 1))
    assert torch.equal(step.to_probs(logits), to_probs(logits, params))
    token, _ = step.pick(logits, 0)
    assert torch.equal(step.q_first, to_probs(logits, params))
    assert torch.equal(step.q_draft[0], step.q_first.gather(1, token[:, None])[:, 0])


@pytest.mark.parametrize("pool", [0, POOL])
def test_the_check_rollouts_are_the_plugins(pool):
    """The GPU check's tails against the code they stand for, with sglang present: the
    greedy tail proposes 0.5.23's `domino_greedy_rollout` token for token, the sampled
    tail what `domino_sampled_rollout` proposes from the same coins (torch's RNG reseeded)
    with upstream's transform, and the same q."""
    from sglang_domino.sglang.sampled_rollout import SampledStep, domino_sampled_rollout
    from tests.sglang.tp_fakes import du

    mods = _modules(torch.float64, pool)
    case = _case(mods)
    hidden, bonus = case["hidden"], case["bonus"]
    kw = dict(draft_hidden=hidden, bonus_tokens=bonus, target_embedding=mods.embed,
              lm_head_weight=mods.lm_head.weight, prefix_gru=mods.draft.prefix_gru, embed_proj=mods.draft.embed_proj,
              vocab_size=mods.vocab, shift_label=True, candidate_pool_size=pool, in_cuda_graph=False)
    (greedy,) = gpu_check.greedy_rollout(mods, hidden, bonus)
    assert torch.equal(greedy, du.domino_greedy_rollout(**kw))

    # temperature 0.5: dividing by it is exact, so the two transforms agree bit for bit
    info = SimpleNamespace(temperatures=torch.full((BS, 1), 0.5), need_top_k_sampling=False,
                           need_top_p_sampling=False, sampling_seed=None)
    step = SampledStep(info, torch.full((BS,), 10))
    torch.manual_seed(7)
    tokens = domino_sampled_rollout(step, **kw)
    torch.manual_seed(7)
    coins = torch.rand(BS, hidden.shape[1] - 1)
    got = gpu_check.sampled_rollout(mods, hidden, bonus, coins, lambda x: to_probs(x, SamplingParams(temperature=0.5)))
    assert torch.equal(got[0], tokens)
    assert torch.allclose(got[1], torch.stack(step.q_draft, dim=1))
    assert torch.allclose(got[2], step.q_first)
    assert torch.allclose(got[3], torch.stack(step.q_rest, dim=1))
    assert got[3].shape[-1] == (pool or mods.vocab)


@pytest.mark.parametrize("tail", ["greedy", "sampled"])
def test_the_check_tails_run_without_sglang(no_sglang, tail, capsys):
    """Section 5's CPU stand-in (no graphs): capture, refill, replay, eager, equal."""
    mods = _modules()
    build = gpu_check.greedy_tail if tail == "greedy" else gpu_check.sampled_tail
    assert gpu_check.check_tail(build(mods, BS, torch.Generator().manual_seed(2)), BS, CPU, repeats=1)
    assert "(CPU: no graph captured)" in capsys.readouterr().out


@pytest.fixture
def fake_cuda():
    """Fake CUDA tensors on this CPU-only machine: a data-dependent read (`.item()`, a
    tensor's truth value, `torch.equal`) raises, as the same read would stall a GPU.
    cuDNN is off: its GRU reaches the real CUDA runtime even on fake tensors. The
    native CUDA GRU cell (`aten::_thnn_fused_gru_cell`) has no fake kernel, so it gets a
    shape-only one here (the cell's outputs are hy and a [b, 5 * hidden] workspace); it
    reads nothing back to the host."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
        return torch.empty_like(hx), hx.new_empty(hx.shape[0], 5 * hx.shape[1])

    with torch.library._scoped_library("aten", "IMPL") as lib:
        lib.impl("_thnn_fused_gru_cell", fused_gru_cell, "Meta")
        with FakeTensorMode(), torch.backends.cudnn.flags(enabled=False), torch.device("cuda"):
            cfg = gpu_check.draft_config(gpu_check.SMALL)
            # fp32: `Module.to(dtype)` cannot swap fake parameters
            mods = gpu_check.DraftModules(gpu_check.DraftModel(cfg).eval(),
                                          torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size),
                                          torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False), POOL)
            case = dict(hidden=torch.randn(BS, cfg.block_size, cfg.hidden_size),
                        bonus=torch.randint(0, cfg.vocab_size, (BS,)), coins=torch.rand(BS, cfg.block_size - 1))
            yield mods, case


def test_the_greedy_and_sampled_tails_are_sync_free_on_fake_cuda(fake_cuda, no_sglang):
    from torch._subclasses.fake_tensor import DataDependentOutputException

    mods, case = fake_cuda
    n = case["coins"].shape[1]
    (tokens,) = gpu_check.greedy_rollout(mods, case["hidden"], case["bonus"])
    assert tokens.shape == (BS, n) and tokens.device.type == "cuda"
    out = gpu_check.sampled_rollout(mods, case["hidden"], case["bonus"], case["coins"],
                                    lambda x: to_probs(x, gpu_check.QWEN3_SAMPLING))
    assert [tuple(t.shape) for t in out] == [(BS, n), (BS, n), (BS, mods.vocab), (BS, n - 1, POOL)]
    assert all(t.device.type == "cuda" for t in out)

    def syncing(logits):               # the control: a transform that reads the device
        return to_probs(logits, SamplingParams(temperature=float(logits.max().item())))

    with pytest.raises(DataDependentOutputException):
        gpu_check.sampled_rollout(mods, case["hidden"], case["bonus"], case["coins"], syncing)
