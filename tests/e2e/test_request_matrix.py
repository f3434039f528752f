"""Every per-request parameter that changes tokens (`request_matrix.ROWS`: penalties,
`min_tokens`, logit bias, stop strings and ids, `ignore_eos`, `n`, `max_tokens` 1,
log-probabilities of the prompt and the output, JSON-schema, regex and EBNF grammars),
asked of the plain server and of the DFlash, Domino, b8 (verify width 8 of the 16-token
block) and adaptive servers on the committed test bed: each speculative server answers
every row as the plain server does."""

from __future__ import annotations

import os
import re
import urllib.request

import pytest

from tests.e2e.conftest import SYNC
from tests.e2e.request_matrix import ROWS, TESTBED, answer, heldout
from tests.helpers.servers import BASE_ARGS

pytestmark = pytest.mark.sglang_e2e

TARGET = ["--model-path", os.path.join(TESTBED, "target"), *BASE_ARGS, "--enable-custom-logit-processor"]


def _draft(name: str, *flags: str) -> list[str]:
    return [*TARGET, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
            os.path.join(TESTBED, name), "--enable-metrics", *flags]


SERVERS = {
    "dflash": _draft("dflash"),
    "domino": _draft("domino"),
    "domino_b8": _draft("domino", "--speculative-num-draft-tokens", "8"),
    "domino_adaptive": _draft("domino", "--speculative-adaptive"),
}


@pytest.fixture(scope="module")
def plain(start):
    """The plain server's answer to every row, with and without its parameter (stopped
    before any speculative server starts: one server at a time on 2 cores). Its
    synchronous loop: 0.5.23's overlap loop applies penalties one token late
    (`tests/e2e/conftest.py`, SYNC)."""
    server = start([*TARGET, *SYNC], "matrix-plain")
    try:
        return {row.name: (answer(server, row), answer(server, row, row.without)) for row in ROWS}
    finally:
        server.stop()


@pytest.fixture(scope="module", params=list(SERVERS))
def spec(request, start, plain):
    server = start(SERVERS[request.param], f"matrix-{request.param}")
    server.kind = request.param
    yield server
    server.stop()


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_each_parameter_changes_the_plain_answer(plain, row):
    with_it, without = plain[row.name]
    assert with_it != without, f"{row.name} has no effect on the test bed: the row asserts nothing"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_speculative_server_answers_as_the_plain_server(spec, plain, row):
    assert answer(spec, row) == plain[row.name][0], (spec.kind, row.name)


def _counters(server) -> dict[str, float]:
    """Prometheus counters of finished requests: generated tokens and verify steps."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out = {}
    for name in ("sglang:generation_tokens_total", "sglang:spec_verify_calls_total"):
        out[name] = sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M))
    return out


def test_metrics_and_loads_report_the_acceptance_a_benchmark_computes(spec):
    """A scrape of `/metrics` around a small benchmark gives the accept length it computes
    from the responses (tokens / verify steps, the first token included, as 0.5.23's
    `spec_accept_length`); `/v1/loads` reports a speculative section once the scheduler
    has logged a decode window (the matrix's rows ran hundreds of steps before this)."""
    before = _counters(spec)
    tokens = steps = 0
    for i in range(20, 26):
        status, body = spec.post("/generate", {"input_ids": heldout(i)["prompt_ids"],
                                               "sampling_params": {"temperature": 0, "max_new_tokens": 64}})
        assert status == 200, body
        tokens += body["meta_info"]["completion_tokens"]
        steps += body["meta_info"]["spec_verify_ct"]
    after = _counters(spec)
    gen = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    verify = after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"]
    assert (gen, verify) == (tokens, steps), spec.kind
    assert steps < tokens   # drafts accepted: more than one token per verify step
    loads = spec.get("/v1/loads")["loads"]
    assert all(load["speculative"] is not None and load["speculative"]["accept_length"] > 1 for load in loads)
    # the adaptive server's decode steps by verify width
    with urllib.request.urlopen(spec.url + "/metrics", timeout=60) as r:
        widths = {int(w): float(n) for w, n in
                  re.findall(r'^sglang:spec_verify_width_steps_total{[^}]*width="(\d+)"[^}]*} ([0-9.e+]+)$',
                             r.read().decode(), re.M)}
    if spec.kind == "domino_adaptive":
        assert widths and set(widths) <= {16, 8, 4, 2, 1} and sum(widths.values()) > 0, widths
    else:
        assert not widths, widths
