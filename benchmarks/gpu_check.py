"""GPU check: what of this project runs on a single GPU without SGLang or network.

    python3 -m benchmarks.gpu_check            # real sizes (Qwen3-8B Domino draft), bf16, CUDA
    python3 -m benchmarks.gpu_check --small    # tiny sizes, any device (a smoke run on CPU)

Random weights (acceptance is meaningless); it checks that each piece runs at real size
and agrees with its reference, and prints timings:
  1. the Triton chain-accept kernel (`sglang_domino.kernels.chain_accept`, sparse draft
     q: dense q_0, then a K=2048 pool; also without a pool and point-mass drafts) against
     `accept_probs` on the densified q at V=151936, n=15, batch 1 / 8 / 32 / 64:
     acceptance lengths equal, next tokens equal or (counted) rounding ties of the
     inverse CDF, then kernel vs reference time; a block / num_warps sweep;
  2. the draft backbone: block of 16 over a cached context, batch 1 / 8 / 32;
  3. proposals at full vocabulary: DFlash argmax and the Domino rollout, greedy and sampled;
  4. the speculative-sampling accept rule at full vocabulary.
Needs torch, triton and pydantic (carry pydantic's wheels where it is missing). Meant
to finish well under 10 minutes on one H200. On CPU (--small; section 1 at V=512, K=64,
batch 1 / 8) the kernel runs under TRITON_INTERPRET=1 (set here when triton is not
imported yet; its times mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from sglang_domino.accept import Uniforms, accept_probs, accept_sampled
from sglang_domino.config import DraftConfig
from sglang_domino.model import DraftModel
from sglang_domino.rollout import propose_dflash, propose_domino
from sglang_domino.sampling import SamplingParams

# Qwen3-8B Domino b16 (algorithm reference, section 1.1 / 2.2).
REAL = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=5, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, num_target_layers=36, gru=1024, emb=256, ctx=1024)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, num_target_layers=4, gru=32, emb=16, ctx=64)


def draft_config(s: dict) -> DraftConfig:
    return DraftConfig.from_dict({
        "architectures": ["DFlashDraftModel"], "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"], "num_hidden_layers": s["num_hidden_layers"],
        "num_attention_heads": s["num_attention_heads"], "num_key_value_heads": s["num_key_value_heads"],
        "head_dim": s["head_dim"], "vocab_size": s["vocab_size"], "block_size": 16,
        "num_target_layers": s["num_target_layers"],
        "dflash_config": {"mask_token_id": s["vocab_size"] - 1, "projector_type": "domino", "shift_label": True,
                          "gru_hidden_dim": s["gru"], "emb_dim": s["emb"]}})


def chain_case(b: int, n: int, V: int, K: int, mode: str, device: torch.device, gen: torch.Generator) -> dict:
    """Target probs and a Domino-shaped draft for the chain kernel. mode "pool": q_0 dense,
    q_1.. on a random pool of K unique ids where the target puts most of its mass;
    "dense": no pool (pool_ids = arange(V)); "point": point-mass drafts (argmax of q).
    Draft quality falls over the batch; every fourth request gets near-zero step coins,
    so acceptance lengths range from 0 to n."""
    from sglang_domino.kernels.chain_accept import densify_q

    K = V if mode == "dense" else K
    if mode == "dense":
        pool_ids = torch.arange(V, device=device).expand(b, V)
    else:
        pool_ids = torch.rand(b, V, generator=gen, device=device).argsort(-1)[:, :K]
    logits = torch.randn(b, n + 1, V, generator=gen, device=device)
    if K < V:
        logits.scatter_add_(2, pool_ids[:, None].expand(b, n + 1, K), torch.full((b, n + 1, K), 6.0, device=device))
    p = torch.softmax(logits, -1)
    sigma = torch.linspace(0, 3, b, device=device)[:, None]
    q_first = torch.softmax(logits[:, 0] + sigma * torch.randn(b, V, generator=gen, device=device), -1)
    rest = logits[:, 1:n].gather(2, pool_ids[:, None].expand(b, n - 1, K))
    noise = torch.randn(rest.shape, generator=gen, device=device)
    q_rest = torch.softmax(rest + sigma[:, None] * noise, -1)
    del logits, rest, noise
    q = densify_q(q_first, pool_ids, q_rest, V)
    if mode == "point":
        drafts = q.argmax(-1)
    else:
        drafts = torch.multinomial(q.view(-1, V), 1, generator=gen).view(b, n)
    u = Uniforms.draw(b, n, device, gen)
    scale = torch.where(torch.arange(b, device=device) % 4 == 0, 1e-4, 1.0)[:, None]
    case = dict(drafts=drafts, p=p, q=q, u=Uniforms(u.steps * scale, u.final))
    if mode == "point":
        case.update(q_draft=None, q_first=None, pool_ids=None, q_rest=None)
    else:
        case.update(q_draft=q.gather(-1, drafts[..., None]).squeeze(-1), q_first=q_first, pool_ids=pool_ids,
                    q_rest=q_rest)
    return case


def inverse_cdf_gap(case: dict, accepted: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Per request, how far (in units of the total mass, float64) u_final * total lies
    outside the CDF interval of `token` under the reference's weights: 0 for an exact
    inverse-CDF draw. Kernel and reference both sum in fp32 (in different orders), off by
    ~1e-7 of the total while a token at V=151936 holds ~1e-5 of it, so they may pick
    neighbouring tokens at a boundary: a rounding tie, a gap of that order; a wrong row
    or residual gives a far larger one."""
    p, q, drafts = case["p"], case["q"], case["drafts"]
    b, n = drafts.shape
    rows = torch.arange(b, device=p.device)
    p_next = p[rows, accepted]
    last = accepted.clamp_max(n - 1)
    if case["q_draft"] is None:
        q_next = torch.zeros_like(p_next).scatter_(1, drafts.gather(1, last[:, None]), 1.0)
    else:
        q_next = q[rows, last]
    q_next[accepted == n] = 0
    w = (p_next - q_next).clamp_min(0)
    w = torch.where(w.sum(-1, keepdim=True) > 0, w, p_next).double()
    cdf = w.cumsum(-1)
    total = cdf[:, -1]
    thr = case["u"].final.double() * total
    hi = cdf.gather(1, token[:, None]).squeeze(1)
    lo = hi - w.gather(1, token[:, None]).squeeze(1)
    return ((lo - thr).clamp_min(0) + (thr - hi).clamp_min(0)) / total


def check_chain_kernel(args, device: torch.device) -> int:
    """Section 1: equality against the reference per batch size and draft layout, then
    times (the reference gets the dense q, built outside the timing)."""
    if "triton" not in sys.modules and device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type == "cpu" and not interpreted:
        print("[kernel] chain_accept skipped: triton was imported without TRITON_INTERPRET=1 (no CPU backend)")
        return 0
    if device.type == "cuda" and interpreted:
        raise SystemExit("TRITON_INTERPRET=1 on a CUDA machine: unset it to time the compiled kernel")
    from sglang_domino.kernels.chain_accept import DEFAULT_BLOCK, accept_chain

    n, V, K = 15, (512 if args.small else 151936), (64 if args.small else 2048)
    block = 128 if args.small else DEFAULT_BLOCK
    gen = torch.Generator(device=device).manual_seed(0)
    note = " (interpreted, 1 repeat)" if interpreted else ""
    failures = 0

    def kernel(case, target, **kw):
        return accept_chain(case["drafts"], case["q_draft"], case["q_first"], case["pool_ids"], case["q_rest"],
                            target, case["u"], **kw)

    def reference(case):
        return accept_probs(case["drafts"], None if case["q_draft"] is None else case["q"], case["p"],
                            uniforms=case["u"])

    for bs in (1, 8) if args.small else (1, 8, 32, 64):
        for mode in ("pool", "dense", "point"):
            case = chain_case(bs, n, V, K, mode, device, gen)
            acc_k, nxt_k = kernel(case, case["p"].clone(), block=block)
            acc_r, nxt_r = reference(case)
            same_acc = torch.equal(acc_k, acc_r)
            exact = int((nxt_k == nxt_r).sum())
            gap = float(inverse_cdf_gap(case, acc_r, nxt_k).max()) if same_acc else float("inf")
            ok = same_acc and gap <= 1e-5
            failures += not ok
            # Timed on one scratch copy, clobbered again by every call: a rejected row
            # stays rejected (its p(d_j) is 0 after the first), so each call does the same work.
            scratch = case["p"].clone()
            ms_k, _ = timed(lambda: kernel(case, scratch, block=block), device, 1 if interpreted else args.repeats)
            ms_r, _ = timed(lambda: reference(case), device, args.repeats)
            layout = {"pool": f"pool K={K}", "dense": "no pool", "point": "point-mass"}[mode]
            print(f"[kernel] chain_accept {layout:<11} bs={bs:<3} n={n} V={V}  triton {ms_k:8.3f} ms{note}  "
                  f"torch {ms_r:8.3f} ms  accepted {int(acc_r.min())}..{int(acc_r.max())} "
                  f"(mean {acc_r.float().mean():.1f})  next exact {exact}/{bs}, max CDF gap {gap:.0e}  equal={ok}")
            del case, scratch
    if not args.small:
        for bs in (1, 64):
            case = chain_case(bs, n, V, K, "pool", device, gen)
            scratch = case["p"].clone()
            times = []
            for blk in (1024, 2048, 4096, 8192):
                for warps in (4, 8):
                    ms, _ = timed(lambda: kernel(case, scratch, block=blk, num_warps=warps), device, args.repeats)
                    times.append(f"{blk}/{warps}w {ms:.3f}")
            print(f"[kernel] chain_accept sweep pool bs={bs:<3} (block/num_warps ms): " + "  ".join(times))
            del case, scratch
    return failures


def timed(fn, device: torch.device, repeats: int) -> tuple[float, object]:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = fn()          # warm-up (Triton compile, cuBLAS heuristics)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    sync()
    return (time.perf_counter() - t0) / repeats * 1e3, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    sizes = SMALL if args.small else REAL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if not args.small and device.type != "cuda":
        raise SystemExit("no CUDA device: real sizes need a GPU (use --small for a CPU smoke run)")
    torch.manual_seed(0)
    cfg = draft_config(sizes)
    h, v, block = cfg.hidden_size, cfg.vocab_size, cfg.block_size
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), {dtype}, "
          f"H={h} V={v} layers={cfg.num_hidden_layers} block={block}")
    failures = 0

    # 1. The chain-accept Triton kernel against `accept_probs` (on the densified q).
    failures += check_chain_kernel(args, device)

    # 2-4. Draft model, proposals, accept rule.
    with torch.device(device):
        draft = DraftModel(cfg).to(dtype).eval()
        embed = torch.nn.Embedding(v, h).to(dtype)
        lm_head = torch.nn.Linear(h, v, bias=False).to(dtype)
    k = len(cfg.target_layer_ids)
    sampled = SamplingParams(temperature=1.0, top_p=0.95)
    with torch.inference_mode():
        for bs in (1, 8, 32):
            feats = torch.randn(bs, sizes["ctx"], k * h, device=device, dtype=dtype)
            ctx = draft.context_kv(feats, torch.arange(sizes["ctx"], device=device).expand(bs, -1))
            pos = torch.arange(sizes["ctx"], sizes["ctx"] + block, device=device).expand(bs, -1)
            masks = {"full_attention": torch.ones(bs, 1, block, sizes["ctx"] + block, dtype=torch.bool, device=device)}
            noise = embed(torch.full((bs, block), v - 1, device=device))
            ms, hidden = timed(lambda: draft(noise, pos, ctx, masks), device, args.repeats)
            print(f"[draft]  backbone bs={bs:<3} ctx={sizes['ctx']}  {ms:8.3f} ms")
            base = lm_head(hidden[:, :block - 1])
            bonus = torch.randint(0, v, (bs,), device=device)
            ms, _ = timed(lambda: propose_dflash(base, SamplingParams()), device, args.repeats)
            print(f"[rollout] dflash greedy bs={bs:<3}          {ms:8.3f} ms")
            for name, params in (("greedy", SamplingParams()), ("sampled", sampled)):
                ms, prop = timed(lambda: propose_domino(hidden[:, :block - 1], base, bonus, embed, draft, params), device,
                                 max(1, args.repeats // 4))
                print(f"[rollout] domino {name:<7} bs={bs:<3}      {ms:8.3f} ms")
            target_logits = torch.randn(bs, block, v, device=device, dtype=torch.float32)
            ms, (acc, nxt) = timed(lambda: accept_sampled(prop.tokens, prop.probs, target_logits, sampled), device,
                                   args.repeats)
            ok = bool(((acc >= 0) & (acc <= block - 1)).all()) and bool(((nxt >= 0) & (nxt < v)).all())
            failures += not ok
            print(f"[accept] sampled bs={bs:<3}             {ms:8.3f} ms  sane={ok}")
    print("PASS" if not failures else f"FAIL ({failures} checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
