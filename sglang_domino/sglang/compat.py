"""Checkpoint compatibility: released and legacy Domino exports load in 0.5.23's DFLASH
worker. Installed by `DominoDFlashWorker.__init__` (the `checkpoint compat` group of
`hooks.py`), in the schedulers only.
"""

from __future__ import annotations

from ..config import DOMINO_PROJECTORS


def register_domino_architecture() -> None:
    """SpecForge exports name the architecture `DominoDraftModel`; 0.5.23's `EntryClass` of
    `models/dflash.py` lacks it. It is the same model class as `DFlashDraftModel`."""
    from sglang.srt.models.registry import ModelRegistry

    if "DominoDraftModel" not in ModelRegistry.models:
        from sglang.srt.models.dflash import DFlashDraftModel

        ModelRegistry.models["DominoDraftModel"] = DFlashDraftModel


def around_parse_dflash_draft_config(original, *args, draft_hf_config=None, **kwargs):
    """0.5.23 recognises the Domino projector only as `projector_type == "domino"`; older
    exports write the alias `causal_v5`, accepted by `DraftConfig` (DOMINO_PROJECTORS).
    Rewrite the alias on the config object, then parse as upstream."""
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


def around_load_weights(original, self, weights, *args, **kwargs):
    """`DFlashDraftModel.load_weights` silently ignores unknown names, so legacy
    `logit_head.prefix_gru.*` / `logit_head.embed_proj.*` keys end in "missing required
    projector weights". Feed it names through the project's one key normalisation,
    `sglang_domino.checkpoint.normalize_keys`."""
    from ..checkpoint import normalize_keys

    def renamed():
        for name, tensor in weights:
            yield from normalize_keys({name: tensor}).items()

    return original(self, renamed(), *args, **kwargs)
