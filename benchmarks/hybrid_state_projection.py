"""Projection: recurrent-state memory of DFLASH verification on gated delta-net (GDN) hybrid targets.

    python -m benchmarks.hybrid_state_projection [--budget-gb 80 --mem-fraction 0.9 --context-len 8192 ...]

ARITHMETIC FROM THE CONFIGS, NOT A MEASUREMENT. Nothing here runs a model or allocates memory.
It prices two ways of verifying a block of D draft tokens against a GDN hybrid target, per GPU:

- snapshot: sglang 0.5.23's recurrent verify. The verify kernel writes the full SSM state after every
  drafted position into `intermediate_ssm` and the commit copies the accepted one into the main state.
- replay: 0.5.23's `--enable-linear-replayssm-spec` layout for GDN. One checkpoint state plus a ring of
  compact per-token records (update vector d, normalised key k, scalar gate g, bf16 low parts of d and k);
  the verify reconstructs outputs without materialising states; the commit folds the accepted tokens into
  the checkpoint.

Both keep the conv windows (`intermediate_conv_window`): conv rollback needs them in either scheme.
Layouts follow the installed 0.5.23 wheel; `file:line` below is relative to its `sglang/` package.
docs/hybrid-state.md explains the formulas, the assumptions and what is not confirmed.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, replace

TITLE = "Projection: arithmetic from the configs, not a measurement"
GIB = 1 << 30
FP32, BF16 = 4, 2

# Dtypes of the state, with their 0.5.23 defaults:
SSM_BYTES = FP32  # srt/configs/mamba_utils.py:71-92: float32 unless config/env say otherwise; both configs say float32
CONV_BYTES = BF16  # srt/configs/mamba_utils.py:68 (SGLANG_MAMBA_CONV_DTYPE, default bfloat16: srt/environ.py:1628)
KV_BYTES = BF16  # --kv-cache-dtype auto = the bf16 model dtype
RING_LEN = 16  # --linear-replayssm-cache-len default (srt/arg_groups/fields/exec_.py:582-585)


@dataclass(frozen=True)
class HybridModel:
    """The config fields the arithmetic needs. GDN layers: all but every `full_attention_interval`-th."""

    name: str
    source: str
    num_layers: int
    full_attention_interval: int
    hidden: int
    vocab: int
    heads: int  # full attention
    kv_heads: int
    head_dim: int
    lin_key_heads: int  # GDN
    lin_value_heads: int
    lin_key_dim: int
    lin_value_dim: int
    conv_kernel: int
    mlp_intermediate: int = 0  # dense MLP (0 for MoE)
    experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    extra_params: int = 0  # loaded but not read at decode (the 27B's vision tower)
    linear_weight_bytes: float = BF16  # bytes per parameter of the linear layers
    weight_note: str = "bf16"

    @property
    def gdn_layers(self) -> int:
        return self.num_layers - self.num_layers // self.full_attention_interval

    @property
    def attn_layers(self) -> int:
        return self.num_layers // self.full_attention_interval


# Qwen/Qwen3.6-27B: its config.json was not read. Values are Qwen3.5-27B's (same Qwen3_5ForConditionalGeneration
# architecture per /work/shared/reference/cpu-tp-hybrid.md §2.1), as copied into public code: a transformers
# Qwen3_5Config construction (text_config: 64 layers, interval 4, hidden 5120, intermediate 17408, 24/4 heads,
# head_dim 256, attn_output_gate, linear heads 16 key / 48 value x 128, conv 4, mamba_ssm_dtype float32,
# vocab 248320, untied; vision_config depth 27, hidden 1152, intermediate 4304, out 5120), THUDM/slime
# scripts/models/qwen3.5-27B.sh (24/4 heads, kv-channels 256, 64 layers, 5120, ffn 17408, vocab 248320,
# untied, gated attention) and several Qwen3.8-27B test configs with the same text fields.
QWEN36_27B = HybridModel(
    name="Qwen3.6-27B", source="Qwen3.5-27B public config (third-party copies); Qwen3.6-27B's own not read",
    num_layers=64, full_attention_interval=4, hidden=5120, vocab=248320, heads=24, kv_heads=4, head_dim=256,
    lin_key_heads=16, lin_value_heads=48, lin_key_dim=128, lin_value_dim=128, conv_kernel=4,
    mlp_intermediate=17408,
    extra_params=460_730_096,  # vision tower: vision_config above with Qwen3-VL block shapes (assumed)
)

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (a public dump of it: 48 layers, interval 4, hidden 2048,
# 16/2 heads, head_dim 256, linear heads 16 key / 32 value x 128, conv 4, 512 experts, 10 per token,
# moe_intermediate 512, shared 512, vocab 151936, untied). Same dump: 81,324,862,720 parameters including the
# MTP layer (~1.65 B, not loaded for DFLASH), so 79.67 B as counted here.
QWEN3_NEXT_80B = HybridModel(
    name="Qwen3-Next-80B-A3B", source="Qwen/Qwen3-Next-80B-A3B-Instruct config.json (public copy)",
    num_layers=48, full_attention_interval=4, hidden=2048, vocab=151936, heads=16, kv_heads=2, head_dim=256,
    lin_key_heads=16, lin_value_heads=32, lin_key_dim=128, lin_value_dim=128, conv_kernel=4,
    experts=512, experts_per_tok=10, moe_intermediate=512, shared_intermediate=512,
)
# Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 (used by sglang's own CI): assumed 1 byte per linear weight with
# embeddings, lm_head and routers left in bf16; block scales ignored.
QWEN3_NEXT_80B_FP8 = replace(QWEN3_NEXT_80B, linear_weight_bytes=1, weight_note="fp8")

MODELS = (QWEN36_27B, QWEN3_NEXT_80B)
WEIGHT_VARIANTS = (QWEN36_27B, QWEN3_NEXT_80B, QWEN3_NEXT_80B_FP8)


# ---------------------------------------------------------------- state (per GPU, all GDN layers)
def _shard(n: int, tp: int) -> int:
    assert n % tp == 0, f"{n} heads do not split over TP {tp}"
    return n // tp


def ssm_bytes(m: HybridModel, tp: int) -> int:
    """One SSM state: [HV/tp, V, K] in fp32 per GDN layer (srt/configs/mamba_utils.py:230)."""
    return m.gdn_layers * _shard(m.lin_value_heads, tp) * m.lin_value_dim * m.lin_key_dim * SSM_BYTES


def conv_dim(m: HybridModel, tp: int) -> int:
    """conv_dim = value_dim + 2 * key_dim, split over TP (srt/configs/mamba_utils.py:222-225)."""
    return (m.lin_value_heads * m.lin_value_dim + 2 * m.lin_key_heads * m.lin_key_dim) // tp


def conv_bytes(m: HybridModel, tp: int) -> int:
    """One conv state: [conv_dim, K-1] in bf16 per GDN layer (srt/configs/mamba_utils.py:225)."""
    return m.gdn_layers * conv_dim(m, tp) * (m.conv_kernel - 1) * CONV_BYTES


def state_bytes(m: HybridModel, tp: int) -> int:
    """One request's main state = 0.5.23's mamba_cache_per_req (srt/configs/mamba_utils.py:115-125)."""
    return ssm_bytes(m, tp) + conv_bytes(m, tp)


def conv_window_bytes(m: HybridModel, tp: int, d: int) -> int:
    """intermediate_conv_window, deduplicated on CUDA for linear chains: [conv_dim, D+K-2] per layer
    (srt/mem_cache/memory_pool.py:135-150, :598-636); kept under replay too (:872, :916-938)."""
    return m.gdn_layers * conv_dim(m, tp) * (d + m.conv_kernel - 2) * CONV_BYTES


def ring_entry_bytes(m: HybridModel, tp: int) -> int:
    """One token's GDN replay record, all layers: d and k (bf16), their bf16 low parts, scalar g (fp32)
    (srt/configs/mamba_utils.py:127-157; allocations srt/mem_cache/memory_pool.py:793-843)."""
    hv, hk = _shard(m.lin_value_heads, tp), _shard(m.lin_key_heads, tp)
    d_and_k = hv * m.lin_value_dim * CONV_BYTES + hk * m.lin_key_dim * CONV_BYTES
    return m.gdn_layers * (2 * d_and_k + hv * FP32)


def ring_bytes(m: HybridModel, tp: int, ring_len: int = RING_LEN) -> int:
    """The request's ring: L records (= replayssm_ring_bytes_per_req(L))."""
    return ring_len * ring_entry_bytes(m, tp)


# ---------------------------------------------------------------- per request and per verify step
def spec_reserved_bytes(m: HybridModel, tp: int, d: int, scheme: str, ring_len: int = RING_LEN) -> int:
    """What speculation adds per running request beside its main state(s)."""
    if scheme == "snapshot":  # intermediate_ssm [.., D, HV, V, K] (srt/mem_cache/memory_pool.py:880-895)
        return d * ssm_bytes(m, tp) + conv_window_bytes(m, tp, d)
    if scheme == "replay":  # intermediate_ssm skipped (:880-881); ring instead
        if d > ring_len or ring_len & (ring_len - 1):  # gdn_replayssm_spec_decode.py:437 and :916
            raise ValueError(f"ring length {ring_len}: must be a power of two and at least D={d}")
        return ring_bytes(m, tp, ring_len) + conv_window_bytes(m, tp, d)
    raise ValueError(scheme)


def reserved_bytes(m: HybridModel, tp: int, d: int, scheme: str, slots: int = 1, ring_len: int = RING_LEN) -> int:
    """Per running request: `slots` main states (1 without radix cache; 0.5.23 keeps 3, +1/+2 with
    extra_buffer: srt/mem_cache/kv_cache_configurator.py:227, :3062-3088) plus the speculative term."""
    return slots * state_bytes(m, tp) + spec_reserved_bytes(m, tp, d, scheme, ring_len)


def written_per_request(m: HybridModel, tp: int, d: int, scheme: str) -> int:
    """State bytes written by one verify step for one request (writes only; reads are not counted).

    snapshot: D states (verify kernel, srt/layers/attention/linear/gdn_backend.py:1147-1162) + the commit copy
    of the accepted one (kernels/ops/mamba/mamba_state_scatter_triton.py:794-801).
    replay: D ring records (kernels/ops/attention/linear/gdn_replayssm_spec_decode.py:437-480) + one fold of
    the checkpoint (:738-742), counted once per step: exact for L <= 2*D (every commit folds, :868), as at the
    default L=16 with D=8 or 16; an upper bound for longer rings.
    Both: the D conv windows + the conv commit copy (mamba_state_scatter_triton.py:812-846)."""
    conv = conv_window_bytes(m, tp, d) + conv_bytes(m, tp)
    if scheme == "snapshot":
        return (d + 1) * ssm_bytes(m, tp) + conv
    if scheme == "replay":
        return d * ring_entry_bytes(m, tp) + ssm_bytes(m, tp) + conv
    raise ValueError(scheme)


def written_per_step(m: HybridModel, tp: int, d: int, scheme: str, concurrency: int) -> int:
    return concurrency * written_per_request(m, tp, d, scheme)


# ---------------------------------------------------------------- weights and KV
def _attn_layer_params(m: HybridModel) -> int:
    q = m.hidden * m.heads * m.head_dim * 2  # q_proj with the output gate (attn_output_gate)
    kv = 2 * m.hidden * m.kv_heads * m.head_dim
    return q + kv + m.heads * m.head_dim * m.hidden + 2 * m.head_dim


def _gdn_layer_params(m: HybridModel) -> int:
    key_dim, value_dim = m.lin_key_heads * m.lin_key_dim, m.lin_value_heads * m.lin_value_dim
    in_proj = m.hidden * (2 * key_dim + 2 * value_dim + 2 * m.lin_value_heads)  # q,k,v,z,b,a
    conv = (2 * key_dim + value_dim) * m.conv_kernel
    return in_proj + conv + value_dim * m.hidden + 2 * m.lin_value_heads + m.lin_value_dim


def _expert_params(m: HybridModel) -> int:
    return 3 * m.hidden * m.moe_intermediate


def param_counts(m: HybridModel) -> dict[str, int]:
    """Parameters by role: `embed` (rows gathered, not streamed), `experts` (streamed when routed to),
    `dense` (every other weight, streamed on every forward), `extra` (loaded, never read at decode)."""
    mlp = 3 * m.hidden * m.mlp_intermediate if not m.experts else (
        m.experts * m.hidden + 3 * m.hidden * m.shared_intermediate + m.hidden)  # router, shared expert, its gate
    dense = (m.attn_layers * _attn_layer_params(m) + m.gdn_layers * _gdn_layer_params(m)
             + m.num_layers * (mlp + 2 * m.hidden) + m.hidden + m.vocab * m.hidden)  # norms, lm_head
    return {"embed": m.vocab * m.hidden, "dense": dense, "experts": m.num_layers * m.experts * _expert_params(m),
            "extra": m.extra_params}


def weight_bytes(m: HybridModel, tp: int) -> float:
    """Weights resident per GPU (all sharded over TP). Embedding, lm_head and routers stay bf16."""
    p = param_counts(m)
    bf16_only = 2 * m.vocab * m.hidden + m.num_layers * m.experts * m.hidden
    linear = p["dense"] + p["experts"] + p["extra"] + p["embed"] - bf16_only
    return (linear * m.linear_weight_bytes + bf16_only * BF16) / tp


def distinct_experts(m: HybridModel, tokens: int) -> float:
    """Expected experts touched per layer by `tokens` tokens under uniform independent top-k routing."""
    return m.experts * (1 - (1 - m.experts_per_tok / m.experts) ** tokens) if m.experts else 0.0


def weight_read_bytes(m: HybridModel, tp: int, tokens: int) -> float:
    """Weights streamed by one verify forward of `tokens` tokens, per GPU (embedding rows ignored)."""
    p = param_counts(m)
    lm_head = m.vocab * m.hidden
    dense = (p["dense"] - lm_head - m.num_layers * m.experts * m.hidden) * m.linear_weight_bytes
    dense += (lm_head + m.num_layers * m.experts * m.hidden) * BF16
    experts = m.num_layers * distinct_experts(m, tokens) * _expert_params(m) * m.linear_weight_bytes
    return (dense + experts) / tp


def kv_bytes_per_token(m: HybridModel, tp: int) -> int:
    """K and V of the full-attention layers only (the hybrid KV pool: kv_cache_configurator.py:1341-1380)."""
    return m.attn_layers * 2 * _shard(m.kv_heads, tp) * m.head_dim * KV_BYTES


def concurrency_cap(budget: float, weights: float, kv_per_request: float, state_per_request: float) -> int:
    """Requests that fit: (budget - weights) / (context KV + state) per request; 0 when the weights do not fit."""
    free = budget - weights
    return max(0, math.floor(free / (kv_per_request + state_per_request))) if free > 0 else 0


# ---------------------------------------------------------------- report
def fmt(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if abs(n) >= 1e9 else f"{n / 1e6:.1f} MB"


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _header(*cells) -> list[str]:
    return [_row(*cells), "|" + "---|" * len(cells)]


def report(budget_gb: float = 80, mem_fraction: float = 0.9, tp: int = 2, widths=(16, 8), concurrency=(1, 8, 32),
           context_len: int = 8192, ring_len: int = RING_LEN, slots=(1, 5)) -> str:
    budget = budget_gb * GIB * mem_fraction
    out = [f"# {TITLE}", "",
           "Nothing was run or measured: every number is bytes computed from public config fields and from the",
           "tensor layouts of sglang 0.5.23 (docs/hybrid-state.md has the formulas, sources and assumptions).",
           f"All values are per GPU at TP {tp}; 1 GB = 10^9 bytes.", ""]

    out += ["## The models", ""]
    out += _header("model", "GDN / attention layers", "one state (SSM + conv)", f"ring, L={ring_len}",
                   "KV per token", "weights", "weight read per verify step, D=16, c=" + " / ".join(map(str, concurrency)))
    for m in MODELS:
        out.append(_row(m.name, f"{m.gdn_layers} / {m.attn_layers}",
                        f"{fmt(state_bytes(m, tp))} ({fmt(ssm_bytes(m, tp))} + {fmt(conv_bytes(m, tp))})",
                        fmt(ring_bytes(m, tp, ring_len)), f"{kv_bytes_per_token(m, tp) / 1e3:.1f} kB",
                        f"{m.weight_note}, {fmt(weight_bytes(m, tp))}",
                        " / ".join(fmt(weight_read_bytes(m, tp, c * 16)) for c in concurrency)))

    out += ["", "## Snapshot (0.5.23 DFLASH) vs replay", "",
            "D = verified positions (b16: 16, b8: 8). Reserved: one main state plus what speculation adds.",
            "Written: state bytes written by one verify step, verify and commit together.", ""]
    out += _header("model", "D", "scheme", "reserved per request", "of which speculative",
                   *(f"written per step, c={c}" for c in concurrency), f"c={concurrency[-1]}: writes / weight read")
    for m in MODELS:
        for d in widths:
            for scheme in ("snapshot", "replay"):
                writes = [written_per_step(m, tp, d, scheme, c) for c in concurrency]
                ratio = writes[-1] / weight_read_bytes(m, tp, concurrency[-1] * d)
                out.append(_row(m.name, d, scheme, fmt(reserved_bytes(m, tp, d, scheme, 1, ring_len)),
                                fmt(spec_reserved_bytes(m, tp, d, scheme, ring_len)), *map(fmt, writes),
                                f"{ratio:.2f}x"))

    out += ["", f"## Concurrency cap: {budget_gb:g} GiB x {mem_fraction:g} = {fmt(budget)}, context {context_len} tokens",
            "",
            "cap = (budget - weights) / (context KV + slots x one state + speculative term). Slots = main states per",
            "request: 1 without radix cache; 5 with radix cache, `extra_buffer` and overlap (the card's command).", ""]
    out += _header("model", "weights", "D", *(f"{s} slot{'s' * (s > 1)}: snapshot -> replay" for s in slots))
    for m in WEIGHT_VARIANTS:
        w, kv = weight_bytes(m, tp), context_len * kv_bytes_per_token(m, tp)
        for d in widths:
            caps = [[concurrency_cap(budget, w, kv, reserved_bytes(m, tp, d, x, s, ring_len))
                     for x in ("snapshot", "replay")] for s in slots]
            cells = [f"{a} -> {b}" if w < budget else "weights do not fit" for a, b in caps]
            out.append(_row(m.name, f"{m.weight_note}, {fmt(w)}", d, *cells))

    out += ["", "Not counted: draft weights and KV, activations and CUDA graphs (outside `--mem-fraction`), sglang's",
            "own split of the rest between KV and state (`--mamba-full-memory-ratio`), DFLASH's default",
            "`--max-running-requests 48`, state reads. 0.5.23 does not wire the GDN replay commit into DFLASH:",
            "the replay rows are what that wiring would cost, not an option of the wheel.", ""]
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--budget-gb", type=float, default=80, help="device memory per GPU, GiB as cards are sold (80)")
    ap.add_argument("--mem-fraction", type=float, default=0.9, help="--mem-fraction-static (0.9)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 8], help="verified positions D (16 8)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--context-len", type=int, default=8192, help="tokens of KV per request for the cap (8192)")
    ap.add_argument("--ring-len", type=int, default=RING_LEN, help="--linear-replayssm-cache-len (16)")
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 5], help="main state slots per request (1 5)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "hybrid_state_projection.md"))
    a = ap.parse_args(argv)
    text = report(a.budget_gb, a.mem_fraction, a.tp, tuple(a.widths), tuple(a.concurrency), a.context_len,
                  a.ring_len, tuple(a.slots))
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
