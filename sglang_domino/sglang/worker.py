"""`DominoDFlashWorker`: sglang 0.5.23's `DFlashWorkerV2` with this project's deltas.

Overrides (everything else, including the ~680-line `forward_batch_generation`, the
draft block, the Domino rollout and the KV bookkeeping, is upstream's):
  * `__init__`: checks the draft through `sglang_domino.config.DraftConfig` against the
    target before anything is built; registers the `DominoDraftModel` architecture;
    on CPU installs `cpu_runtime` and builds the upstream worker with the Domino device
    gate lifted, then switches the draft's Triton qk-norm/rope off; keeps the draft's
    `input_embeds` in the runner dtype; reads the verify width (b8).
  * hooks installed from `__init__` (scheduler only): `parse_dflash_draft_config` reads
    the `causal_v5` alias as `domino`; `DFlashDraftModel.load_weights` sees names through
    `sglang_domino.checkpoint.normalize_keys` (legacy `logit_head.*` keys).
  * `_accept_block` (`dflash_worker_v2.py:2187`): with a verify width W below the draft
    block, acceptance is capped at W - 1 proposals (max W tokens per verify).
"""

from __future__ import annotations

import logging
import os

import torch
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2, _commit_accept

from ..config import DOMINO_PROJECTORS
from . import DRAFT_BLOCK_ENV, HF_WINDOW_ENV, VERIFY_WIDTH_ENV
from . import cpu_runtime
from .checks import check_draft_against_target, check_verify_width, read_draft_config, read_target_config

logger = logging.getLogger(__name__)


def _register_domino_architecture() -> None:
    """SpecForge exports name the architecture `DominoDraftModel`; 0.5.23's `EntryClass`
    (`srt/models/dflash.py:1317`) lacks it. Same model class as `DFlashDraftModel`."""
    from sglang.srt.models.registry import ModelRegistry

    if "DominoDraftModel" not in ModelRegistry.models:
        from sglang.srt.models.dflash import DFlashDraftModel

        ModelRegistry.models["DominoDraftModel"] = DFlashDraftModel


PARSE_DRAFT_CONFIG = "sglang.srt.speculative.dflash_utils.parse_dflash_draft_config"
LOAD_DRAFT_WEIGHTS = "sglang.srt.models.dflash.DFlashDraftModel.load_weights"
_compat_installed = False


def _around_parse_dflash_draft_config(original, *args, draft_hf_config=None, **kwargs):
    """0.5.23 recognises the Domino projector only as `projector_type == "domino"`
    (`dflash_utils.py:727-734`, `models/dflash.py:780`, `:923`, `:987`); older exports
    write the alias `causal_v5`, accepted by `DraftConfig` (DOMINO_PROJECTORS). Rewrite
    the alias on the config object, then parse as upstream."""
    if draft_hf_config is not None:
        section = getattr(draft_hf_config, "dflash_config", None)
        if isinstance(draft_hf_config, dict):
            section = draft_hf_config.get("dflash_config")
        if isinstance(section, dict) and section.get("projector_type") in DOMINO_PROJECTORS:
            section["projector_type"] = "domino"
        top = (draft_hf_config.get("projector_type") if isinstance(draft_hf_config, dict)
               else getattr(draft_hf_config, "projector_type", None))
        if top in DOMINO_PROJECTORS and top != "domino":
            if isinstance(draft_hf_config, dict):
                draft_hf_config["projector_type"] = "domino"
            else:
                draft_hf_config.projector_type = "domino"
    return original(*args, draft_hf_config=draft_hf_config, **kwargs)


def _around_load_weights(original, self, weights, *args, **kwargs):
    """`DFlashDraftModel.load_weights` (`models/dflash.py:886`) silently ignores unknown
    names, so legacy `logit_head.prefix_gru.*` / `logit_head.embed_proj.*` keys end in
    "missing required projector weights". Feed it names through the project's one key
    normalisation, `sglang_domino.checkpoint.normalize_keys`."""
    from ..checkpoint import normalize_keys

    def renamed():
        for name, tensor in weights:
            yield from normalize_keys({name: tensor}).items()

    return original(self, renamed(), *args, **kwargs)


_around_parse_dflash_draft_config._sglang_domino = True
_around_load_weights._sglang_domino = True


def install_checkpoint_compat() -> None:
    global _compat_installed
    if _compat_installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(PARSE_DRAFT_CONFIG, _around_parse_dflash_draft_config, HookType.AROUND)
    HookRegistry.register(LOAD_DRAFT_WEIGHTS, _around_load_weights, HookType.AROUND)
    HookRegistry.apply_hooks()
    _register_domino_architecture()
    _compat_installed = True


class DominoDFlashWorker(DFlashWorkerV2):
    """Returned for `--speculative-algorithm DFLASH` by the plugin's `create_worker` hook."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        self._on_cpu = torch.device(target_worker.device).type == "cpu"
        draft_cfg = read_draft_config(server_args.speculative_draft_model_path,
                                      server_args.speculative_draft_model_revision)
        target_cfg = read_target_config(server_args.model_path, getattr(server_args, "revision", None))
        if draft_cfg is not None and target_cfg is not None:
            check_draft_against_target(
                draft_cfg, target_cfg,
                target_vocab_size=int(target_worker.model_runner.model_config.vocab_size))
        self.domino_draft_config = draft_cfg
        install_checkpoint_compat()

        if self._on_cpu:
            cpu_runtime.install()
            with cpu_runtime.domino_device_gate_lifted():
                super().__init__(server_args, gpu_id, nccl_port, target_worker)
            cpu_runtime.disable_triton_qk_norm_rope(self.draft_model)
        else:
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if self.draft_model_runner.dtype != torch.bfloat16:
            cpu_runtime.keep_input_embeds_dtype(self.draft_model_runner)

        self.verify_width = self._resolve_verify_width()
        self.draft_block = self._resolve_draft_block()
        logger.info(
            "sglang-domino DFLASH worker: device=%s, draft block=%s, verify width=%s, domino=%s",
            self.device, self.draft_block, self.verify_width, self._is_domino)

    def _resolve_draft_block(self) -> int:
        """With SGLANG_DOMINO_HF_WINDOW the worker's block (= verify window, what the
        scheduler accounts in) is draft block + 1: the draft runs its B-slot block, the
        Domino rollout proposes B tokens (slots 0..B-1, `shift_label`), B + 1 are verified,
        as in the Transformers backend. Upstream proposes B - 1 (algorithm.md 4.5)."""
        raw = os.environ.get(DRAFT_BLOCK_ENV)
        if not raw or int(raw) == int(self.block_size):
            return int(self.block_size)
        draft_block = int(raw)
        if not (self._is_domino and bool(self.draft_model.shift_label)
                and int(self.block_size) == draft_block + 1):
            raise ValueError(
                f"{HF_WINDOW_ENV}=1 needs a shift_label Domino draft and a verify window of draft block + 1; "
                f"got draft block {draft_block}, window {self.block_size}, domino={self._is_domino}")
        self.draft_model.set_block_size(draft_block)
        self._run_draft_on_fewer_slots(draft_block)
        return draft_block

    def _run_draft_on_fewer_slots(self, draft_block: int) -> None:
        """Upstream builds the draft block as wide as the verify window
        (`dflash_worker_v2.py:2518-2560`, forward `:2688`); run the draft model on the first
        `draft_block` slots of every request and hand back hidden states padded to the
        window (the padded slot is never read: with `shift_label` the rollout reads slots
        0..window-2, `domino_utils.py:311`)."""
        import copy

        runner = self.draft_model_runner
        original = runner.forward
        window = int(self.block_size)

        def forward(forward_batch, *args, **kwargs):
            bs = int(forward_batch.batch_size)
            if (not forward_batch.forward_mode.is_target_verify() or forward_batch.input_embeds is None
                    or forward_batch.input_ids.numel() != bs * window):
                return original(forward_batch, *args, **kwargs)

            def keep(t):
                return t.view(bs, window, *t.shape[1:])[:, :draft_block].reshape(bs * draft_block, *t.shape[1:])

            fb = copy.copy(forward_batch)
            fb.input_ids = keep(forward_batch.input_ids)
            fb.positions = keep(forward_batch.positions)
            fb.out_cache_loc = keep(forward_batch.out_cache_loc)
            fb.input_embeds = keep(forward_batch.input_embeds)
            if getattr(fb, "num_token_non_padded", None) is not None:
                fb.num_token_non_padded = torch.full_like(fb.num_token_non_padded, bs * draft_block)
            fb.global_num_token_non_padded_cpu = bs * draft_block
            out = original(fb, *args, **kwargs)
            hidden = out.logits_output.hidden_states
            padded = hidden.new_zeros(bs, window, hidden.shape[-1])
            padded[:, :draft_block] = hidden.view(bs, draft_block, -1)
            out.logits_output.hidden_states = padded.view(bs * window, -1)
            return out

        runner.forward = forward

    def _maybe_build_draft_sampler(self):
        # The in-graph Domino sampler (`dflash_worker_v2.py:884`, `:953`) reads the draft
        # graph's output directly; the wider verify window runs the eager rollout.
        if int(getattr(self, "draft_block", self.block_size)) != int(self.block_size) or \
                os.environ.get(DRAFT_BLOCK_ENV):
            return None
        return super()._maybe_build_draft_sampler()

    def _resolve_verify_width(self) -> int:
        raw = os.environ.get(VERIFY_WIDTH_ENV)
        if not raw:
            return int(self.block_size)
        width = int(raw)
        check_verify_width(int(self.block_size), width)
        return width

    def _accept_block(self, **kwargs):
        accept_len, commit_lens, bonus, out_tokens, new_seq_lens = super()._accept_block(**kwargs)
        width = int(self.verify_width)
        if width >= int(self.block_size):
            return accept_len, commit_lens, bonus, out_tokens, new_seq_lens
        # Verify width W < block: keep at most W - 1 proposals. A row that accepted more
        # has proposal W accepted as well (equal to the target's greedy token, or accepted
        # by the sampling rule, hence distributed as the target at that position), so it
        # becomes the row's bonus: output stays the target's, and every step commits at
        # most W tokens, as a W-wide verify would.
        candidates = kwargs["candidates"]
        cap = width - 1
        over = accept_len > cap
        if not bool(over.any()):
            return accept_len, commit_lens, bonus, out_tokens, new_seq_lens
        accept_len = torch.clamp(accept_len, max=cap)
        bonus = torch.where(over, candidates[:, width].to(bonus.dtype), bonus)
        out_tokens, commit_lens = _commit_accept(candidates, accept_len, bonus)
        return accept_len, commit_lens, bonus, out_tokens, None


__all__ = ["DominoDFlashWorker"]
