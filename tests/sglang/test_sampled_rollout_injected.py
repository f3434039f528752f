"""The plugin's per-step draft tail without sglang, as `benchmarks/gpu_check.py` section 5
runs it on a GPU that cannot install it: `sampled_rollout.q_rollout` (what the q rule's
draft graph holds), held equal to the plugin's eager rollout (`domino_sampled_rollout`) and,
with greedy rows, to 0.5.23's `domino_greedy_rollout`, and sync-free on fake CUDA tensors."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_check
from sglang_domino.sglang.sampling import sampled_rollout

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


@pytest.mark.parametrize("pool", [0, POOL])
def test_the_check_rollouts_are_the_plugins(pool):
    """The GPU check's tails against the code they stand for, with sglang present: the
    greedy tail proposes 0.5.23's `domino_greedy_rollout` token for token, the sampled
    tail what the server's eager `domino_sampled_rollout` proposes from the same coins
    (torch's RNG reseeded) under parameters staged from a batch, and the same q."""
    from sglang_domino.sglang.sampling.sampled_rollout import SampledStep, domino_sampled_rollout
    from tests.sglang.tp_fakes import du

    mods = _modules(torch.float64, pool)
    case = _case(mods)
    hidden, bonus = case["hidden"], case["bonus"]
    kw = dict(draft_hidden=hidden, bonus_tokens=bonus, in_cuda_graph=False, **gpu_check.rollout_args(mods))
    (greedy,) = gpu_check.greedy_rollout(mods, hidden, bonus)
    assert torch.equal(greedy, du.domino_greedy_rollout(**kw))

    params = gpu_check.QWEN3_SAMPLING
    info = SimpleNamespace(temperatures=torch.full((BS, 1), params.temperature),
                           top_ks=torch.full((BS,), params.top_k, dtype=torch.int32),
                           top_ps=torch.full((BS,), params.top_p), sampling_seed=None)
    step = SampledStep(info, torch.full((BS,), 10))
    torch.manual_seed(7)
    tokens = domino_sampled_rollout(step, **kw)
    torch.manual_seed(7)
    coins = torch.rand(BS, hidden.shape[1] - 1)
    got = gpu_check.q_tail(mods, hidden, bonus, coins, gpu_check.staged_params(BS, CPU, params))
    d = step.draft
    assert torch.equal(got[0], tokens)
    assert torch.equal(got[1], d.q_draft) and torch.equal(got[2], d.q_first) and torch.equal(got[3], d.q_rest)
    assert got[3].shape[-1] == (pool or mods.vocab)


@pytest.mark.parametrize("tail", ["greedy", "sampled", "sampler"])
def test_the_check_tails_run_without_sglang(no_sglang, tail, capsys):
    """Section 5's CPU stand-in (no graphs): capture, refill, replay, eager (for the
    server's sampler: `q_rollout` on the coins its replay drew), equal."""
    mods = _modules()
    build = {"greedy": gpu_check.greedy_tail, "sampled": gpu_check.sampled_tail,
             "sampler": gpu_check.sampler_tail}[tail]
    assert gpu_check.check_tail(build(mods, BS, torch.Generator().manual_seed(2)), BS, CPU, repeats=1)
    assert "(CPU: no graph captured)" in capsys.readouterr().out


@pytest.fixture
def fake_cuda():
    """The check's modules and a case on fake CUDA tensors (`tests.fake_cuda`)."""
    from tests.fake_cuda import fake_cuda as mode

    with mode(), torch.device("cuda"):
        cfg = gpu_check.draft_config(gpu_check.SMALL)
        # fp32: `Module.to(dtype)` cannot swap fake parameters
        mods = gpu_check.DraftModules(gpu_check.DraftModel(cfg).eval(),
                                      torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size),
                                      torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False), POOL)
        case = dict(hidden=torch.randn(BS, cfg.block_size, cfg.hidden_size),
                    bonus=torch.randint(0, cfg.vocab_size, (BS,)), coins=torch.rand(BS, cfg.block_size - 1))
        yield mods, case


def test_the_greedy_and_sampled_tails_are_sync_free_on_fake_cuda(fake_cuda, no_sglang, monkeypatch):
    from torch._subclasses.fake_tensor import DataDependentOutputException

    mods, case = fake_cuda
    n = case["coins"].shape[1]
    (tokens,) = gpu_check.greedy_rollout(mods, case["hidden"], case["bonus"])
    assert tokens.shape == (BS, n) and tokens.device.type == "cuda"
    params = gpu_check.staged_params(BS, torch.device("cuda"), gpu_check.QWEN3_SAMPLING)
    out = gpu_check.q_tail(mods, case["hidden"], case["bonus"], case["coins"], params)
    assert [tuple(t.shape) for t in out] == [(BS, n), (BS, n), (BS, mods.vocab), (BS, n - 1, POOL)]
    assert all(t.device.type == "cuda" for t in out)

    # the control: q's transform with a host read put back (a top-k bound read from the
    # device, as 0.5.23's own transform does without a host-known bound)
    class Syncing(sampled_rollout.DraftQ):
        def __call__(self, logits):
            self.k = min(self.k, int(self.kth.max().item()) + 1)
            return super().__call__(logits)

    monkeypatch.setattr(sampled_rollout, "DraftQ", Syncing)
    with pytest.raises(DataDependentOutputException):
        gpu_check.q_tail(mods, case["hidden"], case["bonus"], case["coins"], params)
