"""Starting and stopping an SGLang server process (the demo, the benchmarks and the tests).

Stdlib only: importing this imports nothing from SGLang. The server runs in a process
group of its own, on loopback, and is stopped by its own PID (the group's leader):
SIGTERM to it, then SIGKILL to the whole group once it has exited or after a grace
period, so no scheduler or detokenizer process it spawned is left behind.

    with start(cmd, port, log_path, timeout=300) as server:   # healthy, or RuntimeError
        status, body = server.post("/generate", {...})
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

from .sglang.environment import DISABLE, SCHEDULER_SETTINGS

HOST = "127.0.0.1"
# Requests to the server never go through a proxy, whatever the environment says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# Variables a server started by the tests or a benchmark must not inherit: the CPU engine
# switch and the interpreter flag of the test process, the plugin's own per-process settings.
SERVER_ENV_DROP = ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", DISABLE.name, SCHEDULER_SETTINGS.name,
                   "SGLANG_PLUGINS", "SGLANG_PLATFORM", "PYTHONPATH")


def isolated_env(tmp: str, **extra: str) -> dict[str, str]:
    """This process's environment without SERVER_ENV_DROP, the server's caches under `tmp`,
    offline, one OpenMP thread, plus `extra`: `--device cpu` alone must be enough."""
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV_DROP}
    env.update(SGLANG_CACHE_DIR=os.path.join(tmp, "sglang-cache"), XDG_CACHE_HOME=os.path.join(tmp, "xdg-cache"),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


# Where `free_port` looks: below the kernel's ephemeral range, so that no socket bound to
# port 0 or connecting out (a starting server's own gloo, ZMQ and transfer-engine sockets,
# any other process) is handed the port between `free_port` and the server's bind. A
# port from bind(0) was taken that way once in CI (the PD decode server: "address already
# in use" seconds after the port was found free).
_PORT_FLOOR = 20000
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default


def free_port() -> int:
    """A port free on HOST now, outside the ephemeral range where there is room, and not
    handed out before by this process."""
    top = _ephemeral_low() - 1
    pick = random.SystemRandom()
    for _ in range(256 if top - _PORT_FLOOR > 1000 else 0):
        port = pick.randint(_PORT_FLOOR, top)
        if port not in _handed_out and port_is_free(port):
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    _handed_out.add(port)
    return port


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


class PortTaken(RuntimeError):
    """The server could not listen on its port: another process had bound it meanwhile."""


# what uvicorn logs when the server's port is taken
_BIND_FAILED = "error while attempting to bind on address"


def tail(path: str, lines: int = 15) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


def sglang_command(args: list[str], port: int, module_entry: bool = False) -> list[str]:
    """`sglang serve ARGS` (or `python -m sglang.launch_server ARGS`) on HOST:port, with
    this interpreter's environment."""
    if module_entry:
        cmd = [sys.executable, "-m", "sglang.launch_server"]
    else:
        cmd = [os.path.join(os.path.dirname(sys.executable), "sglang"), "serve"]
    return cmd + list(args) + ["--host", HOST, "--port", str(port)]


class Server:
    """A server process started from `cmd` (which must listen on HOST:port), its output
    in `log_path`. Start it with `start()`, or construct it and call `wait_healthy()`."""

    def __init__(self, cmd: list[str], port: int, log_path: str, env: Optional[dict] = None,
                 popen: Optional[Callable] = None):
        """`popen(cmd, log, env)` starts the process instead of `subprocess.Popen`: it must
        return an object with Popen's `pid`, `poll()`, `wait(timeout)` and `returncode`, the
        process leading a session of its own (the tests' forked servers)."""
        self.cmd, self.port, self.log_path = cmd, port, log_path
        self.url = f"http://{HOST}:{port}"
        self._log = open(log_path, "w", encoding="utf-8")
        if popen is not None:
            self.proc = popen(cmd, self._log, env)
        else:
            self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=env)
        # Every process seen in the server's group (the leader excluded): its ranks,
        # scheduler and detokenizer. Updated when it becomes healthy and when it stops.
        self.children: set[int] = set()
        self._stopped = False
        self._scanned = 0   # bytes of the log read by `_bind_failed`

    def _bind_failed(self) -> bool:
        """The log says the server's port was taken (read on from where it was last read)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._scanned)
                raw = fh.read()
        except OSError:
            return False
        raw = raw[: raw.rfind(b"\n") + 1]   # the last line may still be being written
        self._scanned += len(raw)
        return any(_BIND_FAILED in line and f"{self.port})" in line
                   for line in raw.decode("utf-8", errors="replace").splitlines())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def group(self) -> list[int]:
        """Live (not zombie) processes of the server's process group, from /proc."""
        pids = []
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    # `pid (comm) state ppid pgrp ...`; comm may hold spaces and parentheses
                    state, _, pgrp = fh.read().rsplit(")", 1)[1].split()[:3]
            except (OSError, IndexError, ValueError):
                continue
            if int(pgrp) == self.pid and state != "Z":
                pids.append(int(entry))
        return pids

    def _note_children(self) -> None:
        self.children.update(p for p in self.group() if p != self.pid)

    def wait_healthy(self, timeout: float, on_wait: Optional[Callable[[float], None]] = None,
                     tail_lines: int = 15, poll: float = 1.0) -> "Server":
        """Return once `/health` answers 200 (asked every `poll` seconds); `on_wait(seconds)`
        is called as often meanwhile (a progress line). Raises RuntimeError with the log's last
        `tail_lines` lines if the server exits first or is not healthy within `timeout`.
        The server is left running either way: `stop()` it (`start()` does)."""
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with code {self.proc.returncode} before becoming healthy; "
                                   f"see {self.log_path}:\n{tail(self.log_path, tail_lines)}")
            try:
                with _OPENER.open(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self._note_children()
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if self._bind_failed():
                # uvicorn logs the error and then waits on the app's shutdown: the
                # process does not exit, so this would otherwise wait out `timeout`
                raise PortTaken(f"server could not listen on {HOST}:{self.port} (taken by another process); "
                                f"see {self.log_path}:\n{tail(self.log_path, tail_lines)}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"server at {self.url} did not become healthy within {timeout:.0f} s; "
                                   f"see {self.log_path}:\n{tail(self.log_path, tail_lines)}")
            if on_wait:
                on_wait(time.time() - t0)
            time.sleep(poll)

    def stop(self, grace: float = 60) -> None:
        """SIGTERM to the leader, SIGKILL to what is left of the group once the leader
        has exited or after `grace` seconds. Idempotent: a second call signals nothing
        (the group's id may be reused by then). The leader alone first: an SGLang server
        then stops its own children; a SIGTERM to the whole group kills its scheduler
        under it, and it waits 5 s "before crash diagnostics" (6.1 s against 3.3 s per
        stop, measured on 2 cores)."""
        if self._stopped:
            return
        self._stopped = True
        self._note_children()
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while a child it spawned still runs: the group goes too.
        _signal_group(self.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.time() + 10
        while self.group() and time.time() < deadline:   # killed, not yet reaped by init
            time.sleep(0.1)
        self._log.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- HTTP ----------------------------------------------------------------------
    def post(self, path: str, payload, timeout: float = 300):
        """POST JSON (or raw bytes) to `path`: (status, the decoded JSON body, or its text
        when it is not JSON). Error statuses are returned, not raised."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"content-type": "application/json"})
        try:
            with _OPENER.open(req, timeout=timeout) as r:
                return r.status, _decode(r.read())
        except urllib.error.HTTPError as err:
            return err.code, _decode(err.read())

    def get(self, path: str, timeout: float = 60):
        """GET `path`: its JSON body (HTTPError on an error status)."""
        with _OPENER.open(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())


def _decode(raw: bytes):
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return raw.decode(errors="replace")


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def start(cmd: list[str], port: int, log_path: str, timeout: float, env: Optional[dict] = None,
          on_wait: Optional[Callable[[float], None]] = None, tail_lines: int = 15,
          popen: Optional[Callable] = None) -> Server:
    """A healthy Server; stopped again if it does not become healthy (or on Ctrl-C)."""
    server = Server(cmd, port, log_path, env, popen)
    try:
        return server.wait_healthy(timeout, on_wait, tail_lines)
    except BaseException:
        server.stop()
        raise


def start_on_free_port(cmd_for: Callable[[int], list[str]], log_for: Callable[[int], str], timeout: float,
                       tries: int = 3, **kwargs) -> Server:
    """`start(cmd_for(port), port, log_for(port), timeout, **kwargs)` on a `free_port()`,
    on another one if the port was taken before the server bound it (`PortTaken`), up to
    `tries` ports."""
    for attempt in range(tries):
        port = free_port()
        try:
            return start(cmd_for(port), port, log_for(port), timeout, **kwargs)
        except PortTaken:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")

