"""Starting and stopping an SGLang server process (the benchmarks and the demo).

Stdlib and `requests` only: importing this imports nothing from SGLang. The server runs
in a process group of its own, on loopback, and is stopped by its own PID (the group's
leader): SIGTERM, then SIGKILL after a grace period, so no scheduler or detokenizer
process it spawned is left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Iterator, Optional

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def tail(path: str, lines: int = 15) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return "".join(fh.readlines()[-lines:])


@contextmanager
def server(cmd: list[str], port: int, timeout: float, log_path: str, env: Optional[dict] = None,
           on_wait=None) -> Iterator[str]:
    """A server process started from `cmd` (which must listen on HOST:port); yields its URL
    once `/health` answers 200. `on_wait(seconds)` is called about once a second while it
    starts (a progress line). Raises RuntimeError naming the log if it exits or times out."""
    import requests

    log = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://{HOST}:{port}"
    try:
        t0 = time.time()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode} before becoming healthy; "
                                   f"see {log_path}:\n{tail(log_path)}")
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() - t0 > timeout:
                raise RuntimeError(f"server at {url} did not become healthy within {timeout:.0f} s; "
                                   f"see {log_path}:\n{tail(log_path)}")
            if on_wait:
                on_wait(time.time() - t0)
            time.sleep(1)
        yield url
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while a child it spawned still runs: the group goes too.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
