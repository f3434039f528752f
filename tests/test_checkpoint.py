import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_domino.checkpoint import CheckpointError, INDEX_NAME, WEIGHTS_NAME
from sglang_domino.hf import DFlashDraftModel
from sglang_domino.testing import tiny_draft


def draft_output(draft, target, seed=0):
    """Backbone output on a fixed random context and block: equal weights give equal output."""
    g = torch.Generator().manual_seed(seed)
    k = len(draft.config.target_layer_ids)
    feats = torch.randn(2, 5, k * draft.config.hidden_size, generator=g)
    ctx = draft.context_kv(feats.to(draft.dtype), torch.arange(5).expand(2, 5))
    block = target.get_input_embeddings()(torch.randint(0, 200, (2, draft.config.block_size), generator=g))
    pos = torch.arange(5, 5 + draft.config.block_size).expand(2, -1)
    masks = {"full_attention": torch.ones(2, 1, draft.config.block_size, 5 + draft.config.block_size, dtype=torch.bool)}
    return draft(block.to(draft.dtype), pos, ctx, masks)


@pytest.mark.parametrize("kind", ["dflash", "domino"])
def test_save_load_round_trip(tmp_path, target, kind):
    draft = tiny_draft(target, kind)
    draft.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["auto_map"] == {"AutoModel": "dflash.DFlashDraftModel"} and cfg["dtype"] == "float32"
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config.model_dump(exclude={"dtype", "auto_map"}) == draft.config.model_dump()
    for key, value in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(draft_output(loaded, target), draft_output(draft, target))
    if kind == "domino":
        keys = set(load_file(tmp_path / WEIGHTS_NAME))
        assert {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"} <= keys


def test_sharded_checkpoint_loads(tmp_path, target):
    draft = tiny_draft(target, "domino")
    draft.save_pretrained(tmp_path, max_shard_bytes=200_000)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert len(set(index["weight_map"].values())) > 1 and not (tmp_path / WEIGHTS_NAME).exists()
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert torch.equal(draft_output(loaded, target), draft_output(draft, target))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_load_in_each_dtype(tmp_path, target, dtype):
    tiny_draft(target, "domino").save_pretrained(tmp_path)
    loaded = DFlashDraftModel.from_pretrained(tmp_path, dtype=dtype)
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    assert loaded.dtype == dtype
    name = str(dtype).removeprefix("torch.")
    assert DFlashDraftModel.from_pretrained(tmp_path, torch_dtype=name).dtype == dtype


def test_auto_dtype_follows_the_checkpoint(tmp_path, target):
    tiny_draft(target, "dflash", dtype=torch.bfloat16).save_pretrained(tmp_path)
    assert DFlashDraftModel.from_pretrained(tmp_path, torch_dtype="auto").dtype == torch.bfloat16


def rewrite_weights(path, fn):
    tensors = load_file(path / WEIGHTS_NAME)
    save_file(fn(dict(tensors)), path / WEIGHTS_NAME)


def test_legacy_logit_head_keys_are_remapped(tmp_path, target):
    draft = tiny_draft(target, "domino")
    draft.save_pretrained(tmp_path)
    rewrite_weights(tmp_path, lambda t: {("logit_head." + k if k.startswith(("prefix_gru", "embed_proj")) else k): v
                                         for k, v in t.items()})
    assert "logit_head.embed_proj.2.weight" in load_file(tmp_path / WEIGHTS_NAME)
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.embed_proj[2].weight, draft.embed_proj[2].weight)


def test_model_prefix_and_rotary_buffer_are_accepted(tmp_path, target):
    draft = tiny_draft(target, "dflash")
    draft.save_pretrained(tmp_path)
    rewrite_weights(tmp_path, lambda t: {**{"model." + k: v for k, v in t.items()},
                                         "rotary_emb.inv_freq": torch.ones(8)})
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.fc.weight, draft.fc.weight)


def test_missing_weight_is_named(tmp_path, target):
    tiny_draft(target, "domino").save_pretrained(tmp_path)
    rewrite_weights(tmp_path, lambda t: {k: v for k, v in t.items() if k != "prefix_gru.weight_hh_l0"})
    with pytest.raises(CheckpointError, match=r"missing weights \['prefix_gru.weight_hh_l0'\]"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_unexpected_weight_is_named(tmp_path, target):
    tiny_draft(target, "dflash").save_pretrained(tmp_path)
    rewrite_weights(tmp_path, lambda t: {**t, "extra_head.weight": torch.zeros(3)})
    with pytest.raises(CheckpointError, match=r"unexpected weights \['extra_head.weight'\]"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_domino_weights_in_a_dflash_config_are_unexpected(tmp_path, target):
    """A Domino checkpoint whose config lost its projector must not load as plain DFlash."""
    tiny_draft(target, "domino").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["dflash_config"]["projector_type"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unexpected weights.*embed_proj"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_wrong_shape_is_named(tmp_path, target):
    tiny_draft(target, "dflash").save_pretrained(tmp_path)
    rewrite_weights(tmp_path, lambda t: {**t, "fc.weight": torch.zeros(64, 64)})
    with pytest.raises(CheckpointError, match=r"fc.weight: checkpoint shape \(64, 64\), expected \(64, 128\)"):
        DFlashDraftModel.from_pretrained(tmp_path)


def test_missing_weights_file(tmp_path, target):
    tiny_draft(target, "dflash").save_pretrained(tmp_path)
    (tmp_path / WEIGHTS_NAME).unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        DFlashDraftModel.from_pretrained(tmp_path)


@pytest.mark.parametrize("kind,arch", [("dflash", "DFlashDraftModel"), ("domino", "DFlashDraftModel"),
                                       ("domino", "DominoDraftModel")])
def test_trust_remote_code_round_trip(tmp_path, target, kind, arch, monkeypatch):
    """The model card's call, on a local directory: AutoModel returns this implementation,
    for both architecture names (SpecForge exports Domino as `DominoDraftModel`)."""
    from transformers import AutoModel

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    draft = tiny_draft(target, kind, architectures=[arch])
    draft.save_pretrained(tmp_path / "draft")
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["auto_map"]["AutoModel"] == f"dflash.{arch}"
    auto = AutoModel.from_pretrained(str(tmp_path / "draft"), trust_remote_code=True, torch_dtype="auto",
                                     device_map="cpu").eval()
    assert isinstance(auto, DFlashDraftModel)
    ids = torch.randint(0, 200, (1, 9), generator=torch.Generator().manual_seed(5))
    out = auto.spec_generate(input_ids=ids, target=target, max_new_tokens=12, temperature=0.0, stop_token_ids=[])
    assert torch.equal(out, draft.spec_generate(input_ids=ids, target=target, max_new_tokens=12))
