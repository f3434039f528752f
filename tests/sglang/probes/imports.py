"""The modules SGLang's entry points name import no SGLang module."""

import sys


def probe(params) -> list[str]:
    import sglang_domino  # noqa: F401
    import sglang_domino.sglang  # noqa: F401
    import sglang_domino.sglang.checks  # noqa: F401
    import sglang_domino.sglang.cpu.platform  # noqa: F401
    import sglang_domino.sglang.plugin  # noqa: F401

    return sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang.") or m == "sgl_kernel")
