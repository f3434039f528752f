"""A CPU scheduler imports the model it serves, not SGLang's every model.

0.5.23's model registry (`srt/models/registry.py`) imports all of SGLang's model modules,
about 200, when it is first imported: 2.1 s of a scheduler's start on a 2-core AMD EPYC
Zen 3, for a server that builds one target and one draft. The registry already has a
deferred mode, for external model packages (`SGLANG_EXTERNAL_MODEL_PACKAGE`): it then
imports SGLang's models only when an architecture is not found. Here the registry is
imported in that mode with a package that holds no models (`cpu/no_models`), the variable
restored at once; and an architecture the server asks about (`is_arch_supported`,
`resolve_model_cls`) is first looked for in the one module that defines it, found by
reading the model sources for `class <architecture>(`, and registered from that module's
`EntryClass`. Whatever is not found that way (an architecture exported by another module
than the one that defines it, one SGLang does not have, `--model-impl transformers`'s
fallback), and every other use of the registry (the list of architectures,
`register()`), imports SGLang's models as 0.5.23 does.

Installed at scheduler start in the processes that run a model on CPU (the `cpu model
registry` group), before anything there imports the registry; a user's own
`SGLANG_EXTERNAL_MODEL_PACKAGE` is left as it is.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import sys

logger = logging.getLogger(__name__)

REGISTRY = "sglang.srt.models.registry"
MODELS = "sglang.srt.models"
EXTERNAL = "SGLANG_EXTERNAL_MODEL_PACKAGE"
NO_MODELS = "sglang_domino.sglang.cpu.no_models"
_CLASS = re.compile(r"^class (\w+)\(", re.MULTILINE)


class State:
    deferred = False   # this process imported the registry with SGLang's models deferred


def defer_default_models() -> None:
    """The group's CALL row (run by `install()` before it applies the group's hooks, which
    import the registry): import 0.5.23's registry with SGLang's models deferred, where
    nothing imported it yet and the user named no external model package."""
    if REGISTRY in sys.modules or os.environ.get(EXTERNAL):
        return
    os.environ[EXTERNAL] = NO_MODELS
    try:
        importlib.import_module(REGISTRY)
    finally:
        del os.environ[EXTERNAL]
    State.deferred = True


@functools.cache
def _classes() -> dict[str, list[str]]:
    """Every class SGLang's model modules define at top level -> those modules, from their
    sources (read once a process, about 50 ms on the Zen 3; nothing imported)."""
    package = importlib.import_module(MODELS)
    found: dict[str, list[str]] = {}
    for folder in package.__path__:
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py") or name.startswith("_"):
                continue
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as fh:
                    text = fh.read()
            except OSError:
                continue
            for cls in dict.fromkeys(_CLASS.findall(text)):
                found.setdefault(cls, []).append(f"{MODELS}.{name[:-3]}")
    return found


def defining_modules(architecture: str) -> list[str]:
    """The SGLang model modules that define a class named `architecture`."""
    return list(_classes().get(architecture, ()))


def _register(registry, architecture: str) -> None:
    """Register `architecture` from the module that defines it, if that module exports it."""
    if (not State.deferred or registry._default_models_loaded or not isinstance(architecture, str)
            or architecture in registry.models):
        return
    from sglang.srt.environ import envs

    disabled = set(envs.SGLANG_DISABLED_MODEL_ARCHS.get())
    for name in defining_modules(architecture):
        if name.rsplit(".", 1)[-1] in disabled:
            continue
        try:
            module = importlib.import_module(name)
        except Exception as exc:   # as 0.5.23's own import of every model: that module skipped
            logger.warning("Ignore import error when loading %s: %s", name, exc)
            continue
        entry = getattr(module, "EntryClass", None)
        entries = entry if isinstance(entry, list) else [entry] if entry is not None else []
        if any(cls.__name__ == architecture for cls in entries):
            for cls in entries:
                registry.models.setdefault(cls.__name__, cls)
            return


def around_is_arch_supported(original, self, architecture):
    _register(self, architecture)
    return original(self, architecture)


def around_resolve_model_cls(original, self, architectures):
    first = architectures if isinstance(architectures, str) else (architectures or [None])[0]
    _register(self, first)
    return original(self, architectures)


__all__ = ["State", "around_is_arch_supported", "around_resolve_model_cls", "defer_default_models",
           "defining_modules"]
