"""The upstream signatures and source lines the plugin's hooks depend on (SGLang 0.5.23)."""

import inspect


def probe(params) -> dict:
    import sglang.srt.arg_groups.speculative_hook as sh
    import sglang.srt.runtime_context as runtime_context
    import sglang.srt.speculative.dflash_utils as dflash_utils
    import sglang.srt.speculative.dflash_worker_v2 as w2
    import sglang.srt.speculative.domino_utils as du
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
    from sglang.srt.arg_groups.choices import add_draft_attention_backend_choices  # noqa: F401  (must exist)
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.models import dflash as mdf
    from sglang.srt.plugins import load_plugins  # noqa: F401  (must exist)
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def params_of(fn) -> list[str]:
        return list(inspect.signature(fn).parameters)

    src_validate = inspect.getsource(du.validate_domino_runtime)
    last_raise = src_validate.rsplit("raise ValueError", 1)[1]
    forward = inspect.getsource(w2.DFlashWorkerV2.forward_batch_generation)
    return dict(
        max_tokens=params_of(SpeculativeAlgorithm.resolve_max_speculative_num_draft_tokens),
        spec_info=params_of(w2.make_draft_block_spec_info),
        spec_override=hasattr(runtime_context._ConfigBag, "override"),
        capture_width="get_spec().speculative_num_draft_tokens" in inspect.getsource(DecodeCudaGraphRunner.__init__),
        plan=params_of(KVIndexTranslator.plan),
        probs=params_of(dflash_utils.build_speculative_verify_target_probs),
        accept=params_of(w2.DFlashWorkerV2._accept_block),
        sampled_guard="is_dflash_sampling_verify_available()" in inspect.getsource(w2.DFlashWorkerV2._accept_block),
        validate_sampling=params_of(w2.DFlashWorkerV2._validate_phase1_sampling_support),
        commit=params_of(w2._commit_accept),
        draft_forward="draft_out = self.draft_model_runner.forward(forward_batch)" in forward,
        init_params=params_of(w2.DFlashWorkerV2.__init__),
        validate_bound=w2.validate_domino_runtime is du.validate_domino_runtime,
        bf16_is_last=("BF16" in last_raise and "requires CUDA" in src_validate),
        platform_global=hasattr(sh, "current_platform")
        and "current_platform.is_out_of_tree()" in inspect.getsource(sh._handle_dflash),
        choices_list=isinstance(DRAFT_ATTENTION_BACKEND_CHOICES, list),
        record_stream="record_stream(" in forward,
        fwd_ext=params_of(TorchNativeAttnBackend.forward_extend)[:6],
        extend_kwargs=params_of(ModelRunner._extend_forward_kwargs),
        qk_flag="use_table_qk_norm_rope" in inspect.getsource(mdf),
        create_worker=params_of(SpeculativeAlgorithm.create_worker),
        parse=params_of(dflash_utils.parse_dflash_draft_config),
        load_weights=params_of(mdf.DFlashDraftModel.load_weights),
        validate_request=params_of(TokenizerManager._validate_one_request),
        domino_check="logit_head" not in inspect.getsource(mdf)
        and "prefix_gru" in inspect.getsource(mdf.DFlashDraftModel.load_weights),
        rollout_bound=w2.domino_greedy_rollout is du.domino_greedy_rollout,
        rollout_params=params_of(du.domino_greedy_rollout),
        eager_rollout_call="draft_next = domino_greedy_rollout(" in forward,
        sampler_gate="self._draft_sampler is not None" in forward,
        gru_cell=params_of(du._domino_gru_cell),
        tp_sites={"DFLASH_SELECTOR", "DFLASH_ACCEPT_SAMPLE"} <= set(w2.SpecTpSyncSite.__members__),
        rejection_field=hasattr(ServerArgs(model_path="x"), "speculative_use_rejection_sampling"),
    )
