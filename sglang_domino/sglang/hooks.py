"""The seam with SGLang 0.5.23: every patch the plugin makes, declared in one list.

SGLang has no extension point for most of what a DFLASH plugin must change, so the plugin
patches private symbols of the pinned release. `PATCHES` names each one: the upstream
symbol, how it is changed (`Kind`), which processes change it and at which moment
(`Moment`), the install unit it belongs to (`Group`), and why. `DEPENDS` names what the
plugin reads or calls without changing it. `UPSTREAM.md` beside this file gives each row's
file:line in the pinned wheel; `tests/sglang/test_seam.py` checks every row against the
installed SGLang, one case per row.

The kinds are installed in two ways:
  * `install(group)` installs the group's rows of the kinds `HookRegistry` applies
    (AROUND, AFTER, BEFORE, REPLACE), the resolution hooks, and runs its CALL rows, once
    per process;
  * the other kinds (a module global swapped for a scope, an instance's method or
    attribute, per-step state, the import finder) are done by the code the row names at
    the moment it states; they are listed here so that the whole seam reads in one place.

This module is imported by the entry point in every process: it imports nothing heavy,
and each row names its implementation as `module:attr` under `sglang_domino.sglang`,
resolved only when installed.
"""

from __future__ import annotations

import enum
import importlib
import pkgutil
from dataclasses import dataclass


class Kind(str, enum.Enum):
    AROUND = "around"              # HookRegistry: fn(original, *args, **kwargs)
    AFTER = "after"                # HookRegistry: fn(result, *args, **kwargs)
    BEFORE = "before"              # HookRegistry: fn(*args, **kwargs)
    REPLACE = "replace"            # HookRegistry: the function replaced (by-name imports too)
    RESOLUTION = "resolution"      # register_resolution_hook(step): fn(server_args, previous)
    CALL = "call"                  # install() calls the implementation once per process
    SCOPED_GLOBAL = "scoped global"    # a module global swapped while one call runs
    INSTANCE = "instance"          # a method or attribute of one upstream object
    STEP_STATE = "step state"      # worker attributes swapped for one decode step
    IMPORT = "import"              # the import system (sys.meta_path, environment)


HOOK_KINDS = (Kind.AROUND, Kind.AFTER, Kind.BEFORE, Kind.REPLACE)
INSTALLED_BY_GROUP = (*HOOK_KINDS, Kind.RESOLUTION, Kind.CALL)


class Moment(str, enum.Enum):
    PLATFORM_IMPORT = "first `import sglang` (platform entry point)"
    REGISTER = "plugin entry point `register()`"
    RESOLUTION = "argument resolution (main process)"
    SCHEDULER_START = "scheduler start, before the model is built"
    WORKER_INIT = "`DominoDFlashWorker.__init__`"
    STEP = "every decode step"


@dataclass(frozen=True)
class Group:
    """Rows installed together, under one condition."""
    name: str
    moment: Moment
    processes: str
    when: str
    apply_now: bool = True  # False: `load_plugins()` applies them right after `register()`


EVERY_PROCESS = Group("every process", Moment.REGISTER, "every SGLang process", "plugin enabled", apply_now=False)
CPU_ENGINE = Group("cpu engine", Moment.REGISTER, "every SGLang process", "`--device cpu` (SGLANG_USE_CPU_ENGINE=1)")
CPU_STANDIN = Group("cpu stand-in", Moment.SCHEDULER_START, "model-running processes",
                    "the `sgl_kernel` stand-in is serving")
CHECKPOINT_COMPAT = Group("checkpoint compat", Moment.WORKER_INIT, "schedulers", "always")
CPU_DFLASH = Group("cpu dflash", Moment.WORKER_INIT, "schedulers", "the target runs on CPU")
DOMINO_ROLLOUT = Group("domino rollout", Moment.WORKER_INIT, "schedulers", "a Domino draft")
B8_RESERVATION = Group("b8 reservation", Moment.WORKER_INIT, "schedulers", "draft block wider than the verify window")
WORKER = Group("worker", Moment.WORKER_INIT, "schedulers", "as stated per row (done by the worker)")
STEP = Group("step", Moment.STEP, "schedulers", "as stated per row (done by the worker)")
RESOLVE = Group("resolve", Moment.RESOLUTION, "main process", "as stated per row")
PLATFORM = Group("platform", Moment.PLATFORM_IMPORT, "every SGLang process", "`--device cpu`")
DISAGGREGATION = Group("disaggregation", Moment.SCHEDULER_START, "schedulers",
                       "`--disaggregation-mode prefill|decode`")
B8_STATE = Group("b8 state buffers", Moment.SCHEDULER_START, "schedulers",
                 "DFLASH with a draft block wider than the verify window")
CPU_DISAGGREGATION = Group("cpu disaggregation", Moment.SCHEDULER_START, "schedulers",
                           "`--disaggregation-mode prefill|decode` with `--device cpu`")
PENALTIES = Group("penalties", Moment.WORKER_INIT, "schedulers", "always")
ADAPTIVE_METRICS = Group("adaptive metrics", Moment.WORKER_INIT, "schedulers", "`--speculative-adaptive`")
CPU_ATTENTION = Group("cpu attention", Moment.SCHEDULER_START, "model-running processes",
                      "`--device cpu`, unless SGLANG_DOMINO_DEBUG=upstream-cpu-attention")
CPU_FORWARD = Group("cpu compiled forward", Moment.SCHEDULER_START, "model-running processes",
                    "`--device cpu` with `--enable-torch-compile`")

# hybrid replay (issue 21): rows in the `hybrid replay` block of PATCHES
HYBRID_REPLAY = Group("hybrid replay", Moment.SCHEDULER_START, "schedulers",
                      "DFLASH with `--enable-linear-replayssm-spec`")

# effective max_running_requests (issue 21): rows in the `running requests` block of PATCHES
RUNNING_REQUESTS = Group("running requests", Moment.SCHEDULER_START, "schedulers", "plugin enabled")

GROUPS = (EVERY_PROCESS, CPU_ENGINE, CPU_STANDIN, CHECKPOINT_COMPAT, CPU_DFLASH, DOMINO_ROLLOUT, B8_RESERVATION,
          WORKER, STEP, RESOLVE, PLATFORM, DISAGGREGATION, CPU_DISAGGREGATION, B8_STATE, CPU_ATTENTION, CPU_FORWARD,
          ADAPTIVE_METRICS, PENALTIES,
          HYBRID_REPLAY, RUNNING_REQUESTS)


@dataclass(frozen=True)
class Patch:
    name: str
    target: str   # upstream symbol; `Class.attr` of an instance attribute; a resolution step's name
    impl: str     # `module:attr` under sglang_domino.sglang
    kind: Kind
    group: Group
    why: str
    # parameters of the target the implementation passes or reads by name
    params: tuple[str, ...] = ()
    # INSTANCE / STEP_STATE rows: attributes the upstream class sets on its instances
    # (checked in its source), not class attributes
    attributes: tuple[str, ...] = ()

    @property
    def moment(self) -> Moment:
        return self.group.moment

    def implementation(self):
        module, attr = self.impl.split(":")
        obj = importlib.import_module(f"{__package__}.{module}")
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj


_S = "sglang.srt"
_W2 = f"{_S}.speculative.dflash_worker_v2"
WIDTH_STATE = (
    "_block_pos_offsets",
    "_draft_block_ids_buf", "_draft_block_positions_buf", "_draft_block_tokens_buf",
    "_draft_verify_out_cache_loc_buf", "_draft_block_end_buf", "_draft_seq_lens_cpu_buf",
    "_accept_bonus_buffer_cap", "_accept_bonus_buffer_slot", "_accept_len_buf",
    "_commit_lens_bufs", "_bonus_id_bufs", "_out_tokens_bufs", "_new_seq_lens_bufs",
)

# the arguments both torch_native attention loops take (`cpu/attention.py` passes them on)
_SDPA_PARAMS = ("query", "output", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "seq_lens",
                "encoder_lens", "scaling", "enable_gqa", "causal", "is_cross_attn", "sliding_window_size")

PATCHES: tuple[Patch, ...] = (
    # -- every process, from the plugin entry point ------------------------------------
    Patch("create_worker", f"{_S}.speculative.spec_info.SpeculativeAlgorithm.create_worker",
          "plugin:around_create_worker", Kind.AROUND, EVERY_PROCESS,
          "DFLASH gets DominoDFlashWorker; the algorithm keeps its name, which ~30 core files key on"),
    Patch("max_draft_tokens",
          f"{_S}.speculative.spec_info.SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens",
          "plugin:around_max_draft_tokens", Kind.AROUND, EVERY_PROCESS,
          "runner buffers sized for a draft block wider than the verify window (b8)"),
    Patch("add_cli_args", f"{_S}.server_args.ServerArgs.add_cli_args",
          "plugin:after_add_cli_args", Kind.AFTER, EVERY_PROCESS,
          "the model cards' --mamba-scheduler-strategy as an alias; the q rule's meaning in the help"),
    Patch("validate_request", f"{_S}.managers.tokenizer_manager.TokenizerManager._validate_one_request",
          "plugin:before_validate_one_request", Kind.BEFORE, EVERY_PROCESS,
          "prompt token ids outside the vocabulary are refused instead of killing the scheduler",
          params=("obj", "input_ids")),
    Patch("request_proposals_kept", f"{_S}.managers.tokenizer_manager.TokenizerManager.update_request_meta_info",
          "request_accept:around_update_request_meta_info", Kind.AROUND, EVERY_PROCESS,
          "an adaptive server's per-request proposal count (customized info) is kept on the request's state, "
          "not accumulated into meta_info; other customized info passes unchanged",
          params=("meta_info", "state", "customized_info", "index", "finish_reason")),
    Patch("request_accept_rate", f"{_S}.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
          "request_accept:around_calculate_spec_decoding_metrics", Kind.AROUND, EVERY_PROCESS,
          "meta_info.spec_accept_rate of an adaptive server's request divides by the proposals its steps "
          "verified, not by every step at the largest width",
          params=("meta_info", "recv_obj", "i")),
    Patch("resolve_dflash", "handle_speculative_decoding", "resolve:resolve_speculative", Kind.RESOLUTION,
          EVERY_PROCESS, "verify width below the block, adaptive width, q rule, draft checked against the target, "
          "DFLASH allowed on CPU"),
    Patch("resolve_cpu", "handle_model_specific_adjustments", "cpu.resolve:resolve_mamba_on_cpu", Kind.RESOLUTION,
          EVERY_PROCESS, "extra_buffer refused on CPU with the settings that do serve"),
    Patch("resolve_cpu_pd", "handle_pd_disaggregation", "cpu.disaggregation:resolve_pd_on_cpu", Kind.RESOLUTION,
          EVERY_PROCESS, "a CPU decode server's retraction backup is cpu_tensor; host_pool (cudaHostRegister) "
          "refused at start-up"),
    Patch("scheduler_start_groups", f"{_S}.distributed.bootstrap.init_parallel_runtime",
          "scheduler_start:before_init_parallel_runtime", Kind.BEFORE, EVERY_PROCESS,
          "installs, before the pools are built, `running requests` in every scheduler, the `disaggregation` "
          "groups in a PD server's schedulers, `b8 state buffers` when the draft block is wider than the window "
          "and `hybrid replay` for DFLASH with `--enable-linear-replayssm-spec`",
          params=("server_args",)),
    # -- CPU engine processes, from the plugin entry point -------------------------------
    Patch("bind_threads", f"{_S}.distributed.bootstrap._bind_threads_if_cpu",
          "cpu.parallel:around_bind_threads", Kind.AROUND, CPU_ENGINE,
          "--tp-size N on one NUMA node: each rank gets its share of the cores",
          params=("device",)),
    Patch("model_parallel_group", f"{_S}.distributed.parallel_state.init_model_parallel_group",
          "cpu.parallel:around_init_model_parallel_group", Kind.AROUND, CPU_ENGINE,
          "no PyNccl or custom all-reduce on CPU: gloo does every collective",
          params=("use_pynccl", "use_custom_allreduce")),
    Patch("scheduler_start", f"{_S}.distributed.bootstrap.init_parallel_runtime",
          "cpu.hybrid:before_init_parallel_runtime", Kind.BEFORE, CPU_ENGINE,
          "installs the `cpu stand-in` and `cpu attention` groups in the processes that run a model"),
    Patch("draft_backend_choice", f"{_S}.arg_groups.choices.DRAFT_ATTENTION_BACKEND_CHOICES",
          "cpu.dflash:allow_torch_native_draft_backend", Kind.CALL, CPU_ENGINE,
          "torch_native accepted as the draft attention backend (else flashinfer is chosen)"),
    # -- model-running CPU processes while the sgl_kernel stand-in serves ----------------
    Patch("rms_norm_gated", "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward",
          "cpu.qwen3_5_ops:rms_norm_gated_forward", Kind.REPLACE, CPU_STANDIN,
          "the Qwen3.5 gated-delta-net output norm is Triton-only without AMX"),
    Patch("fused_rms_norm_gated", "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward",
          "cpu.qwen3_5_ops:fused_rms_norm_gated_forward", Kind.REPLACE, CPU_STANDIN,
          "Qwen3-Next's gated norm, Triton-only without AMX"),
    Patch("mamba_state_scatter",
          "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify",
          "cpu.gdn_ops:scatter_mamba_states_after_mtp_verify", Kind.REPLACE, CPU_STANDIN,
          "the accepted position's recurrent state committed after a verify; upstream's raises for CPU tensors",
          params=("mamba_caches", "state_indices_tensor", "last_correct_step_indices", "mamba_track_indices",
                  "mamba_steps_to_track", "src_indices_raw")),
    # -- model-running CPU processes: torch_native attention batched --------------------
    Patch("cpu_attention_decode",
          f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_decode",
          "cpu.attention:around_sdpa_forward_decode", Kind.AROUND, CPU_ATTENTION,
          "one attention call per layer for the whole decode batch instead of a loop over requests",
          params=_SDPA_PARAMS),
    Patch("cpu_attention_extend",
          f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_extend",
          "cpu.attention:around_sdpa_forward_extend", Kind.AROUND, CPU_ATTENTION,
          "a verify or draft block of W rows per request: one call per layer over W query rows, not a loop "
          "over requests computing every prefix row and dropping it",
          params=(*_SDPA_PARAMS, "extend_prefix_lens", "extend_seq_lens")),
    # -- model-running CPU processes, `--enable-torch-compile`: the target's and the draft's layers compiled --
    Patch("cpu_compiled_forward", f"{_S}.model_executor.model_runner.ModelRunner.load_model",
          "cpu.compiled_forward:after_load_model", Kind.AFTER, CPU_FORWARD,
          "a CPU model's layers run as one torch.compile graph (0.5.23's eager forward is mostly Python and "
          "dispatch at small sizes, and does not compile as it stands); compiled before the first request"),
    Patch("cpu_no_upstream_graph_runner",
          f"{_S}.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph",
          "cpu.compiled_forward:around_capture_decode_graph", Kind.AROUND, CPU_FORWARD,
          "the compiled layers serve every CPU step: 0.5.23's CPUGraphRunner, which the flag would build, needs "
          "the intel_amx attention backend (AttributeError with torch_native) and refuses speculative servers",
          params=("model_runner",)),
    # -- schedulers of a PD server, at scheduler start ------------------------------------
    Patch("pd_draft_check", f"{_S}.disaggregation.decode.DecodePreallocQueue._init_receiver",
          "disaggregation:around_init_receiver", Kind.AROUND, DISAGGREGATION,
          "a decode server checks each prefill server's draft on first contact: warns, naming the fix, when "
          "the prompt's draft context would not arrive or not fit; refuses the pair that would crash",
          params=("decode_req",)),
    Patch("pd_page_indices", f"{_S}.disaggregation.mooncake.conn.MooncakeKVSender.supports_host_tensor_indices",
          "cpu.disaggregation:plain_page_indices", Kind.CALL, CPU_DISAGGREGATION,
          "on CPU the prefill side's page indices go to the transfer thread as they are "
          "(no pinned copy, no torch.cuda.Event)"),
    Patch("pd_cached_prefix", f"{_S}.disaggregation.prefill.SchedulerDisaggregationPrefillMixin."
          "maybe_send_cached_prefix_chunk", "cpu.disaggregation:around_send_cached_prefix", Kind.AROUND,
          CPU_DISAGGREGATION, "on CPU a cached prefix is sent early without a torch.cuda.Event: the forward "
          "that wrote it has returned", params=("req",)),
    Patch("b8_state_buffers", f"{_S}.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool",
          "draft_block:around_init_mamba_pool", Kind.AROUND, B8_STATE,
          "a hybrid target's per-position recurrent-state buffers sized for the verify window (0.5.23 sizes "
          "them with the draft block, which the plugin's max draft tokens report, and budgets the window)",
          params=("speculative_num_draft_tokens",)),
    # -- schedulers, from DominoDFlashWorker.__init__ ------------------------------------
    Patch("parse_draft_config", f"{_S}.speculative.dflash_utils.parse_dflash_draft_config",
          "compat:around_parse_dflash_draft_config", Kind.AROUND, CHECKPOINT_COMPAT,
          "legacy exports name the Domino projector `causal_v5`",
          params=("draft_hf_config",)),
    Patch("load_draft_weights", f"{_S}.models.dflash.DFlashDraftModel.load_weights",
          "compat:around_load_weights", Kind.AROUND, CHECKPOINT_COMPAT,
          "legacy `logit_head.*` keys, which upstream silently ignores",
          params=("weights",)),
    Patch("draft_architecture", f"{_S}.models.registry.ModelRegistry.models",
          "compat:register_domino_architecture", Kind.CALL, CHECKPOINT_COMPAT,
          "SpecForge exports name the architecture `DominoDraftModel`"),
    Patch("torch_native_verify", f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
          "cpu.dflash:around_torch_native_forward_extend", Kind.AROUND, CPU_DFLASH,
          "TARGET_VERIFY batches arrive without extend lengths, which the CPU backend needs",
          params=("q", "k", "v", "layer", "forward_batch")),
    Patch("record_stream", "torch.Tensor.record_stream", "cpu.dflash:skip_record_stream_on_cpu", Kind.CALL,
          CPU_DFLASH, "upstream records a stream on CPU tensors, which torch rejects"),
    Patch("domino_device_gate", f"{_W2}.validate_domino_runtime", "cpu.dflash:domino_device_gate_lifted",
          Kind.SCOPED_GLOBAL, WORKER,
          "while DFlashWorkerV2.__init__ runs on CPU: Domino's CUDA and BF16 demands lifted, every other check kept"),
    Patch("draft_qk_norm_rope", f"{_S}.models.dflash.DFlashAttention", "cpu.dflash:disable_triton_qk_norm_rope",
          Kind.INSTANCE, WORKER, "on CPU: no Triton driver for the draft's fused qk-norm/rope",
          attributes=("use_table_qk_norm_rope",)),
    Patch("draft_embeds_dtype", f"{_S}.model_executor.model_runner.ModelRunner._extend_forward_kwargs",
          "cpu.dflash:keep_input_embeds_dtype", Kind.INSTANCE, WORKER,
          "a draft that is not bf16: upstream casts the draft block's input_embeds to bf16",
          params=("forward_batch", "pp_proxy_tensors")),
    Patch("domino_rollout", f"{_W2}.domino_greedy_rollout", "rollout_hook:around_domino_rollout", Kind.AROUND,
          DOMINO_ROLLOUT, "width-1 steps propose nothing; the eager feedback embedding looked up plainly; "
          "the q rule's sampled rollout; on CPU, opt-in, the greedy rollout compiled",
          params=("draft_hidden", "lm_head_weight", "vocab_size", "shift_label", "tp_group", "lm_head_num_org_padded",
                  "candidate_pool_size", "bonus_tokens", "target_embedding", "prefix_gru", "embed_proj",
                  "in_cuda_graph")),
    Patch("b8_reservation", f"{_S}.speculative.dflash_info_v2.page_aligned_decode_alloc_lens",
          "draft_block:around_decode_alloc_lens", Kind.AROUND, B8_RESERVATION,
          "the decode KV reservation covers the whole draft block",
          params=("reqs", "reserve")),
    Patch("verify_logits_adjustments", f"{_W2}.apply_dflash_verify_logits_adjustments",
          "penalty_state:around_verify_logits_adjustments", Kind.AROUND, PENALTIES,
          "a penalised step's adjustments are the worker's, per position of the block (0.5.23 broadcasts one "
          "penalty over the block and feeds its penalizers no output); other callers and steps get upstream's",
          params=("next_token_logits", "sampling_info", "draft_token_num")),
    Patch("adaptive_accept_rate",
          f"{_S}.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats",
          "metrics:around_report_decode_stats", Kind.AROUND, ADAPTIVE_METRICS,
          "the logged and exported accept rate divides by the proposals adaptive steps verified, not by every "
          "step at the largest width"),
    Patch("request_proposals_sent", f"{_S}.managers.scheduler.Scheduler.get_output_streamer_class",
          "request_accept:around_get_output_streamer_class", Kind.AROUND, ADAPTIVE_METRICS,
          "the output streamer adds each request's count of verified proposals to its outputs (0.5.23's "
          "customized-info channel), for its accept rate in meta_info"),
    Patch("first_verify_log", f"{_S}.managers.tp_worker.TpModelWorker.forward_batch_generation",
          "worker:FirstVerifyLog", Kind.INSTANCE, WORKER,
          "the target worker of a DominoDFlashWorker: the first verify's width logged (what the target computed "
          "per request); the batch is passed on unchanged",
          params=("forward_batch", "is_verify")),
    Patch("draft_block_runner", f"{_S}.model_executor.model_runner.ModelRunner.forward",
          "draft_block:DraftBlockRunner", Kind.INSTANCE, WORKER,
          "the draft runner of a DominoDFlashWorker runs on the draft block when it differs from the verify window",
          params=("forward_batch",)),
    # -- schedulers, every decode step ----------------------------------------------------
    Patch("width_state", f"{_W2}.DFlashWorkerV2", "width_switch:WidthSwitch", Kind.STEP_STATE, STEP,
          "--speculative-adaptive: upstream's step runs unchanged at the chosen width; the in-graph "
          "sampler's block-wide proposals read at that width (`draft_tail.FirstProposals`)",
          attributes=("block_size", "speculative_num_draft_tokens", "_draft_sampler", *WIDTH_STATE)),
    Patch("verify_graphs", f"{_S}.model_executor.model_runner.ModelRunner", "verify_graphs:VerifyGraphs",
          Kind.STEP_STATE, STEP, "--speculative-adaptive with target decode graphs: the target verifies a step at "
          "another width on that width's attention backend and graph (captured at start-up), so it replays",
          attributes=("attn_backend", "decode_cuda_graph_runner")),
    Patch("q_rule_sampler", f"{_W2}.DFlashWorkerV2", "worker:DominoDFlashWorker._forward_with_q_rollout",
          Kind.STEP_STATE, STEP, "the q rule without its captured rollout (no draft graph, no candidate pool): "
          "the in-graph greedy sampler unread for a step with sampled requests; with it, each decode step stages its "
          "rows' sampling parameters for the draft replay (`q_sampler.QRuleDraftSampler`)",
          attributes=("_draft_sampler",)),
    # -- main process, argument resolution -----------------------------------------------
    Patch("cpu_dflash_platform", f"{_S}.arg_groups.speculative_hook.current_platform",
          "cpu.dflash:dflash_allowed_on_cpu", Kind.SCOPED_GLOBAL, RESOLVE,
          "while DFLASH's arguments are resolved for --device cpu: the device gate says yes"),
    # -- first `import sglang` ------------------------------------------------------------
    Patch("cpu_engine_switch", f"{_S}.utils.common.is_cpu", "cpu.platform:activate", Kind.IMPORT, PLATFORM,
          "--device cpu switches the CPU engine on before `is_cpu()` is first read"),
    Patch("sgl_kernel_standin", "sgl_kernel", "cpu.platform:install_sgl_kernel_finder", Kind.IMPORT, PLATFORM,
          "the real sgl_kernel first; the pure-PyTorch stand-in when it cannot load"),
    # -- hybrid replay (issue 21): DFLASH on a gated delta-net target with 0.5.23's ------
    # -- `--enable-linear-replayssm-spec` (`hybrid_replay.py`); CPU kernels in `cpu stand-in`
    Patch("replay_pool_gate", f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator._build_hybrid_req_pool",
          "hybrid_replay:around_build_hybrid_req_pool", Kind.AROUND, HYBRID_REPLAY,
          "0.5.23's 'requires a KDA model' refusal lifted for a GDN target (its commit is this plugin's); the "
          "ring length checked against the verify window; the state memory logged"),
    Patch("replay_commit",
          f"{_S}.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
          "update_mamba_state_after_mtp_verify",
          "hybrid_replay:around_update_mamba_state_after_mtp_verify", Kind.AROUND, HYBRID_REPLAY,
          "DFLASH's commit on a pool with GDN replay rings: 0.5.23's ReplaySSM cursor advance, fold and conv "
          "rollback (`spec_utils`), not the scatter of per-position states (not allocated)",
          params=("last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track", "model",
                  "req_pool_indices")),
    Patch("replay_verify_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.gdn_replayssm_spec_decode",
          "cpu.gdn_replay:gdn_replayssm_spec_decode", Kind.REPLACE, CPU_STANDIN,
          "the GDN replay verify (imported inside `_replayssm_target_verify`); Triton-only upstream",
          params=("q", "k", "v", "a", "b", "A_log", "dt_bias", "checkpoint_state", "d_cache", "k_cache", "g_cache",
                  "rawv_cache", "rawk_cache", "beta_cache", "out", "query_start_loc", "ssm_state_indices",
                  "replay_indices", "write_pos", "cache_base", "is_flush", "max_cache_len", "max_spec_len", "scale",
                  "use_qk_l2norm_in_kernel", "null_block_id", "launch_mode")),
    Patch("replay_cursors_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.commit_gdn_replayssm_spec",
          "cpu.gdn_replay:commit_gdn_replayssm_spec", Kind.REPLACE, CPU_STANDIN,
          "the replay commit's cursor advance; Triton-only upstream",
          params=("write_pos", "cache_base", "is_flush", "num_accepted", "replay_indices", "max_cache_len",
                  "max_spec_len", "fold_every_commit", "null_block_id")),
    Patch("replay_fold_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.commit_gdn_replayssm_circular",
          "cpu.gdn_replay:commit_gdn_replayssm_circular", Kind.REPLACE, CPU_STANDIN,
          "the replay commit's fold of a row's records into its checkpoint; Triton-only upstream",
          params=("checkpoint_state", "d_cache", "k_cache", "g_cache", "d_residual_cache", "k_residual_cache",
                  "state_batch_indices", "replay_indices", "write_pos", "cache_base", "is_flush", "accept_lens",
                  "mamba_track_indices", "mamba_steps_to_track", "null_block_id")),
    Patch("replay_conv_cpu", "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_with_mask",
          "cpu.gdn_replay:fused_conv_window_scatter_with_mask", Kind.REPLACE, CPU_STANDIN,
          "the conv windows' rollback (not replayed: kept per position); raises for CPU tensors upstream",
          params=("dst", "src", "dst_indices_raw", "step_indices_raw", "src_indices_raw")),
    # -- running requests (issue 21): the effective max_running_requests reported -------
    Patch("running_requests_bounds", f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator.resolve_max_num_reqs",
          "running_requests:around_resolve_max_num_reqs", Kind.AROUND, RUNNING_REQUESTS,
          "records the KV and mamba-state bounds it applies, so the summary warning names its cause",
          params=("token_capacity",)),
    Patch("running_requests_report", f"{_S}.managers.scheduler.Scheduler.get_init_info",
          "running_requests:after_get_init_info", Kind.AFTER, RUNNING_REQUESTS,
          "`/server_info`'s top-level max_running_requests is the value the scheduler admits after every cap "
          "(the request under requested_max_running_requests); one warning when it is below the request"),
)


@dataclass(frozen=True)
class Dependency:
    """An upstream symbol the plugin relies on without changing it."""
    target: str
    why: str
    params: tuple[str, ...] = ()   # parameters the plugin passes or reads by name
    attributes: tuple[str, ...] = ()


DEPENDS: tuple[Dependency, ...] = (
    Dependency(f"{_S}.plugins.load_plugins", "runs `register()` in every process"),
    Dependency(f"{_S}.plugins.hook_registry.HookRegistry.register", "installs the hook rows",
               params=("target", "hook", "hook_type")),
    Dependency(f"{_S}.plugins.hook_registry.HookRegistry.apply_hooks", "applies them"),
    Dependency(f"{_S}.arg_groups.resolution_hooks.register_resolution_hook", "installs the resolution rows",
               params=("name",)),
    Dependency(f"{_S}.arg_groups.model_override_base.resolving_view", "resolved fields during resolution"),
    Dependency(f"{_S}.arg_groups.overrides.declare_resolution", "the verify window and adaptive flag declared"),
    Dependency(f"{_S}.arg_groups.overrides.post_capture_kv_sizing_planned",
               "no KV-share reserve for the adaptive widths' captures where the pool is sized after capture"),
    Dependency(f"{_S}.utils.common.get_device_memory_capacity",
               "the card's size, to take the adaptive widths' captures out of the KV pool's share"),
    Dependency(f"{_S}.arg_groups.choices.add_draft_attention_backend_choices", "adds torch_native"),
    Dependency(f"{_S}.arg_groups.speculative_hook._disable_overlap_schedule_for_cpu",
               "DFLASH on CPU: the synchronous scheduler loop, as upstream declares it for EAGLE and n-gram",
               params=("server_args",)),
    Dependency(f"{_W2}.DFlashWorkerV2", "subclassed by DominoDFlashWorker; attributes it reads",
               attributes=("_target_worker", "model_runner", "draft_model", "draft_model_runner", "selector",
                           "lilicorr", "_is_domino", "_mask_token_id", "_tp_sync", "_draft_block_spec_info",
                           "_selector_sample", "_use_triton_prepare_block", "_use_triton_accept_bonus",
                           "domino_candidate_pool_size", "_target_logits_processor", "_need_mamba_verify_commit",
                           "use_compact_draft_cache")),
    Dependency(f"{_W2}.DFlashWorkerV2.__init__", "the worker's constructor",
               params=("server_args", "gpu_id", "nccl_port", "target_worker")),
    Dependency(f"{_W2}.DFlashWorkerV2.forward_batch_generation", "the whole step, run unchanged"),
    Dependency(f"{_W2}.DFlashWorkerV2._accept_block", "overridden: exact sampled verify without the CUDA kernel; "
               "a penalised step's per-position adjustments and counts (`penalty_state`)"),
    Dependency(f"{_W2}.DFlashWorkerV2.init_cuda_graphs", "overridden: the draft graph at the draft block"),
    Dependency(f"{_W2}.DFlashWorkerV2._maybe_build_draft_sampler",
               "overridden: b8's sampler built at the draft block; the Transformers window's widened to it; "
               "with the q rule the q rule's rollout in the greedy Domino sampler's place"),
    Dependency(f"{_W2}.DFlashWorkerV2._validate_phase1_sampling_support", "overridden: no greedy-fallback warning"),
    Dependency(f"{_W2}.DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc",
               "overridden: an adaptive width-1 step's rows kept and written when the draft next needs them "
               "(`draft_context`)",
               params=("target_hidden", "cache_loc", "positions", "cache_loc_2d", "commit_lens")),
    Dependency(f"{_W2}.DFlashWorkerV2.clear_cache_pool", "overridden: kept width-1 rows dropped with the pools"),
    # -- an adaptive width-1 step without the draft side (`decode_step`) ------------------
    Dependency(f"{_S}.managers.tp_worker.TpModelWorker.forward_batch_generation",
               "the width-1 step: on CPU the target's decode forward of a scheduler batch, its hidden states "
               "captured for the draft, its KV plan returned, not sampled; on CUDA the target's verify of a "
               "prepared one-token batch",
               params=("batch", "is_verify", "capture_hidden_mode", "return_kv_loc_plan", "forward_batch",
                       "skip_attn_backend_init")),
    Dependency(f"{_S}.speculative.dflash_info.DFlashVerifyInput",
               "the CUDA width-1 step's verify input: the bonus, one token per request",
               params=("draft_token", "positions", "draft_token_num", "custom_mask", "capture_hidden_mode",
                       "kv_loc_plan")),
    Dependency(f"{_S}.speculative.dflash_info.DFlashVerifyInput.prepare_for_verify",
               "the CUDA width-1 step prepared as upstream prepares a verify (it decides the graph replay)",
               params=("batch", "target_worker")),
    Dependency(f"{_S}.speculative.dflash_info_v2.DFlashDraftInputV2",
               "the CUDA width-1 step's input and host bound, read as upstream's step reads them",
               attributes=("bonus_tokens", "nxt_kv_lens_cpu", "nxt_kv_lens_sum")),
    Dependency(f"{_S}.managers.schedule_batch.ScheduleBatch",
               "the fields the decode step sets on its copy of the scheduler's batch, and reads",
               attributes=("forward_mode", "input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum",
                           "spec_info", "req_pool_indices", "sampling_info", "return_logprob", "has_grammar")),
    Dependency(f"{_W2}.DFlashWorkerV2._draft_write_ids", "the draft-context slots from the decode step's KV plan",
               params=("plan",)),
    Dependency(f"{_W2}.DFlashWorkerV2._make_next_draft_input_decode", "the decode step's next draft input",
               params=("bonus_tokens", "new_seq_lens")),
    Dependency(f"{_W2}.DFlashWorkerV2._can_skip_verify_logits", "a deferred logits shard reduced to its argmax; "
               "overridden: never in a penalised step",
               params=("batch", "sampling_info")),
    Dependency(f"{_S}.speculative.dflash_utils.apply_dflash_verify_logits_adjustments",
               "penalties and bias on the decode step's logits, as on a verify's",
               params=("next_token_logits", "sampling_info", "draft_token_num")),
    Dependency(f"{_S}.speculative.spec_sampling_mask.SpeculativeSamplingMaskCapture.from_logits",
               "the decode step's sampling masks, as a verify's", params=("next_token_logits", "draft_input",
                                                                          "draft_token_num", "bs")),
    Dependency(f"{_S}.layers.logprob_processor.compute_spec_logprobs", "the decode step's logprobs, stride 1",
               params=("chain_stride",)),
    Dependency(f"{_S}.managers.scheduler.Scheduler.flush_cache", "calls the worker's clear_cache_pool after "
               "resetting the pools"),
    Dependency(f"{_S}.speculative.base_spec_worker.BaseSpecWorker.on_verify_complete_cpu",
               "overridden: acceptance counts on the host feed the adaptive policy",
               params=("num_correct_drafts_per_req", "batch_size")),
    Dependency(f"{_S}.managers.utils.GenerationBatchResult",
               "each adaptive step returns its own width as the result's stride",
               attributes=("speculative_num_draft_tokens",)),
    Dependency(f"{_W2}._DominoDraftSampler", "the greedy Domino rollout in the draft graph, built at the draft "
               "block; narrower steps read its first width - 1 proposals; the q rule's captured rollout is built "
               "from its modules and bound",
               attributes=("out", "block_size", "target_embedding", "lm_head_weight", "prefix_gru", "embed_proj",
                           "vocab_size", "shift_label", "candidate_pool_size", "tp_group", "lm_head_org_vocab_start",
                           "lm_head_num_org", "lm_head_num_org_padded")),
    Dependency(f"{_W2}._DflashDraftSampler", "DFlash's in-graph argmax, read alike", attributes=("out", "block_size")),
    Dependency(f"{_S}.speculative.draft_worker_common.make_draft_sampler_capture_hook",
               "captures the sampler the builder returns (b8: the block-wide sampler behind the window's view)",
               params=("draft_sampler",)),
    Dependency("sglang.kernels.ops.speculative.dflash._prepare_dflash_draft_block_unchecked",
               "launched once per verify width at start-up (Triton compiles per width)",
               params=("bonus_tokens", "prefix_lens", "req_pool_indices", "req_to_token", "block_ids_out",
                       "positions_out", "cache_loc_out", "mask_token_id")),
    Dependency("sglang.kernels.ops.speculative.dflash._compute_dflash_accept_bonus_triton_unchecked",
               "launched once per verify width at start-up",
               params=("candidates", "target_top1", "accept_lens_out", "commit_lens_out", "bonus_ids_out",
                       "out_tokens_out", "prefix_lens", "new_seq_lens_out")),
    Dependency(f"{_W2}._commit_accept", "a sampled verify's committed tokens"),
    Dependency(f"{_W2}._is_all_greedy", "which steps take the sampled paths"),
    Dependency(f"{_W2}.is_dflash_sampling_verify_available", "where upstream has its sampled-verify kernel"),
    Dependency(f"{_W2}.SpecTpSyncSite", "rank 0's sampled proposals and acceptance on every TP rank",
               attributes=("DFLASH_SELECTOR", "DFLASH_ACCEPT_SAMPLE", "DFLASH_ACCEPT_GREEDY")),
    Dependency(f"{_S}.speculative.spec_tp_sync.parse_spec_tp_sync",
               "which of those sites SGLANG_SPEC_TP_SYNC turns on (the q rule at TP > 1 needs both)", params=("spec",)),
    Dependency(f"{_S}.runtime_context._ConfigBag.override", "the draft graph captured at the draft block"),
    Dependency(f"{_S}.mem_cache.kv_index_translator.KVIndexTranslator.plan", "the draft block's own KV plan",
               params=("req_pool_indices", "seq_lens", "seq_lens_cpu", "write_virtual", "read_extent")),
    Dependency(f"{_S}.mem_cache.kv_loc_plan.KVLocPlan.bind", "the plan bound to the draft batch"),
    Dependency(f"{_S}.speculative.draft_worker_common.make_draft_block_spec_info", "the draft block's spec info",
               params=("draft_token_num", "device")),
    Dependency(f"{_S}.speculative.dflash_utils.build_speculative_verify_target_probs",
               "p under the request's temperature, top-k and top-p (q: `sampling.DraftQ`)",
               params=("next_token_logits", "sampling_info", "draft_token_num", "bs")),
    Dependency(f"{_S}.model_executor.runner_utils.pool.borrow_graph_pool",
               "the q rule's verify probabilities in the graph pool's idle bytes, as 0.5.23's sampled verify",
               params=("user",)),
    Dependency(f"{_S}.layers.sampler.murmur_hash32", "seeded coins of the q rule"),
    Dependency(f"{_S}.runtime_context.get_spec", "speculative settings in the scheduler"),
    Dependency(f"{_S}.models.qwen3.Qwen3ForCausalLM.set_dflash_layers_to_capture",
               "a target layer is captured as the next layer's input: the last one never (checked at start-up)",
               params=("layer_ids",)),
    Dependency(f"{_S}.runtime_context.get_parallel", "the TP group (width broadcast, core split)"),
    Dependency(f"{_S}.runtime_context.get_schedule",
               "`disable_overlap_schedule`: with overlap on a device, adaptive step costs come from timing events"),
    Dependency(f"{_S}.disaggregation.common.conn.CommonKVManager", "the PD draft check reads the prefill servers "
               "it bootstrapped from; a refused request's reason", attributes=("kv_args", "prefill_info_table")),
    Dependency(f"{_S}.disaggregation.common.conn.CommonKVManager.record_failure", "a refused request's reason",
               params=("bootstrap_room", "failure_reason")),
    Dependency(f"{_S}.disaggregation.common.conn.CommonKVReceiver.abort", "a refused request fails"),
    Dependency(f"{_S}.disaggregation.decode.DecodePreallocQueue", "the decode queue's KV manager",
               attributes=("kv_manager",)),
    Dependency(f"{_S}.disaggregation.decode._bootstrap_addr", "a decode request's prefill server",
               params=("req",)),
    Dependency(f"{_S}.disaggregation.common.conn.PrefillServerInfo", "a prefill server's HTTP port",
               attributes=("prefill_http_port",)),
    Dependency(f"{_S}.utils.network.NetworkAddress", "the prefill server's URL from its bootstrap address",
               attributes=("parse", "to_url")),
    Dependency(f"{_S}.model_executor.model_runner.ModelRunner._get_attention_backend",
               "a target attention backend per adaptive width, with its own workspace",
               params=("init_new_workspace",)),
    Dependency(f"{_S}.model_executor.model_runner.ModelRunner",
               "the target's home verify graph and the flag its backend factory sets",
               attributes=("eager_runner", "init_new_workspace")),
    Dependency(f"{_S}.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.__init__",
               "a verify graph runner per adaptive width (built as the home runner's class)",
               params=("attn_backend", "speculative_num_steps", "speculative_num_draft_tokens")),
    Dependency(f"{_S}.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph",
               "decides replay per batch: only a batch of the runner's captured width replays"),
    Dependency(f"{_S}.utils.common.get_available_gpu_memory", "each width's capture memory in the log",
               params=("device", "gpu_id")),
    Dependency(f"{_S}.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter",
               "the accept-rate window: accepted proposals and requests' steps since the last log",
               attributes=("scheduler", "spec_num_correct_drafts", "spec_num_forward_ct", "enable_metrics",
                           "metrics_collector")),
    Dependency(f"{_S}.managers.scheduler.Scheduler", "the early prefix send on CPU runs with overlap off",
               attributes=("enable_overlap",)),
    # -- per-position penalties (issue 43, `penalty_state`) ---------------------------------
    Dependency(f"{_S}.sampling.sampling_batch_info.SamplingBatchInfo", "a step's penalties accumulated for the "
               "forward (the O(1) test), its logit bias and custom processors, applied per position",
               attributes=("acc_additive_penalties", "acc_scaling_penalties", "penalizer_orchestrator", "logit_bias",
                           "has_custom_logit_processor", "custom_logit_processor", "custom_params")),
    Dependency(f"{_S}.managers.schedule_batch.Req", "a request's pool row, id, parameters, stop tokens and output "
               "(what a custom processor reads)", attributes=("kv", "rid", "sampling_params", "eos_token_ids",
                                                               "tokenizer", "output_ids", "origin_input_ids")),
    Dependency(f"{_S}.sampling.sampling_batch_info.ProcessorEntry", "a custom logit processor run on every row of "
               "the block with the request as it is at that row, after the penalties and the bias (plain decoding's "
               "order)", attributes=("processor", "rows", "indices")),
    Dependency(f"{_S}.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.accumulate_additive_penalties",
               "the order the penalties compose in: additive, then scaling (held equal by the tests)"),
    # -- hybrid replay (issue 21) ---------------------------------------------------------
    Dependency(f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator",
               "the pool gate reads which linear-attention family the target is; the KDA one swapped for one call",
               attributes=("hybrid_kda_config", "hybrid_gdn_config")),
    Dependency(f"{_S}.mem_cache.memory_pool.MambaPool", "the replay rings and request-row cursors the commit "
               "advances; which protocol the pool chose",
               attributes=("mamba_cache", "replayssm_spec_write_pos", "replayssm_cache_base", "replayssm_is_flush",
                           "replayssm_is_kda", "replayssm_spec_fold")),
    Dependency(f"{_S}.mem_cache.memory_pool.MambaPool.SpeculativeState", "rings, checkpoint and conv windows",
               attributes=("conv", "temporal", "intermediate_ssm", "intermediate_conv_window", "replayssm_d",
                           "replayssm_k", "replayssm_g", "replayssm_rawv", "replayssm_rawk", "replayssm_beta")),
    Dependency(f"{_S}.mem_cache.memory_pool.HybridReqToTokenPool.get_speculative_mamba2_params_all_layers",
               "every layer's rings for the fold"),
    Dependency(f"{_S}.mem_cache.memory_pool.HybridReqToTokenPool.get_mamba_indices",
               "PP stable rows: the commit's state slots", params=("req_indices",)),
    Dependency(f"{_S}.layers.attention.hybrid_linear_attn_backend.MambaAttnBackendBase._translate_mamba_indices",
               "virtual to physical state slots, as upstream's commit does", params=("mamba_indices",)),
    Dependency(f"{_S}.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
               "_update_ple_state_after_mtp_verify", "the tail of upstream's commit, kept",
               params=("state_indices_tensor", "last_correct_step_indices", "mamba_track_indices",
                       "mamba_steps_to_track", "src_indices_raw")),
    Dependency(f"{_S}.layers.attention.linear.utils.pp_spec_stable_rows_enabled", "which rows the commit reads"),
    Dependency(f"{_S}.layers.attention.linear.gdn_backend.GDNAttnBackend._replayssm_target_verify",
               "the verify 0.5.23 routes to once the pool has the rings (no hook)"),
    # -- running requests (issue 21) ------------------------------------------------------
    Dependency(f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator.mambaish_config",
               "a hybrid target: its requests are also bounded by the recurrent-state slots"),
    Dependency(f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator._calculate_mamba_ratio",
               "state slots one request holds, as the cap divides by"),
    Dependency(f"{_S}.managers.tp_worker.TpModelWorker.get_worker_info",
               "the third value is the model runner's max_running_requests after every cap; `Scheduler.__init__` "
               "unpacks it into `Scheduler.max_running_requests`, which the report reads"),
    # -- the compiled CPU rollout's warm-up (issue 20) --------------------------------------
    Dependency(f"{_W2}._resolve_dflash_embedding_module",
               "the embedding the eager Domino rollout is given, found as the step finds it (`warmup.warm_cpu_rollout`)",
               params=("draft_model", "target_model")),
    Dependency(f"{_S}.lora.layers.unwrap_lora_layer", "the step's embedding and lm_head without a LoRA wrapper"),
    # -- the compiled CPU forwards (issue 20, `cpu/compiled_forward.py`) ---------------------
    Dependency(f"{_S}.models.qwen3.Qwen3ForCausalLM", "the one architecture compiled; its embedding, layers, final "
               "norm, lm_head and logits processor read as the eager forward uses them",
               attributes=("model", "lm_head", "logits_processor", "capture_aux_hidden_states", "pp_group")),
    Dependency(f"{_S}.models.qwen3.Qwen3Model.forward", "the eager forward the compiled layers reproduce: the "
               "residual stream captured entering each of `layers_to_capture`, the final norm added to the residual"),
    Dependency(f"{_S}.layers.layernorm.RMSNorm.forward_native", "the norms' math in the graph (with and without the "
               "residual), upstream's CPU path without AMX", params=("x", "residual")),
    Dependency(f"{_S}.layers.rotary_embedding.base.RotaryEmbedding.forward_native", "rotary positions in the graph",
               params=("positions", "query", "key")),
    Dependency(f"{_S}.layers.activation.SiluAndMul.forward_native", "the MLP's activation in the graph"),
    Dependency(f"{_S}.layers.radix_attention.RadixAttention.forward", "each layer's attention, called from the "
               "graph's one opaque op with the step's batch (writes the KV cache, attends)",
               params=("q", "k", "v", "forward_batch")),
    Dependency(f"{_S}.models.dflash.DFlashDraftModel", "the one draft architecture compiled; its layers, final norm "
               "and embedding read as its eager forward uses them", attributes=("layers", "norm", "embed_tokens")),
    Dependency(f"{_S}.models.dflash.DFlashDraftModel.forward", "the eager forward the compiled draft reproduces"),
    Dependency(f"{_S}.models.dflash.DFlashAttention", "a draft layer's attention compiles only without value scales, "
               "sinks or a subclass's own output", attributes=("v_scale", "attention_sink_bias", "q_size", "kv_size")),
    Dependency(f"{_S}.layers.aux_hidden_states.AuxHiddenStateList", "the container the compiled target hands DFLASH "
               "its captured residual streams in, as upstream's forward does"),
    Dependency(f"{_S}.layers.logits_processor.LogitsProcessorOutput", "what the compiled draft returns its block's "
               "hidden states in, as upstream's draft forward does", params=("next_token_logits", "hidden_states")),
    Dependency(f"{_S}.model_executor.model_runner.ModelRunner", "`after_load_model` reads which runner loaded: "
               "the draft's or the target's, on which device", attributes=("is_draft_worker", "device", "model")),
    Dependency(f"{_S}.layers.quantization.unquant.UnquantizedLinearMethod", "only unquantized linear layers compile "
               "(their weight used as is)"),
)


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


__all__ = ["DEPENDS", "GROUPS", "PATCHES", "Dependency", "Group", "Kind", "Moment", "Patch", "WIDTH_STATE",
           "install", "installed", "rows"]
