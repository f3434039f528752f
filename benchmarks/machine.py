"""What a benchmark ran on, recorded beside its results."""

from __future__ import annotations

import os
import platform


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), None)
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
