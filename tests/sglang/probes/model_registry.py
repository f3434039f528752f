"""The `cpu model registry` group in a CPU process: which of SGLang's model modules the
registry imports to resolve the architectures a server asks for, and what it answers."""

from __future__ import annotations

import os
import sys


def _models_imported() -> int:
    return sum(1 for name in sys.modules if name.startswith("sglang.srt.models.") and name.count(".") == 3)


def probe(params):
    from sglang_domino.sglang.cpu import model_registry
    from sglang_domino.sglang.seam import hooks

    before = "sglang.srt.models.registry" in sys.modules
    hooks.install(hooks.CPU_MODELS)
    from sglang.srt.models.registry import ModelRegistry

    out = dict(imported_before=before, deferred=model_registry.State.deferred,
               variable_left=os.environ.get(model_registry.EXTERNAL),
               defaults_loaded=ModelRegistry._default_models_loaded,
               defining=model_registry.defining_modules("Qwen3ForCausalLM"))
    cls, arch = ModelRegistry.resolve_model_cls(["Qwen3ForCausalLM"])
    out.update(resolved=[cls.__module__, cls.__name__, arch],
               draft_supported=ModelRegistry.is_arch_supported("DFlashDraftModel"),
               draft_module=ModelRegistry.models["DFlashDraftModel"].__module__,
               models_imported=_models_imported(), defaults_loaded_after=ModelRegistry._default_models_loaded)
    try:
        out["unknown"] = ModelRegistry.resolve_model_cls(["NoSuchModelForCausalLM"])[1]
    except ValueError as exc:
        out["unknown"] = str(exc)[:200]
    out.update(defaults_loaded_at_end=ModelRegistry._default_models_loaded, models_imported_at_end=_models_imported(),
               supported=len(ModelRegistry.get_supported_archs()))
    return out
