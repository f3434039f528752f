"""Real CPU servers for the end-to-end tests (`tests.helpers.servers`), one at a time
(2 cores): each test module stops its servers when it is done with them, and every
server started through `start` is stopped at session end at the latest."""

from __future__ import annotations

import pytest

from tests.e2e.client import (CHAT, HF_PROMPTS, PENALISED, PROMPTS, chat, completion, generate_ids, generate_penalised,
                              streams_expected)
from tests.helpers.servers import BASE_ARGS, Zygote, start_server


@pytest.fixture(scope="session")
def start(sglang_tmp):
    """`start(args, name, module_entry=False, env=None)` -> a healthy `launch.Server`.
    Forked from one zygote (`tests.helpers.zygote`: about 13 s to healthy instead of 50)
    unless it must be spawned: `module_entry` (`python -m sglang.launch_server`) or an
    environment with a PYTHONPATH (read by a fresh interpreter only)."""
    started = []
    zygote = []

    def _start(args, name, module_entry=False, env=None):
        spawn = module_entry or "PYTHONPATH" in (env or {})
        if not spawn and not zygote:
            zygote.append(Zygote(sglang_tmp))
        server = start_server(args, sglang_tmp, name, module_entry=module_entry, env=env,
                              zygote=None if spawn else zygote[0])
        started.append(server)
        return server

    _start.tmp = sglang_tmp
    try:
        yield _start
    finally:
        for server in started:
            server.stop()
        for z in zygote:
            z.close()


@pytest.fixture(scope="session")
def expected(models, start):
    """Everything the plain (non-speculative) TP 1 server answers, computed once for every
    end-to-end file; the server is stopped before any other starts (2 cores: one server at
    a time)."""
    start.plain_args = ["--model-path", models["target"], *BASE_ARGS]
    base = start(start.plain_args, "base", module_entry=True)
    try:
        return {
            "completions": {p: completion(base, p) for p in PROMPTS},
            "chat": chat(base, CHAT),
            "streams": streams_expected(base),
            "generate": [generate_ids(base, ids)["output_ids"] for ids in HF_PROMPTS],
        } | penalised_expected(start)
    finally:
        base.stop()


# 0.5.23's plain server with its overlap scheduler (the default) applies a penalty one token
# late: `ScheduleBatch.cumulate_penalty_output_tokens` feeds the penalizers
# `req.output_ids[-1]` while the previous step's token is not yet processed. The
# synchronous loop feeds each token before the next step, which is plain decoding's
# definition (and Transformers'): the penalised references come from it.
SYNC = ("--disable-overlap-schedule",)


def penalised_expected(start) -> dict:
    """What the synchronous plain server answers to the PENALISED requests."""
    sync = start([*start.plain_args, *SYNC], "base-sync")
    try:
        return {"penalised": {name: generate_penalised(sync, params) for name, params in PENALISED.items()},
                "unpenalised": generate_penalised(sync, {})}
    finally:
        sync.stop()
