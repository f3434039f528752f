"""`--tp-size 2 --device cpu` end to end: two gloo ranks, no flag or environment variable
beyond the single-rank command (`sglang_domino.sglang.cpu.parallel`).

Greedy output of the TP 2 plain server is the TP 1 output (float32, the tiny target);
DFlash and Domino at TP 2, verify width 16, 8 and adaptive, are token for token the TP 2
plain server's, with the vocabulary-parallel Domino rollout running through real gloo groups;
8 concurrent streams and an abort give the plain text back and every KV slot; stopping
the server leaves no rank running."""

from __future__ import annotations

import os

import pytest

from tests.e2e.client import (HF_PROMPTS, MAX_TOKENS, PENALISED, check_compiled_before_serving, check_streams_and_abort,
                              generate_ids, generate_penalised)
from tests.helpers.servers import BASE_ARGS, COMPILED, ServerConfig, alive

pytestmark = pytest.mark.sglang_e2e

TP = ("--tp-size", "2")
IDS = HF_PROMPTS
# "domino_adaptive": every rank runs rank 0's width (chosen from rank-local step timings);
# "_compiled": each rank's layers, context write and rollout compiled (`--enable-torch-compile`)
CONFIGS = {config.name: config for config in [
    ServerConfig("dflash", "dflash", flags=TP),
    ServerConfig("domino", "domino", flags=TP),
    ServerConfig("domino_w8", "domino", 8, flags=TP),
    ServerConfig("domino_adaptive", "domino", "adaptive", flags=TP),
    ServerConfig("domino_adaptive_compiled", "domino", "adaptive", flags=TP + COMPILED),
]}


def _outputs(server):
    return [generate_ids(server, ids)["output_ids"] for ids in IDS]


@pytest.fixture(scope="module")
def tp1(expected):
    """The TP 1 plain server's answers (shared by every end-to-end file)."""
    return {"ids": expected["generate"], "streams": expected["streams"]}


@pytest.fixture(scope="module")
def tp2_plain(models, start):
    server = start(["--model-path", models["target"], *BASE_ARGS, *TP], "tp2-plain")
    try:
        log = server.log()
        return {"ids": _outputs(server), "log": log, "children": set(server.children), "server": server}
    finally:
        server.stop()


def test_tp2_plain_server_gives_the_tp1_output_and_stops_every_rank(tp1, tp2_plain):
    assert tp2_plain["ids"] == tp1["ids"]
    log = tp2_plain["log"]
    assert "this CPU rank runs on cores" in log          # each rank pinned to its share
    assert "Expected a cuda device" not in log
    # the server and both ranks (scheduler processes) are gone after stop()
    children = tp2_plain["children"]
    assert len(children) >= 2
    assert not any(alive(pid) for pid in children | {tp2_plain["server"].pid})


@pytest.fixture(scope="module", params=list(CONFIGS))
def tp2_spec(request, models, start):
    config = CONFIGS[request.param]
    server = start(config.args(models), f"tp2-{config.name}")
    server.config = config
    yield server
    server.stop()
    assert not any(alive(pid) for pid in server.children) and not server.group()


def test_tp2_speculative_output_equals_tp2_plain(tp2_spec, tp2_plain):
    bodies = [generate_ids(tp2_spec, ids) for ids in IDS]
    assert [b["output_ids"] for b in bodies] == tp2_plain["ids"], tp2_spec.config.name
    assert all(b["meta_info"]["spec_verify_ct"] > 0 for b in bodies)
    # drafts were right often enough for multi-token commits on these prompts
    steps = sum(b["meta_info"]["spec_verify_ct"] for b in bodies)
    assert steps < len(IDS) * (MAX_TOKENS - 1)


def test_tp2_compiled_ranks_compile_before_serving(tp2_spec):
    """Each rank compiles its shard's graphs and the vocabulary-parallel rollout's while the
    server starts, none while it serves (run after the outputs above)."""
    if "--enable-torch-compile" not in tp2_spec.config.flags:
        pytest.skip("eager forwards")
    log = tp2_spec.log()
    for rank in (0, 1):
        lines = [line for line in log.splitlines() if f" TP{rank}]" in line or line.startswith(f"[rank{rank}]")]
        check_compiled_before_serving("\n".join(lines))


@pytest.mark.parametrize("name", list(PENALISED))
def test_tp2_penalised_output_equals_plain_decoding(tp2_spec, expected, name):
    """Penalties and min_new_tokens at TP 2: each rank penalises every row of the block with
    the tokens before it, as the synchronous plain server does (TP 1; greedy TP 2 = TP 1)."""
    assert generate_penalised(tp2_spec, PENALISED[name]) == expected["penalised"][name], (tp2_spec.config.name, name)


@pytest.mark.parametrize("tp2_spec", ["domino"], indirect=True)
def test_tp2_streams_and_abort_free_every_kv_slot(tp2_spec, tp1):
    check_streams_and_abort(tp2_spec, tp1["streams"])


def test_more_ranks_than_cores_stops_the_server_with_the_reason(models, start):
    ranks = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(RuntimeError, match=f"= {ranks} ranks on CPU needs a core per rank"):
        start(["--model-path", models["target"], *BASE_ARGS, "--tp-size", str(ranks)], f"tp{ranks}-refused")
