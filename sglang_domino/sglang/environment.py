"""Every environment variable the plugin reads, declared in one table with one parser.

A switch a user needs is an `sglang serve` flag (`plugin.md`, flags reference). What stays
an environment variable is what no flag can be: the kill switch (it must work when the
plugin's own flags are what is broken), the debug checks (off in every served
configuration), and the private channel from argument resolution to the schedulers
(`settings.py`). Nothing else named `SGLANG_DOMINO_*` is read; the switches of earlier
releases are refused at start-up with what replaced them (`refuse_removed`), since a
switch that silently does nothing is worse than an error.

Importing this module imports nothing from SGLang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class EnvVar:
    name: str
    role: str                     # "kill switch", "debug" or "private"
    values: tuple[str, ...]       # what it accepts ("*" : any text); empty or unset is the default
    what: str


DISABLE = EnvVar("SGLANG_DOMINO_DISABLE", "kill switch", ("1", "0"),
                 "`1` turns the plugin off in every process: 0.5.23's own DFLASH worker and no hook "
                 "(the `--device cpu` platform stays).")
DEBUG = EnvVar("SGLANG_DOMINO_DEBUG", "debug", ("q-rule-block", "upstream-cpu-attention", "spawn-cpu-processes"),
               "Comma-separated checks, none by default. `q-rule-block`: each q-rule verify checks that the "
               "verified block is the rollout's proposals (a host sync that waits for the verify). "
               "`upstream-cpu-attention`: 0.5.23's per-request CPU attention loops instead of the batched "
               "ones, for side-by-side measurements. `spawn-cpu-processes`: a CPU server's scheduler and "
               "detokenizer processes spawned as 0.5.23 starts them (each imports SGLang again), not forked.")
SCHEDULER_SETTINGS = EnvVar("SGLANG_DOMINO_SCHEDULER_SETTINGS", "private", ("*",),
                            "Written by argument resolution, read by the schedulers it spawns "
                            "(`settings.py`); never set by hand.")

TABLE = (DISABLE, DEBUG, SCHEDULER_SETTINGS)

# switches of earlier releases -> what replaced them
REMOVED = {
    "SGLANG_DOMINO_CPU_FORWARD": "SGLang's own --enable-torch-compile (with --device cpu)",
    "SGLANG_DOMINO_CPU_ROLLOUT": "SGLang's own --enable-torch-compile (with --device cpu)",
    "SGLANG_DOMINO_HF_WINDOW": "--speculative-num-draft-tokens 17 with --speculative-dflash-block-size 16 "
                               "(the draft block + 1, shift_label Domino drafts)",
    "SGLANG_DOMINO_ADAPTIVE": "--speculative-adaptive",
    "SGLANG_DOMINO_CPU_ATTENTION": "SGLANG_DOMINO_DEBUG=upstream-cpu-attention (the batched attention is the default)",
    "SGLANG_DOMINO_CHECK_Q_RULE_BLOCK": "SGLANG_DOMINO_DEBUG=q-rule-block",
}


def _raw(var: EnvVar, environ: Optional[Mapping[str, str]]) -> str:
    return (os.environ if environ is None else environ).get(var.name, "").strip().lower()


def disabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """The kill switch: `SGLANG_DOMINO_DISABLE=1` (also `true`, `yes`, `on`)."""
    return _raw(DISABLE, environ) in ("1", "true", "yes", "on")


def debug(check: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `SGLANG_DOMINO_DEBUG` lists `check`; a value it does not know is refused,
    naming the ones it does (a typo must not quietly leave a check off)."""
    if check not in DEBUG.values:
        raise KeyError(f"{check!r} is not a check of {DEBUG.name}: {', '.join(DEBUG.values)}")
    given = [v.strip() for v in _raw(DEBUG, environ).split(",") if v.strip()]
    unknown = [v for v in given if v not in DEBUG.values]
    if unknown:
        raise ValueError(f"{DEBUG.name}={','.join(given)!r}: {', '.join(unknown)} unknown; expected a "
                         f"comma-separated list of {', '.join(DEBUG.values)}")
    return check in given


def refuse_removed(environ: Optional[Mapping[str, str]] = None) -> None:
    """A server started with a switch of an earlier release is refused, its replacement
    named (argument resolution, before any process is spawned)."""
    environ = os.environ if environ is None else environ
    for name, instead in REMOVED.items():
        if name in environ:
            raise ValueError(f"{name} was removed: use {instead}; unset {name}")
    debug(DEBUG.values[0], environ)   # the debug list checked up front too


def markdown_table() -> str:
    """The table as docs/plugin.md shows it (a test holds the two equal)."""
    rows = ["| variable | role | values | what it does |", "|---|---|---|---|"]
    for var in TABLE:
        values = "any" if var.values == ("*",) else ", ".join(f"`{v}`" for v in var.values)
        rows.append(f"| `{var.name}` | {var.role} | {values} | {var.what} |")
    return "\n".join(rows)


__all__ = ["DEBUG", "DISABLE", "EnvVar", "REMOVED", "SCHEDULER_SETTINGS", "TABLE", "debug", "disabled",
           "markdown_table", "refuse_removed"]
