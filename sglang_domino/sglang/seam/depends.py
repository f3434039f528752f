"""What the plugin reads or calls in 0.5.23 without changing it, one row each (checked
against the installed SGLang by `tests/sglang/test_seam.py`, named in `UPSTREAM.md`)."""

from __future__ import annotations

from .manifest import Dependency, _S, _W2

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
    # -- the compiled CPU forwards (issue 20, `cpu/compiled/forward.py`) ---------------------
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
    # -- the compiled step's attention without upstream's per-layer dispatch (`cpu/attention.Plan`) --
    Dependency(f"{_S}.model_executor.forward_context.get_attn_backend", "the backend RadixAttention.forward would "
               "call: the plan is made only for torch_native"),
    Dependency(f"{_S}.model_executor.forward_context.has_forward_context", "no plan outside a forward"),
    Dependency(f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend", "its pools and SWA write "
               "locations, read as its forward_decode / forward_extend read them",
               attributes=("token_to_kv_pool", "req_to_token_pool", "swa_out_cache_loc")),
    Dependency(f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend", "reproduced by "
               "the plan: the KV write at out_cache_loc, causal unless cross or encoder-only, the window when causal"),
    Dependency(f"{_S}.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode", "reproduced by "
               "the plan: the KV write, the decode row's window"),
    Dependency(f"{_S}.layers.attention.graph_utils.padded_extend_real_tokens", "no plan for an extend padded for "
               "attention TP (upstream then attends its real rows only)", params=("q", "forward_batch")),
    Dependency(f"{_S}.layers.radix_attention.RadixAttention", "the layer's heads, dims, scaling, window and type "
               "the plan attends with",
               attributes=("tp_q_head_num", "tp_k_head_num", "tp_v_head_num", "qk_head_dim", "v_head_dim", "scaling",
                           "sliding_window_size", "is_cross_attention", "attn_type", "layer_id")),
    Dependency(f"{_S}.layers.radix_attention.AttentionType", "encoder-only layers attend without the causal mask"),
    Dependency(f"{_S}.mem_cache.memory_pool.MHATokenToKVPool.get_key_buffer", "the layer's key cache, read in place "
               "by the kernel", params=("layer_id",)),
    Dependency(f"{_S}.mem_cache.memory_pool.MHATokenToKVPool.get_value_buffer", "the layer's value cache",
               params=("layer_id",)),
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
    Dependency(f"{_S}.model_executor.model_runner_components.weight_updater._unsupported_derived_weight_cache_error",
               "reads `_derived_weight_cache_error` off every module before an online weight update: the compiled "
               "model declares its oneDNN-packed copies there (`cpu/compiled/packed_linear.py`)", params=("model",)),
    # -- a hybrid target's layers compiled (`cpu/compiled/hybrid.py`) ----------------------------
    Dependency(f"{_S}.models.qwen3_5_text.Qwen3_5ForCausalLM", "the dense text-only Qwen3.5 compiled; its body, "
               "lm_head and logits processor read as its eager forward uses them",
               attributes=("model", "lm_head", "logits_processor", "capture_aux_hidden_states", "pp_group", "pooler")),
    Dependency(f"{_S}.models.qwen3_5_text.Qwen3_5ForCausalLM.forward", "the eager forward the compiled target "
               "reproduces (1-D positions: a text checkpoint's mrope rows are equal)"),
    Dependency(f"{_S}.models.qwen3_5.Qwen3_5ForCausalLM.forward", "the body's eager forward: the residual stream "
               "captured entering each of `layers_to_capture`, the final norm added to the residual"),
    Dependency(f"{_S}.models.qwen3_5.Qwen3_5GatedDeltaNet", "the delta-net mixer the graph reproduces (projections, "
               "split, core, gated norm, out_proj)",
               attributes=("in_proj_qkvz", "in_proj_ba", "num_k_heads", "num_v_heads", "attn_tp_size", "head_k_dim",
                           "head_v_dim", "attn", "norm", "out_proj")),
    Dependency(f"{_S}.models.qwen3_5.Qwen3_5GatedDeltaNet.forward", "its eager forward, reproduced in the graph"),
    Dependency(f"{_S}.models.qwen3_5.Qwen3_5AttentionDecoderLayer", "the gated attention layer the graph reproduces",
               attributes=("qkv_proj", "o_proj", "q_norm", "k_norm", "rotary_emb", "attn", "attn_output_gate",
                           "q_size", "kv_size", "head_dim", "num_heads")),
    Dependency(f"{_S}.models.qwen3_5.Qwen3_5AttentionDecoderLayer.forward_prepare_fused_gate", "the CPU path of its "
               "q/k/gate preparation, reproduced with the same stand-in math"),
    Dependency(f"{_S}.layers.radix_linear_attention.RadixLinearAttention.forward", "each delta-net layer's core, "
               "called from the graph's opaque op with the step's batch (conv and recurrence over the pool's states)",
               params=("forward_batch", "mixed_qkv", "a", "b")),
    Dependency(f"{_S}.layers.layernorm.GemmaRMSNorm.forward_native", "the hybrid target's norms in the graph",
               params=("x", "residual")),
    Dependency(f"{_S}.layers.rotary_embedding.mrope.MRotaryEmbedding.forward_native", "a text checkpoint's mrope "
               "rotary at 1-D positions in the graph", params=("positions", "query", "key")),
)
