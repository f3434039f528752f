"""A process that has imported `sglang serve`'s entry point once and forks test servers
from it: `python -m tests.helpers.zygote` (cwd: the repository root).

Why: on the 2-core CI machine a server start costs about 45 s, 36 s of it two imports of
SGLang one after the other (the main process, then the scheduler it spawns). The
end-to-end suite starts about 40 servers. A forked server skips both: its main process
is a fork of this one, and its scheduler, detokenizer and TP ranks are forks of that
(`multiprocessing` start method "fork" in the server only).

What a forked server runs is `sglang serve ARGS` itself (`sglang.cli.main.main`), from the
same point a spawned one would reach after `import sglang.launch_server`, which is all
this process imports. It imports it as `sglang serve --device cpu` would, so the CPU
switch (`cpu.platform.activate`) runs the way it does in a real server's first import.
Plugins are loaded in the forked server, not here (hooks must be applied before SGLang's
modules that copy the patched names are imported). What forked servers do not prove is
what only a fresh interpreter shows: a spawned scheduler finding the plugin by its entry
points, `--device cpu` alone reaching children through the environment, start-up code
from `PYTHONPATH`. The tests' plain base server (`python -m sglang.launch_server`), the
demo and the servers given a PYTHONPATH are spawned for that (`tests/e2e/conftest.py`).

Protocol, one JSON object per line: in on stdin `{"argv": [...], "env": {...}, "log": path}`
(the server's `sglang serve` arguments, its whole environment, its log file); out on
stdout `{"pid": N}`. The server runs in a session of its own (its PID is its process
group), and when it exits its code is written to `log + ".exit"` (this process reaps it).
Closing stdin ends this process; it never stops a server.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys

EXIT_SUFFIX = ".exit"


def _import_sglang() -> dict[str, str]:
    """Import what `sglang serve` imports before it parses its arguments; return the
    environment variables that import set (the CPU switch, SGLang's cache folders)."""
    before = dict(os.environ)
    argv, sys.argv = sys.argv, ["sglang", "serve", "--device", "cpu"]
    try:
        import sglang.cli.main  # noqa: F401
        import sglang.cli.serve  # noqa: F401
        import sglang.launch_server  # noqa: F401
    finally:
        sys.argv = argv
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _serve(argv: list[str], env: dict[str, str], log: str, set_by_import: dict[str, str]) -> None:
    """In the forked child: become `sglang serve ARGV`; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdin = open(os.devnull)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.environ.clear()
        os.environ.update(set_by_import)
        os.environ.update(env)
        # SGLang sets "spawn" (forced) before it starts its schedulers; in a forked
        # server the children are forks of it instead (they need no import of their own).
        set_start_method = multiprocessing.set_start_method
        multiprocessing.set_start_method = lambda method, force=False: set_start_method("fork", force=True)
        sys.argv = ["sglang", "serve", *argv]
        import sglang.cli.main

        code = sglang.cli.main.main() or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    set_by_import = _import_sglang()
    logs: dict[int, str] = {}

    def reap(signum, frame):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            log = logs.pop(pid, None)
            if log is not None:
                with open(log + EXIT_SUFFIX, "w") as fh:
                    fh.write(str(os.waitstatus_to_exitcode(status)))

    signal.signal(signal.SIGCHLD, reap)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "--device" not in request["argv"] or request["argv"][request["argv"].index("--device") + 1] != "cpu":
            print(json.dumps({"error": "the zygote imported SGLang for `--device cpu` only"}), flush=True)
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                _serve(request["argv"], request["env"], request["log"], set_by_import)
            logs[pid] = request["log"]
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
