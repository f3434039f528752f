import os

# Triton reads this when it is first imported: kernels then run on CPU tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models gain nothing from intra-op threads, and OpenMP spin-waiting makes them
# 100x slower whenever the two cores are shared with another process.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def target():
    from sglang_domino.testing import tiny_target

    return tiny_target(seed=0)


@pytest.fixture
def prompt():
    g = torch.Generator().manual_seed(123)
    return torch.randint(0, 250, (1, 11), generator=g)
