"""The seam with SGLang 0.5.23: every patch the plugin makes, declared in one list.

SGLang has no extension point for most of what a DFLASH plugin must change, so the plugin
patches private symbols of the pinned release. `PATCHES` (`patches.py`) names each
one: the upstream symbol, how it is changed (`Kind`), which processes change it and at
which moment (`Moment`), the install unit it belongs to (`Group`), and why; the vocabulary
is `manifest.py`. `DEPENDS` (`depends.py`) names what the plugin reads or calls
without changing it. This module installs them. `UPSTREAM.md` beside this file gives each row's
file:line in the pinned wheel; `tests/sglang/test_seam.py` checks every row against the
installed SGLang, one case per row.

The kinds are installed in two ways:
  * `install_moment(moment, context)` installs, at `register()`, at scheduler start and
    before and after 0.5.23's worker constructor, every group of that moment whose
    predicate (a field of the group) holds of the moment's context; `install(group)`
    installs the group's rows of the kinds `HookRegistry` applies (AROUND, AFTER, BEFORE,
    REPLACE), the resolution hooks, and runs its CALL rows, once per process;
  * the other kinds (a module global swapped for a scope, an instance's method or
    attribute, per-step state, the import finder) are done by the code the row names at
    the moment it states; they are listed in `PATCHES` so that the whole seam reads in one
    place.

This module is imported by the entry point in every process: it imports nothing heavy,
and each row names its implementation as `module:attr` under `sglang_domino.sglang`,
resolved only when installed.
"""

from __future__ import annotations

import pkgutil

# the vocabulary and the groups, read as `hooks.X` by the code that installs a group
from .manifest import (ADAPTIVE_METRICS, B8_RESERVATION, B8_STATE, CHECKPOINT_COMPAT, CPU_ATTENTION, CPU_DFLASH,
                       CPU_DISAGGREGATION, CPU_ENGINE, CPU_FORWARD, CPU_MODELS, CPU_PROCESS, CPU_STANDIN,
                       DISAGGREGATION,
                       DOMINO_ROLLOUT, EVERY_PROCESS, GROUPS, HOOK_KINDS, HYBRID_REPLAY, INSTALLED_BY_GROUP,
                       PENALTIES, PLATFORM, RESOLVE, RUNNING_REQUESTS, STEP, WORKER, Dependency, Group, Kind, Moment,
                       Patch, resolve)
from .depends import DEPENDS
from .patches import PATCHES, WIDTH_STATE

# -- installing ---------------------------------------------------------------------------
_installed: set[str] = set()


def rows(group: Group) -> list[Patch]:
    return [p for p in PATCHES if p.group is group]


def install(group: Group) -> bool:
    """Install `group`'s rows of the kinds installed here, once per process; returns
    whether this call installed them."""
    if group.name in _installed:
        return False
    todo = [p for p in rows(group) if p.kind in INSTALLED_BY_GROUP]
    if not todo:
        raise ValueError(f"group {group.name!r} has no row that install() installs")
    hooks = [p for p in todo if p.kind in HOOK_KINDS]
    if hooks:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for p in hooks:
            HookRegistry.register(p.target, p.implementation(), HookType[p.kind.name])
    for p in todo:
        if p.kind is Kind.RESOLUTION:
            from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

            register_resolution_hook(p.target)(p.implementation())
        elif p.kind is Kind.CALL:
            p.implementation()()
    if hooks and group.apply_now:
        HookRegistry.apply_hooks()
    _installed.add(group.name)
    return True


def always(_context=None) -> bool:
    """The predicate of a group installed at every such moment."""
    return True


def install_group(group: Group, context=None) -> bool:
    """Install `group` where its predicate holds of `context`, after its `prepare` (which
    may refuse what cannot work); returns whether the predicate held (the group is then in
    place, installed by this call or an earlier one)."""
    if not group.predicate or not resolve(group.predicate)(context):
        return False
    if group.prepare:
        resolve(group.prepare)(context)
    install(group)
    return True


def install_moment(moment: Moment, context=None, processes: str | None = None) -> list[str]:
    """Every group of `moment` (of `processes`, when given) whose predicate holds of
    `context`, installed in the manifest's order; the names of those in place."""
    return [g.name for g in GROUPS if g.moment is moment and g.predicate
            and (processes is None or g.processes == processes) and install_group(g, context)]


def installed() -> dict[str, bool]:
    """For every row installed by `install()` that this process can check: is it live?
    A hook row is live when its function is registered on its target and the target is
    patched; a resolution row when its function wraps the step."""
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.plugins.hook_registry import HookRegistry

    out = {}
    for p in PATCHES:
        if p.kind in HOOK_KINDS:
            fn = p.implementation()
            out[p.name] = (p.target in HookRegistry._patched
                           and any(h is fn for _, h, _ in HookRegistry._hooks.get(p.target, ())))
        elif p.kind is Kind.RESOLUTION:
            out[p.name] = any(f is p.implementation() for f in resolution_hooks._HOOKS.get(p.target, ()))
    return out


def resolve_target(target: str):
    """The upstream object a row or dependency names (`pkgutil.resolve_name`)."""
    return pkgutil.resolve_name(target)


__all__ = ["ADAPTIVE_METRICS", "B8_RESERVATION", "B8_STATE", "CHECKPOINT_COMPAT", "CPU_ATTENTION", "CPU_DFLASH",
           "CPU_DISAGGREGATION", "CPU_ENGINE", "CPU_FORWARD", "CPU_MODELS", "CPU_PROCESS", "CPU_STANDIN", "DEPENDS",
           "DISAGGREGATION",
           "DOMINO_ROLLOUT", "EVERY_PROCESS", "GROUPS", "HOOK_KINDS", "HYBRID_REPLAY", "INSTALLED_BY_GROUP", "PATCHES",
           "PENALTIES", "PLATFORM", "RESOLVE", "RUNNING_REQUESTS", "STEP", "WIDTH_STATE", "WORKER", "Dependency",
           "Group", "Kind", "Moment", "Patch", "always", "install", "install_group", "install_moment", "installed",
           "resolve_target", "rows"]
