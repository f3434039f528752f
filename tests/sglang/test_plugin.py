"""Registration, argument resolution and the upstream symbols the plugin depends on.

Anything that imports sglang runs in a subprocess: the plugin patches sglang in place,
and SGLang only logs a failing plugin, so each check asserts the effect itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points


from conftest import server_env

MARK = "@@RESULT@@"


def run_py(code: str, tmp: str, argv=("sglang",), **env) -> dict:
    prelude = f"import sys, json\nsys.argv = {list(argv)!r}\n"
    script = prelude + textwrap.dedent(code)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env=server_env(tmp, **env))
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise AssertionError(f"no result (rc={out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")


def emit(name: str = "result") -> str:
    return f"print({MARK!r} + json.dumps({name}))"


def test_entry_points_are_registered():
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert plugins.get("sglang_domino") == "sglang_domino.sglang.plugin:register"
    assert platforms.get("sglang_domino_cpu") == "sglang_domino.sglang.platform:activate"


def test_importing_the_package_and_plugin_modules_does_not_import_sglang(sglang_tmp):
    result = run_py(f"""
        import sglang_domino, sglang_domino.sglang, sglang_domino.sglang.plugin, sglang_domino.sglang.platform
        import sglang_domino.sglang.checks
        result = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang.") or m == "sgl_kernel")
        {emit()}
    """, sglang_tmp)
    assert result == []


HOOK_CHECK = f"""
    import os
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_domino.sglang import plugin
    plugin.register(); plugin.register()  # idempotent
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    ours = sum(1 for f in resolution_hooks._HOOKS.get("handle_speculative_decoding", ())
               if getattr(f, "_sglang_domino", False))
    worker = SpeculativeAlgorithm.DFLASH.create_worker(None) if plugin.hooks_installed()["create_worker"] else None
    import argparse
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "x", "--mamba-scheduler-strategy", "extra_buffer"])
    ns_default = parser.parse_args(["--model-path", "x"])
    result = dict(hooks=plugin.hooks_installed(), resolution_hooks=ours,
                  worker=None if worker is None else worker.__module__ + "." + worker.__name__,
                  mamba=getattr(ns, "mamba_radix_cache_strategy", None),
                  mamba_default=getattr(ns_default, "mamba_radix_cache_strategy", None),
                  torch_native_draft="torch_native" in DRAFT_ATTENTION_BACKEND_CHOICES,
                  cpu_engine=os.environ.get("SGLANG_USE_CPU_ENGINE"))
    {emit()}
"""


def test_hooks_are_in_place_after_load_plugins(sglang_tmp):
    r = run_py(HOOK_CHECK, sglang_tmp)
    assert r["hooks"] == {"create_worker": True, "max_draft_tokens": True, "add_cli_args": True,
                          "validate_request": True, "resolution": True}
    assert r["resolution_hooks"] == 1
    assert r["worker"] == "sglang_domino.sglang.worker.DominoDFlashWorker"
    assert r["mamba"] == "extra_buffer"
    assert r["mamba_default"] == "auto"
    # no --device cpu on this command line: the CPU engine stays off, the list untouched
    assert r["cpu_engine"] is None and r["torch_native_draft"] is False


def test_device_cpu_on_the_command_line_switches_the_cpu_engine_on(sglang_tmp):
    r = run_py(textwrap.dedent(HOOK_CHECK) + textwrap.dedent(f"""
        import sgl_kernel
        result = dict(result, standin=bool(getattr(sgl_kernel, "__sglang_domino_standin__", False)))
        {emit()}
    """), sglang_tmp, argv=("sglang", "serve", "--device", "cpu"))
    assert r["cpu_engine"] == "1"
    assert r["torch_native_draft"] is True
    assert r["standin"] is True


def test_disable_env_leaves_upstream_behaviour(sglang_tmp):
    r = run_py(f"""
        import os
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang_domino.sglang import plugin
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
        result = dict(hooks=plugin.hooks_installed(), cpu_engine=os.environ.get("SGLANG_USE_CPU_ENGINE"))
        {emit()}
    """, sglang_tmp, argv=("sglang", "serve", "--device", "cpu"), SGLANG_DOMINO_DISABLE="1")
    assert r["hooks"] == {"create_worker": False, "max_draft_tokens": False, "add_cli_args": False,
                          "validate_request": False,
                          "resolution": False}
    assert r["cpu_engine"] == "1"  # the CPU switch is not the worker: it stays on


RESOLVE = f"""
    import os
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens
    result = []
    for args in CASES:
        try:
            sa = prepare_server_args(args)
            sa.resolve_once()
            v = resolving_view(sa)
            result.append(dict(ok=True, num_draft_tokens=v.speculative_num_draft_tokens,
                               draft_backend=v.speculative_draft_attention_backend,
                               block=v.speculative_dflash_block_size,
                               max_draft=max_speculative_num_draft_tokens(sa),
                               **({{"draft_block": os.environ["SGLANG_DOMINO_DRAFT_BLOCK"]}}
                                  if "SGLANG_DOMINO_DRAFT_BLOCK" in os.environ else {{}}),
                               **({{"adaptive": json.loads(os.environ["SGLANG_DOMINO_ADAPTIVE"]),
                                    "upstream_adaptive": v.speculative_adaptive}}
                                  if "SGLANG_DOMINO_ADAPTIVE" in os.environ else {{}})))
        except Exception as err:
            result.append(dict(ok=False, error=type(err).__name__ + ": " + str(err)))
    {emit()}
"""


def resolve(tmp, models, cases, env=None, device="cpu") -> list[dict]:
    """Resolve each (draft path, extra args) case in one fresh sglang process."""
    argvs = [["--model-path", models["target"], "--device", device, "--speculative-algorithm", "DFLASH",
              "--speculative-draft-model-path", draft, *extra] for draft, extra in cases]
    return run_py(f"CASES = {argvs!r}\n" + textwrap.dedent(RESOLVE), tmp, argv=("sglang", "serve", "--device", device),
                  **(env or {}))


def test_resolution_on_cpu_verify_width_and_its_limits(sglang_tmp, models):
    w8, plain, too_wide, compact = resolve(sglang_tmp, models, [
        (models["domino"], ["--speculative-dflash-block-size", "16", "--speculative-num-draft-tokens", "8"]),
        (models["dflash"], ["--speculative-dflash-block-size", "16"]),
        (models["dflash"], ["--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "16"]),
        (models["dflash"], ["--speculative-dflash-block-size", "16", "--speculative-num-draft-tokens", "8",
                            "--speculative-draft-window-size", "64"]),
    ])
    # the scheduler accounts in verify windows (8: verify batch, target graphs, result
    # stride); the draft block (16) travels apart and sizes the runners' buffers
    assert w8 == {"ok": True, "num_draft_tokens": 8, "draft_backend": "torch_native", "block": 8,
                  "max_draft": 16, "draft_block": "16"}
    assert plain == {"ok": True, "num_draft_tokens": 16, "draft_backend": "torch_native", "block": 16,
                     "max_draft": 16}
    assert not too_wide["ok"]
    assert "verify width" in too_wide["error"]
    assert "larger than --speculative-dflash-block-size 8" in too_wide["error"]
    assert not compact["ok"] and "drop --speculative-draft-window-size" in compact["error"]


def test_resolution_on_cuda_keeps_flashinfer_for_the_draft(sglang_tmp, models):
    """The Qwen3.6-27B card's flags on a CUDA server (resolution only: no GPU here): the
    draft gets FlashInfer attention (upstream's choice, left as is) and b8 still verifies 8."""
    b8, b16 = resolve(sglang_tmp, models, [
        (models["domino"], ["--attention-backend", "flashinfer", "--speculative-dflash-block-size", "16",
                            "--speculative-num-draft-tokens", "8"]),
        (models["dflash"], ["--attention-backend", "flashinfer", "--speculative-dflash-block-size", "16",
                            "--speculative-num-draft-tokens", "16"]),
    ], device="cuda")
    assert b8 == {"ok": True, "num_draft_tokens": 8, "draft_backend": "flashinfer", "block": 8, "max_draft": 16,
                  "draft_block": "16"}
    assert b16 == {"ok": True, "num_draft_tokens": 16, "draft_backend": "flashinfer", "block": 16, "max_draft": 16}


def test_resolution_of_the_transformers_window_option(sglang_tmp, models):
    hf17, dflash = resolve(sglang_tmp, models, [
        (models["domino"], ["--speculative-dflash-block-size", "16"]),
        (models["dflash"], ["--speculative-dflash-block-size", "16"]),
    ], env={"SGLANG_DOMINO_HF_WINDOW": "1"})
    assert hf17 == {"ok": True, "num_draft_tokens": 17, "draft_backend": "torch_native", "block": 17,
                    "max_draft": 17, "draft_block": "16"}
    assert not dflash["ok"] and "needs a Domino draft with dflash_config.shift_label=true" in dflash["error"]


def test_resolution_of_the_adaptive_flag(sglang_tmp, models, tmp_path):
    """`--speculative-adaptive` (0.5.23: EAGLE only, turned off for DFLASH) means the adaptive
    verify width: its settings validated and carried to the schedulers, upstream's own
    EAGLE machinery left off; the window stays the largest width; combinations the worker
    cannot serve are refused with the flag named."""
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps({"widths": [8, 2], "probe_every": 8}))
    eagle = tmp_path / "eagle.json"
    eagle.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    flag = "--speculative-adaptive"
    default, b8, bad, compact = resolve(sglang_tmp, models, [
        (models["domino"], ["--speculative-dflash-block-size", "16", flag]),
        (models["dflash"], ["--speculative-dflash-block-size", "16", "--speculative-num-draft-tokens", "8", flag,
                            "--speculative-adaptive-config", str(narrow)]),
        (models["domino"], ["--speculative-dflash-block-size", "16", flag, "--speculative-adaptive-config", str(eagle)]),
        (models["domino"], ["--speculative-dflash-block-size", "16", flag, "--speculative-draft-window-size", "64"]),
    ])
    assert default["ok"] and default["num_draft_tokens"] == 16 and default["max_draft"] == 16, default
    assert default["adaptive"]["widths"] == [16, 8, 4, 2, 1] and default["upstream_adaptive"] is False
    assert b8["ok"] and b8["num_draft_tokens"] == 8 and b8["draft_block"] == "16", b8
    assert b8["adaptive"]["widths"] == [8, 2] and b8["adaptive"]["probe_every"] == 8
    assert not bad["ok"] and "--speculative-adaptive-config" in bad["error"] and "Extra inputs" in bad["error"]
    assert "fields: widths" in bad["error"]
    assert not compact["ok"] and "needs the full draft cache" in compact["error"]
    (hf,) = resolve(sglang_tmp, models, [(models["domino"], ["--speculative-dflash-block-size", "16", flag])],
                    env={"SGLANG_DOMINO_HF_WINDOW": "1"})
    assert not hf["ok"] and "cannot be combined with SGLANG_DOMINO_HF_WINDOW=1" in hf["error"]


def test_disabled_plugin_gives_upstreams_cpu_refusal(sglang_tmp, models):
    (r,) = resolve(sglang_tmp, models, [(models["dflash"], ["--speculative-dflash-block-size", "16"])],
                   env={"SGLANG_DOMINO_DISABLE": "1"})
    assert not r["ok"]
    assert "DFLASH speculative decoding is not supported by CpuSRTPlatform" in r["error"]


def _bad_draft(models, tmp, name, **changes):
    import shutil

    path = os.path.join(tmp, "bad-drafts", name)
    if not os.path.exists(path):
        shutil.copytree(models["dflash"], path)
        with open(os.path.join(path, "config.json")) as fh:
            cfg = json.load(fh)
        for key, value in changes.items():
            if key == "dflash_config":
                cfg[key].update(value)
            else:
                cfg[key] = value
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(cfg, fh)
    return path


BAD_DRAFTS = [
    ("vocab", {"vocab_size": 1024}, "vocab_size: draft has 1024, expected the target's vocab_size 512"),
    ("hidden", {"hidden_size": 128}, "hidden_size: draft has 128, expected the target's hidden_size 64"),
    ("mask", {"dflash_config": {"mask_token_id": 4096}},
     "mask_token_id: got 4096, expected an id inside the target vocabulary [0, 511]"),
    ("last_layer", {"dflash_config": {"target_layer_ids": [1, 3]}}, "expected ids below the target's last layer 3"),
    ("projector", {"dflash_config": {"projector_type": "medusa"}}, "dflash_config.projector_type: got 'medusa'"),
]


def test_resolution_of_the_rejection_sampling_flag(sglang_tmp, models):
    """`--speculative-use-rejection-sampling` (0.5.23: EAGLE only) means the q rule for Domino
    drafts; a plain DFlash draft and accept thresholds are refused with the reason."""
    flag = "--speculative-use-rejection-sampling"
    domino, dflash, thresholds = resolve(sglang_tmp, models, [
        (models["domino"], ["--speculative-dflash-block-size", "16", flag]),
        (models["dflash"], ["--speculative-dflash-block-size", "16", flag]),
        (models["domino"], ["--speculative-dflash-block-size", "16", flag,
                            "--speculative-accept-threshold-single", "0.5"]),
    ])
    assert domino["ok"], domino
    assert not dflash["ok"] and "needs a Domino draft" in dflash["error"] and "point-mass rule" in dflash["error"]
    assert not thresholds["ok"] and "--speculative-accept-threshold-single must be 1.0 (got 0.5)" in thresholds["error"]


def test_rejection_sampling_help_says_what_it_means_with_dflash(sglang_tmp):
    # `sglang serve --help` prints before it loads plugins (`cli/serve.py:195-207`); the
    # server's own parser, which every launch goes through, carries the text.
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--help"],
                          capture_output=True, text=True, timeout=300, env=server_env(sglang_tmp))
    help_text = " ".join(proc.stdout.split())
    assert "With DFLASH and a Domino draft (sglang-domino)" in help_text
    assert "Refused for plain DFlash drafts" in help_text


def test_resolution_refuses_a_draft_that_does_not_fit_the_target(sglang_tmp, models):
    results = resolve(sglang_tmp, models, [
        (_bad_draft(models, sglang_tmp, name, **changes), ["--speculative-dflash-block-size", "16"])
        for name, changes, _ in BAD_DRAFTS])
    for (name, _, message), r in zip(BAD_DRAFTS, results):
        assert not r["ok"], name
        assert r["error"].startswith("DraftConfigError"), (name, r)
        assert message in r["error"], (name, r)


UPSTREAM = f"""
    import inspect
    from sglang.srt.plugins import load_plugins
    import sglang.srt.speculative.dflash_worker_v2 as w2
    import sglang.srt.speculative.domino_utils as du
    import sglang.srt.arg_groups.speculative_hook as sh
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES, add_draft_attention_backend_choices
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.models import dflash as mdf
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    src_validate = inspect.getsource(du.validate_domino_runtime)
    last_raise = src_validate.rsplit("raise ValueError", 1)[1]
    result = dict(
        max_tokens=list(inspect.signature(SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens).parameters),
        spec_info=list(inspect.signature(w2.make_draft_block_spec_info).parameters),
        spec_override=hasattr(__import__("sglang.srt.runtime_context", fromlist=["x"])._ConfigBag, "override"),
        capture_width="get_spec().speculative_num_draft_tokens" in inspect.getsource(
            __import__("sglang.srt.model_executor.runner.decode_cuda_graph_runner", fromlist=["x"]).DecodeCudaGraphRunner.__init__),
        plan=list(inspect.signature(__import__("sglang.srt.mem_cache.kv_index_translator", fromlist=["x"]).KVIndexTranslator.plan).parameters),
        probs=list(inspect.signature(__import__("sglang.srt.speculative.dflash_utils", fromlist=["x"]).build_speculative_verify_target_probs).parameters),
        accept=list(inspect.signature(w2.DFlashWorkerV2._accept_block).parameters),
        sampled_guard="is_dflash_sampling_verify_available()" in inspect.getsource(w2.DFlashWorkerV2._accept_block),
        validate_sampling=list(inspect.signature(w2.DFlashWorkerV2._validate_phase1_sampling_support).parameters),
        commit=list(inspect.signature(w2._commit_accept).parameters),
        draft_forward="draft_out = self.draft_model_runner.forward(forward_batch)" in inspect.getsource(w2.DFlashWorkerV2.forward_batch_generation),
        init_params=list(inspect.signature(w2.DFlashWorkerV2.__init__).parameters),
        validate_bound=w2.validate_domino_runtime is du.validate_domino_runtime,
        bf16_is_last=("BF16" in last_raise and "requires CUDA" in src_validate),
        platform_global=hasattr(sh, "current_platform") and "current_platform.is_out_of_tree()" in inspect.getsource(sh._handle_dflash),
        choices_list=isinstance(DRAFT_ATTENTION_BACKEND_CHOICES, list),
        record_stream="record_stream(" in inspect.getsource(w2.DFlashWorkerV2.forward_batch_generation),
        fwd_ext=list(inspect.signature(TorchNativeAttnBackend.forward_extend).parameters)[:6],
        extend_kwargs=list(inspect.signature(ModelRunner._extend_forward_kwargs).parameters),
        qk_flag="use_table_qk_norm_rope" in inspect.getsource(mdf),
        create_worker=list(inspect.signature(SpeculativeAlgorithm.create_worker).parameters),
        parse=list(inspect.signature(__import__("sglang.srt.speculative.dflash_utils", fromlist=["x"]).parse_dflash_draft_config).parameters),
        load_weights=list(inspect.signature(mdf.DFlashDraftModel.load_weights).parameters),
        validate_request=list(inspect.signature(__import__("sglang.srt.managers.tokenizer_manager", fromlist=["x"]).TokenizerManager._validate_one_request).parameters),
        domino_check="logit_head" not in inspect.getsource(mdf) and "prefix_gru" in inspect.getsource(mdf.DFlashDraftModel.load_weights),
        rollout_bound=w2.domino_greedy_rollout is du.domino_greedy_rollout,
        rollout_params=list(inspect.signature(du.domino_greedy_rollout).parameters),
        eager_rollout_call="draft_next = domino_greedy_rollout(" in inspect.getsource(w2.DFlashWorkerV2.forward_batch_generation),
        sampler_gate="self._draft_sampler is not None" in inspect.getsource(w2.DFlashWorkerV2.forward_batch_generation),
        gru_cell=list(inspect.signature(du._domino_gru_cell).parameters),
        tp_sites={{"DFLASH_SELECTOR", "DFLASH_ACCEPT_SAMPLE"}} <= set(w2.SpecTpSyncSite.__members__),
        rejection_field=hasattr(__import__("sglang.srt.server_args", fromlist=["x"]).ServerArgs(model_path="x"),
                                "speculative_use_rejection_sampling"),
    )
    {emit()}
"""


def test_upstream_symbols_the_plugin_depends_on_are_still_there(sglang_tmp):
    r = run_py(UPSTREAM, sglang_tmp)
    assert r["max_tokens"] == ["self", "server_args"]
    assert r["probs"] == ["next_token_logits", "sampling_info", "draft_token_num", "bs", "max_top_k",
                          "uniform_top_k_value", "use_sparse_topk"]
    assert r["accept"] == ["self", "candidates", "next_token_logits", "sampling_info", "draft_input",
                           "prefix_lens", "bs", "target_predict"]
    assert r["sampled_guard"] and r["validate_sampling"] == ["self", "batch"]
    assert r["commit"] == ["candidates", "accept_len", "bonus_tokens"]
    assert r["spec_info"] == ["draft_token_num", "device"]
    assert r["spec_override"] and r["capture_width"] and r["draft_forward"]
    assert r["plan"] == ["self", "req_pool_indices", "seq_lens", "seq_lens_cpu", "write_virtual", "read_extent",
                         "write_slots", "translated_writes"]
    assert r["init_params"] == ["self", "server_args", "gpu_id", "nccl_port", "target_worker"]
    assert r["validate_bound"] and r["bf16_is_last"] and r["platform_global"] and r["choices_list"]
    assert r["record_stream"] and r["qk_flag"]
    assert r["fwd_ext"] == ["self", "q", "k", "v", "layer", "forward_batch"]
    assert r["extend_kwargs"] == ["self", "forward_batch", "pp_proxy_tensors"]
    assert r["create_worker"] == ["self", "server_args"]
    assert r["parse"] == ["draft_hf_config"]
    assert r["load_weights"] == ["self", "weights"]
    assert r["validate_request"] == ["self", "obj", "input_ids"]
    assert r["domino_check"]
    assert r["rollout_bound"] and r["eager_rollout_call"] and r["sampler_gate"] and r["tp_sites"]
    assert r["rollout_params"] == ["draft_hidden", "bonus_tokens", "target_embedding", "lm_head_weight", "prefix_gru",
                                   "embed_proj", "vocab_size", "shift_label", "candidate_pool_size", "tp_group",
                                   "lm_head_org_vocab_start", "lm_head_num_org", "lm_head_num_org_padded",
                                   "in_cuda_graph"]
    assert r["gru_cell"] == ["prefix_gru", "input", "hidden"]
    assert r["rejection_field"]


RESERVE = f"""
    from types import SimpleNamespace
    import inspect
    import sglang.srt.speculative.dflash_info_v2 as info
    from sglang_domino.sglang.worker import reserve_draft_block

    def lens(reserve):
        reqs = [SimpleNamespace(kv=SimpleNamespace(kv_committed_len=10, kv_allocated_len=12)),
                SimpleNamespace(kv=SimpleNamespace(kv_committed_len=40, kv_allocated_len=80))]
        return info.page_aligned_decode_alloc_lens(reqs, reserve=reserve, page_size=1)

    before = lens(16)
    reserve_draft_block(8)
    reserve_draft_block(8)  # idempotent: one hook, the extra is not added twice
    result = dict(before=before, after=lens(16),
                  upstream_call="page_aligned_decode_alloc_lens(" in inspect.getsource(
                      info.DFlashDraftInputV2.prepare_for_decode)
                  and "reserve = 2 * block_size" in inspect.getsource(info.DFlashDraftInputV2.prepare_for_decode))
    {emit()}
"""


def test_b8_decode_reservation_covers_the_draft_block(sglang_tmp):
    """Width 8, block 16: upstream reserves 2 x 8 past the committed length; the draft
    writes 16 slots after up to 8 of host lag, so 8 + 16 are reserved."""
    r = run_py(RESERVE, sglang_tmp)
    assert r["upstream_call"]
    assert r["before"] == [[12, 80], [26, 80], 14]
    assert r["after"] == [[12, 80], [34, 80], 22]


def test_sglang_serve_exits_with_the_draft_error_before_serving(sglang_tmp, models):
    """The real CLI: a draft whose vocabulary does not match the target stops
    `sglang serve` during argument resolution, with the parser's message."""
    from conftest import free_port

    draft = _bad_draft(models, sglang_tmp, "vocab", vocab_size=1024)
    cmd = [os.path.join(os.path.dirname(sys.executable), "sglang"), "serve", "--model-path", models["target"],
           "--device", "cpu", "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft,
           "--speculative-dflash-block-size", "16", "--max-total-tokens", "1024",
           "--host", "127.0.0.1", "--port", str(free_port())]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=server_env(sglang_tmp))
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert "vocab_size: draft has 1024, expected the target's vocab_size 512" in out


def test_resolution_refuses_extra_buffer_on_cpu_and_names_what_serves(sglang_tmp, models):
    """The Qwen3.6-27B card's `--mamba-scheduler-strategy extra_buffer` cannot run on
    0.5.23's CPU platform; the refusal names the settings the hybrid CPU tests serve with."""
    extra, no_buffer, no_radix = resolve(sglang_tmp, models, [
        (models["dflash"], ["--speculative-dflash-block-size", "16", "--mamba-scheduler-strategy", "extra_buffer"]),
        (models["dflash"], ["--speculative-dflash-block-size", "16", "--mamba-scheduler-strategy", "no_buffer",
                            "--disable-overlap-schedule"]),
        (models["dflash"], ["--speculative-dflash-block-size", "16", "--mamba-scheduler-strategy", "extra_buffer",
                            "--disable-radix-cache"]),
    ])
    assert not extra["ok"]
    assert "--mamba-scheduler-strategy extra_buffer is not available with --device cpu" in extra["error"]
    assert "--mamba-scheduler-strategy no_buffer --disable-overlap-schedule" in extra["error"]
    assert no_buffer["ok"] and no_radix["ok"]


HYBRID_UPSTREAM = f"""
    import inspect
    import sglang.srt.layers.attention.linear.gdn_backend as gdn
    import sglang.srt.layers.attention.linear.kernels.gdn_triton as gdn_triton
    import sglang.srt.layers.attention.hybrid_linear_attn_backend as hybrid
    import sglang.srt.distributed.bootstrap as bootstrap
    import sglang.srt.arg_groups.mamba_hook as mamba_hook
    from sglang.kernels.ops.attention.fla.layernorm_gated import RMSNorm
    from sglang.kernels.ops.attention.fla.fused_norm_gate import FusedRMSNormGated
    from sglang.kernels.ops.attention.fla.layernorm_gated import rms_norm_ref
    from types import SimpleNamespace
    import torch
    from sglang_domino.sglang import cpu_gdn_ops, cpu_hybrid
    src = inspect.getsource(gdn) + inspect.getsource(gdn_triton)
    installed = cpu_hybrid.install()
    # the replacements answer through upstream's own names, on CPU tensors
    pool = torch.zeros(1, 3, 2)
    buf = torch.arange(12.0).reshape(1, 2, 3, 2)
    hybrid.scatter_mamba_states_after_mtp_verify(
        SimpleNamespace(temporal=pool, intermediate_ssm=buf, conv=[], intermediate_conv_window=[]),
        torch.tensor([2, 0]), torch.tensor([1, 2]), None, None)
    norm = RMSNorm(8, eps=1e-6, group_size=4, norm_before_gate=True)
    x, z = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        ref = rms_norm_ref(x, norm.weight, None, z=z, eps=1e-6, group_size=4, norm_before_gate=True)
        fused = FusedRMSNormGated(8, eps=1e-6, activation="silu")
        fused.weight.uniform_(0.5, 1.5)
        fused_ref = rms_norm_ref(x, fused.weight, None, z=z, eps=1e-6, norm_before_gate=True)
    result = dict(
        # the stand-ins are what 0.5.23 bound by name on CPU
        conv=gdn.causal_conv1d_fn is cpu_gdn_ops.causal_conv1d_fn_cpu
             and gdn.causal_conv1d_update is cpu_gdn_ops.causal_conv1d_update_cpu,
        chunk=gdn_triton.chunk_gated_delta_rule is cpu_gdn_ops.chunk_gated_delta_rule_cpu,
        verify_kwargs=all(k in src for k in ("disable_state_update=True", "intermediate_states_buffer=",
                                               "intermediate_conv_window=", "cache_steps=")),
        scatter_params=list(inspect.signature(hybrid.scatter_mamba_states_after_mtp_verify).parameters),
        installed=installed,
        scatter=pool[0].tolist() == [buf[0, 1, 2].tolist(), [0.0, 0.0], buf[0, 0, 1].tolist()],
        norm=bool(torch.allclose(norm(x, z), ref, atol=1e-6)),
        fused_norm=bool(torch.allclose(fused(x.clone(), z), fused_ref, atol=1e-6)),
        runtime="init_parallel_runtime" in dir(bootstrap),
        extra_buffer_gate=hasattr(mamba_hook, "_platform_supports_mamba_cache_extra_buffer"),
    )
    {emit()}
"""


def test_upstream_hybrid_symbols_the_cpu_path_depends_on(sglang_tmp):
    r = run_py(HYBRID_UPSTREAM, sglang_tmp, argv=("sglang", "serve", "--device", "cpu"))
    assert r["conv"] and r["chunk"] and r["verify_kwargs"]
    assert r["scatter_params"] == ["mamba_caches", "state_indices_tensor", "last_correct_step_indices",
                                   "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"]
    assert r["installed"] and r["scatter"] and r["norm"] and r["fused_norm"]
    assert r["runtime"] and r["extra_buffer_gate"]
