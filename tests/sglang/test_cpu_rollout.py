"""`sglang_domino.sglang.cpu.rollout`: the greedy Domino rollout under `torch.compile` on CPU,
against 0.5.23's eager `domino_greedy_rollout`, in process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.sglang.tp_fakes import V, du, rollout_modules


def _kwargs(mods, hidden, bonus, pool):
    lm_head, embed, gru, proj = mods
    return dict(draft_hidden=hidden, bonus_tokens=bonus, target_embedding=embed, lm_head_weight=lm_head,
                prefix_gru=gru, embed_proj=proj, vocab_size=V, shift_label=True, candidate_pool_size=pool,
                in_cuda_graph=False)


@pytest.fixture(scope="module")
def mods():
    return rollout_modules(seed=5)


def _block(mods, bs, block, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs, block, mods[0].shape[1], generator=g, dtype=torch.float64)
    return hidden, torch.randint(0, V, (bs,), generator=g)


def test_the_compiled_rollout_proposes_upstreams_chain_and_compiles_once_per_block(mods):
    """Batch 1 and 2 compile the block length's two graphs (batch 1, the dynamic batch);
    every other batch size reuses them, with and without the candidate pool, and each
    block length (a narrower verify width) adds its own two. The proposals are upstream's
    eager rollout's, token for token."""
    import torch._dynamo.utils as dynamo_utils

    from sglang_domino.sglang.cpu import rollout as cpu_rollout

    compiled = cpu_rollout.CompiledRollout(mods[2], mods[3])
    weight = mods[1].weight
    graphs = lambda: dynamo_utils.counters["stats"]["unique_graphs"]  # noqa: E731
    for block in (8, 4):
        for pool in (0, 20):
            for bs in (1, 2):   # the warm-up of this block length and pool
                hidden, bonus = _block(mods, bs, block, seed=bs)
                kw = _kwargs(mods, hidden, bonus, pool)
                kw.pop("in_cuda_graph"), kw.pop("target_embedding"), kw.pop("prefix_gru"), kw.pop("embed_proj")
                assert torch.equal(compiled(embed_weight=weight, **kw), du.domino_greedy_rollout(**_kwargs(
                    mods, hidden, bonus, pool)))
            before = graphs()
            for bs in (3, 5, 8, 2, 1):
                # the step's draft hidden states are inference tensors (the draft's forward runs in
                # inference mode), the warm-up's were not: the same graphs serve both
                with torch.inference_mode(bs % 2 == 1):
                    hidden, bonus = _block(mods, bs, block, seed=10 + bs)
                    # the step's bonus tokens are a column of its [bs, block] ids
                    bonus = torch.stack([bonus, bonus], 1)[:, 0]
                kw = _kwargs(mods, hidden, bonus, pool)
                want = du.domino_greedy_rollout(**kw)
                kw.pop("in_cuda_graph"), kw.pop("target_embedding"), kw.pop("prefix_gru"), kw.pop("embed_proj")
                got = compiled(embed_weight=weight, **kw)
                assert got.shape == (bs, block - 1) and torch.equal(got, want), (block, pool, bs)
                assert not got.is_inference()   # the step may write into it
            assert graphs() == before, (block, pool)   # no recompile after the warm-up


def test_the_rollout_hook_runs_eligible_cpu_calls_compiled(mods, monkeypatch):
    """With SGLANG_DOMINO_CPU_ROLLOUT=compiled, a single-rank plain embedding on CPU: the
    hook answers with the compiled rollout (upstream is not called) and upstream's tokens;
    by default (eager), or over a tensor-parallel group, upstream runs; another value is
    refused."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    from sglang_domino.sglang.cpu import rollout as cpu_rollout
    from sglang_domino.sglang.rollout_hook import around_domino_rollout

    layer = SimpleNamespace(tp_size=1, output_dtype=None, quant_method=UnquantizedEmbeddingMethod(),
                            weight=mods[1].weight)
    hidden, bonus = _block(mods, 3, 8, seed=7)
    want = du.domino_greedy_rollout(**_kwargs(mods, hidden, bonus, 0))
    calls = []

    def upstream(**kw):
        calls.append(kw)
        return du.domino_greedy_rollout(**kw)

    kwargs = {**_kwargs(mods, hidden, bonus, 0), "target_embedding": layer}
    monkeypatch.delenv(cpu_rollout.MODE_ENV, raising=False)
    assert cpu_rollout.mode() == "eager" and not cpu_rollout.eligible(kwargs, layer.weight)
    monkeypatch.setenv(cpu_rollout.MODE_ENV, "compiled")
    assert torch.equal(around_domino_rollout(upstream, **kwargs), want) and not calls
    assert not cpu_rollout.eligible({**kwargs, "tp_group": SimpleNamespace(world_size=2)}, layer.weight)
    monkeypatch.setenv(cpu_rollout.MODE_ENV, "eager")
    assert torch.equal(around_domino_rollout(upstream, **kwargs), want) and len(calls) == 1
    monkeypatch.setenv(cpu_rollout.MODE_ENV, "graph")
    with pytest.raises(ValueError, match="SGLANG_DOMINO_CPU_ROLLOUT='graph': expected one of eager, compiled"):
        cpu_rollout.mode()
