"""The CPU port's environment switches and what its compiled pieces share.

Each switch is an environment variable with a fixed set of values, the first the default;
any other value is refused, naming the expected ones (a typo must not quietly select the
default)."""

from __future__ import annotations

import os

# graphs one compiled function may hold: the compiled rollout keeps two per block length
# (up to 5 block lengths with the adaptive widths and the window), the compiled layers four
# per model (the target's and the draft's on one code); past torch's default of 8, dynamo
# would run a new shape eagerly without a word
RECOMPILE_LIMIT = 16


def choice(env: str, values: tuple[str, ...]) -> str:
    """`env`'s value, lower-cased; `values[0]` when unset or empty."""
    value = os.environ.get(env, values[0]).strip().lower() or values[0]
    if value not in values:
        raise ValueError(f"{env}={value!r}: expected one of {', '.join(values)}")
    return value


def allow_graphs() -> None:
    """Let every compiled function hold RECOMPILE_LIMIT graphs (never lowering the limit)."""
    import torch

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)


__all__ = ["RECOMPILE_LIMIT", "allow_graphs", "choice"]
