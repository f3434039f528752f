import copy
import json

import pytest

from sglang_domino.config import DraftConfig, DraftConfigError, build_target_layer_ids, predicting_slots

BASE = {
    "architectures": ["DFlashDraftModel"],
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "block_size": 16, "num_target_layers": 4,
    "dflash_config": {"mask_token_id": 255, "target_layer_ids": [0, 2]},
}
DOMINO = {"projector_type": "domino", "shift_label": True, "pure_draft_prefix_len": 1,
          "gru_hidden_dim": 32, "emb_dim": 16}


def make(dflash=None, **top):
    data = copy.deepcopy(BASE)
    data["dflash_config"].update(dflash or {})
    data.update(top)
    return data


class FakeTargetConfig:
    def __init__(self, hidden_size=64, vocab_size=256, num_hidden_layers=4):
        self.hidden_size, self.vocab_size, self.num_hidden_layers = hidden_size, vocab_size, num_hidden_layers


def test_plain_dflash_parses():
    cfg = DraftConfig.from_dict(make())
    assert not cfg.is_domino and cfg.block_size == 16 and cfg.target_layer_ids == [0, 2]
    assert cfg.num_predictions == 15 and cfg.resolved_layer_types == ["full_attention"] * 2


@pytest.mark.parametrize("arch", ["DFlashDraftModel", "DominoDraftModel"])
@pytest.mark.parametrize("projector", ["domino", "causal_v5"])
def test_domino_both_architectures_and_projector_spellings(arch, projector):
    cfg = DraftConfig.from_dict(make({**DOMINO, "projector_type": projector}, architectures=[arch]))
    assert cfg.is_domino and cfg.shift_label and cfg.num_predictions == 16
    assert cfg.dflash_config.emb_dim == 16 and cfg.emb_dim == 16


def test_top_level_emb_dim_alone_is_used():
    d = {k: v for k, v in DOMINO.items() if k != "emb_dim"}
    cfg = DraftConfig.from_dict(make(d, emb_dim=24))
    assert cfg.dflash_config.emb_dim == 24


def test_dflash_keys_at_top_level_are_read():
    data = make()
    data["mask_token_id"] = data["dflash_config"].pop("mask_token_id")
    assert DraftConfig.from_dict(data).mask_token_id == 255


@pytest.mark.parametrize("t,l,expected", [(36, 5, [1, 9, 17, 25, 33]), (64, 5, [1, 16, 31, 46, 61]), (36, 1, [18])])
def test_default_target_layer_rule(t, l, expected):
    assert build_target_layer_ids(t, l) == expected
    data = make(num_target_layers=t, num_hidden_layers=l)
    del data["dflash_config"]["target_layer_ids"]
    assert DraftConfig.from_dict(data).target_layer_ids == expected


@pytest.mark.parametrize("data,field,value,expected", [
    (make({**DOMINO, "projector_type": "causal_v9"}), "projector_type", "causal_v9", "'domino'"),
    (make({**DOMINO, "pure_draft_prefix_len": 2}), "pure_draft_prefix_len", "2", "expected 1"),
    (make(DOMINO, emb_dim=32), "emb_dim", "32", "expected equal"),
    (make({"target_layer_ids": [0, 4]}), "target_layer_ids", "[0, 4]", "[0, 3]"),
    (make({"mask_token_id": -3}), "mask_token_id", "-3", "non-negative integer"),
    (make({"mask_token_id": True}), "mask_token_id", "True", "non-negative integer"),
    (make({**DOMINO, "shift_label": "yes"}), "shift_label", "'yes'", "true or false"),
    (make({**DOMINO, "use_bias_gate": True}), "use_bias_gate", "true", "expected false"),
    (make({**DOMINO, "gru_hidden_dim": None}), "gru_hidden_dim", "None", "positive integer"),
    (make(architectures=["LlamaForCausalLM"]), "architectures", "LlamaForCausalLM", "DFlashDraftModel"),
    (make(architectures=["DominoDraftModel"]), "projector_type", "None", "'domino'"),
    (make(block_size=1), "block_size", "1", ">= 2"),
    (make(layer_types=["full_attention"]), "layer_types", "1 entries", "num_hidden_layers=2"),
    (make(layer_types=["full_attention", "linear_attention"]), "layer_types", "linear_attention", "sliding_attention"),
    (make(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}), "rope_type", "yarn", "'default'"),
])
def test_bad_config_names_field_value_and_expectation(data, field, value, expected):
    with pytest.raises(DraftConfigError) as err:
        DraftConfig.from_dict(data)
    msg = str(err.value)
    assert field in msg and value in msg and expected in msg, msg


def test_missing_required_field_is_named():
    data = make()
    del data["hidden_size"]
    with pytest.raises(DraftConfigError, match="hidden_size: missing"):
        DraftConfig.from_dict(data)


@pytest.mark.parametrize("target,field,needle", [
    (FakeTargetConfig(hidden_size=96), "hidden_size", "96"),
    (FakeTargetConfig(vocab_size=300), "vocab_size", "300"),
    (FakeTargetConfig(num_hidden_layers=2), "target_layer_ids", "[0, 2]"),
])
def test_target_mismatch_is_named(target, field, needle):
    with pytest.raises(DraftConfigError) as err:
        DraftConfig.from_dict(make()).check_target(target)
    assert field in str(err.value) and needle in str(err.value)


def test_mask_id_outside_target_vocabulary():
    cfg = DraftConfig.from_dict(make({"mask_token_id": 256}))
    with pytest.raises(DraftConfigError, match=r"mask_token_id: got 256, expected an id inside the target vocabulary \[0, 255\]"):
        cfg.check_target(FakeTargetConfig())


def test_matching_target_passes():
    DraftConfig.from_dict(make()).check_target(FakeTargetConfig())


def test_mask_id_is_checked_against_the_served_vocabulary_and_an_override():
    cfg = DraftConfig.from_dict(make())
    with pytest.raises(DraftConfigError, match=r"dflash_config.mask_token_id: got 255, .*\[0, 199\]"):
        cfg.check_target(FakeTargetConfig(), target_vocab_size=200)
    with pytest.raises(DraftConfigError, match=r"^mask_token_id: got 300, .*\[0, 255\]"):
        cfg.check_target(FakeTargetConfig(), mask_token_id=300)
    cfg.check_target(FakeTargetConfig(), mask_token_id=7)


@pytest.mark.parametrize("shift,n,first,last", [
    (True, None, 0, 7),    # slot k predicts the token after it: every slot
    (False, None, 1, 7),   # slot k predicts its own token: slot 0 is the given one
    (True, 7, 0, 6),       # SGLang's rollout: block - 1 proposals either way
    (False, 7, 1, 7),
    (False, 3, 1, 3),
])
def test_predicting_slots_follow_shift_label(shift, n, first, last):
    slots = predicting_slots(8, shift, n)
    assert list(range(8))[slots] == list(range(first, last + 1))
    with pytest.raises(ValueError, match="n: got 9"):
        predicting_slots(8, shift, 9)


def test_num_predictions_counts_the_predicting_slots():
    for dflash, expected in [({}, 15), (DOMINO, 16), ({**DOMINO, "shift_label": False}, 15)]:
        cfg = DraftConfig.from_dict(make(dflash))
        slots = predicting_slots(cfg.block_size, cfg.shift_label)
        assert cfg.num_predictions == expected == len(range(cfg.block_size)[slots])


def test_from_pretrained_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(make(DOMINO)))
    assert DraftConfig.from_pretrained(tmp_path).is_domino
    with pytest.raises(DraftConfigError, match="config.json: not found"):
        DraftConfig.from_pretrained(tmp_path / "nowhere")


def test_round_trip_through_dict():
    cfg = DraftConfig.from_dict(make(DOMINO, layer_types=["sliding_attention", "full_attention"], sliding_window=8))
    again = DraftConfig.from_dict(cfg.to_dict())
    assert again == cfg
