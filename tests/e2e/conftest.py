"""Real CPU servers for the end-to-end tests (`tests.helpers.servers`), one at a time
(2 cores): each test module stops its servers when it is done with them, and every
server started through `start` is stopped at session end at the latest."""

from __future__ import annotations

import pytest

from tests.helpers.servers import start_server


@pytest.fixture(scope="session")
def start(sglang_tmp):
    """`start(args, name, module_entry=False, env=None)` -> a healthy `launch.Server`."""
    started = []

    def _start(args, name, **kwargs):
        server = start_server(args, sglang_tmp, name, **kwargs)
        started.append(server)
        return server

    _start.tmp = sglang_tmp
    try:
        yield _start
    finally:
        for server in started:
            server.stop()
