"""Checks that import SGLang, each in a fresh interpreter (the plugin patches SGLang in
place, so no two checks share a process): `run_probe(NAME, ...)` runs the module NAME of
this folder through `run.py` and returns its `probe(params)` result."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.servers import server_env
from tests.sglang.probes.run import MARK

HERE = os.path.dirname(os.path.abspath(__file__))


def run_probe(name: str, tmp: str, argv=("sglang",), params=None, **env):
    """The result of probe NAME run in a fresh interpreter whose command line reads `argv`
    (`sglang serve --device cpu` switches the CPU engine on), with `params` (JSON) and the
    server environment (`server_env(tmp)`) plus `env`."""
    payload = json.dumps({"argv": list(argv), **(params or {})})
    out = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), name, payload], capture_output=True,
                         text=True, timeout=600, env=server_env(tmp, **env))
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"no result (rc={out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
