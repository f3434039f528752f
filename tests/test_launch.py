"""The launcher's ports: found outside the ephemeral range, and a server whose port was
taken before it bound it is noticed at once and started again on another port."""

import sys
import time

import pytest

from sglang_domino import launch
from tests.helpers.servers import alive

# a stand-in server: with "taken" it logs what uvicorn logs when its port is taken and
# then hangs, as uvicorn does while it waits on the application's shutdown
SERVER = r"""
import http.server, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "taken":
    print(f"[x] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
          "address already in use", flush=True)
    time.sleep(600)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_free_port_is_below_the_ephemeral_range_and_new():
    low = launch._ephemeral_low()
    ports = [launch.free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    if low - launch._PORT_FLOOR > 1000:
        assert all(launch._PORT_FLOOR <= p < low for p in ports)
    assert all(launch.port_is_free(p) for p in ports)


def test_a_taken_port_is_noticed_and_another_one_tried(tmp_path):
    modes, procs = iter(["taken", "serve"]), []

    def cmd(port):
        return [sys.executable, "-c", SERVER, str(port), next(modes)]

    def popen(cmd, log, env):
        import subprocess

        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    t0 = time.time()
    server = launch.start_on_free_port(cmd, lambda port: str(tmp_path / f"server-{port}.log"), timeout=120,
                                       popen=popen)
    try:
        assert time.time() - t0 < 60   # not the 120 s timeout
        assert len(procs) == 2 and server.proc is procs[1]
        assert server.port == int(server.cmd[3]) and server.get("/health", timeout=5) == {}
        assert not alive(procs[0].pid)   # the one that could not bind was stopped
    finally:
        server.stop()
    assert not alive(procs[1].pid)


def test_the_last_try_raises_port_taken(tmp_path):
    def cmd(port):
        return [sys.executable, "-c", SERVER, str(port), "taken"]

    with pytest.raises(launch.PortTaken, match="taken by another process"):
        launch.start_on_free_port(cmd, lambda port: str(tmp_path / f"server-{port}.log"), timeout=120, tries=2)
