import os

# Triton reads this when it is first imported: kernels then run on CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import signal  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models gain nothing from intra-op threads, and OpenMP spin-waiting makes them
# 100x slower whenever the two cores are shared with another process.
torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
# Tests of the SGLang plugin: marked `sglang` (the end-to-end ones mark themselves
# `sglang_e2e` too; `-m "not sglang_e2e"` starts no server).
SGLANG_FOLDERS = (HERE / "sglang", HERE / "e2e")


def pytest_configure(config):
    # A SIGTERM to pytest must still run fixture teardown, which stops the servers.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(folder in item.path.parents for folder in SGLANG_FOLDERS):
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def target():
    from sglang_domino.testing import tiny_target

    return tiny_target(seed=0)


@pytest.fixture
def prompt():
    g = torch.Generator().manual_seed(123)
    return torch.randint(0, 250, (1, 11), generator=g)


@pytest.fixture(scope="session")
def sglang_tmp():
    with tempfile.TemporaryDirectory(prefix="sglang-domino-tests-") as tmp:
        yield tmp


@pytest.fixture(scope="session")
def models(sglang_tmp):
    """Paths of the tiny target (with tokenizer) and the drafts on disk, plus the HF target."""
    from tests.helpers import tiny
    from tests.helpers.servers import BLOCK

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
