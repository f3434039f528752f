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


def guarded_inputs(tensors, fresh_strides: bool = False) -> tuple:
    """`tensors` as a compiled function's warm-up saw them, for a call in the current mode:
    dynamo's guards tell inference tensors from others (and check strides), so an input of
    the other kind than the mode, or any input with `fresh_strides` (a strided view such as
    a column of the step's ids), is copied in this mode; a matching input passes as it is.
    Without this, serving compiles every graph again (tests/sglang/test_cpu_rollout.py)."""
    import torch

    inference = torch.is_inference_mode_enabled()
    return tuple(t.clone(memory_format=torch.contiguous_format) if fresh_strides or t.is_inference() != inference
                 else t for t in tensors)


__all__ = ["RECOMPILE_LIMIT", "allow_graphs", "choice", "guarded_inputs"]
