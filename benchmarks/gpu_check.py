"""GPU check: what of this project runs on a single GPU without SGLang or network.

    python3 -m benchmarks.gpu_check            # real sizes (Qwen3-8B Domino draft), bf16, CUDA
    python3 -m benchmarks.gpu_check --small    # tiny sizes, any device (a smoke run on CPU)

Random weights (acceptance is meaningless); it checks that each piece runs at real size
and agrees with its reference, and prints timings:
  1. the Triton greedy-accept kernel against `accept_greedy` (equality, then time);
  2. the draft backbone: block of 16 over a cached context, batch 1 / 8 / 32;
  3. proposals at full vocabulary: DFlash argmax and the Domino rollout, greedy and sampled;
  4. the speculative-sampling accept rule at full vocabulary.
Needs torch, triton and pydantic (carry pydantic's wheels where it is missing). Meant
to finish well under 10 minutes on one H200.
"""

from __future__ import annotations

import argparse
import time

import torch

from sglang_domino.accept import accept_greedy, accept_sampled
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

    # 1. Triton kernel against its reference.
    from sglang_domino.kernels.accept import accept_greedy_tokens

    for bs in (1, 32):
        logits = torch.randn(bs, block, 64, device=device)
        target = logits.argmax(-1)
        drafts = target[:, :-1].clone()
        drafts[bs // 2:, 3] += 1
        ms_k, (acc_k, nxt_k) = timed(lambda: accept_greedy_tokens(drafts, target), device, args.repeats)
        ms_r, (acc_r, nxt_r) = timed(lambda: accept_greedy(drafts, logits), device, args.repeats)
        ok = torch.equal(acc_k, acc_r) and torch.equal(nxt_k, nxt_r)
        failures += not ok
        print(f"[kernel] accept_greedy bs={bs:<3} triton {ms_k:7.3f} ms  torch {ms_r:7.3f} ms  equal={ok}")

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
