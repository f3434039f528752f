"""Every patch the plugin makes to 0.5.23, one row each (`hooks.py` says how they are
installed; `UPSTREAM.md` gives each row's file:line; `tests/sglang/test_seam.py` checks
every row against the installed SGLang)."""

from __future__ import annotations

from .manifest import (ADAPTIVE_METRICS, B8_RESERVATION, B8_STATE, CHECKPOINT_COMPAT, CPU_ATTENTION, CPU_DFLASH,
                       CPU_DISAGGREGATION, CPU_ENGINE, CPU_FORWARD, CPU_MODELS, CPU_STANDIN, DISAGGREGATION,
                       DOMINO_ROLLOUT,
                       CPU_PROCESS, EVERY_PROCESS, HYBRID_REPLAY, PENALTIES, PLATFORM, RESOLVE, RUNNING_REQUESTS,
                       STEP, WORKER, Kind, Patch, _S, _W2)

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
          "adaptive.request_accept:around_update_request_meta_info", Kind.AROUND, EVERY_PROCESS,
          "an adaptive server's per-request proposal count (customized info) is kept on the request's state, "
          "not accumulated into meta_info; other customized info passes unchanged",
          params=("meta_info", "state", "customized_info", "index", "finish_reason")),
    Patch("request_accept_rate", f"{_S}.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
          "adaptive.request_accept:around_calculate_spec_decoding_metrics", Kind.AROUND, EVERY_PROCESS,
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
          "seam.scheduler_start:before_init_parallel_runtime", Kind.BEFORE, EVERY_PROCESS,
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
          "seam.scheduler_start:before_init_parallel_runtime_on_cpu", Kind.BEFORE, CPU_ENGINE,
          "installs the `cpu model registry`, `cpu stand-in` and `cpu attention` groups in the processes that run "
          "a model"),
    Patch("fork_schedulers", f"{_S}.entrypoints.engine.Engine._launch_scheduler_processes",
          "cpu.start_method:around_launch_schedulers", Kind.AROUND, CPU_ENGINE,
          "the scheduler processes forked, not spawned, where a forked probe shows it safe: they start with "
          "SGLang already imported (about 11 s of a 2-core start-up)"),
    Patch("fork_detokenizers", f"{_S}.entrypoints.engine.Engine._launch_detokenizer_subprocesses",
          "cpu.start_method:around_launch_detokenizers", Kind.AROUND, CPU_ENGINE,
          "the detokenizer forked too: a spawned one imports SGLang on a core the scheduler is compiling on"),
    Patch("draft_backend_choice", f"{_S}.arg_groups.choices.DRAFT_ATTENTION_BACKEND_CHOICES",
          "cpu.dflash:allow_torch_native_draft_backend", Kind.CALL, CPU_ENGINE,
          "torch_native accepted as the draft attention backend (else flashinfer is chosen)"),
    # -- model-running CPU processes while the sgl_kernel stand-in serves ----------------
    Patch("rms_norm_gated", "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward",
          "cpu.hybrid.qwen3_5_ops:rms_norm_gated_forward", Kind.REPLACE, CPU_STANDIN,
          "the Qwen3.5 gated-delta-net output norm is Triton-only without AMX"),
    Patch("fused_rms_norm_gated", "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward",
          "cpu.hybrid.qwen3_5_ops:fused_rms_norm_gated_forward", Kind.REPLACE, CPU_STANDIN,
          "Qwen3-Next's gated norm, Triton-only without AMX"),
    Patch("mamba_state_scatter",
          "sglang.kernels.ops.mamba.mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify",
          "cpu.hybrid.gdn_ops:scatter_mamba_states_after_mtp_verify", Kind.REPLACE, CPU_STANDIN,
          "the accepted position's recurrent state committed after a verify; upstream's raises for CPU tensors",
          params=("mamba_caches", "state_indices_tensor", "last_correct_step_indices", "mamba_track_indices",
                  "mamba_steps_to_track", "src_indices_raw")),
    # -- model-running CPU processes: the model registry imports the served models only --------
    Patch("models_deferred", f"{_S}.models.registry.ModelRegistry",
          "cpu.model_registry:defer_default_models", Kind.CALL, CPU_MODELS,
          "the registry imported with SGLang's ~200 model modules deferred (0.5.23's mode for an external "
          "model package, given one without models): 2.1 s of a 2-core scheduler start"),
    Patch("models_arch_supported", f"{_S}.models.registry._ModelRegistry.is_arch_supported",
          "cpu.model_registry:around_is_arch_supported", Kind.AROUND, CPU_MODELS,
          "an architecture asked about is imported from the module that defines it; else 0.5.23's import of all",
          params=("architecture",)),
    Patch("models_resolve", f"{_S}.models.registry._ModelRegistry.resolve_model_cls",
          "cpu.model_registry:around_resolve_model_cls", Kind.AROUND, CPU_MODELS,
          "the architecture resolved is imported from the module that defines it; else 0.5.23's import of all",
          params=("architectures",)),
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
          "cpu.compiled.forward:after_load_model", Kind.AFTER, CPU_FORWARD,
          "a CPU model's layers run as one torch.compile graph (0.5.23's eager forward is mostly Python and "
          "dispatch at small sizes, and does not compile as it stands); compiled before the first request"),
    Patch("cpu_no_upstream_graph_runner",
          f"{_S}.model_executor.model_runner_components.cuda_graph_setup.capture_decode_graph",
          "cpu.compiled.forward:around_capture_decode_graph", Kind.AROUND, CPU_FORWARD,
          "the compiled layers serve every CPU step: 0.5.23's CPUGraphRunner, which the flag would build, needs "
          "the intel_amx attention backend (AttributeError with torch_native) and refuses speculative servers",
          params=("model_runner",)),
    # -- schedulers of a PD server, at scheduler start ------------------------------------
    Patch("pd_draft_check", f"{_S}.disaggregation.decode.DecodePreallocQueue._init_receiver",
          "serving.disaggregation:around_init_receiver", Kind.AROUND, DISAGGREGATION,
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
          "step.draft_block:around_init_mamba_pool", Kind.AROUND, B8_STATE,
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
    Patch("domino_rollout", f"{_W2}.domino_greedy_rollout", "step.rollout_hook:around_domino_rollout", Kind.AROUND,
          DOMINO_ROLLOUT, "width-1 steps propose nothing; the eager feedback embedding looked up plainly; "
          "the q rule's sampled rollout; on CPU, opt-in, the greedy rollout compiled",
          params=("draft_hidden", "lm_head_weight", "vocab_size", "shift_label", "tp_group", "lm_head_num_org_padded",
                  "candidate_pool_size", "bonus_tokens", "target_embedding", "prefix_gru", "embed_proj",
                  "in_cuda_graph")),
    Patch("b8_reservation", f"{_S}.speculative.dflash_info_v2.page_aligned_decode_alloc_lens",
          "step.draft_block:around_decode_alloc_lens", Kind.AROUND, B8_RESERVATION,
          "the decode KV reservation covers the whole draft block",
          params=("reqs", "reserve")),
    Patch("verify_logits_adjustments", f"{_W2}.apply_dflash_verify_logits_adjustments",
          "sampling.penalty_state:around_verify_logits_adjustments", Kind.AROUND, PENALTIES,
          "a penalised step's adjustments are the worker's, per position of the block (0.5.23 broadcasts one "
          "penalty over the block and feeds its penalizers no output); other callers and steps get upstream's",
          params=("next_token_logits", "sampling_info", "draft_token_num")),
    Patch("adaptive_accept_rate",
          f"{_S}.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats",
          "adaptive.metrics:around_report_decode_stats", Kind.AROUND, ADAPTIVE_METRICS,
          "the logged and exported accept rate divides by the proposals adaptive steps verified, not by every "
          "step at the largest width"),
    Patch("request_proposals_sent", f"{_S}.managers.scheduler.Scheduler.get_output_streamer_class",
          "adaptive.request_accept:around_get_output_streamer_class", Kind.AROUND, ADAPTIVE_METRICS,
          "the output streamer adds each request's count of verified proposals to its outputs (0.5.23's "
          "customized-info channel), for its accept rate in meta_info"),
    Patch("first_verify_log", f"{_S}.managers.tp_worker.TpModelWorker.forward_batch_generation",
          "step.first_verify_log:FirstVerifyLog", Kind.INSTANCE, WORKER,
          "the target worker of a DominoDFlashWorker: the first verify's width logged (what the target computed "
          "per request); the batch is passed on unchanged",
          params=("forward_batch", "is_verify")),
    Patch("q_rule_tp_broadcast", f"{_S}.model_executor.model_runner.ModelRunner.forward",
          "sampling.q_sampler:BroadcastProposals", Kind.INSTANCE, WORKER,
          "the draft runner's forward under TP with the q rule's graph: after a replay of a sampled step, rank 0's "
          "proposals broadcast to every rank before upstream reads them for the verify",
          params=("forward_batch",)),
    Patch("draft_block_runner", f"{_S}.model_executor.model_runner.ModelRunner.forward",
          "step.draft_block:DraftBlockRunner", Kind.INSTANCE, WORKER,
          "the draft runner of a DominoDFlashWorker runs on the draft block when it differs from the verify window",
          params=("forward_batch",)),
    # -- schedulers, every decode step ----------------------------------------------------
    Patch("width_state", f"{_W2}.DFlashWorkerV2", "adaptive.width_switch:WidthSwitch", Kind.STEP_STATE, STEP,
          "--speculative-adaptive: upstream's step runs unchanged at the chosen width; the in-graph "
          "sampler's block-wide proposals read at that width (`draft_tail.FirstProposals`)",
          attributes=("block_size", "speculative_num_draft_tokens", "_draft_sampler", *WIDTH_STATE)),
    Patch("verify_graphs", f"{_S}.model_executor.model_runner.ModelRunner", "adaptive.verify_graphs:VerifyGraphs",
          Kind.STEP_STATE, STEP, "--speculative-adaptive with target decode graphs: the target verifies a step at "
          "another width on that width's attention backend and graph (captured at start-up), so it replays",
          attributes=("attn_backend", "decode_cuda_graph_runner")),
    Patch("q_rule_sampler", f"{_W2}.DFlashWorkerV2", "step.worker:DominoDFlashWorker._forward_with_q_rollout",
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
          "serving.hybrid_replay:around_build_hybrid_req_pool", Kind.AROUND, HYBRID_REPLAY,
          "0.5.23's 'requires a KDA model' refusal lifted for a GDN target (its commit is this plugin's); the "
          "ring length checked against the verify window; the state memory logged"),
    Patch("replay_commit",
          f"{_S}.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
          "update_mamba_state_after_mtp_verify",
          "serving.hybrid_replay:around_update_mamba_state_after_mtp_verify", Kind.AROUND, HYBRID_REPLAY,
          "DFLASH's commit on a pool with GDN replay rings: 0.5.23's ReplaySSM cursor advance, fold and conv "
          "rollback (`spec_utils`), not the scatter of per-position states (not allocated)",
          params=("last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track", "model",
                  "req_pool_indices")),
    Patch("replay_verify_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.gdn_replayssm_spec_decode",
          "cpu.hybrid.gdn_replay:gdn_replayssm_spec_decode", Kind.REPLACE, CPU_STANDIN,
          "the GDN replay verify (imported inside `_replayssm_target_verify`); Triton-only upstream",
          params=("q", "k", "v", "a", "b", "A_log", "dt_bias", "checkpoint_state", "d_cache", "k_cache", "g_cache",
                  "rawv_cache", "rawk_cache", "beta_cache", "out", "query_start_loc", "ssm_state_indices",
                  "replay_indices", "write_pos", "cache_base", "is_flush", "max_cache_len", "max_spec_len", "scale",
                  "use_qk_l2norm_in_kernel", "null_block_id", "launch_mode")),
    Patch("replay_cursors_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.commit_gdn_replayssm_spec",
          "cpu.hybrid.gdn_replay_commit:commit_gdn_replayssm_spec", Kind.REPLACE, CPU_STANDIN,
          "the replay commit's cursor advance; Triton-only upstream",
          params=("write_pos", "cache_base", "is_flush", "num_accepted", "replay_indices", "max_cache_len",
                  "max_spec_len", "fold_every_commit", "null_block_id")),
    Patch("replay_fold_cpu",
          "sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode.commit_gdn_replayssm_circular",
          "cpu.hybrid.gdn_replay_commit:commit_gdn_replayssm_circular", Kind.REPLACE, CPU_STANDIN,
          "the replay commit's fold of a row's records into its checkpoint; Triton-only upstream",
          params=("checkpoint_state", "d_cache", "k_cache", "g_cache", "d_residual_cache", "k_residual_cache",
                  "state_batch_indices", "replay_indices", "write_pos", "cache_base", "is_flush", "accept_lens",
                  "mamba_track_indices", "mamba_steps_to_track", "null_block_id")),
    Patch("replay_conv_cpu", "sglang.kernels.ops.mamba.mamba_state_scatter_triton.fused_conv_window_scatter_with_mask",
          "cpu.hybrid.gdn_replay_commit:fused_conv_window_scatter_with_mask", Kind.REPLACE, CPU_STANDIN,
          "the conv windows' rollback (not replayed: kept per position); raises for CPU tensors upstream",
          params=("dst", "src", "dst_indices_raw", "step_indices_raw", "src_indices_raw")),
    # -- running requests (issue 21): the effective max_running_requests reported -------
    Patch("running_requests_bounds", f"{_S}.mem_cache.kv_cache_configurator.KVCacheConfigurator.resolve_max_num_reqs",
          "serving.running_requests:around_resolve_max_num_reqs", Kind.AROUND, RUNNING_REQUESTS,
          "records the KV and mamba-state bounds it applies, so the summary warning names its cause",
          params=("token_capacity",)),
    Patch("running_requests_report", f"{_S}.managers.scheduler.Scheduler.get_init_info",
          "serving.running_requests:after_get_init_info", Kind.AFTER, RUNNING_REQUESTS,
          "`/server_info`'s top-level max_running_requests is the value the scheduler admits after every cap "
          "(the request under requested_max_running_requests); one warning when it is below the request"),
    # -- process-wide torch settings of the CPU port ---------------------------------------
    Patch("dynamo_recompile_limit", "torch._dynamo.config.recompile_limit", "cpu.compiled.switches:allow_graphs", Kind.PROCESS,
          CPU_PROCESS, "with --enable-torch-compile: each compiled function of the CPU step may hold 16 graphs "
          "(never lowered), so no shape the warm-up compiled runs eagerly past torch's default of 8"),
    Patch("recompile_log", "torch._logging.set_logs", "cpu.compiled.forward:after_load_model", Kind.PROCESS,
          CPU_PROCESS, "with --enable-torch-compile, after the warm-up: a graph compiled while serving is logged "
          "with the guard that failed"),
    Patch("cpu_rank_threads", "torch.set_num_threads", "cpu.parallel:_pin", Kind.PROCESS, CPU_PROCESS,
          "a CPU rank of a TP / DP server pinned to its share of the cores, its torch threads no more than them"),
)
