"""What a test bed build is made of: sizes, step counts and the seed, as one validated model.

Every stage reads its numbers from here, so a build is reproducible from (preset, seed)
and the cache directory can tell whether it holds the build being asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict


class TargetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = 1280           # embedding rows; the tokenizer leaves the last few unused
    tokenizer_vocab: int = 1277      # an upper bound: BPE stops early once every word is one token
    hidden_size: int = 256
    intermediate_size: int = 768
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 2000
    lr: float = 3e-3
    warmup_steps: int = 100


class DataSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    eval_every: int = 12             # one task (codechat) or stdlib file in `eval_every` is held out, by hash
    train_conversations: int = 120000  # codechat: the target's training documents
    eval_conversations: int = 400      # codechat: held-out documents for perplexity
    prompt_tokens: int = 64          # stdlib: corpus chunk given to the target as the prompt
    response_tokens: int = 160       # greedy continuation the target writes (draft training text)
    num_prompts: int = 1600
    gen_batch_size: int = 64


class DraftSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_layers: int = 2
    intermediate_size: int = 512
    block_size: int = 16
    gru_hidden_dim: int = 256
    emb_dim: int = 128
    steps: int = 600
    batch_size: int = 8
    num_anchors: int = 32
    lr: float = 2e-3


class TestbedSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    corpus: Literal["codechat", "stdlib"] = "codechat"
    max_stdlib_files: int = 0        # stdlib: 0 = every file
    target: TargetSpec = TargetSpec()
    data: DataSpec = DataSpec()
    draft: DraftSpec = DraftSpec()

    def digest(self) -> str:
        return _hash(self.model_dump())

    def stage_digest(self, stage: str) -> str:
        """What a stage's output depends on: a change elsewhere keeps it cached."""
        parts = {"seed": self.seed, "corpus": self.corpus, "files": self.max_stdlib_files,
                 "target": self.target.model_dump(), "split": self.data.eval_every,
                 "documents": [self.data.train_conversations, self.data.eval_conversations]}
        if stage in ("data", "dflash", "domino"):
            parts["data"] = self.data.model_dump()
        if stage in ("dflash", "domino"):
            parts["draft"] = self.draft.model_dump()
            parts["kind"] = stage
        return _hash(parts)


def _hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


PRESETS: dict[str, TestbedSpec] = {
    "full": TestbedSpec(),
    # Minutes-scale build for tests on a cold cache: same pipeline, toy sizes.
    "tiny": TestbedSpec(
        max_stdlib_files=40,
        target=TargetSpec(vocab_size=512, tokenizer_vocab=500, hidden_size=64, intermediate_size=128,
                          num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, seq_len=128,
                          batch_size=8, steps=120, lr=3e-3, warmup_steps=10),
        data=DataSpec(eval_every=8, train_conversations=2000, eval_conversations=40, prompt_tokens=32,
                      response_tokens=48, num_prompts=96, gen_batch_size=48),
        draft=DraftSpec(num_layers=1, intermediate_size=128, block_size=8, gru_hidden_dim=32, emb_dim=16,
                        steps=60, batch_size=8, num_anchors=8, lr=3e-3),
    ),
}


def default_root() -> Path:
    env = os.environ.get("DOMINO_TESTBED_DIR")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sglang-domino" / "testbed"


def build_dir(preset: str, root: Path | None = None) -> Path:
    return (root or default_root()) / preset
