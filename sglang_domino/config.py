"""The one parser of DFlash / Domino draft configs (`config.json`).

Every backend (Transformers, the trainer, the SGLang plugin) reads drafts through
`DraftConfig`, so a checkpoint is accepted or rejected the same way everywhere.
Errors are raised as `DraftConfigError` with one line per problem, each naming the
field, the value found and what was expected.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

ARCHITECTURES = ("DFlashDraftModel", "DominoDraftModel")
# `causal_v5` is the name older SpecForge exports used for the Domino projector.
DOMINO_PROJECTORS = ("domino", "causal_v5")
LAYER_TYPES = ("full_attention", "sliding_attention")
DEFAULT_MASK_TOKEN = "<|MASK|>"
# Flags of the official Domino remote code that no released checkpoint sets; we do
# not implement them, so a checkpoint that turns one on is refused rather than
# silently served with a different head.
UNSUPPORTED_DOMINO_FLAGS = ("use_bias_norm", "use_bias_gate")


class DraftConfigError(ValueError):
    """A draft config that cannot be served; the message names field, value and expectation."""


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layers, the rule every DFlash implementation uses when the
    config omits `target_layer_ids`: one draft layer reads the middle layer, otherwise
    layers 1 .. T-3 spaced evenly."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    if num_target_layers < 4:
        raise DraftConfigError(
            f"dflash_config.target_layer_ids: absent, and the default rule needs num_target_layers >= 4 "
            f"(got {num_target_layers}); set target_layer_ids explicitly"
        )
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def predicting_slots(block_size: int, shift_label: bool, n: Optional[int] = None) -> slice:
    """The draft-block slots whose hidden states predict the n proposals after slot 0's
    given token (by default all a block can predict). With shifted labels (Domino
    `shift_label`) slot k predicts the token after it, so slots 0..n-1; otherwise slot k
    predicts its own token, so slots 1..n."""
    first = 0 if shift_label else 1
    most = block_size - first
    n = most if n is None else n
    if not 0 <= n <= most:
        raise ValueError(f"n: got {n}, expected 0..{most} proposals "
                         f"(block_size={block_size}, shift_label={shift_label})")
    return slice(first, first + n)


class DFlashSection(BaseModel):
    """`config.json["dflash_config"]` (values may also sit at the top level)."""

    model_config = ConfigDict(extra="allow")

    mask_token_id: Optional[int] = None
    mask_token: str = DEFAULT_MASK_TOKEN
    target_layer_ids: Optional[list[int]] = None
    projector_type: Optional[str] = None
    shift_label: Optional[bool] = None
    pure_draft_prefix_len: Optional[int] = None
    gru_hidden_dim: Optional[int] = None
    emb_dim: Optional[int] = None
    use_bias_norm: bool = False
    use_bias_gate: bool = False

    @field_validator("mask_token_id", mode="before")
    @classmethod
    def _mask_id_is_int(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"got {v!r}, expected a non-negative integer token id")
        return v

    @field_validator("shift_label", mode="before")
    @classmethod
    def _shift_label_is_bool(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, bool):
            raise ValueError(f"got {v!r}, expected true or false")
        return v

    @field_validator("projector_type")
    @classmethod
    def _known_projector(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in DOMINO_PROJECTORS:
            raise ValueError(
                f"got {v!r}, expected 'domino' (legacy alias 'causal_v5') or absent for plain DFlash"
            )
        return v


class DraftConfig(BaseModel):
    """A validated draft config. Qwen3 backbone fields plus the DFlash / Domino fields."""

    model_config = ConfigDict(extra="allow", frozen=False)

    architectures: list[str]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    vocab_size: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    max_position_embeddings: int = 40960
    rope_theta: Optional[float] = None
    rope_parameters: Optional[dict[str, Any]] = None
    rope_scaling: Optional[dict[str, Any]] = None
    layer_types: Optional[list[str]] = None
    sliding_window: Optional[int] = None
    block_size: int = 16
    num_target_layers: int
    emb_dim: Optional[int] = None
    dflash_config: DFlashSection = DFlashSection()

    # -- field checks ---------------------------------------------------------------
    @field_validator("architectures")
    @classmethod
    def _known_architecture(cls, v: list[str]) -> list[str]:
        if len(v) != 1 or v[0] not in ARCHITECTURES:
            raise ValueError(f"got {v!r}, expected ['DFlashDraftModel'] or ['DominoDraftModel']")
        return v

    @field_validator("hidden_act")
    @classmethod
    def _silu_only(cls, v: str) -> str:
        if v != "silu":
            raise ValueError(f"got {v!r}, expected 'silu' (Qwen3 MLP)")
        return v

    @field_validator("block_size")
    @classmethod
    def _block_at_least_two(cls, v: int) -> int:
        if v < 2:
            raise ValueError(f"got {v}, expected an integer >= 2 (bonus token plus at least one mask)")
        return v

    @field_validator("layer_types")
    @classmethod
    def _known_layer_types(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        for t in v or []:
            if t not in LAYER_TYPES:
                raise ValueError(f"got {t!r}, expected one of {LAYER_TYPES}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _lift_top_level_dflash_keys(cls, data: Any) -> Any:
        """DFlash keys may sit at the top level; `dflash_config` wins (as in every upstream parser)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        section = dict(data.get("dflash_config") or {})
        for key in ("mask_token_id", "mask_token", "target_layer_ids", "projector_type", "shift_label",
                    "pure_draft_prefix_len", "gru_hidden_dim"):
            if key not in section and key in data:
                section[key] = data[key]
        data["dflash_config"] = section
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "DraftConfig":
        d = self.dflash_config
        n = self.num_hidden_layers
        if self.layer_types is not None and len(self.layer_types) != n:
            raise ValueError(
                f"layer_types: got {len(self.layer_types)} entries, expected num_hidden_layers={n}"
            )
        if "sliding_attention" in (self.layer_types or []) and not self.sliding_window:
            raise ValueError("sliding_window: got null, expected a positive window for sliding_attention layers")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_key_value_heads: got {self.kv_heads}, expected a divisor of num_attention_heads={self.num_attention_heads}"
            )
        if self.rope_type != "default":
            raise ValueError(f"rope_parameters.rope_type: got {self.rope_type!r}, expected 'default'")
        if d.target_layer_ids is None:
            d.target_layer_ids = build_target_layer_ids(self.num_target_layers, n)
        for layer in d.target_layer_ids:
            if not 0 <= layer < self.num_target_layers:
                raise ValueError(
                    f"dflash_config.target_layer_ids: got {d.target_layer_ids}, expected ids in "
                    f"[0, {self.num_target_layers - 1}] (num_target_layers={self.num_target_layers})"
                )
        if not d.target_layer_ids:
            raise ValueError("dflash_config.target_layer_ids: got [], expected at least one layer id")
        if self.is_domino:
            self._check_domino()
        elif self.architectures[0] == "DominoDraftModel":
            raise ValueError(
                "dflash_config.projector_type: got None for architecture DominoDraftModel, expected 'domino'"
            )
        return self

    def _check_domino(self) -> None:
        d = self.dflash_config
        if d.pure_draft_prefix_len is None:
            d.pure_draft_prefix_len = 1
        if d.pure_draft_prefix_len != 1:
            raise ValueError(f"dflash_config.pure_draft_prefix_len: got {d.pure_draft_prefix_len}, expected 1")
        if d.shift_label is None:
            raise ValueError("dflash_config.shift_label: missing, expected true or false for a Domino draft")
        for key in ("gru_hidden_dim",):
            value = getattr(d, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"dflash_config.{key}: got {value!r}, expected a positive integer")
        if d.emb_dim is not None and self.emb_dim is not None and d.emb_dim != self.emb_dim:
            raise ValueError(
                f"emb_dim: dflash_config.emb_dim={d.emb_dim} and top-level emb_dim={self.emb_dim} disagree, "
                "expected equal values"
            )
        emb = d.emb_dim if d.emb_dim is not None else self.emb_dim
        if not isinstance(emb, int) or emb <= 0:
            raise ValueError(f"dflash_config.emb_dim: got {emb!r}, expected a positive integer")
        d.emb_dim = self.emb_dim = emb
        for flag in UNSUPPORTED_DOMINO_FLAGS:
            if getattr(d, flag):
                raise ValueError(f"dflash_config.{flag}: got true, expected false (not implemented)")

    # -- derived values -------------------------------------------------------------
    @property
    def is_domino(self) -> bool:
        return self.dflash_config.projector_type in DOMINO_PROJECTORS

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rope_type(self) -> str:
        params = self.rope_parameters or self.rope_scaling or {}
        return params.get("rope_type", params.get("type", "default"))

    @property
    def rope_base(self) -> float:
        params = self.rope_parameters or {}
        return float(params.get("rope_theta", self.rope_theta or 1_000_000.0))

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.dflash_config.target_layer_ids)

    @property
    def resolved_layer_types(self) -> list[str]:
        return list(self.layer_types or ["full_attention"] * self.num_hidden_layers)

    @property
    def mask_token_id(self) -> Optional[int]:
        return self.dflash_config.mask_token_id

    @property
    def shift_label(self) -> bool:
        return bool(self.dflash_config.shift_label) if self.is_domino else False

    @property
    def num_predictions(self) -> int:
        """Draft tokens one backbone pass can predict (`predicting_slots`)."""
        slots = predicting_slots(self.block_size, self.shift_label)
        return slots.stop - slots.start

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DraftConfig":
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise DraftConfigError(_format_validation_error(err)) from None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "DraftConfig":
        path = os.fspath(path)
        file = os.path.join(path, "config.json") if os.path.isdir(path) else path
        try:
            with open(file, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise DraftConfigError(f"config.json: not found at {file!r}, expected a draft checkpoint directory") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    # -- checks against the target ----------------------------------------------------
    def check_target(self, target_config: Any, target_vocab_size: Optional[int] = None,
                     mask_token_id: Optional[int] = None) -> None:
        """Raise if this draft cannot run against `target_config` (a Transformers config).

        The mask id (`mask_token_id` when given, else the config's) must lie inside the
        target vocabulary: `target_vocab_size` rows when given (the embedding actually served),
        else the target config's `vocab_size`."""
        problems = []
        text = getattr(target_config, "get_text_config", lambda: target_config)()
        t_hidden = getattr(text, "hidden_size", None)
        t_vocab = getattr(text, "vocab_size", None)
        t_layers = getattr(text, "num_hidden_layers", None)
        if t_hidden is not None and t_hidden != self.hidden_size:
            problems.append(f"hidden_size: draft has {self.hidden_size}, expected the target's hidden_size {t_hidden}")
        if t_vocab is not None and t_vocab != self.vocab_size:
            problems.append(f"vocab_size: draft has {self.vocab_size}, expected the target's vocab_size {t_vocab}")
        if t_layers is not None:
            if self.num_target_layers != t_layers:
                problems.append(
                    f"num_target_layers: got {self.num_target_layers}, expected the target's num_hidden_layers {t_layers}"
                )
            bad = [i for i in self.target_layer_ids if i >= t_layers]
            if bad:
                problems.append(
                    f"dflash_config.target_layer_ids: got {self.target_layer_ids}, expected ids below the "
                    f"target's num_hidden_layers {t_layers}"
                )
        mask, field = ((mask_token_id, "mask_token_id") if mask_token_id is not None
                       else (self.mask_token_id, "dflash_config.mask_token_id"))
        vocab = target_vocab_size if target_vocab_size is not None else t_vocab
        if mask is not None and vocab is not None and not 0 <= mask < vocab:
            problems.append(f"{field}: got {mask}, expected an id inside the target vocabulary [0, {vocab - 1}]")
        if problems:
            raise DraftConfigError("; ".join(problems))


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if not loc:
            lines.append(msg)
        elif e["type"] == "missing":
            lines.append(f"{loc}: missing, expected a value")
        elif msg.startswith(loc.split(".")[-1] + ":") or msg.startswith(loc + ":"):
            lines.append(msg)
        else:
            got = e.get("input")
            detail = msg if msg.startswith("got ") else f"got {got!r}, {msg[0].lower() + msg[1:]}"
            lines.append(f"{loc}: {detail}")
    return "invalid draft config: " + "; ".join(lines)

