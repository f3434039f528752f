"""A tiny hybrid target whose greedy output depends on where the gated delta-net conv
state is rounded to the cache's dtype, a constant DFlash draft for it, and Transformers
loops that emulate the two rounding schedules.

SGLang 0.5.23 stores the conv state in bfloat16 (`SGLANG_MAMBA_CONV_DTYPE`) whatever
`--dtype` says. Token-by-token decoding rounds the state after every token; a DFLASH
target verify must do the same between its positions (`gdn_ops.causal_conv1d_update_cpu`),
or the tokens it commits are not those of decoding one token at a time.

The target is `tiny.build_hybrid_target`'s model with
- conv kernels whose three taps on past positions sum to zero in every channel (and three
  times larger): in token-by-token decoding each stored input's rounding error enters the
  next three outputs with weights summing to zero, and the delta-net layers, which sum
  their inputs over time, largely cancel it; a verify that does not round between its
  positions leaves the accepted positions' inputs unrounded until the commit, so the
  same error enters only the later uses and no longer cancels;
- a head with 8 live tokens (LIVE_TOKENS: four rows and their negatives, so a live token
  always wins over the zero rows of the rest of the vocabulary), the row of
  CONSTANT_TOKEN five times larger: the target emits it in runs of 1 to 16 tokens, which
  the constant draft (`build_constant_draft`) proposes, so every verify's acceptance is
  known from the target's output (0 to the whole window).
"""

from __future__ import annotations

import copy
import os

from tests.helpers import tiny

LIVE_TOKENS = tuple(range(300, 308))
CONSTANT_TOKEN = LIVE_TOKENS[0]
CONV_SCALE = 3.0
HEAD_SCALE = 20.0
CONSTANT_BOOST = 5.0
HEAD_SEED = 7


def build_sensitive_target(path: str, seed: int = 0):
    """`tiny.build_hybrid_target(path, seed)` with the conv kernels and head described in the
    module docstring, saved in place (tensors rewritten, config kept); returns the HF model."""
    import torch
    from safetensors.torch import load_file, save_file

    target = tiny.build_hybrid_target(path, seed=seed)
    weights_path = os.path.join(path, "model.safetensors")
    weights = load_file(weights_path)
    hidden = target.config.hidden_size
    with torch.no_grad():
        for i, layer in enumerate(target.model.layers):
            if not hasattr(layer, "linear_attn"):
                continue
            w = layer.linear_attn.conv1d.weight                          # [channels, 1, K]
            w.mul_(CONV_SCALE)
            w[..., :-1] -= w[..., :-1].mean(-1, keepdim=True)            # past taps sum to zero
            weights[f"model.layers.{i}.linear_attn.conv1d.weight"] = w.detach().clone()
        rows = torch.randn(len(LIVE_TOKENS) // 2, hidden, generator=torch.Generator().manual_seed(HEAD_SEED))
        head = target.lm_head.weight
        head.zero_()
        head[list(LIVE_TOKENS)] = torch.cat([rows, -rows]) * HEAD_SCALE / hidden ** 0.5
        head[CONSTANT_TOKEN] *= CONSTANT_BOOST
        weights["lm_head.weight"] = head.detach().clone()
    save_file(weights, weights_path, metadata={"format": "pt"})
    return target


def build_constant_draft(path: str, target, token: int = CONSTANT_TOKEN, block_size: int = 16, seed: int = 2):
    """A DFlash draft proposing `token` at every position of every block (its layers'
    output projections zero: each proposal is the target head applied to the draft's final
    norm of the mask embedding, whose weight is set so that `token` wins by a wide margin)."""
    import torch

    from sglang_domino.testing import TINY_MASK_ID, tiny_draft

    draft = tiny_draft(target, "dflash", seed=seed, block_size=block_size, mask_token_id=TINY_MASK_ID)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        e = target.get_input_embeddings().weight[TINY_MASK_ID].float()
        n = e * torch.rsqrt(e.pow(2).mean() + draft.config.rms_norm_eps)
        head = target.lm_head.weight.float()
        live = list(LIVE_TOKENS)
        want = torch.full((len(live),), -10.0)
        want[live.index(token)] = 10.0
        draft.norm.weight.copy_(torch.linalg.lstsq(head[live] * n, want[:, None]).solution[:, 0])
        logits = head @ (n * draft.norm.weight.float())
    top = logits.topk(2)
    assert int(top.indices[0]) == token and float(top.values[0] - top.values[1]) > 5, top
    draft.save_pretrained(path)
    return draft


# -- Transformers loops with the conv state rounded where SGLang stores it ---------------
def round_conv_states(cache, dtype=None) -> None:
    """Round every linear-attention layer's cached conv state to `dtype` (bfloat16: 0.5.23's
    default conv-state dtype) in place."""
    import torch

    dtype = dtype or torch.bfloat16
    for layer in cache.layers:
        for i, state in getattr(layer, "conv_states", {}).items():
            if state is not None and layer.is_conv_states_initialized[i]:
                state.copy_(state.to(dtype).to(state.dtype))


def _prefill_rounded(target, prompt: list[int]):
    """The prompt's cache (conv state rounded, as the pool stores it), its last logits in a
    list and the first greedy token in a list."""
    import torch

    out = target(torch.tensor([prompt]), use_cache=True)
    round_conv_states(out.past_key_values)
    return out.past_key_values, [out.logits[0, -1]], [int(out.logits[0, -1].argmax())]


def decode_rounded(target, prompt: list[int], n: int):
    """Greedy tokens and logits [n, V] of decoding one token at a time with the conv state
    rounded after the prefill and after every token: SGLang's plain decode, and a DFLASH
    verify that rounds between its positions."""
    import torch

    with torch.no_grad():
        cache, logits, tokens = _prefill_rounded(target, prompt)
        while len(tokens) < n:
            out = target(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            round_conv_states(cache)
            logits.append(out.logits[0, -1])
            tokens.append(int(logits[-1].argmax()))
    return tokens, torch.stack(logits)


def dflash_unrounded(target, prompt: list[int], n: int, token: int = CONSTANT_TOKEN, window: int = 16):
    """Greedy tokens, logits [n, V] and the tokens each verify commits, for DFLASH with the
    constant draft when a verify does not round between its positions: each verify runs
    [last token, `token` * (window - 1)] on the committed state, keeps the accepted prefix
    and its bonus token, and only the committed conv state is rounded."""
    import torch

    with torch.no_grad():
        cache, logits, tokens = _prefill_rounded(target, prompt)
        commits = []
        while len(tokens) < n:
            ids = [tokens[-1]] + [token] * (window - 1)
            predicted = target(torch.tensor([ids]), past_key_values=copy.deepcopy(cache),
                               use_cache=True).logits[0].argmax(-1).tolist()
            run = 0
            while run < window - 1 and predicted[run] == token:
                run += 1
            out = target(torch.tensor([ids[:run + 1]]), past_key_values=cache, use_cache=True)
            round_conv_states(cache)
            for j in range(run + 1):
                logits.append(out.logits[0, j])
                tokens.append(int(out.logits[0, j].argmax()))
            commits.append(run + 1)
    return tokens[:n], torch.stack(logits)[:n], commits


def top2_margins(logits):
    """Top-1 minus top-2 logit at each row."""
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]
