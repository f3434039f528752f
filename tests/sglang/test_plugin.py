"""Registration, argument resolution and the upstream symbols the plugin depends on.

Anything that imports sglang runs in a subprocess (a probe, `probes/*.py`): the plugin
patches sglang in place, and SGLang only logs a failing plugin, so each check asserts the
effect itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from sglang_domino.sglang.seam import hooks
from tests.helpers.servers import server_env, start_server
from tests.sglang.probes import run_probe


def test_entry_points_are_registered():
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert plugins.get("sglang_domino") == "sglang_domino.sglang.plugin:register"
    assert platforms.get("sglang_domino_cpu") == "sglang_domino.sglang.cpu.platform:activate"


def test_importing_the_package_and_plugin_modules_does_not_import_sglang(sglang_tmp):
    assert run_probe("imports", sglang_tmp) == []


def test_hooks_are_in_place_after_load_plugins(sglang_tmp):
    r = run_probe("hooks", sglang_tmp)
    # without --device cpu only the `every process` rows of hooks.py are installed
    assert r["hooks"] == {p.name: p.group is hooks.EVERY_PROCESS for p in hooks.PATCHES if p.name in r["hooks"]}
    assert {"create_worker", "max_draft_tokens", "add_cli_args", "validate_request", "resolve_dflash",
            "resolve_cpu"} <= set(r["hooks"])
    assert r["resolution_hooks"] == 1
    assert r["worker"] == "sglang_domino.sglang.step.worker.DominoDFlashWorker"
    assert r["mamba"] == "extra_buffer"
    assert r["mamba_default"] == "auto"
    # no --device cpu on this command line: the CPU engine stays off, the list untouched
    assert r["cpu_engine"] is None and r["torch_native_draft"] is False


def test_device_cpu_on_the_command_line_switches_the_cpu_engine_on(sglang_tmp):
    r = run_probe("hooks", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"), params={"standin": True})
    assert r["cpu_engine"] == "1"
    assert r["torch_native_draft"] is True
    assert r["standin"] is True


def test_disable_env_leaves_upstream_behaviour(sglang_tmp):
    r = run_probe("disabled", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"), SGLANG_DOMINO_DISABLE="1")
    assert r["hooks"] and not any(r["hooks"].values()), r["hooks"]
    assert r["cpu_engine"] == "1"  # the CPU switch is not the worker: it stays on


def resolve(tmp, models, cases, env=None, device="cpu") -> list[dict]:
    """Resolve each (draft path, extra args) case in one fresh sglang process."""
    argvs = [["--model-path", models["target"], "--device", device, "--speculative-algorithm", "DFLASH",
              "--speculative-draft-model-path", draft, *extra] for draft, extra in cases]
    return run_probe("resolve", tmp, argv=("sglang", "serve", "--device", device), params={"cases": argvs},
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
    # on CPU the synchronous scheduler loop, as 0.5.23 declares for EAGLE and n-gram there
    assert w8 == {"ok": True, "num_draft_tokens": 8, "draft_backend": "torch_native", "block": 8,
                  "max_draft": 16, "draft_block": "16", "overlap": False}
    assert plain == {"ok": True, "num_draft_tokens": 16, "draft_backend": "torch_native", "block": 16,
                     "max_draft": 16, "overlap": False}
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
                  "draft_block": "16", "overlap": True}
    assert b16 == {"ok": True, "num_draft_tokens": 16, "draft_backend": "flashinfer", "block": 16, "max_draft": 16,
                   "overlap": True}


def test_resolution_of_the_transformers_window_option(sglang_tmp, models):
    """`--speculative-num-draft-tokens 17` over a 16-slot block: the Transformers window
    (shift_label Domino drafts only); the environment switch that once selected it is
    refused, its flag named."""
    window = ["--speculative-dflash-block-size", "16", "--speculative-num-draft-tokens", "17"]
    hf17, dflash = resolve(sglang_tmp, models, [(models["domino"], window), (models["dflash"], window)])
    assert hf17 == {"ok": True, "num_draft_tokens": 17, "draft_backend": "torch_native", "block": 17,
                    "max_draft": 17, "draft_block": "16", "overlap": False}
    assert not dflash["ok"] and "needs a Domino draft with dflash_config.shift_label=true" in dflash["error"]
    (old,) = resolve(sglang_tmp, models, [(models["domino"], ["--speculative-dflash-block-size", "16"])],
                     env={"SGLANG_DOMINO_HF_WINDOW": "1"})
    assert not old["ok"] and "SGLANG_DOMINO_HF_WINDOW was removed: use --speculative-num-draft-tokens 17" in old["error"]


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
    # another member of 0.5.23's DFLASH family (a DFlash2 selector draft): refused, not cut per width
    dflash2 = _bad_draft(models, sglang_tmp, "dflash2", architectures=["DFlash2DraftModel"])
    (other,) = resolve(sglang_tmp, models, [(dflash2, ["--speculative-dflash-block-size", "16", flag])])
    assert not other["ok"] and "serves DFlash and Domino drafts" in other["error"], other
    assert "['DFlash2DraftModel']" in other["error"]
    (hf,) = resolve(sglang_tmp, models, [(models["domino"], ["--speculative-dflash-block-size", "16", flag,
                                                              "--speculative-num-draft-tokens", "17"])])
    assert not hf["ok"] and "cannot be combined with a verify window of draft block + 1" in hf["error"]
    # the width goes from the first TP rank to the others: no rank may sit the step out
    pp, dp = resolve(sglang_tmp, models, [
        (models["domino"], ["--speculative-dflash-block-size", "16", flag, "--pp-size", "2"]),
        (models["domino"], ["--speculative-dflash-block-size", "16", flag, "--enable-dp-attention", "--tp-size", "2",
                            "--dp-size", "2", "--enable-dp-lm-head"]),
    ], device="cuda")  # 0.5.23 itself refuses DFLASH with DP attention on CPU
    assert not pp["ok"] and "--speculative-adaptive with DFLASH cannot be combined with --pp-size 2" in pp["error"]
    assert not dp["ok"] and "cannot be combined with DP attention" in dp["error"], dp["error"]


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


def test_the_q_rule_under_tp_needs_its_broadcasts(monkeypatch):
    """At TP > 1 the q rule is refused when `SGLANG_SPEC_TP_SYNC` leaves out a site that
    broadcasts rank 0's sampled proposals or acceptance (ranks would verify different
    tokens); the default and a single rank pass."""
    from sglang_domino.sglang.resolve import _check_q_rule_tp_sync

    monkeypatch.delenv("SGLANG_SPEC_TP_SYNC", raising=False)
    _check_q_rule_tp_sync(2)
    monkeypatch.setenv("SGLANG_SPEC_TP_SYNC", "all,-dflash-accept-sample")
    _check_q_rule_tp_sync(1)
    with pytest.raises(ValueError, match="SGLANG_SPEC_TP_SYNC must include dflash-accept-sample"):
        _check_q_rule_tp_sync(2)
    monkeypatch.setenv("SGLANG_SPEC_TP_SYNC", "off")
    with pytest.raises(ValueError, match="must include dflash-selector and dflash-accept-sample"):
        _check_q_rule_tp_sync(4)


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


def test_upstream_symbols_the_plugin_depends_on_are_still_there(sglang_tmp):
    r = run_probe("upstream", sglang_tmp)
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


def test_b8_decode_reservation_covers_the_draft_block(sglang_tmp):
    """Width 8, block 16: upstream reserves 2 x 8 past the committed length; the draft
    writes 16 slots after up to 8 of host lag, so 8 + 16 are reserved."""
    r = run_probe("reserve", sglang_tmp)
    assert r["upstream_call"]
    assert r["before"] == [[12, 80], [26, 80], 14]
    assert r["after"] == [[12, 80], [34, 80], 22]


def test_sglang_serve_exits_with_the_draft_error_before_serving(sglang_tmp, models):
    """The real CLI: a draft whose vocabulary does not match the target stops
    `sglang serve` during argument resolution, with the parser's message."""
    draft = _bad_draft(models, sglang_tmp, "vocab", vocab_size=1024)
    args = ["--model-path", models["target"], "--device", "cpu", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", draft, "--speculative-dflash-block-size", "16",
            "--max-total-tokens", "1024"]
    with pytest.raises(RuntimeError, match="server exited with code -?[1-9]") as refused:
        start_server(args, sglang_tmp, "bad-vocab").stop()
    assert "vocab_size: draft has 1024, expected the target's vocab_size 512" in str(refused.value)


def test_speculative_flags_without_a_speculative_algorithm_are_refused(sglang_tmp, models):
    """A plain server given a flag that means something only with speculation: refused at
    start-up naming it (0.5.23 crashes on the first in its pool configurator, ignores the
    others); the plain server itself resolves."""
    plain = ["--model-path", models["target"], "--device", "cpu"]
    cases = [[], ["--enable-linear-replayssm-spec"], ["--speculative-adaptive"],
             ["--speculative-use-rejection-sampling"], ["--speculative-num-draft-tokens", "8"],
             ["--speculative-draft-model-path", models["domino"], "--speculative-dflash-block-size", "16"]]
    ok, *refused = run_probe("resolve", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"),
                             params={"cases": [[*plain, *extra] for extra in cases]})
    assert ok["ok"], ok
    for extra, r in zip(cases[1:], refused):
        assert not r["ok"], extra
        assert r["error"].startswith("ValueError"), r
        for flag in (a for a in extra if a.startswith("--")):
            assert flag in r["error"], (flag, r["error"])
        assert "add --speculative-algorithm DFLASH --speculative-draft-model-path" in r["error"]


def test_recurrent_state_flags_on_an_attention_only_target_are_refused(sglang_tmp, models):
    """`--mamba-scheduler-strategy` (or `--mamba-radix-cache-strategy`) and
    `--enable-linear-replayssm-spec` on a Qwen3 target, which has no recurrent state:
    refused naming the flag; the same server without them resolves."""
    spec = ["--speculative-dflash-block-size", "16"]
    ok, strategy, renamed, replay = resolve(sglang_tmp, models, [
        (models["dflash"], spec),
        (models["dflash"], [*spec, "--mamba-scheduler-strategy", "no_buffer"]),
        (models["dflash"], [*spec, "--mamba-radix-cache-strategy", "no_buffer"]),
        (models["dflash"], [*spec, "--enable-linear-replayssm-spec"]),
    ])
    assert ok["ok"], ok
    for r, flag in ((strategy, "--mamba-radix-cache-strategy no_buffer"),
                    (renamed, "--mamba-radix-cache-strategy no_buffer"), (replay, "--enable-linear-replayssm-spec")):
        assert not r["ok"] and flag in r["error"], r
        assert "has no recurrent (mamba / linear-attention) layers" in r["error"], r


def test_resolution_refuses_extra_buffer_on_cpu_and_names_what_serves(sglang_tmp):
    """The Qwen3.6-27B card's `--mamba-scheduler-strategy extra_buffer` cannot run on
    0.5.23's CPU platform; the refusal names the settings the hybrid CPU tests serve with
    (a tiny gated delta-net target, as those tests serve)."""
    from tests.helpers import tiny

    target = os.path.join(sglang_tmp, "plugin-hybrid-target")
    if not os.path.exists(target):
        tiny.build_hybrid_target(target)
    base = ["--model-path", target, "--device", "cpu"]
    extra, no_buffer, no_radix = run_probe("resolve", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"), params={
        "cases": [[*base, "--mamba-scheduler-strategy", "extra_buffer"],
                  [*base, "--mamba-scheduler-strategy", "no_buffer", "--disable-overlap-schedule"],
                  [*base, "--mamba-scheduler-strategy", "extra_buffer", "--disable-radix-cache"]]})
    assert not extra["ok"]
    assert "--mamba-scheduler-strategy extra_buffer is not available with --device cpu" in extra["error"]
    assert "--mamba-scheduler-strategy no_buffer --disable-overlap-schedule" in extra["error"]
    assert no_buffer["ok"] and no_radix["ok"], (no_buffer, no_radix)


def test_enable_torch_compile_on_cpu_refuses_what_it_cannot_compile_and_the_removed_switches(sglang_tmp, models):
    """`--enable-torch-compile --device cpu` resolves for a Qwen3 target, plain or with a
    Domino draft, and for a dense text-only Qwen3.5 (gated delta-net) target; another
    architecture (here the MoE Qwen3.5) is refused naming why and what serves; the
    environment switches it replaced are refused naming it."""
    import json
    import shutil

    from tests.helpers import tiny

    target = os.path.join(sglang_tmp, "plugin-hybrid-target")
    if not os.path.exists(target):
        tiny.build_hybrid_target(target)
    moe = os.path.join(sglang_tmp, "plugin-hybrid-moe-target")
    if not os.path.exists(moe):
        shutil.copytree(target, moe)
        with open(os.path.join(moe, "config.json")) as fh:
            config = json.load(fh)
        config["architectures"] = ["Qwen3_5MoeForCausalLM"]
        with open(os.path.join(moe, "config.json"), "w") as fh:
            json.dump(config, fh)
    flag = ["--device", "cpu", "--enable-torch-compile"]
    spec = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", models["domino"],
            "--speculative-dflash-block-size", "16"]
    hybrid_args = [*flag, "--mamba-scheduler-strategy", "no_buffer", "--disable-overlap-schedule"]
    plain, domino, hybrid, other = run_probe("resolve", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"), params={
        "cases": [["--model-path", models["target"], *flag], ["--model-path", models["target"], *flag, *spec],
                  ["--model-path", target, *hybrid_args], ["--model-path", moe, *hybrid_args]]})
    assert plain["ok"] and domino["ok"] and hybrid["ok"], (plain, domino, hybrid)
    assert not other["ok"]
    assert "--enable-torch-compile with --device cpu compiles Qwen3ForCausalLM, Qwen3_5ForCausalLM targets" \
           in other["error"]
    assert "Qwen3_5MoeForCausalLM" in other["error"] and "serve it without --enable-torch-compile" in other["error"]
    removed, = run_probe("resolve", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"),
                         params={"cases": [["--model-path", models["target"], *flag]]},
                         SGLANG_DOMINO_CPU_FORWARD="compiled")
    assert not removed["ok"]
    assert "SGLANG_DOMINO_CPU_FORWARD was removed: use SGLang's own --enable-torch-compile (with --device cpu)" \
           in removed["error"]


def test_resolution_of_a_cpu_decode_server_keeps_its_retraction_backup_in_host_memory(sglang_tmp, models):
    """0.5.23 picks the `host_pool` retraction backup for a decode server, pinned with
    cudaHostRegister: on CPU `cpu_tensor` is declared and an explicit `host_pool` refused."""
    pd = ["--speculative-dflash-block-size", "16", "--disaggregation-mode"]
    decode, prefill, host_pool = resolve(sglang_tmp, models, [
        (models["domino"], [*pd, "decode"]),
        (models["domino"], [*pd, "prefill"]),
        (models["domino"], [*pd, "decode", "--disaggregation-decode-retraction-backup", "host_pool"]),
    ])
    assert decode["ok"] and decode["retraction_backup"] == "cpu_tensor"
    assert prefill["ok"] and "retraction_backup" in prefill and prefill["retraction_backup"] is None
    assert not host_pool["ok"]
    assert "--disaggregation-decode-retraction-backup host_pool is not available with --device cpu" in host_pool["error"]
    assert "use --disaggregation-decode-retraction-backup cpu_tensor" in host_pool["error"]


def test_upstream_hybrid_symbols_the_cpu_path_depends_on(sglang_tmp):
    r = run_probe("hybrid_upstream", sglang_tmp, argv=("sglang", "serve", "--device", "cpu"))
    assert r["conv"] and r["chunk"] and r["verify_kwargs"]
    assert r["scatter_params"] == ["mamba_caches", "state_indices_tensor", "last_correct_step_indices",
                                   "mamba_track_indices", "mamba_steps_to_track", "src_indices_raw"]
    assert r["installed"] and r["scatter"] and r["norm"] and r["fused_norm"]
    assert r["runtime"] and r["extra_buffer_gate"]
