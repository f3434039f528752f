"""Prefill-decode disaggregation on CPU over loopback, with Domino drafts on both sides:
SGLang 0.5.23's own PD machinery (mooncake's transfer engine, which takes TCP when the
machine has no RDMA device) and the Shepherd Model Gateway in PD mode, with no flag or
environment variable beyond upstream's PD flags. The decode side runs TP 2.

The pair gives the plain TP 1 server's greedy output with the single Domino server's
verify counts (the prompt's draft context arrives with the KV), also under concurrent
streams with a client disconnect, every KV slot back on both sides. A decode server
paired with a prefill server that does not draft serves exactly and warns, naming the
fix; a decode server without a draft paired with a drafting prefill server refuses the
request with the fix named, and the prefill server lives on."""

from __future__ import annotations

import random
import threading

import pytest

from sglang_domino import launch
from tests.e2e.client import HF_PROMPTS, check_streams_and_abort, generate_ids, transformers_spec
from tests.helpers.servers import BASE_ARGS, GATEWAY_GRACE, SPEC_CONFIGS, start_gateway

pytestmark = pytest.mark.sglang_e2e


@pytest.fixture(scope="module", autouse=True)
def mooncake():
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as err:
        pytest.fail(f"mooncake's transfer engine does not load ({err}): the PD tests need the test extra's "
                    "mooncake-transfer-engine-non-cuda and Debian's libibverbs1 (scripts/install.sh installs both)")


def _pd(mode: str) -> tuple[list[str], int]:
    boot = launch.free_port()
    return ["--disaggregation-mode", mode, "--disaggregation-transfer-backend", "mooncake",
            "--disaggregation-bootstrap-port", str(boot)], boot


@pytest.fixture(scope="module")
def single_counts(models):
    """The verify steps one Domino server takes for HF_PROMPTS: the Transformers backend's
    (`test_e2e_cpu` holds a single server to them)."""
    return [transformers_spec(models, "domino", ids)[1].num_verify_steps for ids in HF_PROMPTS]


@pytest.fixture(scope="module")
def pd(models, start, sglang_tmp):
    """A Domino prefill server (TP 1), a Domino decode server (TP 2) and the gateway in PD
    mode in front of them; yields a dict of them and the prefill bootstrap port."""
    domino = SPEC_CONFIGS["domino"].args(models)
    prefill_args, boot = _pd("prefill")
    prefill = start([*domino, *prefill_args], "pd-prefill")
    decode = start([*domino, *_pd("decode")[0], "--tp-size", "2"], "pd-decode-tp2")
    router = None
    try:
        model = prefill.get("/v1/models")["data"][0]["id"]
        router = start_gateway(["--pd-disaggregation", "--prefill", prefill.url, str(boot), "--decode", decode.url],
                               sglang_tmp, model, name="pd-gateway")
        yield dict(prefill=prefill, decode=decode, router=router, model=model, boot=boot)
    finally:
        if router is not None:
            router.stop(grace=GATEWAY_GRACE)
        prefill.stop()
        decode.stop()
    assert not router.group() and not prefill.group() and not decode.group()


def test_pd_through_the_gateway_gives_the_plain_output_with_the_single_servers_verify_counts(
        pd, expected, single_counts):
    bodies = [generate_ids(pd["router"], ids, model=pd["model"]) for ids in HF_PROMPTS]
    assert [b["output_ids"] for b in bodies] == expected["generate"]
    # the prompt's draft context arrived with the KV: the decode side drafts as one server does
    assert [b["meta_info"]["spec_verify_ct"] for b in bodies] == single_counts
    assert "drafts as this decode server does" in pd["decode"].log()


def test_pd_concurrent_streams_and_a_disconnect_free_every_kv_slot(pd, expected):
    check_streams_and_abort(pd["router"], expected["streams"], model=pd["model"],
                            workers=[pd["prefill"], pd["decode"]])


def test_pd_cached_prompt_prefix_is_sent_early(pd, expected):
    # the same prompt again: its prefix is in the prefill server's radix cache, which 0.5.23
    # sends ahead of the forward (a CUDA event on CPU without the CPU port)
    generate_ids(pd["router"], HF_PROMPTS[0], model=pd["model"])
    seen = len(pd["prefill"].log())
    body = generate_ids(pd["router"], HF_PROMPTS[0], model=pd["model"])
    assert body["output_ids"] == expected["generate"][0]
    batches = [line for line in pd["prefill"].log()[seen:].splitlines() if "Prefill batch" in line]
    assert any(not line.split("#cached-token: ")[1].startswith("0,") for line in batches), batches


def _pair(prefill, boot: int, decode, input_ids) -> tuple[int, object]:
    """One request sent as the gateway sends it: to the prefill and the decode server at
    once, with the prefill server's bootstrap address and a room; the decode side's answer."""
    room = random.randrange(2 ** 62)
    payload = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 32, "temperature": 0,
                                                           "ignore_eos": True},
               "bootstrap_host": launch.HOST, "bootstrap_port": boot, "bootstrap_room": room}
    prefill_side = {}
    thread = threading.Thread(target=lambda: prefill_side.update(r=prefill.post("/generate", payload, timeout=120)))
    thread.start()
    try:
        return decode.post("/generate", payload, timeout=120)
    finally:
        thread.join(timeout=130)


def test_decode_draft_without_a_prefill_draft_serves_exactly_and_warns_with_the_fix(pd, models, start, expected):
    prefill_args, boot = _pd("prefill")
    plain_prefill = start(["--model-path", models["target"], *BASE_ARGS, *prefill_args], "pd-prefill-plain")
    try:
        for ids, want in zip(HF_PROMPTS[:2], expected["generate"][:2]):
            status, body = _pair(plain_prefill, boot, pd["decode"], ids)
            assert status == 200, body
            assert body["output_ids"] == want
        log = pd["decode"].log()
        assert f"the prefill server {plain_prefill.url} serves without a DFLASH draft" in log
        assert "Fix: start the prefill server with --speculative-algorithm DFLASH" in log
    finally:
        plain_prefill.stop()


def test_prefill_draft_without_a_decode_draft_is_refused_and_the_prefill_server_lives_on(
        pd, models, start, expected):
    plain_decode = start(["--model-path", models["target"], *BASE_ARGS, *_pd("decode")[0]], "pd-decode-plain")
    try:
        status, body = _pair(pd["prefill"], pd["boot"], plain_decode, HF_PROMPTS[0])
        assert status != 200
        assert "PD draft mismatch, refused" in str(body)
        assert "Fix: start this decode server with --speculative-algorithm DFLASH" in str(body)
    finally:
        plain_decode.stop()
    # 0.5.23's transfer thread would have died on the draft buffers the decode side lacks
    assert "Transfer thread failed" not in pd["prefill"].log()
    body = generate_ids(pd["router"], HF_PROMPTS[1], model=pd["model"])
    assert body["output_ids"] == expected["generate"][1]
