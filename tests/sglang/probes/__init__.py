"""Checks that import SGLang, each in a process of its own (the plugin patches SGLang in
place, so no two checks share a process): `run_probe(NAME, ...)` runs the module NAME of
this folder and returns its `probe(params)` result.

A probe runs in a fork of a zygote (`tests.helpers.zygote --probes`) that imported
`sglang.launch_server` with the probe's command line and loaded no plugin: what a fresh
interpreter would have reached after that import, without paying it (about 20 s on 2
cores) per probe. `imports` (that importing this project does not import SGLang) runs in
a fresh interpreter, through `run.py`."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile

from tests.helpers.servers import Zygote, server_env
from tests.sglang.probes.run import MARK

HERE = os.path.dirname(os.path.abspath(__file__))
FRESH = {"imports"}
_zygotes: dict = {}


def _zygote(tmp: str, argv) -> Zygote:
    key = (tmp, tuple(argv))
    if key not in _zygotes:
        _zygotes[key] = Zygote(tmp, probes_argv=list(argv))
    return _zygotes[key]


@atexit.register
def _close_zygotes() -> None:
    for zygote in _zygotes.values():
        zygote.close()
    _zygotes.clear()


def run_probe(name: str, tmp: str, argv=("sglang",), params=None, **env):
    """The result of probe NAME run with the command line `argv` (`sglang serve --device
    cpu` switches the CPU engine on), `params` (JSON) and the server environment
    (`server_env(tmp)`) plus `env`."""
    params = {"argv": list(argv), **(params or {})}
    if name in FRESH:
        out = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), name, json.dumps(params)],
                             capture_output=True, text=True, timeout=600, env=server_env(tmp, **env))
        stdout, stderr, code = out.stdout, out.stderr, out.returncode
    else:
        fd, path = tempfile.mkstemp(prefix=f"probe-{name}-", suffix=".log", dir=tmp)
        os.close(fd)
        code = _zygote(tmp, argv).probe(name, params, server_env(tmp, **env), path).wait(timeout=600)
        with open(path, encoding="utf-8", errors="replace") as fh:
            stdout, stderr = fh.read(), ""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"no result (rc={code}):\n{stdout[-3000:]}\n{stderr[-6000:]}")
