"""Pure-PyTorch CPU stand-ins for the gated delta-net (GDN) ops SGLang 0.5.23 calls when
it serves a hybrid target (Qwen3.5 / Qwen3.6, Qwen3-Next) with `--device cpu`.

0.5.23 has no CPU fallback for them: every "mambaish" model imports them from `sgl_kernel`
at module import (the `is_cpu()` branches of `srt/layers/attention/linear/gdn_backend`,
`kernels/gdn_triton` and `kda_backend`), and PyPI's `sgl_kernel` is CUDA-only. Served as
`sgl_kernel.mamba` and `torch.ops.sgl_kernel.*` by the stand-in in `kernel_standin.py`:

  * `causal_conv1d_fn_cpu`       prefill conv (`GDNAttnBackend._convolve_prefill`);
  * `causal_conv1d_update_cpu`   decode conv (`GDNAttnBackend.forward_decode`) and the
    DFLASH target verify (`GDNAttnBackend.forward_extend`), which also writes the window
    after every draft position;
  * `chunk_gated_delta_rule_cpu` prefill recurrence (`TritonGDNKernel.extend`);
  * `fused_gdn_gating_cpu`       prefill gates (`GDNAttnBackend._prefill_gates`);
  * `fused_sigmoid_gating_delta_rule_update_cpu` decode (`TritonGDNKernel.decode`) and
    target verify (`TritonGDNKernel.target_verify`: `disable_state_update=True`, the state
    after each position written to `intermediate_states_buffer`);
  * `scatter_mamba_states_after_mtp_verify` the commit after acceptance
    (`HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`): 0.5.23's version
    raises for CPU tensors (`mamba_state_scatter_triton.fused_mamba_state_scatter_with_mask`
    and `fused_conv_window_scatter_with_mask`).

One recurrence serves prefill, decode and verify (`_delta_rule`, one token's math in
`_token`), so the state a verify snapshots at position t is bit for bit the state decoding
those t + 1 tokens would reach. Under `--enable-torch-compile` the decode's and the verify's
sequences run it as compiled graphs (`compile_rule`), equal to the eager loop to float32
rounding.
Layouts (from the pool, `srt/mem_cache/memory_pool.py`): ssm state `[slot, HV, V, K]`,
conv state `[slot, dim, K - 1]`; per-position verify buffers `[row, D, HV, V, K]` and
`[row, D, dim, K - 1]`. Only the linear chain DFLASH verifies is supported (no tree
`retrieve_*` indices).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

MAMBA_FUNCTIONS = ("causal_conv1d_fn_cpu", "causal_conv1d_update_cpu", "chunk_gated_delta_rule_cpu")


def _activate(x: torch.Tensor, activation) -> torch.Tensor:
    if activation in (None, False):
        return x
    if activation in (True, "silu", "swish"):
        return F.silu(x)
    raise ValueError(f"causal conv stand-in: activation {activation!r}, expected None, 'silu' or 'swish'")


def _conv(windows: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation):
    """windows [dim, ..., K] (oldest input first), weight [dim, K] -> [dim, ...], float32."""
    lead = (weight.shape[0],) + (1,) * (windows.dim() - 2)
    out = (windows.float() * weight.float().reshape(*lead, -1)).sum(-1)
    if bias is not None:
        out = out + bias.float().reshape(lead)
    return _activate(out, activation)


def _weight_2d(weight: torch.Tensor) -> torch.Tensor:
    # `RadixLinearAttention.refresh_conv_weights` hands [dim, K]; conv1d layers keep [dim, 1, K]
    return weight.reshape(weight.shape[0], -1)


def causal_conv1d_fn_cpu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                         activation=None, conv_states: Optional[torch.Tensor] = None,
                         has_initial_state: Optional[torch.Tensor] = None,
                         cache_indices: Optional[torch.Tensor] = None,
                         query_start_loc: Optional[torch.Tensor] = None, seq_lens_cpu=None,
                         **unused) -> torch.Tensor:
    """x [dim, T] (the sequences of a prefill batch packed along T, bounded by
    `query_start_loc`) -> [dim, T]. Each sequence starts from its conv state when
    `has_initial_state`, else from zeros, and leaves its last K - 1 inputs in
    `conv_states[cache_indices[i]]`."""
    if unused.get("block_table") is not None:
        raise NotImplementedError("causal_conv1d_fn_cpu: paged conv state (block_table) is CUDA-only")
    w = _weight_2d(weight)
    dim, width = w.shape
    bounds = [0, x.shape[1]] if query_start_loc is None else query_start_loc.tolist()
    out = torch.empty_like(x)
    for i in range(len(bounds) - 1):
        start, end = int(bounds[i]), int(bounds[i + 1])
        slot = None if cache_indices is None else int(cache_indices[i])
        if slot is not None and slot < 0:
            continue  # a padded row
        if conv_states is not None and slot is not None and has_initial_state is not None and bool(has_initial_state[i]):
            history = conv_states[slot].to(x.dtype)
        else:
            history = x.new_zeros(dim, width - 1)
        seq = torch.cat([history, x[:, start:end]], dim=1)                    # [dim, K-1+n]
        out[:, start:end] = _conv(seq.unfold(1, width, 1), w, bias, activation).to(x.dtype)  # [dim, n, K] windows
        if conv_states is not None and slot is not None:
            conv_states[slot] = seq[:, seq.shape[1] - (width - 1):].to(conv_states.dtype)
    return out


def causal_conv1d_update_cpu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, activation=None,
                             cache_seqlens=None, conv_state_indices: Optional[torch.Tensor] = None,
                             num_accept_tokens=None,
                             intermediate_conv_window: Optional[torch.Tensor] = None,
                             intermediate_state_indices: Optional[torch.Tensor] = None,
                             retrieve_next_token=None, retrieve_next_sibling=None,
                             retrieve_parent_token=None, pad_slot_id: int = -1, **unused) -> torch.Tensor:
    """x [bs, dim] (decode: one token, the conv state shifts in place) or [bs, dim, D]
    (target verify with `intermediate_conv_window`: the window after position t goes to
    `intermediate_conv_window[intermediate_state_indices[b], t]` and the conv state is
    left as it was; the commit after acceptance writes the accepted position's window)."""
    for name, value in (("cache_seqlens", cache_seqlens), ("num_accept_tokens", num_accept_tokens),
                        ("retrieve_next_token", retrieve_next_token),
                        ("retrieve_next_sibling", retrieve_next_sibling),
                        ("retrieve_parent_token", retrieve_parent_token)):
        if value is not None:
            raise NotImplementedError(f"causal_conv1d_update_cpu: {name} is not supported on CPU "
                                      "(linear-chain verify only)")
    verify = intermediate_conv_window is not None
    if verify and intermediate_state_indices is None:
        raise ValueError("causal_conv1d_update_cpu: intermediate_conv_window needs intermediate_state_indices")
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    w = _weight_2d(weight)
    out = torch.empty_like(xs)
    for b in range(xs.shape[0]):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if slot == pad_slot_id or slot < 0:
            out[b] = 0
            continue
        state = conv_state[slot].to(xs.dtype)                                # [dim, K-1]
        row = int(intermediate_state_indices[b]) if verify else None
        for t in range(xs.shape[2]):
            window = torch.cat([state, xs[b, :, t:t + 1]], dim=1)           # [dim, K]
            out[b, :, t] = _conv(window, w, bias, activation).to(xs.dtype)
            # rounded to the cache's dtype after every position, as decoding one token at
            # a time stores it: a verify then sees what token-by-token decoding would
            state = window[:, 1:].to(conv_state.dtype).to(xs.dtype)
            if verify:
                intermediate_conv_window[row, t] = state.to(intermediate_conv_window.dtype)
        if not verify:
            conv_state[slot] = state.to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


def gdn_gates(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
              softplus_beta: float = 1.0, softplus_threshold: float = 20.0):
    """(g, beta), both float32: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return g, torch.sigmoid(b.float())


def fused_gdn_gating_cpu(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor):
    """a, b [T, HV] -> (g, beta) [1, T, HV] float32 (the Triton
    `kernels/ops/attention/linear/fused_gdn_gating.fused_gdn_gating` keeps beta in b's
    dtype)."""
    g, beta = gdn_gates(A_log, a, b, dt_bias)
    return g.unsqueeze(0), beta.to(b.dtype).unsqueeze(0)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, l2norm: bool, scale: Optional[float]):
    """q, k [T, HK, K] -> float32 [T, HV, K]; value head h reads key head h // (HV / HK)."""
    q, k = q.float(), k.float()
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    ratio = num_v_heads // q.shape[1]
    if ratio * q.shape[1] != num_v_heads:
        raise ValueError(f"gated delta rule: {num_v_heads} value heads is not a multiple of {q.shape[1]} key heads")
    if ratio > 1:
        q, k = q.repeat_interleave(ratio, dim=1), k.repeat_interleave(ratio, dim=1)
    return q * (q.shape[-1] ** -0.5 if scale is None else scale), k


def _token(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
           beta: torch.Tensor):
    """One token of the gated delta rule: state [HV, V, K] float32; q, k [HV, K]; v [HV, V];
    g, beta [HV] -> (the new state, o [HV, V] float32).
    S <- exp(g) S; S <- S + beta (v - S k) k^T; o = S q."""
    state = state * torch.exp(g)[:, None, None]
    err = (v.float() - torch.einsum("hvk,hk->hv", state, k)) * beta[:, None]
    state = state + err[:, :, None] * k[:, None, :]
    return state, torch.einsum("hvk,hk->hv", state, q)


def _rule_graph(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor):
    """`_token` over all of a (short) sequence, as one graph under `--enable-torch-compile`:
    (o [n, HV, V], the state after each token [n, HV, V, K])."""
    outs, states = [], []
    for t in range(q.shape[0]):
        state, o = _token(state, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
        states.append(state)
    return torch.stack(outs), torch.stack(states)


class _Compiled:
    """`_rule_graph` compiled for the sequence lengths a server's decode and verify run (one
    graph each, compiled before serving by `compile_rule`); None in an eager server."""
    rule = None
    lengths: frozenset = frozenset()
    told = False   # the eager loop's use for a rounded state pool logged


def compile_rule(lengths, heads: int, v_dim: int, k_dim: int, dtype: torch.dtype) -> float:
    """Under `--enable-torch-compile`: the delta rule of one sequence as one graph per length
    in `lengths` (decode: 1; a verify: its width), compiled now as the compiled target calls
    it: grad-free, below autograd (inside its opaque op `sglang_domino::cpu_linear_attention`;
    dynamo's guards read the dispatch keys a tensor has there); seconds taken. The eager loop
    was 1.8 ms per layer for a 16-token verify of 8 heads of 64 x 64 on the 2-core AMD EPYC,
    the graph 0.25 ms. Other lengths (prefill) and a state pool stored in another dtype than
    float32 keep the eager loop (the latter logged once)."""
    import time

    from ..compiled.switches import allow_graphs

    t0 = time.perf_counter()
    allow_graphs()
    _Compiled.rule = torch.compile(_rule_graph, dynamic=False)
    with torch.no_grad(), torch._C._AutoDispatchBelowAutograd():
        for n in sorted(set(lengths)):
            _Compiled.rule(torch.zeros(heads, v_dim, k_dim), torch.zeros(n, heads, k_dim),
                           torch.zeros(n, heads, k_dim), torch.zeros(n, heads, v_dim, dtype=dtype),
                           torch.zeros(n, heads), torch.zeros(n, heads))
    _Compiled.lengths = frozenset(lengths)
    return time.perf_counter() - t0


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` with a contiguous tensor's strides, size-1 dimensions included (dynamo's guards
    compare every stride; `.contiguous()` keeps a size-1 dimension's odd stride)."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    return t if t.stride() == tuple(reversed(strides)) else t.clone(memory_format=torch.contiguous_format)


def _delta_rule(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, snapshots: Optional[list] = None, stored_as: Optional[torch.dtype] = None):
    """The gated delta rule over one sequence. state [HV, V, K] float32 (updated in place);
    q, k [n, HV, K] (q scaled); v [n, HV, V]; g, beta [n, HV] float32 -> o [n, HV, V] float32.
    `stored_as`: S is rounded to that dtype after every token, as a pool of that dtype stores
    it between the tokens of token-by-token decoding. Token by token (`_token`), or as one
    compiled graph where `compile_rule` compiled this length."""
    rounds = stored_as is not None and stored_as != torch.float32
    if rounds and _Compiled.rule is not None and not _Compiled.told:
        import logging

        logging.getLogger(__name__).info("--enable-torch-compile: the delta rule runs its eager loop for a %s state "
                                         "pool (the compiled graphs keep float32 states)", stored_as)
        _Compiled.told = True
    if _Compiled.rule is not None and q.shape[0] in _Compiled.lengths and not rounds:
        from ..compiled.switches import guarded_inputs

        inputs = tuple(_dense(t) for t in guarded_inputs((state, q, k, v, g, beta)))
        out, states = _Compiled.rule(*inputs)
        state.copy_(states[-1])
        if snapshots is not None:
            snapshots.extend(states.unbind(0))
        return out
    out = v.new_empty(v.shape, dtype=torch.float32)
    current = state
    for t in range(q.shape[0]):
        current, out[t] = _token(current, q[t], k[t], v[t], g[t], beta[t])
        if rounds:
            current = current.to(stored_as).float()
        if snapshots is not None:
            snapshots.append(current)
    state.copy_(current)
    return out


def _segments(cu_seqlens: Optional[torch.Tensor], total: int):
    bounds = [0, total] if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
    return list(zip(bounds[:-1], bounds[1:]))


def _rule_over_sequences(q, k, v, g, beta, pool: Optional[torch.Tensor], slots: Optional[torch.Tensor],
                         cu_seqlens, l2norm: bool, scale: Optional[float], write_back: bool = True,
                         buffer: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None,
                         max_steps: Optional[int] = None, per_token: bool = False) -> torch.Tensor:
    """The delta rule over each sequence of `cu_seqlens` in q, k [1, T, HK, K], v [1, T, HV, V],
    g, beta [T, HV] float32, from `pool[slots[i]]` (zeros without a pool; a negative slot is a
    padded row, left at zero output). `write_back`: the final state goes back to the pool;
    `buffer`: the state after each position goes to `buffer[rows[i], t]`; `per_token`: the
    state is rounded to the pool's dtype after every token (decode and verify)."""
    if buffer is not None and rows is None:
        raise ValueError("intermediate_states_buffer needs intermediate_state_indices")
    hv = v.shape[2]
    qs, ks = _prepare_qk(q[0], k[0], hv, l2norm, scale)
    out = torch.zeros_like(v)
    for i, (start, end) in enumerate(_segments(cu_seqlens, q.shape[1])):
        slot = i if slots is None else int(slots[i])
        if slot < 0:
            continue
        if pool is not None:
            state = pool[slot].float().clone()
        else:
            state = v.new_zeros(hv, v.shape[3], q.shape[3], dtype=torch.float32)
        steps: Optional[list] = [] if buffer is not None else None
        out[0, start:end] = _delta_rule(state, qs[start:end], ks[start:end], v[0, start:end], g[start:end],
                                        beta[start:end], steps,
                                        stored_as=pool.dtype if per_token and pool is not None else None
                                        ).to(out.dtype)
        if buffer is not None:
            limit = buffer.shape[1] if max_steps is None else min(max_steps, buffer.shape[1])
            if len(steps) > limit:
                raise ValueError(f"target verify of {len(steps)} positions, but the state buffer holds {limit}")
            buffer[int(rows[i]), :len(steps)] = torch.stack(steps).to(buffer.dtype)
        if write_back and pool is not None:
            pool[slot] = state.to(pool.dtype)
    return out


def chunk_gated_delta_rule_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, scale: Optional[float] = None,
                               initial_state: Optional[torch.Tensor] = None, output_final_state: bool = False,
                               cu_seqlens: Optional[torch.Tensor] = None, head_first: bool = False,
                               use_qk_l2norm_in_kernel: bool = False,
                               initial_state_indices: Optional[torch.Tensor] = None, **unused):
    """Prefill. q, k [1, T, HK, K], v [1, T, HV, V], g, beta [1, T, HV]; sequence i is
    `cu_seqlens[i]:cu_seqlens[i+1]` and starts from (and updates in place)
    `initial_state[initial_state_indices[i]]`. Returns (o [1, T, HV, V], None, None): the
    caller keeps the pool and 0.5.23's CPU kernel returns no per-chunk states either."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule_cpu: head_first=True")
    out = _rule_over_sequences(q, k, v, g[0].float(), beta[0].float(), initial_state, initial_state_indices,
                               cu_seqlens, use_qk_l2norm_in_kernel, scale)
    return out, None, None


def fused_sigmoid_gating_delta_rule_update_cpu(
        A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        a: torch.Tensor, b: torch.Tensor, initial_state_source: torch.Tensor,
        initial_state_indices: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
        use_qk_l2norm_in_kernel: bool = False, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
        scale: Optional[float] = None, is_kda: bool = False, disable_state_update: bool = False,
        intermediate_states_buffer: Optional[torch.Tensor] = None,
        intermediate_state_indices: Optional[torch.Tensor] = None, cache_steps: Optional[int] = None,
        retrieve_parent_token: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode and target verify: gates from (a, b), then the delta rule per sequence of
    `cu_seqlens` over q, k [1, T, HK, K], v [1, T, HV, V], a, b [T, HV]. Decode updates
    `initial_state_source[initial_state_indices[i]]` in place; verify
    (`disable_state_update`) leaves it and writes the state after position t to
    `intermediate_states_buffer[intermediate_state_indices[i], t]`. -> o [1, T, HV, V]."""
    if is_kda:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: is_kda=True (KDA) on CPU")
    if retrieve_parent_token is not None:
        raise NotImplementedError("fused_sigmoid_gating_delta_rule_update_cpu: tree verify (retrieve_parent_token)")
    hv = v.shape[2]
    g, beta = gdn_gates(A_log, a.reshape(-1, hv), b.reshape(-1, hv), dt_bias, softplus_beta, softplus_threshold)
    return _rule_over_sequences(q, k, v, g, beta, initial_state_source, initial_state_indices, cu_seqlens,
                                use_qk_l2norm_in_kernel, scale, write_back=not disable_state_update,
                                buffer=intermediate_states_buffer, rows=intermediate_state_indices,
                                max_steps=cache_steps, per_token=True)


def _scatter_steps(dst: torch.Tensor, src: torch.Tensor, dst_indices: torch.Tensor, steps: torch.Tensor,
                   src_rows: Optional[torch.Tensor]) -> None:
    """dst [layers, slots, ...] <- src [layers, rows, D, ...]: dst[:, dst_indices[r]] =
    src[:, src_rows[r], steps[r]] for every r with a valid step (>= 0)."""
    if dst is None or src is None or dst.numel() == 0 or steps.numel() == 0:
        return
    steps = steps.to(torch.long).reshape(-1)
    dst_indices = dst_indices.to(torch.long).reshape(-1)
    rows = torch.arange(steps.shape[0]) if src_rows is None else src_rows.to(torch.long).reshape(-1)
    keep = (steps >= 0) & (steps < src.shape[2]) & (dst_indices >= 0)
    if bool(keep.any()):
        dst[:, dst_indices[keep]] = src[:, rows[keep], steps[keep]].to(dst.dtype)


def scatter_mamba_states_after_mtp_verify(mamba_caches, state_indices_tensor: torch.Tensor,
                                          last_correct_step_indices: torch.Tensor,
                                          mamba_track_indices: Optional[torch.Tensor],
                                          mamba_steps_to_track: Optional[torch.Tensor],
                                          src_indices_raw: Optional[torch.Tensor] = None) -> None:
    """0.5.23's `scatter_mamba_states_after_mtp_verify` contract, eagerly: the state and
    every conv window of each request's last accepted position become its live state (and
    the track slot's, when radix tracking asks for one)."""
    targets = [(state_indices_tensor, last_correct_step_indices)]
    if mamba_track_indices is not None:
        if mamba_steps_to_track is None:
            raise ValueError("mamba_track_indices needs mamba_steps_to_track")
        targets.append((mamba_track_indices, mamba_steps_to_track))
    pairs = [(mamba_caches.temporal, mamba_caches.intermediate_ssm)]
    pairs += list(zip(mamba_caches.conv, mamba_caches.intermediate_conv_window))
    for dst_indices, steps in targets:
        for dst, src in pairs:
            _scatter_steps(dst, src, dst_indices, steps, src_indices_raw)


SIGMOID_GATING_SCHEMA = (
    "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
    "Tensor a, Tensor b, Tensor(s!) initial_state_source, Tensor initial_state_indices, Tensor? cu_seqlens=None, "
    "bool use_qk_l2norm_in_kernel=False, float softplus_beta=1.0, float softplus_threshold=20.0, "
    "float? scale=None, bool is_kda=False, bool disable_state_update=False, "
    "Tensor(i!)? intermediate_states_buffer=None, Tensor? intermediate_state_indices=None, "
    "int? cache_steps=None, Tensor? retrieve_parent_token=None) -> Tensor"
)


def register(lib) -> None:
    """Define the two `torch.ops.sgl_kernel` GDN ops on `lib` (a FRAGMENT of `sgl_kernel`)."""
    lib.define("fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)")
    lib.impl("fused_gdn_gating_cpu", fused_gdn_gating_cpu, "CPU")
    lib.define(SIGMOID_GATING_SCHEMA)
    lib.impl("fused_sigmoid_gating_delta_rule_update_cpu", fused_sigmoid_gating_delta_rule_update_cpu, "CPU")
