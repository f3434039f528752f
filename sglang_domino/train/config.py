"""`TrainConfig`: every setting of a draft training run, validated in one place.

The command line is generated from this model (one flag per field), so a run can be
described equally by flags, by a JSON file (`--config`), or from Python.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- what to train against, on what, and where to write ------------------------------
    target: str = Field(description="Transformers causal LM directory (or hub id) the draft serves")
    data: str = Field(description="JSONL: {prompt_ids, response_ids} | {input_ids, loss_mask} | "
                                  "{prompt, response} | {conversations} | {text}")
    output_dir: str = Field(description="final draft checkpoint; checkpoint-<step>/ folders inside")
    tokenizer: Optional[str] = Field(None, description="tokenizer path (default: the target's)")

    # -- the draft ---------------------------------------------------------------------
    kind: Literal["dflash", "domino"] = "dflash"
    draft_config: Optional[str] = Field(None, description="start from this config.json instead of the size flags")
    init_from: Optional[str] = Field(None, description="draft checkpoint whose weights initialise training")
    num_draft_layers: int = Field(1, ge=1)
    draft_intermediate_size: Optional[int] = Field(None, description="default: the target's")
    block_size: int = Field(16, ge=2)
    mask_token_id: Optional[int] = Field(None, description="default: the last embedding row when the "
                                         "tokenizer leaves it unused")
    target_layer_ids: Optional[list[int]] = None
    shift_label: bool = True
    gru_hidden_dim: int = Field(256, ge=1)
    emb_dim: int = Field(128, ge=1)

    # -- data ------------------------------------------------------------------------------
    max_length: int = Field(2048, ge=4)
    regenerate: bool = Field(False, description="replace responses by the target's greedy continuation")
    regenerate_max_new_tokens: int = 256
    regenerate_batch_size: int = 32

    # -- optimisation ------------------------------------------------------------------------
    batch_size: int = Field(4, ge=1)
    num_anchors: Optional[int] = Field(None, description="blocks per sequence (default 512 DFlash, 256 Domino)")
    epochs: int = Field(1, ge=1)
    max_steps: Optional[int] = Field(None, ge=1, description="total steps (overrides epochs)")
    learning_rate: float = 6e-4
    warmup_ratio: float = Field(0.04, ge=0, le=1)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    loss_decay_gamma: Optional[float] = Field(7.0, description="position decay of the loss weights; null: none")
    lambda_base_start: float = Field(1.0, ge=0, le=1)
    lambda_base_decay_ratio: float = Field(1.0, gt=0, description="lambda reaches 0 at this fraction of the run")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="bfloat16: autocast over fp32 weights; auto: bfloat16 on GPU, float32 on CPU "
                            "(CPUs without AMX/AVX512-BF16 run bf16 many times slower)")
    device: str = Field("auto", description="auto: cuda when available, else cpu")
    seed: int = 0

    # -- bookkeeping ---------------------------------------------------------------------------
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(2, ge=1)
    resume: Optional[str] = Field(None, description="checkpoint directory, or 'auto' for the latest in output_dir")
    progress: bool = True
    threads: int = Field(0, ge=0, description="torch threads (0: leave torch's default)")

    @model_validator(mode="after")
    def _defaults(self) -> "TrainConfig":
        if self.num_anchors is None:
            self.num_anchors = 256 if self.kind == "domino" else 512
        return self

    @property
    def anchors(self) -> int:
        return int(self.num_anchors)
