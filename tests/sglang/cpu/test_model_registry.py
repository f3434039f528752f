"""A CPU scheduler's model registry imports the architectures it is asked for, not SGLang's
every model module (`cpu/model_registry.py`), and answers as 0.5.23's does."""

from __future__ import annotations

import pytest

from tests.sglang.probes import run_probe

CPU_ARGV = ("sglang", "serve", "--device", "cpu")


@pytest.fixture(scope="module")
def registry(sglang_tmp):
    return run_probe("model_registry", sglang_tmp, argv=CPU_ARGV)


def test_the_registry_is_imported_with_sglangs_models_deferred_and_the_variable_restored(registry):
    assert registry["imported_before"] is False   # nothing imported it before the group
    assert registry["deferred"] is True and registry["defaults_loaded"] is False
    assert registry["variable_left"] is None


def test_an_architecture_is_resolved_from_the_one_module_that_defines_it(registry):
    assert registry["defining"] == ["sglang.srt.models.qwen3"]
    assert registry["resolved"] == ["sglang.srt.models.qwen3", "Qwen3ForCausalLM", "Qwen3ForCausalLM"]
    assert registry["draft_supported"] is True and registry["draft_module"] == "sglang.srt.models.dflash"
    assert registry["defaults_loaded_after"] is False
    assert registry["models_imported"] < 20   # the two and what they import, not ~200


def test_what_is_not_found_so_falls_back_to_importing_every_model_as_upstream(registry):
    assert registry["unknown"] == "TransformersForCausalLM"   # 0.5.23's fallback for an unknown architecture
    assert registry["defaults_loaded_at_end"] is True
    assert registry["models_imported_at_end"] > 100 and registry["supported"] > 100
