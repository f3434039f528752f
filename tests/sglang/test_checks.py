"""Draft checks shared by argument resolution and the worker (no sglang import)."""

from __future__ import annotations

import json
import os

import pytest

from sglang_domino.config import DraftConfigError
from sglang_domino.sglang.checks import (check_draft_against_target, check_verify_width, read_draft_config,
                                         read_target_config)


def _write(tmp_path, name, cfg):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def test_project_drafts_go_through_draftconfig_and_others_are_left_to_sglang(tmp_path, models):
    with open(os.path.join(models["domino_legacy"], "config.json")) as fh:
        legacy = json.load(fh)
    cfg = read_draft_config(models["domino_legacy"])
    assert cfg.is_domino and cfg.dflash_config.projector_type == "causal_v5"
    other = dict(legacy, architectures=["DFlash2DraftModel"])
    assert read_draft_config(_write(tmp_path, "dflash2", other)) is None
    assert read_draft_config(str(tmp_path / "missing")) is None
    broken = dict(legacy, block_size=1)
    with pytest.raises(DraftConfigError, match="block_size: got 1"):
        read_draft_config(_write(tmp_path, "broken", broken))


def test_target_checks(models):
    target = read_target_config(models["target"])
    draft = read_draft_config(models["dflash"])
    check_draft_against_target(draft, target)
    with pytest.raises(DraftConfigError, match=r"mask_token_id: got 511, expected an id inside the target vocabulary \[0, 399\]"):
        check_draft_against_target(draft, dict(target), target_vocab_size=400)
    last = draft.model_copy(deep=True)
    last.dflash_config.target_layer_ids = [0, target["num_hidden_layers"] - 1]
    with pytest.raises(DraftConfigError, match="SGLang cannot capture the last layer"):
        check_draft_against_target(last, target)


def test_verify_width_bounds():
    check_verify_width(16, 16)
    check_verify_width(16, 8)
    with pytest.raises(ValueError, match="larger than --speculative-dflash-block-size 16"):
        check_verify_width(16, 17)
    with pytest.raises(ValueError, match="expected >= 2"):
        check_verify_width(16, 1)
