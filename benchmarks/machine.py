"""What a benchmark ran on, recorded beside its results."""

from __future__ import annotations

import os
import platform
import subprocess


# The instruction sets that decide how fast the CPU port runs: bf16 matmuls without
# AVX-512 bf16 or AMX are emulated, and 0.5.23's CPU kernels need AMX.
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
    """The fields of /proc/cpuinfo's first processor block (the others repeat them)."""
    fields: dict[str, str] = {}
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        fields = _cpuinfo()
        info["cpu"] = fields.get("model name")
        info["cpu_family"] = fields.get("cpu family")
        flags = set(fields.get("flags", "").split())
        info["simd"] = [f for f in SIMD_FLAGS if f in flags]
        with open("/proc/meminfo", encoding="utf-8") as fh:
            info["memory_gib"] = round(int(fh.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def cpu_label(info: dict) -> str:
    """'AMD EPYC (family 23; AVX2, no AVX-512, no AMX)' from `machine()`."""
    simd = set(info.get("simd") or ())
    parts = ["AVX2" if "avx2" in simd else "no AVX2",
             ("AVX-512 with bf16" if "avx512_bf16" in simd else "AVX-512") if "avx512f" in simd else "no AVX-512",
             "AMX" if "amx_bf16" in simd else "no AMX"]
    family = f"family {info['cpu_family']}; " if info.get("cpu_family") else ""
    return f"{info.get('cpu') or 'unknown CPU'} ({family}{', '.join(parts)})"


def cpu_description() -> dict:
    """The CPU by name, family and model, and the matrix instructions that matter for torch
    (the profile's runs record it beside `machine()`)."""
    fields = _cpuinfo()
    info: dict = {key: fields[key] for key in ("model name", "cpu family", "model", "vendor_id") if key in fields}
    if "flags" in fields:
        flags = set(fields["flags"].split())
        info["flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")}
    info["cores"] = os.cpu_count()
    return info


def git_commit() -> str:
    """The commit measured, '+dirty' when tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_busy_seconds() -> float:
    """CPU seconds every core has been busy since boot: /proc/stat's user, nice, system, irq
    and softirq (not idle, iowait, or steal, which is other virtual machines'). On a shared
    machine the busy cores during a run say how much else ran beside it."""
    with open("/proc/stat") as fh:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, fh.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
