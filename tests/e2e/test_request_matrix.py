"""Every per-request parameter that changes tokens (`request_matrix.ROWS`: penalties,
`min_tokens`, logit bias, stop strings and ids, `ignore_eos`, `n`, `max_tokens` 1,
log-probabilities of the prompt and the output, JSON-schema, regex and EBNF grammars),
asked of the plain server and of the DFlash, Domino, b8 (verify width 8 of the 16-token
block) and adaptive servers on the committed test bed: each speculative server answers
every row as the plain server does."""

from __future__ import annotations

import os

import pytest

from tests.e2e.conftest import SYNC
from tests.e2e.request_matrix import ROWS, TESTBED, answer
from tests.helpers.servers import BASE_ARGS

pytestmark = pytest.mark.sglang_e2e

TARGET = ["--model-path", os.path.join(TESTBED, "target"), *BASE_ARGS]


def _draft(name: str, *flags: str) -> list[str]:
    return [*TARGET, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
            os.path.join(TESTBED, name), *flags]


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
