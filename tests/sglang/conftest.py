"""Fixtures for the SGLang plugin tests: tiny models on disk and real CPU servers.

Every server is a real `sglang serve` / `python -m sglang.launch_server` subprocess on
127.0.0.1 with a free port and a small `--max-total-tokens`, shared per configuration
(session scope), and stopped by its own PID (SIGTERM, then SIGKILL), after which any
child it left behind is killed by PID too. Servers get no CPU env var and no
TRITON_INTERPRET: `--device cpu` alone must be enough.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tiny  # noqa: E402

BLOCK = 16
STARTUP_TIMEOUT = 420
SERVER_ENV_DROP = ("SGLANG_USE_CPU_ENGINE", "TRITON_INTERPRET", "SGLANG_DOMINO_DISABLE",
                   "SGLANG_DOMINO_DRAFT_BLOCK", "SGLANG_PLUGINS", "SGLANG_PLATFORM", "PYTHONPATH")


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: tests of the SGLang plugin (sglang_domino.sglang)")
    config.addinivalue_line("markers", "sglang_e2e: end-to-end tests that start real CPU SGLang servers (slow)")
    # A SIGTERM to pytest must still run fixture teardown, which stops the servers.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in str(item.fspath):
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def sglang_tmp():
    with tempfile.TemporaryDirectory(prefix="sglang-domino-tests-") as tmp:
        yield tmp


def server_env(tmp: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVER_ENV_DROP}
    env.update(SGLANG_CACHE_DIR=os.path.join(tmp, "sglang-cache"), XDG_CACHE_HOME=os.path.join(tmp, "xdg-cache"),
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def models(sglang_tmp):
    """Paths of the tiny target (with tokenizer) and the drafts, plus the HF target."""
    root = os.path.join(sglang_tmp, "models")
    target = tiny.build_target(os.path.join(root, "target"))
    paths = {"target": os.path.join(root, "target")}
    for kind in ("dflash", "domino"):
        paths[kind] = os.path.join(root, kind)
        tiny.build_draft(paths[kind], target, kind, BLOCK)
    paths["domino_legacy"] = os.path.join(root, "domino_legacy")
    tiny.build_legacy_domino(paths["domino_legacy"], paths["domino"])
    paths["hf_target"] = target
    return paths


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Server:
    def __init__(self, args: list[str], tmp: str, name: str, module_entry: bool = False, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tmp, f"server-{name}-{self.port}.log")
        if module_entry:
            cmd = [sys.executable, "-m", "sglang.launch_server"]
        else:
            cmd = [os.path.join(os.path.dirname(sys.executable), "sglang"), "serve"]
        self.cmd = cmd + args + ["--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env or server_env(tmp))
        self.children: set[int] = set()

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> "Server":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-6000:]}")
            self.children.update(_children(self.proc.pid))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        self.children.update(_children(self.proc.pid))
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(2)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.log()[-6000:]}")

    def stop(self) -> None:
        self.children.update(_children(self.proc.pid))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(p) for p in self.children):
            time.sleep(0.5)
        for pid in self.children:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._log.close()

    # -- HTTP helpers ---------------------------------------------------------------
    def post(self, path: str, payload, timeout: float = 300):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                try:
                    return r.status, json.loads(raw or b"null")
                except ValueError:
                    return r.status, raw.decode(errors="replace")
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                return err.code, json.loads(body)
            except ValueError:
                return err.code, body.decode(errors="replace")

    def get(self, path: str, timeout: float = 60):
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return json.loads(r.read())


def start_server(args, tmp, name, **kwargs) -> Server:
    server = Server(args, tmp, name, **kwargs)
    try:
        return server.wait_healthy()
    except BaseException:
        server.stop()
        raise


# --sleep-on-idle: an idle scheduler otherwise busy-polls a core.
BASE_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-total-tokens", "3072", "--max-running-requests", "16",
             "--sleep-on-idle"]

# name -> (draft, verify width or None for width = block). The width-8 Domino server
# loads the legacy export of the same draft (DominoDraftModel / causal_v5 / logit_head.*).
# "domino_hf17": SGLANG_DOMINO_HF_WINDOW=1, the Transformers backend's window for shift_label
# drafts (16 proposals from the 16-slot block, 17 verified).
SPEC_CONFIGS = {
    "dflash": ("dflash", None),
    "domino": ("domino", None),
    "dflash_w8": ("dflash", 8),
    "domino_legacy_w8": ("domino_legacy", 8),
    "domino_hf17": ("domino", "hf"),
    # sampled requests verified with the draft's own q (`--speculative-use-rejection-sampling`)
    "domino_q": ("domino", None),
    "domino_q_w8": ("domino", 8),
    # `--speculative-adaptive`: a verify width in {16, 8, 4, 2, 1} chosen per decode step
    "dflash_adaptive": ("dflash", "adaptive"),
    "domino_adaptive": ("domino", "adaptive"),
    "domino_q_adaptive": ("domino", "adaptive"),
}
SPEC_FLAGS = {"domino_q": ["--speculative-use-rejection-sampling"],
              "domino_q_w8": ["--speculative-use-rejection-sampling"],
              "domino_q_adaptive": ["--speculative-use-rejection-sampling"]}


def spec_args(models, kind: str, width: Optional[int]) -> list[str]:
    args = [
        "--model-path", models["target"], *BASE_ARGS,
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", models[kind],
        "--speculative-dflash-block-size", str(BLOCK),
    ]
    if isinstance(width, int):
        args += ["--speculative-num-draft-tokens", str(width)]
    if width == "adaptive":
        args += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_config_file(models)]
    return args


ADAPTIVE_LOG_EVERY = 20


def adaptive_config_file(models) -> str:
    """The adaptive servers' settings: the default widths, the histogram logged every
    ADAPTIVE_LOG_EVERY decode steps."""
    path = os.path.join(os.path.dirname(models["target"]), "adaptive.json")
    with open(path, "w") as fh:
        json.dump({"widths": [16, 8, 4, 2, 1], "log_every_steps": ADAPTIVE_LOG_EVERY}, fh)
    return path


def spec_env(tmp: str, width) -> dict[str, str]:
    return server_env(tmp, **({"SGLANG_DOMINO_HF_WINDOW": "1"} if width == "hf" else {}))


def verify_window(width) -> int:
    """Tokens one verify step can commit for a SPEC_CONFIGS width (the largest width when adaptive)."""
    return BLOCK + 1 if width == "hf" else BLOCK if width == "adaptive" else (width or BLOCK)


def proposals_per_step(width) -> int:
    """Draft tokens the target verifies per step: window - 1, or all 16 of the block with
    the Transformers window."""
    return BLOCK if width == "hf" else verify_window(width) - 1


@pytest.fixture(scope="session")
def start(sglang_tmp):
    """`start(args, name, **kw)` -> a healthy Server; every server started through it is
    stopped at session end at the latest (tests stop them earlier)."""
    started: list[Server] = []

    def _start(args, name, **kwargs) -> Server:
        server = start_server(args, sglang_tmp, name, **kwargs)
        started.append(server)
        return server

    _start.tmp = sglang_tmp
    try:
        yield _start
    finally:
        for server in started:
            server.stop()
