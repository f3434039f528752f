"""The seam with SGLang: every row of `sglang_domino.sglang.seam.hooks` (PATCHES and DEPENDS)
checked against the installed SGLang, and every install group installed and seen live.

Run under `sglang serve --device cpu` (the CPU engine and the `sgl_kernel` stand-in)."""

import dataclasses
import inspect


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _params(obj) -> set:
    try:
        return set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return set()


def _has_attribute(obj, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        return True
    if isinstance(obj, type):
        return any(f"self.{name} =" in _source(cls) or f"self.{name}: " in _source(cls) for cls in obj.__mro__)
    return False


def _check(target: str, params=(), attributes=()) -> dict:
    """What is wrong with one upstream symbol, as {problem: detail}; empty when it holds."""
    import pkgutil

    try:
        obj = pkgutil.resolve_name(target)
    except Exception as err:  # noqa: BLE001 (any import or attribute error is the finding)
        return {"missing": f"{type(err).__name__}: {err}"}
    problems = {}
    if params:
        have = _params(obj)
        lost = [p for p in params if p not in have]
        # a **kwargs function that reads its keywords by name: look for the names in its body
        if lost and "kwargs" in have:
            lost = [p for p in lost if p not in _source(obj)]
        if lost:
            problems["params"] = lost
    lost = [a for a in attributes if not _has_attribute(obj, a)]
    if lost:
        problems["attributes"] = lost
    return problems


def _check_patch(patch) -> dict:
    from sglang.srt.arg_groups import resolution_hooks

    from sglang_domino.sglang.seam.hooks import Kind

    if patch.kind is Kind.RESOLUTION:
        return {} if patch.target in resolution_hooks._OVERRIDABLE_HOOKS else {"missing": "not an overridable step"}
    if patch.kind is Kind.IMPORT and patch.target == "sgl_kernel":
        import sys

        import sgl_kernel  # noqa: F401 (served by the platform entry point's finder)

        served = getattr(sys.modules["sgl_kernel"], "__sglang_domino_standin__", False)
        return {} if served else {"missing": "the stand-in is not serving sgl_kernel"}
    problems = _check(patch.target, patch.params, patch.attributes)
    try:
        patch.implementation()
    except Exception as err:  # noqa: BLE001
        problems["implementation"] = f"{type(err).__name__}: {err}"
    return problems


def _install_every_group() -> dict:
    """Which hook rows are live after `load_plugins()` alone, and after installing every
    group the worker and the scheduler start install."""
    from sglang.srt.plugins import load_plugins

    from sglang_domino.sglang.seam import hooks
    from sglang_domino.sglang import plugin

    load_plugins()
    plugin.register()  # idempotent
    after_load = hooks.installed()
    standin = hooks.install_group(hooks.CPU_STANDIN)
    hooks.install_group(hooks.CPU_ATTENTION)
    hooks.install_group(hooks.CPU_MODELS)
    for group in (hooks.CHECKPOINT_COMPAT, hooks.CPU_DFLASH, hooks.DOMINO_ROLLOUT, hooks.B8_RESERVATION):
        hooks.install(group)
    again = hooks.install(hooks.CPU_DFLASH)
    # a PD server's scheduler start on CPU (`disaggregation` and `cpu disaggregation`); b8
    from types import SimpleNamespace

    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    from sglang_domino.sglang.seam import scheduler_start

    host_indices_before = MooncakeKVSender.supports_host_tensor_indices
    scheduler_start.before_init_parallel_runtime(
        server_args=SimpleNamespace(disaggregation_mode="prefill", speculative_num_draft_tokens=None))
    hooks.install(hooks.B8_STATE)
    hooks.install(hooks.HYBRID_REPLAY)
    hooks.install(hooks.ADAPTIVE_METRICS)
    hooks.install(hooks.PENALTIES)
    hooks.install(hooks.CPU_FORWARD)   # with --enable-torch-compile
    return dict(after_load=after_load, after_all=hooks.installed(), standin=standin, install_twice=again,
                host_indices=[host_indices_before, MooncakeKVSender.supports_host_tensor_indices])


def probe(params) -> dict:
    from sglang_domino.sglang.seam.hooks import DEPENDS, PATCHES

    return dict(
        patches={p.name: _check_patch(p) for p in PATCHES},
        depends={d.target: _check(d.target, d.params, d.attributes) for d in DEPENDS},
        groups=_install_every_group(),
    )
