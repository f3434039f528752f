"""SGLang's argument resolution, after `load_plugins()`, of each command line in
params["cases"] in turn: what it resolved and what the plugin handed to the scheduler
processes, or the error."""

import json
import os

SETTINGS_ENV = "SGLANG_DOMINO_SCHEDULER_SETTINGS"


def handed_to_schedulers() -> dict:
    """The draft block (as text) and the adaptive settings resolution published in the
    scheduler settings document."""
    settings = json.loads(os.environ.get(SETTINGS_ENV, "{}"))
    block, adaptive = settings.get("draft_block"), settings.get("adaptive")
    block = None if block is None else str(block)
    return {**({"draft_block": block} if block is not None else {}),
            **({"adaptive": adaptive} if adaptive is not None else {})}


def probe(params) -> list[dict]:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens
    from sglang.srt.server_args import prepare_server_args

    result = []
    for args in params["cases"]:
        try:
            sa = prepare_server_args(args)
            sa.resolve_once()
            v = resolving_view(sa)
            handed = handed_to_schedulers()
            if "adaptive" in handed:
                handed["upstream_adaptive"] = v.speculative_adaptive
            result.append(dict(ok=True, num_draft_tokens=v.speculative_num_draft_tokens,
                               draft_backend=v.speculative_draft_attention_backend,
                               block=v.speculative_dflash_block_size,
                               max_draft=max_speculative_num_draft_tokens(sa),
                               overlap=not v.disable_overlap_schedule,
                               **({"retraction_backup": v.disaggregation_decode_retraction_backup}
                                  if str(v.disaggregation_mode) != "null" else {}), **handed))
        except Exception as err:
            result.append(dict(ok=False, error=type(err).__name__ + ": " + str(err)))
    return result
