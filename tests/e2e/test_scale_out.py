"""Scaling out on SGLang's own machinery, end to end on CPU over loopback, with a Domino
draft: tensor parallelism across two "nodes" (two `sglang serve` processes joined by
`--nnodes 2 --dist-init-addr`), data parallelism (`--dp-size 2`), and the Shepherd Model
Gateway (`smg`) in front of the two-node and the DP 2 server. Each gives the TP 1 plain server's greedy output,
serves 8 streams plus an abort with every KV slot back, and leaves no process behind."""

from __future__ import annotations

import os

import pytest

from sglang_domino import launch
from tests.e2e.client import HF_PROMPTS, PROMPTS, check_streams_and_abort, completion, generate_ids
from tests.helpers.servers import GATEWAY_GRACE, SPEC_CONFIGS, server_env, start_gateway

pytestmark = pytest.mark.sglang_e2e


def _domino(models) -> list[str]:
    return SPEC_CONFIGS["domino"].args(models)


@pytest.fixture(scope="module")
def two_nodes(models, start, sglang_tmp):
    """TP 2 over two processes, one rank each: node 1 joins node 0, which serves HTTP."""
    common = [*_domino(models), "--tp-size", "2", "--nnodes", "2",
              "--dist-init-addr", f"{launch.HOST}:{launch.free_port()}"]
    port = launch.free_port()
    node1 = launch.Server(launch.sglang_command([*common, "--node-rank", "1"], port), port,
                          os.path.join(sglang_tmp, f"server-node1-{port}.log"), env=server_env(sglang_tmp))
    try:
        node0 = start([*common, "--node-rank", "0"], "node0")
        node1._note_children()
        yield node0, node1
        node0.stop()
    finally:
        node1.stop(grace=30)
    assert not node0.group() and not node1.group()


def test_two_node_tp2_gives_the_tp1_plain_output(two_nodes, expected):
    node0, _ = two_nodes
    bodies = [generate_ids(node0, ids) for ids in HF_PROMPTS]
    assert [b["output_ids"] for b in bodies] == expected["generate"]
    assert all(b["meta_info"]["spec_verify_ct"] > 0 for b in bodies)


def test_each_node_splits_its_own_cores_among_its_own_ranks(two_nodes):
    # one rank per node: it gets every core of its node (not a share of a split made for
    # the global rank count, which left a core idle)
    cores = sorted(os.sched_getaffinity(0))
    for node in two_nodes:
        assert f"this CPU rank runs on cores {cores}" in node.log()


def test_two_node_tp2_streams_and_abort_free_every_kv_slot(two_nodes, expected):
    check_streams_and_abort(two_nodes[0], expected["streams"])


@pytest.fixture(scope="module")
def dp2(models, start):
    server = start([*_domino(models), "--dp-size", "2"], "dp2-domino")
    yield server
    server.stop()
    assert not server.group()


def test_dp2_gives_the_tp1_plain_output_from_both_workers(dp2, expected):
    bodies = [generate_ids(dp2, ids) for ids in HF_PROMPTS]
    assert [b["output_ids"] for b in bodies] == expected["generate"]
    assert all(b["meta_info"]["spec_verify_ct"] > 0 for b in bodies)
    check_streams_and_abort(dp2, expected["streams"])
    # both workers run this project's worker and both served requests
    log = dp2.log()
    for rank in (0, 1):
        assert f" DP{rank}] sglang-domino DFLASH worker: device=cpu" in log, f"DP{rank}"
        assert f" DP{rank}] Prefill batch" in log, f"DP{rank}"


@pytest.fixture(scope="module")
def gateway(two_nodes, dp2, sglang_tmp):
    """`smg launch` (round robin) in front of two Domino servers of different shapes, the
    two-node TP 2 server (node 0 serves HTTP) and the DP 2 server; yields (gateway,
    workers, the served model name, which the gateway routes by)."""
    workers = [two_nodes[0], dp2]
    model = workers[0].get("/v1/models")["data"][0]["id"]
    router = start_gateway(["--worker-urls", *[w.url for w in workers], "--policy", "round_robin"],
                           sglang_tmp, model)
    try:
        yield router, workers, model
    finally:
        router.stop(grace=GATEWAY_GRACE)
    assert not router.group()


def _prefills(server) -> int:
    return server.log().count("Prefill batch")


def test_gateway_routes_to_both_servers_and_gives_the_plain_output(gateway, expected):
    router, workers, model = gateway
    before = [_prefills(w) for w in workers]
    for prompt in PROMPTS:
        assert completion(router, prompt, model=model) == expected["completions"][prompt], prompt
    bodies = [generate_ids(router, ids, model=model) for ids in HF_PROMPTS]
    assert [b["output_ids"] for b in bodies] == expected["generate"]
    assert all(b["meta_info"]["spec_verify_ct"] > 0 for b in bodies)
    assert all(_prefills(w) > n for w, n in zip(workers, before)), "round robin used one server only"


def test_gateway_streams_and_a_disconnect_free_every_kv_slot(gateway, expected):
    router, workers, model = gateway
    check_streams_and_abort(router, expected["streams"], model=model, workers=workers)
