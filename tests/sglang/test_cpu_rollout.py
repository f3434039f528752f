"""`sglang_domino.sglang.step.compiled_rollout`: the greedy Domino rollout under `torch.compile` on CPU,
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

    from sglang_domino.sglang.step import compiled_rollout as cpu_rollout

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
    """In a process serving the compiled CPU step (`--enable-torch-compile`), a plain
    embedding on CPU: the hook answers with the compiled rollout (upstream is not called)
    and upstream's tokens; without the compiled step upstream runs."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    from sglang_domino.sglang.step import compiled_rollout as cpu_rollout
    from sglang_domino.sglang.cpu.compiled import switches
    from sglang_domino.sglang.step.rollout_hook import around_domino_rollout

    layer = SimpleNamespace(tp_size=1, output_dtype=None, quant_method=UnquantizedEmbeddingMethod(),
                            weight=mods[1].weight)
    hidden, bonus = _block(mods, 3, 8, seed=7)
    want = du.domino_greedy_rollout(**_kwargs(mods, hidden, bonus, 0))
    calls = []

    def upstream(**kw):
        calls.append(kw)
        return du.domino_greedy_rollout(**kw)

    kwargs = {**_kwargs(mods, hidden, bonus, 0), "target_embedding": layer}
    monkeypatch.setattr(switches._Process, "compiled", False)
    assert not cpu_rollout.eligible(kwargs, layer.weight)
    assert torch.equal(around_domino_rollout(upstream, **kwargs), want) and len(calls) == 1
    monkeypatch.setattr(switches._Process, "compiled", True)
    assert torch.equal(around_domino_rollout(upstream, **kwargs), want) and len(calls) == 1


class _ParallelEmbedding:
    """A vocabulary-parallel embedding as upstream's `VocabParallelEmbedding` computes it:
    this rank's rows (zeros outside its shard), summed over the ranks."""

    def __init__(self, full, rank, padded, group):
        self.tp_size, self.group = 2, group
        self.start, self.weight = rank * padded, torch.zeros(padded, full.shape[1], dtype=full.dtype)
        rows = full[self.start:self.start + padded]
        self.weight[:rows.shape[0]] = rows

    def __call__(self, ids):
        local = ids - self.start
        inside = (local >= 0) & (local < self.weight.shape[0])
        out = self.weight[local.clamp(0, self.weight.shape[0] - 1)] * inside[..., None].to(self.weight.dtype)
        return self.group.all_reduce(out)


def test_tensor_parallel_ranks_run_the_rollout_compiled_with_the_single_ranks_proposals():
    """`--tp-size 2`: each rank's compiled rollout (its lm_head and embedding shards, the base
    logits all-gathered, the feedback embedding one opaque op over the parallel embedding)
    proposes the single-rank rollout's tokens, with and without the candidate pool. Ranks
    are threads of a fresh interpreter (see tests/sglang/cpu/test_compiled_forward.py)."""
    from tests.helpers.fresh import run_fresh

    run_fresh(tensor_parallel_rollout, "ranks propose the single rank's tokens")


def tensor_parallel_rollout():
    import threading

    from sglang_domino.sglang.step import compiled_rollout as cpu_rollout
    from sglang_domino.sglang.cpu.compiled import switches
    from tests.sglang.tp_fakes import H, Exchange, FakeGroup

    switches.set_compiled_step()   # as a server's first compiled model sets it
    mods = rollout_modules(seed=5)
    lm_head, embed, gru, proj = mods
    world, padded = 2, -(-V // 2)
    for pool in (0, 24):
        for bs in (1, 3):
            hidden, bonus = _block(mods, bs, 8, seed=30 + bs)
            want = du.domino_greedy_rollout(**_kwargs(mods, hidden, bonus, pool))
            exchange = Exchange(world)
            outs, errors = [None] * world, []

            def rank(r):
                try:
                    group = FakeGroup(exchange, r)
                    shard = torch.zeros(padded, H, dtype=lm_head.dtype)
                    num = min(padded, V - r * padded)
                    shard[:num] = lm_head[r * padded:r * padded + num]
                    kw = {**_kwargs(mods, hidden, bonus, pool), "lm_head_weight": shard, "tp_group": group,
                          "target_embedding": _ParallelEmbedding(embed.weight.detach(), r, padded, group),
                          "lm_head_org_vocab_start": r * padded, "lm_head_num_org": num,
                          "lm_head_num_org_padded": padded}
                    assert cpu_rollout.eligible(kw, None)
                    outs[r] = cpu_rollout.greedy_rollout(None, **kw)
                    assert "all_gather" in group.calls and "all_reduce" in group.calls
                except BaseException as err:   # surfaced below
                    errors.append(err)
                    exchange.barrier.abort()

            threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
            [t.start() for t in threads]
            [t.join(120) for t in threads]
            assert not errors, errors
            for out in outs:
                assert torch.equal(out, want), (pool, bs, out, want)
    print("ranks propose the single rank's tokens")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True], ids=["bias-free (Domino)", "biases"])
def test_the_gru_update_from_the_gates_products_is_gru_cell(dtype, bias):
    """The compiled CPU rollout multiplies the GRU's gates through the kernel library's
    linear op and updates the state with `gru_update`: `gru_cell`'s step."""
    from sglang_domino.kernels import cpu_linear
    from sglang_domino.sglang.sampling.sampled_rollout import gru_update

    g = torch.Generator().manual_seed(3)
    x, h = torch.randn(5, 12, generator=g, dtype=dtype), torch.randn(5, 8, generator=g, dtype=dtype)
    w_ih, w_hh = torch.randn(24, 12, generator=g, dtype=dtype), torch.randn(24, 8, generator=g, dtype=dtype)
    b_ih, b_hh = ((torch.randn(24, generator=g, dtype=dtype), torch.randn(24, generator=g, dtype=dtype)) if bias
                  else (None, None))
    want = torch.ops.aten.gru_cell.default(x, h, w_ih, w_hh, b_ih, b_hh)
    got = gru_update(cpu_linear.linear(x, w_ih, b_ih), cpu_linear.linear(h, w_hh, b_hh), h)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_the_compiled_rollouts_head_multiplies_through_the_kernel_librarys_op():
    """Its correction and GRU steps go through the op (`packed_linear.linear`), and give
    the modules' and `gru_cell`'s values (float32, the served dtype)."""
    from sglang_domino.sglang.sampling.sampled_rollout import UpstreamDominoHead
    from sglang_domino.sglang.step import compiled_rollout as cpu_rollout

    lm_head, _, gru, proj = rollout_modules(seed=7)
    gru, proj = gru.float(), proj.float()
    compiled = cpu_rollout.CompiledRollout(gru, proj)
    reference = UpstreamDominoHead(gru, proj)
    g = torch.Generator().manual_seed(4)
    z, state = torch.randn(3, lm_head.shape[1], generator=g), torch.randn(3, gru.hidden_size, generator=g)
    embed = torch.randn(3, gru.input_size, generator=g)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = compiled.head.correction(z, state), compiled.head.gru_step(embed, state)
    assert sum(e.count for e in prof.key_averages() if e.key == "sglang_domino_cpu::linear") == 4
    with torch.no_grad():
        torch.testing.assert_close(got[0], reference.correction(z, state), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[1], reference.gru_step(embed, state), rtol=1e-5, atol=1e-5)
