"""`./scripts/demo.sh` (python -m sglang_domino.demo) on the committed test bed: real
`sglang serve` processes, the OpenAI client, and the measured table; nothing left running."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import psutil
import pytest

from tests.helpers.servers import server_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what ./scripts/demo.sh passes (it runs from the repository root)
DEMO = [sys.executable, "-m", "sglang_domino.demo", "--testbed", os.path.join(ROOT, "benchmarks", "testbed", "checkpoints")]
# The working directory of every demo this module runs, and so of every process its
# servers start: what it left running is told apart by it from servers of other tests or
# runs. (Not an environment variable: a scheduler's `setproctitle` overwrites the memory
# /proc/PID/environ shows; and not the parent: a leftover child is re-parented.)
CWD = os.path.join(tempfile.gettempdir(), f"sglang-domino-demo-test-{uuid.uuid4().hex}")


@pytest.fixture(scope="module", autouse=True)
def _demo_cwd():
    os.makedirs(CWD)
    yield
    shutil.rmtree(CWD, ignore_errors=True)


def _demo(args, tmp, timeout=900):
    """The demo, its temporary directories (the server logs' by default) under `tmp`."""
    return subprocess.run([*DEMO, *args], cwd=CWD, env=server_env(tmp, TMPDIR=tmp), capture_output=True, text=True,
                          timeout=timeout)


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections(kind="tcp"))


@pytest.mark.sglang_e2e
def test_demo_serves_the_test_bed_and_reports_identical_outputs(sglang_tmp):
    port = 30000 + os.getpid() % 1000
    proc = _demo(["--prompts", "2", "--tokens", "48", "--port", str(port)], sglang_tmp)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    # The OpenAI client's completion and streamed chat completion answered with code.
    assert "POST /v1/completions" in out and "POST /v1/chat/completions" in out and "```python" in out
    table = out.split("=== sglang serve --device cpu")[1]
    for name in ("no speculation", "Domino", "DFlash"):
        assert re.search(rf"^{name}\s+\d+\.\d\s+\d+\.\d\dx", table, re.M), table
    assert table.count("identical to no speculation: 2 of 2") == 2
    accept = float(re.search(r"^Domino\s+\S+\s+\S+\s+(\d+\.\d\d)", table, re.M).group(1))
    assert accept > 2.0
    # the server logs went to a new temporary directory
    log = re.search(rf"^\[demo\] log: ({re.escape(sglang_tmp)}/sglang-domino-demo-\w+/server-domino\.log)$", out, re.M)
    assert log
    # a spawned scheduler (a fresh interpreter, unlike the tests' forked servers) found the
    # plugin through its entry point and ran this project's worker
    with open(log.group(1), encoding="utf-8", errors="replace") as fh:
        assert "sglang-domino DFLASH worker: device=cpu" in fh.read()
    assert not _listening(port) and not _left_behind()


def _servers_on(port: int) -> list[int]:
    """`sglang serve` processes started for `port` (their scheduler children carry no port)."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if "serve" in (p.info["cmdline"] or [])
            and str(port) in p.info["cmdline"]]


def _left_behind(wait: float = 15.0) -> list[str]:
    """SGLang processes (the server, its `sglang::scheduler` and `sglang::detokenizer`
    children) started by this module's demos and still alive after a grace period."""
    deadline = time.time() + wait
    while True:
        left = []
        for p in psutil.process_iter(["cmdline", "status"]):
            cmdline = " ".join(p.info["cmdline"] or [])
            if "sglang" in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE and _marked(p):
                left.append(f"{p.pid} {cmdline[:120]}")
        if not left or time.time() > deadline:
            return left
        time.sleep(0.5)


def _marked(p: psutil.Process) -> bool:
    try:
        return p.cwd() == CWD
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


@pytest.mark.sglang_e2e
def test_demo_interrupted_while_a_server_starts_leaves_nothing_running(sglang_tmp):
    port = 31000 + os.getpid() % 1000
    cmd = [*DEMO, "--log-dir", os.path.join(sglang_tmp, "demo-int"), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=CWD, env=server_env(sglang_tmp), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "starting the Domino server" in line:
                break
        assert _servers_on(port), "the Domino server was not started"
        # Interrupt once the server has spawned its scheduler: the children must go too.
        deadline = time.time() + 180
        while not any("sglang::scheduler" in p for p in _left_behind(wait=0)) and time.time() < deadline:
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)     # what Ctrl-C sends
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "interrupted; the server was stopped" in rest
    assert not _listening(port) and not _left_behind()


def test_demo_refuses_a_busy_port_with_a_clear_message(sglang_tmp):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _demo(["--port", str(port)], sglang_tmp, timeout=300)
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is busy" in proc.stderr and "--port" in proc.stderr
