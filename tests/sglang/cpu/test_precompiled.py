"""The compiled CPU step's graphs are compiled ahead, saved beside the compile cache and
loaded by the next start-up instead of traced again (`cpu/compiled/precompiled.py`), and a
saved graph is used only where it still holds (its guards, the globals it read, the
sources it traced, an unreadable file)."""

from __future__ import annotations

import glob
import json
import logging
import os

import pytest
import torch

from tests.sglang.cpu.test_compiled_forward import HIDDEN, _inputs, _layers, _reference


@pytest.fixture
def graphs_dir(tmp_path, monkeypatch):
    """A process serving the compiled step (graphs are compiled ahead there), its saved
    graphs in a fresh directory (inductor's own cache stays the suite's)."""
    from sglang_domino.sglang.cpu.compiled import switches

    monkeypatch.setattr(switches, "cache_dir", lambda: str(tmp_path))
    monkeypatch.setattr(switches._Process, "compiled", True)
    return tmp_path


def _start(layers, final_norm):
    """What a server's start-up does with a model's layers: wrap them and compile their
    graph of many rows (the warm-up also compiles the one of one row; left out to keep
    the test short); the graphs (loaded, compiled ahead) and the traces dynamo made."""
    import torch._dynamo.utils as dynamo_utils

    from sglang_domino.sglang.cpu.compiled import layers as cl, precompiled

    traced = dynamo_utils.counters["stats"]["unique_graphs"]
    before = precompiled.tally()
    compiled = cl.CompiledLayers(layers, final_norm)
    with torch.no_grad():
        compiled(torch.zeros(2, HIDDEN), torch.zeros(2, dtype=torch.int64), None)
    loaded, made = (now - then for now, then in zip(precompiled.tally(), before))
    return compiled, loaded, made, dynamo_utils.counters["stats"]["unique_graphs"] - traced


def _saved(directory) -> list[str]:
    return sorted(glob.glob(os.path.join(str(directory), "sglang_domino_graphs", "*", "*.graph")))


def _check_outputs(compiled, layers, final_norm):
    for rows in (3, 5):
        hidden, positions = _inputs(rows, seed=rows)
        out, streams = compiled(hidden, positions, object())   # a step: the attention runs
        want, want_streams = _reference(layers, final_norm, hidden, positions)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        for got, ref in zip(streams, want_streams):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_a_restart_loads_the_graphs_the_first_start_compiled_ahead_and_traces_nothing(graphs_dir):
    seen = []
    layers, final_norm = _layers(1, seen)
    first, loaded, made, _ = _start(layers, final_norm)
    assert (loaded, made) == (0, 1) and len(_saved(graphs_dir)) == 1
    _check_outputs(first, layers, final_norm)

    again, loaded, made, traced = _start(layers, final_norm)   # a new server's wrapper, the same model
    assert (loaded, made, traced) == (1, 0, 0)
    _check_outputs(again, layers, final_norm)
    assert again.graphs() == 1

    # another model on the same code: the saved graphs' guards (the number of layers) refuse
    # it, its own graphs are compiled and saved beside the first model's
    other, other_norm = _layers(2, seen, seed=1)
    third, loaded, made, _ = _start(other, other_norm)
    assert (loaded, made) == (0, 1) and len(_saved(graphs_dir)) == 2
    _check_outputs(third, other, other_norm)
    assert _start(layers, final_norm)[1:3] == (1, 0)   # the first model's are still there


class Projection:
    """A small function to compile: one projection through the kernel library's op (its
    traced code reads a global, the flag saying the library is loaded)."""

    def __init__(self):
        self.weight = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))

    def project(self, x):
        from sglang_domino.sglang.cpu.compiled import packed_linear

        return packed_linear.linear(x, self.weight, None) * 2


def _run(x) -> tuple[int, int]:
    """A new start-up's graph over `Projection.project` called once: (loaded, compiled)."""
    from sglang_domino.sglang.cpu.compiled import precompiled
    from sglang_domino.sglang.cpu.compiled.switches import Graph

    projection = Projection()
    before = precompiled.tally()
    torch.testing.assert_close(Graph(projection.project)(x), x @ projection.weight.T * 2)
    loaded, made = (now - then for now, then in zip(precompiled.tally(), before))
    return loaded, made


def test_a_saved_graph_that_no_longer_holds_is_compiled_again(graphs_dir, monkeypatch, caplog):
    from torch._dynamo import package

    x = torch.randn(3, 4)
    assert _run(x) == (0, 1) and _run(x) == (1, 0)

    # a global the graph read while tracing (the library's flag) reads differently now
    sidecar, = glob.glob(os.path.join(str(graphs_dir), "sglang_domino_graphs", "*", "*.globals.json"))
    with open(sidecar, encoding="utf-8") as fh:
        saved = json.load(fh)
    assert any("cpu_linear" in name for name, _, _ in saved.values()), saved
    for entry in saved.values():
        entry[2] = "'something else'"
    with open(sidecar, "w", encoding="utf-8") as fh:
        json.dump(saved, fh)
    assert _run(x) == (0, 1)

    # a file that cannot be read back (a truncated write, another torch's)
    for path in _saved(graphs_dir):
        with open(path, "wb") as fh:
            fh.write(b"not a graph")
    with caplog.at_level(logging.INFO, logger="sglang_domino.sglang.cpu.compiled.precompiled"):
        assert _run(x) == (0, 1)
    assert "not used" in caplog.text

    # a source line the graph traced has changed since
    assert _run(x) == (1, 0)
    monkeypatch.setattr(package, "_hash_sourcelines", lambda *args: "changed")
    assert _run(x) == (0, 1)


def test_outside_a_server_graphs_are_compiled_on_their_calls(tmp_path, monkeypatch):
    from sglang_domino.sglang.cpu.compiled import switches

    monkeypatch.setattr(switches, "cache_dir", lambda: str(tmp_path))
    assert not switches.compiled_step_serving()
    assert _run(torch.randn(3, 4)) == (0, 0) and _saved(tmp_path) == []


def test_a_function_that_cannot_be_compiled_ahead_is_compiled_on_its_calls_with_a_warning(graphs_dir, caplog):
    from sglang_domino.sglang.cpu.compiled.switches import Graph

    class Branchy:
        def f(self, x):
            if x.sum().item() > 0:   # a host read: a graph break, no whole graph ahead
                return x * 2
            return x - 1

    graph = Graph(Branchy().f)
    x = torch.ones(3, 4)
    with caplog.at_level(logging.WARNING):
        torch.testing.assert_close(graph(x), x * 2)
        torch.testing.assert_close(graph(-x), -x - 1)
    assert "is compiled on its first calls, not ahead" in caplog.text
    assert caplog.text.count("not ahead") == 1 and _saved(graphs_dir) == []


def test_the_code_digest_reads_only_the_packages_own_sources():
    """A checkout's root holds virtual environments (tens of thousands of sources): the
    digest a saved graph is filed under reads the package's folder and its kernels only."""
    import sglang_domino
    import sglang_domino.kernels as kernels
    from sglang_domino.sglang.cpu.compiled import precompiled

    roots = [os.path.dirname(sglang_domino.__file__), *kernels.__path__]
    sources = precompiled.package_sources()
    assert os.path.abspath(precompiled.__file__) in sources
    assert any(path.endswith("cpu_linear.cpp") for path in sources)
    assert all(any(path.startswith(os.path.abspath(root) + os.sep) for root in roots) for path in sources)
    assert not any("__pycache__" in path for path in sources)
