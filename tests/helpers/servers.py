"""SGLang servers for the tests: their environment, their command lines and the
speculative configurations of the end-to-end matrix (`SPEC_CONFIGS`).

Every server is a real `sglang serve` / `python -m sglang.launch_server` process started
by the library's launcher (`sglang_domino.launch`): on 127.0.0.1 with a free port and a
small `--max-total-tokens`, in a process group of its own, stopped by its own PID
(SIGTERM, then SIGKILL to the group). Servers get no CPU env var and no
TRITON_INTERPRET: `--device cpu` alone must be enough.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Literal, Union

from sglang_domino import launch

BLOCK = 16
STARTUP_TIMEOUT = 420
# Lines of a failed server's log in the error (a TP rank's traceback comes before the
# other ranks' shutdown lines).
LOG_TAIL_LINES = 100
# The gateway keeps no state worth a drain: stopped after 5 s (it kept 20 s of a test
# module's teardown waiting out a longer grace).
GATEWAY_GRACE = 5

# --sleep-on-idle: an idle scheduler otherwise busy-polls a core.
BASE_ARGS = ["--device", "cpu", "--dtype", "float32", "--max-total-tokens", "3072", "--max-running-requests", "16",
             "--sleep-on-idle"]


def server_env(tmp: str, **extra: str) -> dict[str, str]:
    """`launch.isolated_env`: no inherited CPU switch or interpreter flag, caches under `tmp`."""
    return launch.isolated_env(tmp, **extra)


def start_server(args: list[str], tmp: str, name: str, module_entry: bool = False, env=None,
                 zygote: "Zygote | None" = None) -> launch.Server:
    """A healthy `sglang serve ARGS` (`python -m sglang.launch_server ARGS` with
    `module_entry`), forked from `zygote` when one is given, its log
    `tmp/server-NAME-PORT.log`; RuntimeError with the log's tail if it exits or is not
    healthy within STARTUP_TIMEOUT (it is stopped then)."""
    popen = None
    if zygote is not None:
        if module_entry:
            raise ValueError("a forked server runs `sglang serve`; module_entry needs a spawned one")
        popen = zygote.popen
    return launch.start_on_free_port(lambda port: launch.sglang_command(args, port, module_entry),
                                     lambda port: os.path.join(tmp, f"server-{name}-{port}.log"), STARTUP_TIMEOUT,
                                     env=env or server_env(tmp), tail_lines=LOG_TAIL_LINES, popen=popen)


class Forked:
    """A server forked by the zygote, seen through Popen's `pid`, `poll()`, `wait()` and
    `returncode`: it is not this process's child, so its exit code comes from the file
    the zygote writes when it reaps it."""

    def __init__(self, pid: int, exit_path: str):
        self.pid, self._exit_path, self.returncode = pid, exit_path, None

    def poll(self):
        if self.returncode is None and os.path.exists(self._exit_path):
            with open(self._exit_path) as fh:
                text = fh.read().strip()
            if text:
                self.returncode = int(text)
        return self.returncode

    def wait(self, timeout=None):
        import subprocess
        import time

        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired(["forked server", str(self.pid)], timeout)
            time.sleep(0.1)
        return self.returncode


class Zygote:
    """`python -m tests.helpers.zygote` (see there: why, and what a forked server does
    not prove), started in the tests' environment `server_env(tmp)`; `popen` is
    `launch.Server`'s hook. `close()` ends it (the servers it forked are stopped by
    their own `stop()`)."""

    def __init__(self, tmp: str, probes_argv: "list[str] | None" = None):
        """A zygote for servers; with `probes_argv`, one for probes run with that command
        line (`tests/sglang/probes`)."""
        import subprocess
        import sys

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cmd = [sys.executable, "-m", "tests.helpers.zygote"]
        if probes_argv is not None:
            cmd += ["--probes", "--import-argv", json.dumps(list(probes_argv))]
        self._log = open(os.path.join(tmp, f"zygote-{launch.free_port()}.log"), "w")
        self._proc = subprocess.Popen(cmd, cwd=root, env=server_env(tmp), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._answer()  # {"ready": true} once SGLang is imported

    def _answer(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited: {launch.tail(self._log.name, LOG_TAIL_LINES)}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    def popen(self, cmd: list[str], log, env) -> Forked:
        log.flush()
        return self._fork({"argv": cmd[cmd.index("serve") + 1:], "env": dict(env), "log": log.name})

    def probe(self, name: str, params: dict, env: dict, out_path: str) -> Forked:
        """Probe NAME run in a fork, its output (`run.MARK` and the result) in `out_path`."""
        open(out_path, "w").close()
        return self._fork({"probe": name, "params": params, "env": dict(env), "log": out_path})

    def _fork(self, request: dict) -> Forked:
        from tests.helpers.zygote import EXIT_SUFFIX

        exit_path = request["log"] + EXIT_SUFFIX
        if os.path.exists(exit_path):
            os.remove(exit_path)
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return Forked(self._answer()["pid"], exit_path)

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except Exception:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def start_gateway(routing: list[str], tmp: str, model: str, name: str = "gateway") -> launch.Server:
    """`python -m smg launch ROUTING` on HOST (its Prometheus port on HOST too), healthy and
    routing `model`: the gateway answers /health before its workers are registered, so
    this waits for /v1/models to list the model. Stopped (and RuntimeError) if it does not
    within STARTUP_TIMEOUT."""
    import sys
    import time

    def cmd(port: int) -> list[str]:
        return [sys.executable, "-m", "smg", "launch", *routing, "--host", launch.HOST, "--port", str(port),
                "--prometheus-host", launch.HOST, "--prometheus-port", str(launch.free_port())]

    router = launch.start_on_free_port(cmd, lambda port: os.path.join(tmp, f"{name}-{port}.log"), timeout=120,
                                       env=server_env(tmp))
    deadline = time.time() + STARTUP_TIMEOUT
    while True:
        try:
            if any(m["id"] == model for m in router.get("/v1/models")["data"]):
                return router
        except OSError:  # 503 until a worker is registered
            pass
        if time.time() > deadline:
            router.stop(grace=GATEWAY_GRACE)
            raise RuntimeError(f"the gateway never listed {model}: {launch.tail(router.log_path, LOG_TAIL_LINES)}")
        time.sleep(0.5)


def alive(pid: int) -> bool:
    """A running process (a zombie is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- the speculative servers -----------------------------------------------------------
ADAPTIVE_LOG_EVERY = 20


def adaptive_config_file(models) -> str:
    """The adaptive servers' settings: the default widths, the histogram logged every
    ADAPTIVE_LOG_EVERY decode steps."""
    path = os.path.join(os.path.dirname(models["target"]), "adaptive.json")
    with open(path, "w") as fh:
        json.dump({"widths": [16, 8, 4, 2, 1], "log_every_steps": ADAPTIVE_LOG_EVERY}, fh)
    return path


Width = Union[int, None, Literal["hf", "adaptive"]]


def spec_args(models, draft: str, width: Width) -> list[str]:
    """`sglang serve` arguments for the tiny target with DFLASH and `models[draft]`."""
    args = [
        "--model-path", models["target"], *BASE_ARGS,
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", models[draft],
        "--speculative-dflash-block-size", str(BLOCK),
    ]
    if isinstance(width, int):
        args += ["--speculative-num-draft-tokens", str(width)]
    if width == "hf":
        args += ["--speculative-num-draft-tokens", str(BLOCK + 1)]
    if width == "adaptive":
        args += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_config_file(models)]
    return args


@dataclass(frozen=True)
class ServerConfig:
    """One speculative server: `draft` names a checkpoint of the `models` fixture; `width`
    is the verify width: None for the draft block (16), an int for
    `--speculative-num-draft-tokens`, "hf" for the Transformers backend's window (16
    proposals from the 16-slot block, 17 verified: `--speculative-num-draft-tokens 17`),
    "adaptive" for `--speculative-adaptive` (a width in {16, 8, 4, 2, 1} per decode step)."""

    name: str
    draft: str
    width: Width = None
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def adaptive(self) -> bool:
        return self.width == "adaptive"

    @property
    def verify_window(self) -> int:
        """Tokens one verify step can commit (the largest width when adaptive)."""
        return BLOCK + 1 if self.width == "hf" else BLOCK if self.adaptive else (self.width or BLOCK)

    @property
    def proposals_per_step(self) -> int:
        """Draft tokens the target verifies per step: window - 1, or all 16 of the block
        with the Transformers window."""
        return BLOCK if self.width == "hf" else self.verify_window - 1

    def args(self, models) -> list[str]:
        return spec_args(models, self.draft, self.width) + list(self.flags)


Q_RULE = ("--speculative-use-rejection-sampling",)
COMPILED = ("--enable-torch-compile",)
# the q-rule servers check that every verified block is the sampled rollout's proposals
Q_RULE_ENV = {"SGLANG_DOMINO_DEBUG": "q-rule-block"}

# The end-to-end matrix. The width-8 Domino server loads the legacy export of the same
# draft (DominoDraftModel / causal_v5 / logit_head.*); the "_q" servers verify sampled
# requests with the draft's own q (`--speculative-use-rejection-sampling`); "_compiled"
# runs the target's and the draft's layers and the Domino rollout under torch.compile.
SPEC_CONFIGS = {config.name: config for config in [
    ServerConfig("dflash", "dflash"),
    ServerConfig("domino", "domino"),
    ServerConfig("dflash_w8", "dflash", 8),
    ServerConfig("domino_legacy_w8", "domino_legacy", 8),
    ServerConfig("domino_hf17", "domino", "hf"),
    ServerConfig("domino_q", "domino", flags=Q_RULE, env=Q_RULE_ENV),
    ServerConfig("domino_q_w8", "domino", 8, flags=Q_RULE, env=Q_RULE_ENV),
    ServerConfig("dflash_adaptive", "dflash", "adaptive"),
    ServerConfig("domino_adaptive", "domino", "adaptive"),
    ServerConfig("domino_q_adaptive", "domino", "adaptive", flags=Q_RULE, env=Q_RULE_ENV),
    # the compiled CPU step: the target's and the draft's layers, the context write and the Domino
    # rollout under torch.compile (`--enable-torch-compile`, `cpu/compiled/forward.py`, `step/compiled_rollout.py`)
    # (oneDNN logs each kernel it builds: `check_compiled_before_serving` reads them)
    ServerConfig("domino_adaptive_compiled", "domino", "adaptive", flags=COMPILED,
                 env={"ONEDNN_VERBOSE": "profile_create"}),
]}
