"""`sglang_domino.sglang.cpu.compiled.forward`: the layers of a CPU target or draft under
one `torch.compile` graph, in process, over layers built from upstream's own norm and
activation modules (a stand-in rotary and attention). Served end to end, greedy tokens
equal to the plain server's: `tests/e2e/test_e2e_cpu.py` (the `domino_adaptive_compiled`
server)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.sglang.cpu.layers import Holder, rms_norm

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 32, 4, 2, 8, 48


class Rotary:
    """A stand-in rotary embedding with `forward_native`'s signature (rotates pairs by
    the position, enough to make positions matter)."""

    def forward_native(self, positions, query, key):
        angle = positions.to(query.dtype)[:, None] * 0.1
        # rolled within each head, as a real rotary rotates pairs of a head's dims
        rolled = query.view(query.shape[0], -1, HEAD_DIM).roll(1, -1).view(query.shape)
        return query * torch.cos(angle) + rolled * torch.sin(angle), key * torch.cos(angle)


class Attention:
    """A stand-in for one layer's `RadixAttention`: causal attention over this call's rows,
    recording the batch it was given."""

    def __init__(self, index, seen):
        self.index, self.seen = index, seen

    def __call__(self, q, k, v, forward_batch):
        self.seen.append((self.index, forward_batch))
        t = q.shape[0]
        q = q.view(t, HEADS, HEAD_DIM).transpose(0, 1)
        k = k.view(t, KV_HEADS, HEAD_DIM).transpose(0, 1)
        v = v.view(t, KV_HEADS, HEAD_DIM).transpose(0, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(0, 1).reshape(t, HEADS * HEAD_DIM)


def _linear(g, out_features, in_features):
    return Holder(weight=torch.randn(out_features, in_features, generator=g) / in_features ** 0.5, bias=None)


def _layers(n, seen, seed=0):
    from sglang.srt.layers.activation import SiluAndMul
    g = torch.Generator().manual_seed(seed)

    def norm(size):
        return rms_norm(size, g)

    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layers = []
    for i in range(n):
        attn = Holder(qkv_proj=_linear(g, q_size + 2 * kv_size, HIDDEN), o_proj=_linear(g, HIDDEN, q_size),
                       q_norm=norm(HEAD_DIM), k_norm=norm(HEAD_DIM), rotary_emb=Rotary(), q_size=q_size,
                       kv_size=kv_size, head_dim=HEAD_DIM, attn=Attention(i, seen))
        mlp = Holder(gate_up_proj=_linear(g, 2 * INTER, HIDDEN), down_proj=_linear(g, HIDDEN, INTER),
                      act_fn=SiluAndMul())
        layers.append(Holder(self_attn=attn, mlp=mlp, input_layernorm=norm(HIDDEN),
                              post_attention_layernorm=norm(HIDDEN)))
    return layers, norm(HIDDEN)


def _inputs(rows, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HIDDEN, generator=g), torch.arange(rows, dtype=torch.int64) + 3


def _reference(layers, final_norm, hidden, positions):
    """Upstream's pre-norm layer, written out: the residual stream entering each layer."""
    residual, streams = None, []
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        if residual is None:
            residual, hidden = hidden, layer.input_layernorm.forward_native(hidden)
        else:
            hidden, residual = layer.input_layernorm.forward_native(hidden, residual)
        streams.append(residual)
        q, k, v = F.linear(hidden, attn.qkv_proj.weight).split([attn.q_size, attn.kv_size, attn.kv_size], -1)
        q = attn.q_norm.forward_native(q.reshape(-1, HEAD_DIM)).view(q.shape)
        k = attn.k_norm.forward_native(k.reshape(-1, HEAD_DIM)).view(k.shape)
        q, k = attn.rotary_emb.forward_native(positions, q, k)
        hidden = F.linear(attn.attn(q, k, v, None), attn.o_proj.weight)
        hidden, residual = layer.post_attention_layernorm.forward_native(hidden, residual)
        hidden = F.linear(mlp.act_fn.forward_native(F.linear(hidden, mlp.gate_up_proj.weight)), mlp.down_proj.weight)
    hidden, _ = final_norm.forward_native(hidden, residual)
    return hidden, streams


def _op_calls(fn, *keys):
    """How many times `fn` calls each op of `keys` (the profiler sees the kernel library's
    calls and the ones it makes from C++)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    counts = {e.key: e.count for e in prof.key_averages()}
    return out, [counts.get(key, 0) for key in keys]


@pytest.mark.parametrize("inference, packed", [(False, True), (True, False)],
                         ids=["grad-free (target), packed for oneDNN", "inference (draft), unpacked"])
def test_compiled_layers_match_the_eager_layers_and_compile_nothing_after_the_warm_up(caplog, monkeypatch,
                                                                                       inference, packed):
    """Every row count (one row, a decode batch, verify blocks, a prefill), in the mode the
    warm-up was given (the target grad-free, the draft in inference mode), runs the two
    graphs the warm-up compiled, with the step's batch handed to every layer's attention,
    and gives the eager layers' hidden states and residual streams; with the projections
    packed for oneDNN (as served) each projection is one call of the kernel library's
    linear op, which multiplies through the packed copies above its few rows."""
    from sglang_domino.kernels import cpu_linear
    from sglang_domino.sglang.cpu.compiled import layers as cl

    seen = []
    layers, final_norm = _layers(3, seen)
    compiled = cl.CompiledLayers(layers, final_norm)
    if packed:
        assert compiled.pack() == (12, sum(4 * p.numel() for l in layers for m in cl.CompiledLayers.projections(l)
                                           for p in [m.weight]))
    cut = cpu_linear.small_rows()
    real, calls = compiled._compiled, []
    compiled._compiled = lambda h, p: calls.append((int(h.shape[0]), torch.is_inference_mode_enabled())) or real(h, p)
    compiled.warm(torch.float32, HIDDEN, inference=inference)
    compiled._compiled = real
    assert calls == [(1, inference), (2, inference)]    # one row and many, in the model's mode only
    assert compiled.warmed and seen == []    # the warm-up never reaches an attention module
    graphs = compiled.graphs()
    batch = object()
    with caplog.at_level(logging.WARNING, logger=cl.__name__):
        for rows in (1, 2, 5, 16, 17, HIDDEN, HEAD_DIM, 48, 7):
            seen.clear()
            # the draft may be given hidden states made outside its mode: mixed inputs
            with torch.inference_mode(rows % 3 == 0):
                hidden, positions = _inputs(rows, seed=rows)
            with torch.inference_mode(inference):
                (got, streams), (linears, onednn) = _op_calls(lambda: compiled(hidden, positions, batch),
                                                              "sglang_domino_cpu::linear",
                                                              "mkldnn::_linear_pointwise")
                assert got.is_inference() == inference
            assert [i for i, _ in seen] == [0, 1, 2] and all(b is batch for _, b in seen)
            assert linears == 12   # 3 layers x 4 projections
            assert onednn == (12 if packed and rows > cut else 0)
            want, want_streams = _reference(layers, final_norm, hidden, positions)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            assert len(streams) == 3
            for s, w in zip(streams, want_streams):
                torch.testing.assert_close(s, w, rtol=1e-4, atol=1e-5)
    assert compiled.graphs() == graphs
    assert cl.NEW_GRAPH not in caplog.text
    # positions of a dtype the warm-up did not compile are a new graph, and say so
    hidden, positions = _inputs(4, seed=1)
    with caplog.at_level(logging.WARNING, logger=cl.__name__), torch.inference_mode(inference):
        compiled(hidden, positions.to(torch.int32), batch)
    assert cl.NEW_GRAPH in caplog.text


def test_the_attention_and_all_reduce_ops_outside_a_step_return_zeros_and_their_input():
    """Compiling at load time there is no step: attention gives zeros and the all-reduce
    its input, on each rank alone (no collective while the ranks load)."""
    from sglang_domino.sglang.cpu.compiled import graph_ops

    q = torch.randn(3, HEADS * HEAD_DIM)
    out = torch.ops.sglang_domino.cpu_attention(q, torch.randn(3, 16), torch.randn(3, 16), 0)
    assert torch.equal(out, torch.zeros_like(q)) and graph_ops._Step.batch is None
    group = graph_ops.reduce_group(SimpleNamespace(tp_group=SimpleNamespace(world_size=2)))
    assert group >= 0 and graph_ops.reduce_group(SimpleNamespace(tp_group=None)) == -1
    assert torch.equal(torch.ops.sglang_domino.cpu_all_reduce(q, group), q)


def test_a_graph_takes_the_floats_it_reads_off_modules_as_constants_and_leaves_dynamos_setting_as_it_was():
    """`switches.Graph` traces with floats specialized (a norm's eps is a constant guarded by
    value, not a tensor built on every call: a new value is a new graph), and restores
    dynamo's process-wide setting after every call, a failing one too."""
    import torch._dynamo
    import torch._dynamo.utils as dynamo_utils

    from sglang_domino.sglang.cpu.compiled.switches import Graph

    norm = rms_norm(8, torch.Generator().manual_seed(0))
    before = torch._dynamo.config.specialize_float
    graph = Graph(lambda x: norm.forward_native(x) * 2)
    graphs = lambda: dynamo_utils.counters["stats"]["unique_graphs"]  # noqa: E731
    x = torch.randn(3, 8)
    torch.testing.assert_close(graph(x), norm.forward_native(x) * 2)
    assert torch._dynamo.config.specialize_float == before
    count = graphs()
    graph(torch.randn(5, 8))
    assert graphs() == count   # the same eps: the same graphs
    norm.variance_epsilon = 0.5
    torch.testing.assert_close(graph(x), norm.forward_native(x) * 2)
    assert graphs() == count + 1   # the eps was a constant of the graph
    with pytest.raises(ValueError, match="hidden_size"):   # the norm's own check, raised while tracing
        graph(torch.randn(3, 7))
    assert torch._dynamo.config.specialize_float == before


def test_the_target_hands_dflash_the_streams_of_its_captured_layers():
    """`layers_to_capture` counts from the model's first layer: the streams entering
    those layers, in upstream's container; none when DFLASH captures nothing."""
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList

    from sglang_domino.sglang.cpu.compiled import forward as cf

    inner = SimpleNamespace(layers=[], start_layer=0, end_layer=0, norm=None, embed_tokens=None, layers_to_capture=[2, 5])
    model = SimpleNamespace(model=inner, capture_aux_hidden_states=True, forward=None)
    target = cf.CompiledTarget(model)
    streams = [torch.full((1,), float(i)) for i in range(6)]
    aux = target.aux(streams)
    assert isinstance(aux, AuxHiddenStateList) and [int(t) for t in aux] == [2, 5]
    model.capture_aux_hidden_states = False
    assert target.aux(streams) is None


def test_sglangs_own_flag_switches_the_compiled_step_on_cpu_and_the_old_switches_are_refused():
    from sglang_domino.sglang.seam import hooks
    from sglang_domino.sglang.cpu.compiled import switches

    args = lambda device, flag: SimpleNamespace(device=device, enable_torch_compile=flag)  # noqa: E731
    assert switches.compiled_step(args("cpu", True))
    assert not switches.compiled_step(args("cpu", False)) and not switches.compiled_step(args("cuda", True))
    assert not hooks.install_group(hooks.CPU_FORWARD, args("cpu", False))
    from sglang_domino.sglang import environment

    for name in ("SGLANG_DOMINO_CPU_FORWARD", "SGLANG_DOMINO_CPU_ROLLOUT"):
        with pytest.raises(ValueError, match=f"{name} was removed: .*--enable-torch-compile .*--device cpu"):
            environment.refuse_removed({name: "compiled"})
    environment.refuse_removed({})


def test_the_compile_cache_is_sglangs_unless_torchs_variable_names_one(monkeypatch, tmp_path):
    from sglang_domino.sglang.cpu.compiled import switches

    monkeypatch.delenv(switches.CACHE_ENV, raising=False)
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "sglang"))
    assert switches.cache_dir() == str(tmp_path / "sglang" / "inductor")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv(switches.CACHE_ENV, default_cache_dir())   # torch's own, set by torch itself
    assert switches.cache_dir() == str(tmp_path / "sglang" / "inductor")
    monkeypatch.setenv(switches.CACHE_ENV, str(tmp_path / "mine"))
    assert switches.persistent_cache() == str(tmp_path / "mine") and (tmp_path / "mine").is_dir()


def test_the_cpu_kernels_are_built_into_the_compile_cache_and_a_failed_build_refuses_the_start(monkeypatch,
                                                                                              tmp_path):
    from sglang_domino.kernels import cpu_build, cpu_paged_attention
    from sglang_domino.sglang.cpu import attention
    from sglang_domino.sglang.cpu.compiled import forward as cf, switches

    monkeypatch.setenv(switches.CACHE_ENV, str(tmp_path / "cache"))
    built = []
    monkeypatch.setattr(cpu_build, "build", lambda directory: built.append(directory))
    monkeypatch.setattr(attention._Kernel, "op", None)
    cf.build_kernels()
    assert built == [str(tmp_path / "cache" / "kernels")] and attention._Kernel.op == cpu_paged_attention.op()

    def no_compiler(directory):
        raise RuntimeError("g++: not found")

    monkeypatch.setattr(cpu_build, "build", no_compiler)
    with pytest.raises(RuntimeError, match="--enable-torch-compile with --device cpu: the CPU kernels "
                                           "could not be built: g[+][+]: not found"):
        cf.build_kernels()


@pytest.mark.parametrize("draft", [False, True])
def test_a_model_it_cannot_compile_is_refused_at_load_naming_why(monkeypatch, draft):
    from sglang_domino.sglang.cpu.compiled import forward as cf

    class Other:
        pass

    flag = SimpleNamespace(device="cpu", enable_torch_compile=True)
    runner = SimpleNamespace(device="cpu", is_draft_worker=draft, model=Other(), server_args=flag)
    want = "only DFlashDraftModel" if draft else "only Qwen3ForCausalLM"
    kind = "draft" if draft else "target"
    with pytest.raises(ValueError, match=f"--enable-torch-compile with --device cpu cannot compile this {kind}: "
                                         f".*Other.*{want}.*; serve it without --enable-torch-compile"):
        cf.after_load_model(None, runner)
    # a GPU runner, or a server without the flag, leaves the model alone
    assert cf.after_load_model("r", SimpleNamespace(device="cuda", is_draft_worker=draft, model=Other(),
                                                    server_args=flag)) == "r"
    runner.server_args = SimpleNamespace(device="cpu", enable_torch_compile=False)
    assert cf.after_load_model("r", runner) == "r" and not hasattr(runner.model, "forward")


class _RankAttention(Attention):
    """`Attention` over one rank's heads (its share of the q and kv heads)."""

    def __init__(self, index, seen, heads, kv_heads):
        super().__init__(index, seen)
        self.heads, self.kv_heads = heads, kv_heads

    def __call__(self, q, k, v, forward_batch):
        t = q.shape[0]
        q = q.view(t, self.heads, HEAD_DIM).transpose(0, 1)
        k = k.view(t, self.kv_heads, HEAD_DIM).transpose(0, 1)
        v = v.view(t, self.kv_heads, HEAD_DIM).transpose(0, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(0, 1).reshape(t, self.heads * HEAD_DIM)


def _shard(layers, rank, world, group):
    """Rank `rank`'s share of `layers` as upstream's tensor parallelism cuts them: its q and
    kv heads, the o_proj's and down_proj's input columns (row-parallel, reduced over
    `group`), its gate and up rows."""
    heads, kv_heads, inter = HEADS // world, KV_HEADS // world, INTER // world
    q_all, kv_all = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q_rows = slice(rank * heads * HEAD_DIM, (rank + 1) * heads * HEAD_DIM)
    kv_rows = slice(rank * kv_heads * HEAD_DIM, (rank + 1) * kv_heads * HEAD_DIM)
    i_rows = slice(rank * inter, (rank + 1) * inter)
    out = []
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        w = attn.qkv_proj.weight
        qkv = torch.cat([w[:q_all][q_rows], w[q_all:q_all + kv_all][kv_rows], w[q_all + kv_all:][kv_rows]])
        gate_up = torch.cat([mlp.gate_up_proj.weight[:INTER][i_rows], mlp.gate_up_proj.weight[INTER:][i_rows]])
        rank_attn = Holder(
            qkv_proj=Holder(weight=qkv, bias=None),
            o_proj=Holder(weight=attn.o_proj.weight[:, q_rows].contiguous(), bias=None, tp_group=group),
            q_norm=attn.q_norm, k_norm=attn.k_norm, rotary_emb=attn.rotary_emb, q_size=heads * HEAD_DIM,
            kv_size=kv_heads * HEAD_DIM, head_dim=HEAD_DIM, attn=_RankAttention(i, attn.attn.seen, heads, kv_heads))
        rank_mlp = Holder(gate_up_proj=Holder(weight=gate_up, bias=None),
                           down_proj=Holder(weight=mlp.down_proj.weight[:, i_rows].contiguous(), bias=None,
                                             tp_group=group),
                           act_fn=mlp.act_fn)
        out.append(Holder(self_attn=rank_attn, mlp=rank_mlp, input_layernorm=layer.input_layernorm,
                           post_attention_layernorm=layer.post_attention_layernorm))
    return out


def test_tensor_parallel_ranks_run_their_shards_compiled_and_reduce_to_the_whole_model():
    """`--tp-size 2`: each rank compiles its shard of the layers (the warm-up on its own, no
    collective), and serving reduces the row-parallel projections over the rank group:
    every rank's hidden states and residual streams are the unsharded layers'.

    The ranks are threads of a fresh interpreter: beside the graphs this module's other
    tests compiled, two threads entering compiled code hung or crashed the process (a test
    artifact: a server's ranks are processes)."""
    from tests.helpers.fresh import run_fresh

    run_fresh(tensor_parallel_ranks, "ranks equal to the whole model")


def tensor_parallel_ranks():
    import threading

    from sglang_domino.sglang.cpu.compiled import layers as cl
    from tests.sglang.tp_fakes import Exchange, FakeGroup

    world, seen = 2, []
    layers, final_norm = _layers(2, seen, seed=3)
    exchange = Exchange(world)
    groups = [FakeGroup(exchange, r) for r in range(world)]
    ranks = [cl.CompiledLayers(_shard(layers, r, world, groups[r]), final_norm) for r in range(world)]
    for compiled in ranks:
        compiled.pack()   # as served: each rank's shards packed for oneDNN
        compiled.warm(torch.float32, HIDDEN, inference=False)   # one rank after the other: no collective at load
    assert not any(g.calls for g in groups)
    for rows in (1, 6):
        hidden, positions = _inputs(rows, seed=20 + rows)
        want, want_streams = _reference(layers, final_norm, hidden, positions)
        results, errors = [None] * world, []

        def rank(r):
            try:
                with torch.inference_mode():
                    results[r] = ranks[r](hidden, positions, object())
            except Exception as err:   # surfaced below
                errors.append(err)

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
        [t.start() for t in threads]
        [t.join(60) for t in threads]
        assert not errors, errors
        for got, streams in results:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            for s, w in zip(streams, want_streams):
                torch.testing.assert_close(s, w, rtol=1e-4, atol=1e-5)
    assert all(g.calls.count("all_reduce") == 2 * 2 * 2 for g in groups)   # 2 layers x 2 projections x 2 runs
    print("ranks equal to the whole model")


def test_the_shape_warm_up_covers_every_batch_at_every_width_and_compiles_nothing_new(monkeypatch):
    """The row counts a server's forwards serve (plain decode, the verify at the window and
    at every adaptive width, a draft's block) for 1 to max_running_requests requests; in
    bfloat16 each runs once at start-up on the warm graphs (no graph compiled), float32
    warms none."""
    from sglang_domino.sglang import settings
    from sglang_domino.sglang.cpu.compiled import forward as cf
    from sglang_domino.sglang.cpu.compiled import layers as cl
    from sglang_domino.sglang.adaptive import AdaptiveWidthConfig

    plain = SimpleNamespace(max_running_requests=3, speculative_algorithm=None)
    assert cf.serving_rows(plain, draft=False) == [1, 2, 3]
    spec = SimpleNamespace(max_running_requests=2, speculative_algorithm="DFLASH", speculative_num_draft_tokens=8)
    monkeypatch.setenv(settings.SETTINGS_ENV, settings.SchedulerSettings(draft_block=16).model_dump_json())
    assert cf.serving_rows(spec, draft=False) == [8, 16] and cf.serving_rows(spec, draft=True) == [16, 32]
    adaptive = settings.SchedulerSettings(adaptive=AdaptiveWidthConfig(widths=[16, 4, 1]))
    monkeypatch.setenv(settings.SETTINGS_ENV, adaptive.model_dump_json())
    assert cf.serving_rows(spec, draft=False) == [1, 2, 4, 8, 16, 32]
    assert len(cf.serving_rows(SimpleNamespace(max_running_requests=1000, speculative_algorithm=None), False)) \
        == cf.WARM_BATCH_CAP

    seen = []
    layers, final_norm = _layers(2, seen, seed=4)
    for module in [final_norm, *layers]:
        module.to(torch.bfloat16)
    compiled = cl.CompiledLayers(layers, final_norm)
    compiled.warm(torch.bfloat16, HIDDEN, inference=True)
    graphs = compiled.graphs()
    calls = []
    real = compiled._compiled
    compiled._compiled = lambda hidden, positions: calls.append(int(hidden.shape[0])) or real(hidden, positions)
    assert cf.warm_shapes(compiled, torch.float32, HIDDEN, [1, 2, 3], inference=False, packed=False) == 0.0
    assert not calls
    cf.warm_shapes(compiled, torch.bfloat16, HIDDEN, [1, 4, 7, 16], inference=True, packed=False)
    assert calls == [1, 4, 7, 16] and compiled.graphs() == graphs and seen == []


def _onednn_kernels_built(capfd, fn) -> int:
    """How many kernels oneDNN builds (its verbose log's `create:cache_miss` lines) while `fn` runs."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
        fn()
    return sum("create:cache_miss" in line for line in capfd.readouterr().out.splitlines())


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
def test_in_float32_the_shape_warm_up_builds_every_onednn_kernel_the_packed_layers_serve(capfd):
    """In float32 the warm-up runs each distinct packed product (a bias in the product or
    added after it, as the layers project) once per row count above the linear op's few
    rows, not the layers: afterwards the compiled layers at those row counts build no
    oneDNN kernel, and one row count it did not warm does (the count sees them)."""
    from sglang_domino.kernels import cpu_linear
    from sglang_domino.sglang.cpu.compiled import forward as cf
    from sglang_domino.sglang.cpu.compiled import layers as cl

    g = torch.Generator().manual_seed(7)
    seen = []
    layers, final_norm = _layers(2, seen, seed=5)
    for layer in layers:   # a bias in the qkv product, and one the output projection adds after its product
        layer.self_attn.qkv_proj.bias = torch.randn(layer.self_attn.qkv_proj.weight.shape[0], generator=g)
        layer.self_attn.o_proj.bias = torch.randn(HIDDEN, generator=g)
    compiled = cl.CompiledLayers(layers, final_norm)
    assert compiled.pack()[0] == 8
    compiled.warm(torch.float32, HIDDEN, inference=False)
    cut = cpu_linear.small_rows()
    rows = [1, cut, cut + 1, cut + 7, 3 * cut + 5]
    real, calls = compiled._compiled, []
    compiled._compiled = lambda h, p: calls.append(int(h.shape[0])) or real(h, p)
    # 4 distinct products (both layers share their shapes) x 3 row counts above the cut
    assert cf.warm_products(compiled, rows) == 12
    cf.warm_shapes(compiled, torch.float32, HIDDEN, rows, inference=False, packed=True)
    compiled._compiled = real
    assert calls == [] and seen == []   # the layers themselves never ran
    batch = object()
    for n in rows:
        hidden, positions = _inputs(n, seed=n)
        assert _onednn_kernels_built(capfd, lambda: compiled(hidden, positions, batch)) == 0, n
    hidden, positions = _inputs(5 * cut + 3, seed=1)   # a count no other test multiplies at
    assert _onednn_kernels_built(capfd, lambda: compiled(hidden, positions, batch)) > 0


_ONEDNN_EVICTION = """
import sys
import torch
from sglang_domino.sglang.cpu.compiled import switches
switches.prepare()
packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(16, 8), None)
def product(rows):
    torch.ops.mkldnn._linear_pointwise(torch.zeros(rows, 8), packed, None, "none", [], "")
for rows in range(17, 17 + 600):   # 1200 kernels: past oneDNN's default cache of 1024
    product(rows)
sys.stdout.flush()
with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
    product(17)                     # the first one built
"""


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("user", [None, "1024"], ids=["ours", "the user's"])
def test_the_compiled_step_sizes_onednns_kernel_cache_for_its_warm_up_unless_the_user_did(tmp_path, user):
    """`switches.prepare` (before a model-running process builds its model) raises oneDNN's
    kernel cache above its default of 1024, which an adaptive server's warm-up overflows:
    in a fresh process, 1200 kernels later the first one is still cached; a capacity the
    user set is kept (and then the first one is built again)."""
    import os
    import subprocess
    import sys

    from sglang_domino.sglang.cpu.compiled import switches

    env = {k: v for k, v in os.environ.items() if k != switches.ONEDNN_CACHE_ENV}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    if user is not None:
        env[switches.ONEDNN_CACHE_ENV] = user
    done = subprocess.run([sys.executable, "-c", _ONEDNN_EVICTION], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    created = [line for line in done.stdout.splitlines() if ",primitive,create" in line and "inner_product" in line]
    assert len(created) == 1, done.stdout[-2000:]
    assert ("cache_hit" if user is None else "cache_miss") in created[0]
