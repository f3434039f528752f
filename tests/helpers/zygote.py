"""A process that has imported SGLang once and forks test servers (and plugin probes)
from it: `python -m tests.helpers.zygote [--probes --import-argv JSON]` (cwd: the
repository root).

Why: on the 2-core CI machine a spawned server start costs about 50 s, 36 s of it two
imports of SGLang one after the other (the main process, then the scheduler it spawns),
and the suite starts about 40 servers and 20 probes. A forked server starts in about
13 s: its main process is a fork of this one, and its scheduler, detokenizer and TP
ranks are forks of that (`multiprocessing` start method "fork" in the server only).

What a forked server runs is `sglang serve ARGS` itself (`sglang.cli.main.main`). SGLang
is imported here as `sglang serve --device cpu` imports it, so the CPU switch
(`cpu.platform.activate`) runs as in a real server's first import, and what that import
sets in the environment is set in every fork. Plugins are loaded in the fork, not here;
see PRELOAD for why modules imported before them are patched all the same. What forked
servers do not prove is what only a fresh interpreter shows: a spawned scheduler finding
the plugin by its entry points, `--device cpu` alone reaching spawned children through
the environment, start-up code from `PYTHONPATH`. The tests' plain base server
(`python -m sglang.launch_server`), the demo's servers, node 1 of the two-node test and
the servers given a PYTHONPATH are spawned for that (`tests/e2e/conftest.py`).

Protocol, one JSON object per line: in on stdin `{"argv": [...], "env": {...}, "log": path}`
(a server's `sglang serve` arguments, its whole environment, its log file) or
`{"probe": name, "params": {...}, "env": {...}, "log": path}`; out on stdout
`{"pid": N}` (or `{"error": ...}`). A server runs in a session of its own (its PID is its
process group). When a fork exits its code is written to `log + ".exit"` (this process
reaps it). Closing stdin ends this process; it never stops a server.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys

EXIT_SUFFIX = ".exit"
# `sglang serve`'s entry point, then what its processes import once it runs: the HTTP
# server, the scheduler, the detokenizer and every model class (the registry imports
# them all). Plugins are not loaded here: SGLang's hook registry applies each hook to
# its target and to every stale `from X import Y` binding of it
# (`srt/plugins/hook_registry._propagate_patch`), so a forked server patches these
# modules as a spawned one patches them.
SERVE_ARGV = ["sglang", "serve", "--device", "cpu"]
PRELOAD = ("sglang.cli.main", "sglang.cli.serve", "sglang.launch_server", "sglang.srt.entrypoints.http_server",
           "sglang.srt.managers.scheduler", "sglang.srt.managers.detokenizer_manager", "sglang.srt.models.registry")


def _import_sglang(argv: list[str], modules) -> dict[str, str]:
    """Import `modules` with `argv` as the command line (what the CPU switch reads);
    return the environment variables that import set (the CPU switch, SGLang's caches)."""
    import importlib

    before = dict(os.environ)
    own, sys.argv = sys.argv, list(argv)
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        sys.argv = own
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def _redirect(path: str) -> None:
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdin = open(os.devnull)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def _child(log: str, env: dict[str, str], set_by_import: dict[str, str], body, new_session: bool = False) -> None:
    """In a forked child: output to `log`, the environment `set_by_import` + `env`, then
    `body()` (an exit code); never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if new_session:
            os.setsid()
        _redirect(log)
        os.environ.clear()
        os.environ.update(set_by_import)
        os.environ.update(env)
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(argv: list[str]) -> int:
    """`sglang serve ARGV` in this (forked) process."""
    # SGLang sets "spawn" (forced) before it starts its schedulers; in a forked server the
    # children are forks of it instead (they need no import of their own).
    set_start_method = multiprocessing.set_start_method
    multiprocessing.set_start_method = lambda method, force=False: set_start_method("fork", force=True)
    sys.argv = ["sglang", "serve", *argv]
    import sglang.cli.main

    return sglang.cli.main.main() or 0


def _probe(name: str, params: dict) -> int:
    """Probe NAME (`tests/sglang/probes`) in this (forked) process, as `run.py` runs it."""
    from tests.sglang.probes import run

    run.run(name, params)
    return 0


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--import-argv", default=json.dumps(SERVE_ARGV),
                        help="JSON list: the command line SGLang is imported with")
    parser.add_argument("--probes", action="store_true", help="import `sglang.launch_server` only (for probes)")
    options = parser.parse_args()
    import_argv = json.loads(options.import_argv)
    set_by_import = _import_sglang(import_argv, ("sglang.launch_server",) if options.probes else PRELOAD)
    cpu = import_argv[-2:] == ["--device", "cpu"]
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
        if "probe" in request:
            if list(request["params"]["argv"]) != import_argv:
                print(json.dumps({"error": f"this zygote imported SGLang with argv {import_argv}"}), flush=True)
                continue
        elif not cpu or "--device" not in request["argv"] or \
                request["argv"][request["argv"].index("--device") + 1] != "cpu":
            print(json.dumps({"error": "the zygote imported SGLang for `sglang serve --device cpu` only"}), flush=True)
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                if "probe" in request:
                    _child(request["log"], request["env"], set_by_import,
                           lambda: _probe(request["probe"], request["params"]))
                _child(request["log"], request["env"], set_by_import, lambda: _serve(request["argv"]),
                       new_session=True)
            logs[pid] = request["log"]
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    main()
