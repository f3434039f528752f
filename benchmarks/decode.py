"""The ways a benchmark decodes one prompt: target alone, speculative with a DFlash / Domino
draft, or Transformers' own `generate` with a candidate generator (assisted generation with a
small autoregressive assistant, or prompt lookup): the peers a Transformers user would pick.

All return the same fields, so every method is measured the same way; `ids` is the
completion (token ids, the stop token included), which the benchmark compares with
target-only decoding's.
"""

from __future__ import annotations

import time

import torch


@torch.inference_mode()
def target_only_decode(target, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), temperature: float = 0.0) -> dict:
    """Plain decoding: prefill, then one cached target forward per token."""
    from transformers import DynamicCache

    from sglang_domino.sampling import SamplingParams, sample, to_probs

    params = SamplingParams(temperature=temperature)
    pick = (lambda logits: logits.argmax(-1)) if params.greedy else (lambda logits: sample(to_probs(logits, params)))
    stops = set(stop_ids)
    t0 = time.perf_counter()
    out = target(input_ids=ids, past_key_values=DynamicCache(), use_cache=True, logits_to_keep=1)
    cache, tok = out.past_key_values, pick(out.logits[:, -1])
    tokens = [int(tok)]
    t_decode = time.perf_counter()
    forward = 0.0
    while len(tokens) < max_new_tokens and tokens[-1] not in stops:
        f0 = time.perf_counter()
        out = target(input_ids=tok[:, None], past_key_values=cache, use_cache=True)
        forward += time.perf_counter() - f0
        tok = pick(out.logits[:, -1])
        tokens.append(int(tok))
    end = time.perf_counter()
    return {"tokens": len(tokens), "seconds": end - t0, "decode_s": end - t_decode, "target_forward_s": forward,
            "verify_steps": 0, "accepted_tokens": 0, "accept_lengths": None, "ids": tokens}


def speculative_decode(draft, target, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                       verify_width: int | None = None) -> dict:
    limit = draft.config.num_predictions + 1
    width = None if verify_width is None else min(verify_width, limit)
    out, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=max_new_tokens, temperature=temperature,
                                     stop_token_ids=list(stop_ids), num_verify_tokens=width, return_stats=True)
    return {"tokens": stats.new_tokens, "seconds": stats.total_time, "decode_s": stats.total_time - stats.prefill_time,
            "target_forward_s": stats.verify_time, "verify_steps": stats.num_verify_steps,
            "accepted_tokens": sum(stats.accept_lengths), "accept_lengths": stats.accept_lengths,
            "ids": out[0, ids.shape[1]:ids.shape[1] + stats.new_tokens].tolist()}


@torch.inference_mode()
def hf_generate_decode(target, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), assistant_model=None,
                       prompt_lookup_num_tokens: int | None = None) -> dict:
    """Transformers' assisted generation, greedy: `target.generate` with `assistant_model` (a small
    autoregressive model sharing the target's vocabulary; the assistant's own generation
    config, i.e. Transformers' defaults) or with `prompt_lookup_num_tokens` (candidates copied
    from what follows an earlier occurrence of the context's last n-gram).

    Each loop of `generate` is one target forward: the first one prefills the prompt and
    verifies the first candidates together. So `verify_steps` counts the loops (every target
    forward), and `accept_lengths` the tokens each one committed, bonus included (their sum
    is the completion). `decode_s` is the time after the first target forward;
    `target_forward_s` the target's forwards within it (the assistant's too if it is the
    target itself).
    """
    from transformers import StoppingCriteria, StoppingCriteriaList

    if (assistant_model is None) == (prompt_lookup_num_tokens is None):
        raise ValueError("hf_generate_decode: pass exactly one of assistant_model and prompt_lookup_num_tokens")
    lengths: list[int] = []
    spans: list[tuple[float, float]] = []

    class Lengths(StoppingCriteria):   # called once per loop of generate, with the sequence so far; never stops
        def __call__(self, input_ids, scores, **kwargs):
            lengths.append(input_ids.shape[1])
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    pre = target.register_forward_pre_hook(lambda *_: spans.append((time.perf_counter(), 0.0)))
    post = target.register_forward_hook(lambda *_: spans.append((spans.pop()[0], time.perf_counter())))
    stops = list(stop_ids)
    kwargs = {"assistant_model": assistant_model} if assistant_model is not None else \
        {"prompt_lookup_num_tokens": prompt_lookup_num_tokens}
    try:
        t0 = time.perf_counter()
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, temperature=None, top_p=None, top_k=None,
                              eos_token_id=stops or None, pad_token_id=stops[-1] if stops else None,
                              stopping_criteria=StoppingCriteriaList([Lengths()]), **kwargs)
        end = time.perf_counter()
    finally:
        pre.remove()
        post.remove()
    completion = out[0, ids.shape[1]:].tolist()
    # generate crops at the first stop token; cut there too in case a version does not.
    for i, tok in enumerate(completion):
        if tok in stops:
            completion = completion[:i + 1]
            break
    steps = [b - a for a, b in zip([ids.shape[1]] + lengths, lengths)]
    first_end = spans[0][1] if spans else t0
    return {"tokens": len(completion), "seconds": end - t0, "decode_s": end - first_end,
            "target_forward_s": sum(b - a for a, b in spans[1:]), "verify_steps": len(steps),
            "accepted_tokens": sum(steps), "accept_lengths": steps, "ids": completion}
