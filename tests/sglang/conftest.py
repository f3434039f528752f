import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels():
    """The CPU kernel library the compiled step serves with (`kernels/cpu_build`: the
    paged-attention kernel, the linear op), built once per machine into the compile cache
    the servers use, loaded before any test here traces a graph: whether it is loaded
    decides what the graphs call (`packed_linear.linear`), so no test's outcome hangs on
    the order they run in."""
    from sglang_domino.kernels import cpu_build
    from sglang_domino.sglang.cpu.compiled import switches

    cpu_build.build(os.path.join(switches.cache_dir(), "kernels"))
