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
  4. the speculative-sampling accept rule at full vocabulary;
  5. the plugin's per-step draft tails in CUDA graphs, batch 1 / 8 / 32, n=15, pool K=2048:
     the Domino rollout the q rule's draft graph holds (`sampled_rollout.q_rollout`), with
     every row greedy and with Qwen3's T 0.6 / top-k 20 / top-p 0.95 (`DraftQ`),
     over a block's hidden states; the server's sampler around it (`QRuleDraftSampler`:
     staged rows, coins drawn in the graph, static outputs; compared with `q_rollout` on
     the coins its replay drew); and the chain-accept kernel on the pool
     layout. Each is captured (`torch.cuda.graph`, after a warm-up on a side stream: a
     host sync inside raises), its static inputs refilled with a fresh case, replayed and
     compared with an eager call on the same inputs (tokens exactly, q allclose); one eager
     call runs under `torch.cuda.set_sync_debug_mode("error")` (the op that syncs is
     named); then the median replay and eager times. Randomness: the proposals' coins are
     pre-drawn uniforms in a static buffer (refilled before a replay, as a server stages
     its inputs), so a replay draws exactly what the eager call does; the graph holds no
     RNG op. On CPU there are no graphs: the stand-in calls the function again on the
     same static buffers ("(CPU: no graph captured)"), and no sync check runs.
  6. no compile after the start-up warm-up: the chain-accept variants the warm-up builds
     (`warmup._warm_chain_accept`, one request per width) against the served layouts at
     batch 1 / 2 / 8 / 32 (views of the step's buffers, misaligned at batch 1), counted
     from the kernel's own variant table; a twin that specialises the scalar pointers on
     alignment shows the batch-1 compile the kernel used to make (issue 45).
Needs torch, triton and pydantic (carry pydantic's wheels where it is missing); never
imports sglang. Estimate on one H200 (not yet measured): sections 1-4 about 2 minutes
(Triton compiles, 9 sweep variants, CUDA init and ~2.5 GB of random weights), section 5
under a minute (12 captures, 2 x 20 timed calls each: the eager sampled rollout is ~600
launches, ~5-10 ms); with Python start-up well under 4 minutes in all, inside the lent
8. On CPU (--small; section 1 at V=512, K=64, batch 1 / 8) the kernel runs under
TRITON_INTERPRET=1 (set here when triton is not imported yet; its times mean nothing).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_domino.accept import Uniforms, accept_probs, accept_sampled
from sglang_domino.config import DraftConfig
from sglang_domino.model import DraftModel
from sglang_domino.rollout import propose_dflash, propose_domino
from sglang_domino.sampling import SamplingParams
# imports nothing from sglang (its seeded-coin hash is lazy, and the check seeds no row)
from sglang_domino.sglang.sampling.q_sampler import QRuleDraftSampler
from sglang_domino.sglang.sampling.sampled_rollout import DraftParams, q_rollout

# Qwen3-8B Domino b16 (algorithm reference, section 1.1 / 2.2).
REAL = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=5, num_attention_heads=32,
            num_key_value_heads=8, head_dim=128, vocab_size=151936, num_target_layers=36, gru=1024, emb=256, ctx=1024,
            pool=2048)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=512, num_target_layers=4, gru=32, emb=16, ctx=64, pool=64)


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


def kernel_runnable(device: torch.device) -> tuple[bool, bool, str]:
    """(runnable, interpreted, why not). Triton has no CPU backend: on CPU the kernel runs
    under TRITON_INTERPRET=1, set here when triton is not imported yet."""
    if "triton" not in sys.modules and device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type == "cpu" and not interpreted:
        return False, False, "triton was imported without TRITON_INTERPRET=1 (no CPU backend)"
    if device.type == "cuda" and interpreted:
        raise SystemExit("TRITON_INTERPRET=1 on a CUDA machine: unset it to time the compiled kernel")
    return True, interpreted, ""


def check_chain_kernel(args, device: torch.device) -> int:
    """Section 1: equality against the reference per batch size and draft layout, then
    times (the reference gets the dense q, built outside the timing)."""
    runnable, interpreted, why = kernel_runnable(device)
    if not runnable:
        print(f"[kernel] chain_accept skipped: {why}")
        return 0
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


def build_modules(cfg: DraftConfig, device: torch.device, dtype: torch.dtype, pool_size: int) -> "DraftModules":
    with torch.device(device):
        draft = DraftModel(cfg).to(dtype).eval()
        embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size).to(dtype)
        lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False).to(dtype)
    return DraftModules(draft, embed, lm_head, pool_size)


def check_draft_path(args, sizes: dict, cfg: DraftConfig, mods: "DraftModules", device: torch.device,
                     dtype: torch.dtype) -> int:
    """Sections 2-4: backbone, proposals and the sampled accept rule, timed; the accept
    rule's results range-checked."""
    draft, embed, lm_head = mods.draft, mods.embed, mods.lm_head
    h, v, block = cfg.hidden_size, cfg.vocab_size, cfg.block_size
    k = len(cfg.target_layer_ids)
    sampled = SamplingParams(temperature=1.0, top_p=0.95)
    failures = 0
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
    return failures


# -- 5. The plugin's per-step draft tails in CUDA graphs ----------------------------------

# Qwen3's generation_config, the default of every request that sets nothing (SGLang's
# `--sampling-defaults model`): the sampled tail's q is drawn under it.
QWEN3_SAMPLING = SamplingParams(temperature=0.6, top_p=0.95, top_k=20)
NOT_CHECKED = "not checked (CPU)"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class DraftModules:
    """The draft (its Domino head: `prefix_gru`, `embed_proj`), the target's embedding and
    lm_head, and the candidate pool size the plugin's rollouts use (upstream's default 2048)."""
    draft: DraftModel
    embed: torch.nn.Embedding
    lm_head: torch.nn.Linear
    pool_size: int

    @property
    def vocab(self) -> int:
        return self.lm_head.weight.shape[0]


def rollout_args(mods: DraftModules) -> dict:
    """`q_rollout`'s module arguments (upstream's `domino_greedy_rollout` keywords) over
    the check's modules: shifted labels, one rank."""
    return dict(target_embedding=mods.embed, lm_head_weight=mods.lm_head.weight, prefix_gru=mods.draft.prefix_gru,
                embed_proj=mods.draft.embed_proj, vocab_size=mods.vocab, shift_label=True,
                candidate_pool_size=mods.pool_size)


def staged_params(bs: int, device: torch.device, params: Optional[SamplingParams]) -> DraftParams:
    """Every row under `params` (Qwen3's defaults for the sampled tail), or greedy (None)."""
    rows = DraftParams.empty(bs, device)
    if params is not None:
        rows.temperature.fill_(params.temperature)
        rows.top_k.fill_(params.top_k)
        rows.top_p.fill_(params.top_p)
        rows.greedy.fill_(False)
    return rows


def q_tail(mods: DraftModules, hidden: torch.Tensor, bonus: torch.Tensor, coins: torch.Tensor,
           params: DraftParams) -> tuple[torch.Tensor, ...]:
    """The plugin's per-step Domino tail, `sampled_rollout.q_rollout`, which the q rule's
    draft graph holds (`q_sampler.QRuleDraftSampler`) over a block's hidden states [bs, B, H]
    with the coins [bs, n] given (a static buffer, so a replay draws what the eager call
    draws; the server's sampler draws them in the graph). Greedy rows propose upstream's
    `domino_greedy_rollout` token for token (tests/sglang/test_sampled_rollout_injected.py).
    Returns tokens [bs, n], q at them [bs, n], q_0 [bs, V] and q on the pool [bs, n-1, K]."""
    d = q_rollout(params, coins, draft_hidden=hidden, bonus_tokens=bonus, **rollout_args(mods))
    return d.tokens, d.q_draft, d.q_first, d.q_rest


def greedy_rollout(mods: DraftModules, hidden: torch.Tensor, bonus: torch.Tensor) -> tuple[torch.Tensor]:
    """`q_tail` with every row greedy (its coins are not read)."""
    n = hidden.shape[1] - 1
    coins = torch.zeros(hidden.shape[0], n, device=hidden.device)
    return q_tail(mods, hidden, bonus, coins, staged_params(hidden.shape[0], hidden.device, None))[:1]


@dataclass
class Tail:
    """One per-step tail: `run()` reads only the static `inputs` and returns its outputs;
    `draw()` gives a fresh case of the same shapes, copied in before a replay."""
    name: str
    run: Callable[[], tuple]
    inputs: dict
    draw: Callable[[], dict]
    outputs: tuple[str, ...]           # the names of what `run` returns
    # what the replay is compared with (default: an eager `run()` on the same inputs)
    reference: Optional[Callable[[], tuple]] = None


def rollout_case(mods: DraftModules, bs: int, gen: torch.Generator) -> dict:
    """A block's hidden states, the bonus token and the proposals' coins (pre-drawn
    uniforms: capture-safe, and the replay uses exactly the eager call's)."""
    device, dtype = mods.lm_head.weight.device, mods.lm_head.weight.dtype
    block, n = mods.draft.config.block_size, mods.draft.config.block_size - 1
    hidden = torch.randn(bs, block, mods.lm_head.weight.shape[1], generator=gen, device=device).to(dtype)
    return dict(hidden=hidden, bonus=torch.randint(0, mods.vocab, (bs,), generator=gen, device=device),
                coins=torch.rand(bs, n, generator=gen, device=device))


def greedy_tail(mods: DraftModules, bs: int, gen: torch.Generator) -> Tail:
    inputs = rollout_case(mods, bs, gen)
    return Tail("domino greedy", lambda: greedy_rollout(mods, inputs["hidden"], inputs["bonus"]), inputs,
                lambda: rollout_case(mods, bs, gen), ("tokens",))


def sampled_tail(mods: DraftModules, bs: int, gen: torch.Generator,
                 params: SamplingParams = QWEN3_SAMPLING) -> Tail:
    inputs = rollout_case(mods, bs, gen)
    staged = staged_params(bs, mods.lm_head.weight.device, params)
    return Tail("domino sampled", lambda: q_tail(mods, inputs["hidden"], inputs["bonus"], inputs["coins"], staged),
                inputs, lambda: rollout_case(mods, bs, gen), ("tokens", "q_draft", "q_first", "q_rest"))


def sampler_tail(mods: DraftModules, bs: int, gen: torch.Generator,
                 params: SamplingParams = QWEN3_SAMPLING) -> Tail:
    """The server's own tail, `q_sampler.QRuleDraftSampler`: its parameters staged into its
    static rows, its coins drawn in the graph (`uniform_` on its static buffer), its outputs
    in static buffers. A replay is compared with `q_rollout` on the coins the replay drew."""
    device = mods.lm_head.weight.device
    inputs = rollout_case(mods, bs, gen)
    block = mods.draft.config.block_size
    sampler = QRuleDraftSampler(block_size=block, max_bs=bs, hashed_coins=False, **rollout_args(mods))
    for row, value in zip(sampler.params.rows(bs), staged_params(bs, device, params)):
        row.copy_(value)
    ids = torch.zeros(bs, block, dtype=torch.int64, device=device)

    def run() -> tuple:
        ids[:, 0].copy_(inputs["bonus"])
        sampler(inputs["hidden"].reshape(bs * block, -1), ids.reshape(-1))
        d = sampler.read(bs, block)
        return d.tokens, d.q_draft, d.q_first, d.q_rest

    def reference() -> tuple:
        d = q_rollout(sampler.params.rows(bs), sampler.uniforms[:bs].clone(), draft_hidden=inputs["hidden"],
                      bonus_tokens=inputs["bonus"], **rollout_args(mods))
        return d.tokens, d.q_draft, d.q_first, d.q_rest

    return Tail("q-rule sampler", run, inputs, lambda: rollout_case(mods, bs, gen),
                ("tokens", "q_draft", "q_first", "q_rest"), reference)


def chain_tail(bs: int, n: int, V: int, K: int, block: int, device: torch.device, gen: torch.Generator) -> Tail:
    """The chain-accept kernel on the sparse q (pool layout). It clobbers its target probs,
    so each call copies p into a scratch first (in the graph too: both timings include
    that copy)."""
    from sglang_domino.kernels.chain_accept import accept_chain

    def draw() -> dict:
        c = chain_case(bs, n, V, K, "pool", device, gen)
        return dict(drafts=c["drafts"], q_draft=c["q_draft"], q_first=c["q_first"], pool_ids=c["pool_ids"],
                    q_rest=c["q_rest"], p=c["p"], u_steps=c["u"].steps.contiguous(), u_final=c["u"].final.contiguous())

    inputs = draw()

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        i = inputs
        return accept_chain(i["drafts"], i["q_draft"], i["q_first"], i["pool_ids"], i["q_rest"], i["p"].clone(),
                            Uniforms(i["u_steps"], i["u_final"]), block=block)

    return Tail(f"chain_accept K={K}", run, inputs, draw, ("accepted", "next"))


def warm_up(fn: Callable[[], tuple]) -> None:
    """Eager calls on a side stream before capture (Triton compiles, cuBLAS handles, the
    allocator's pools), as `torch.cuda.graph` asks."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn: Callable[[], tuple], device: torch.device) -> tuple[Callable[[], None], Callable[[], tuple]]:
    """(replay, outputs). CUDA: one call of `fn` captured in a graph (a host sync inside
    raises here) and its static outputs. CPU, where there are no graphs: the stand-in,
    whose replay calls `fn` again on the same static buffers."""
    if device.type != "cuda":
        held = [fn()]

        def rerun() -> None:
            held[0] = fn()
        return rerun, lambda: held[0]
    warm_up(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, lambda: out


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def sync_point(exc: BaseException) -> str:
    """Where a host sync was raised: the innermost traceback frame in this repository."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(REPO_ROOT) and "/.venv/" not in f.filename] or frames
    f = ours[-1]
    return f"{os.path.relpath(f.filename, REPO_ROOT)}:{f.lineno} `{(f.line or '').strip()}`"


def check_sync_free(fn: Callable[[], tuple], device: torch.device) -> str:
    """One eager call under `torch.cuda.set_sync_debug_mode("error")`, which raises at any
    op that waits for the device: 'none' or where it raised."""
    if device.type != "cuda":
        return NOT_CHECKED
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        return f"RAISED at {sync_point(exc)}: {first_line(exc)}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return "none"


def refill(tail: Tail) -> None:
    for name, fresh in tail.draw().items():
        tail.inputs[name].copy_(fresh)


def compare(replayed: tuple, eager: tuple, names: tuple[str, ...]) -> tuple[bool, str]:
    """Integer outputs (tokens, acceptance) exactly, probabilities allclose; names the
    outputs that differ."""
    differ, worst = [], 0.0
    for name, a, b in zip(names, replayed, eager):
        if a.dtype.is_floating_point:
            gap = float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
            worst = max(worst, gap)
            if not torch.allclose(a, b, rtol=1e-4, atol=1e-6):
                differ.append(f"{name} (max|diff| {gap:.0e})")
        elif not torch.equal(a, b):
            differ.append(f"{name} ({int((a != b).sum())} of {a.numel()})")
    if differ:
        return False, "DIFFER: " + ", ".join(differ)
    probs = f", q max|diff| {worst:.0e}" if any(t.dtype.is_floating_point for t in eager) else ""
    return True, f"{'/'.join(n for n, t in zip(names, eager) if not t.dtype.is_floating_point)} equal{probs}"


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of one call, the device drained before and after (an eager tail
    is launch bound: its host time is the point)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(max(1, repeats)):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def check_tail(tail: Tail, bs: int, device: torch.device, repeats: int) -> bool:
    """Capture, refill the static inputs, replay, then the eager call on the same inputs:
    equal outputs; the eager call's host syncs; graph replay against eager time."""
    label = f"[graph] {tail.name:<19} bs={bs:<3}"
    try:
        replay, outputs = capture(tail.run, device)
    except Exception as exc:  # reported, counted, and the next tail still runs
        print(f"{label} capture FAILED at {sync_point(exc)}: {first_line(exc)}")
        return False
    sync = check_sync_free(tail.run, device)
    refill(tail)
    replay()
    replayed = tuple(t.clone() for t in outputs())
    ok, detail = compare(replayed, (tail.reference or tail.run)(), tail.outputs)
    ok &= sync in ("none", NOT_CHECKED)
    ms_graph = median_ms(replay, device, repeats)
    ms_eager = median_ms(tail.run, device, repeats)
    if device.type == "cuda":
        mode, speedup = "captured", f"  (eager/replay {ms_eager / max(ms_graph, 1e-9):.1f}x)"
    else:
        mode, speedup = "(CPU: no graph captured)", ""
    print(f"{label} {mode}  replay==eager: {detail}  host syncs: {sync}  "
          f"replay {ms_graph:8.3f} ms  eager {ms_eager:8.3f} ms{speedup}  ok={ok}")
    return ok


def check_graph_tails(args, mods: DraftModules, device: torch.device) -> int:
    """Section 5: the greedy rollout, the sampled (q rule) rollout and the chain-accept
    kernel, each captured at batch 1 / 8 / 32 (on CPU the stand-in)."""
    kernel_ok, interpreted, why = kernel_runnable(device)
    if kernel_ok:
        from sglang_domino.kernels.chain_accept import DEFAULT_BLOCK

        block = 128 if interpreted else DEFAULT_BLOCK      # section 1's tiles
    n, V, K = mods.draft.config.block_size - 1, mods.vocab, mods.pool_size
    gen = torch.Generator(device=device).manual_seed(5)
    where = ("CUDA graphs" if device.type == "cuda"
             else "(CPU: no graph captured; the replay stand-in calls the function again on the same buffers)")
    print(f"[graph] per-step draft tails in {where}; n={n} V={V} pool K={K}, sampled under "
          f"T={QWEN3_SAMPLING.temperature} top-k={QWEN3_SAMPLING.top_k} top-p={QWEN3_SAMPLING.top_p}, "
          f"coins pre-drawn into a static buffer")
    failures = 0
    for bs in (1, 8, 32):
        tails = [greedy_tail(mods, bs, gen), sampled_tail(mods, bs, gen), sampler_tail(mods, bs, gen)]
        # interpreted, each request's program runs in Python: stop at 8 as section 1 does
        if kernel_ok and not (interpreted and bs > 8):
            tails.append(chain_tail(bs, n, V, K, block, device, gen))
        elif not kernel_ok and bs == 1:
            print(f"[graph] chain_accept skipped: {why}")
        for tail in tails:
            failures += not check_tail(tail, bs, device, args.repeats)
        del tails
    return failures


def compiled_variants(kernel) -> int:
    """How many compiled variants a Triton kernel holds, over its devices (its per-device
    cache's first entry is the variant table in the Triton releases we meet)."""
    caches = getattr(kernel, "device_caches", {})
    return sum(len(entry[0]) for entry in caches.values())


def served_accept(b: int, n: int, V: int, K: int, device: torch.device, kernel=None) -> None:
    """One q-rule accept laid out as the served step lays it: the drafts a view of the
    candidates (`candidates[:, 1:]`), q_k(d_k) a view of the block's q, the coins two views
    of one draw (`u[:, :n]`, `u[:, n]`); at batch 1 those views are not 16-byte aligned."""
    from sglang_domino.kernels import chain_accept as ca

    candidates = torch.randint(0, V, (b, n + 1), device=device)
    q = torch.rand(b, n + 1, device=device)
    u = torch.rand(b, n + 1, device=device)
    pool = torch.stack([torch.randperm(V, device=device)[:K] for _ in range(b)])
    real = ca._chain_accept_kernel
    if kernel is not None:
        ca._chain_accept_kernel = kernel
    try:
        ca.accept_chain(candidates[:, 1:], q[:, 1:], torch.rand(b, V, device=device), pool,
                        torch.rand(b, n - 1, K, device=device), torch.rand(b, n + 1, V, device=device),
                        Uniforms(u[:, :n], u[:, n]))
    finally:
        ca._chain_accept_kernel = real


def check_no_compile_after_warm_up(args, device: torch.device) -> int:
    """6. The start-up warm-up (`warmup._warm_chain_accept`, fresh tensors, one request per
    width) builds every chain-accept variant the served step launches: served layouts at
    batch 1 / 2 / 8 / 32 and every width compile nothing new. Also shown: a twin kernel that
    specialises the scalar pointers on alignment (as the kernel did before issue 45) would
    compile at batch 1."""
    import triton

    from sglang_domino.kernels import chain_accept as ca
    from sglang_domino.sglang.step.warmup import _warm_chain_accept

    if device.type != "cuda":
        print("[compile] skipped (no CUDA: the interpreter compiles nothing)")
        return 0
    V, K = (512, 64) if args.small else (151936, 2048)
    widths = (16, 8, 4, 2)
    kernel = ca._chain_accept_kernel
    tic = time.perf_counter()
    for w in widths:
        _warm_chain_accept(w - 1, V, K, device)
    torch.cuda.synchronize()
    warmed = compiled_variants(kernel)
    print(f"[compile] warm-up: {warmed} chain-accept variant(s) over widths {widths} "
          f"in {time.perf_counter() - tic:.1f} s")
    for b in (1, 2, 8, 32):
        for w in widths:
            served_accept(b, w - 1, V, K, device)
    torch.cuda.synchronize()
    new = compiled_variants(kernel) - warmed
    print(f"[compile] served layouts at batch 1/2/8/32 x widths {widths}: {new} new variant(s)  ok={new == 0}")
    twin = triton.jit(kernel.fn, do_not_specialize=ca.NO_VALUE_SPECIALIZATION)
    for b in (8, 1):
        served_accept(b, 15, V, K, device, kernel=twin)
    torch.cuda.synchronize()
    print(f"[compile] a twin specialising the scalar pointers on alignment: {compiled_variants(twin)} variant(s) "
          f"for batch 8 then batch 1 (2 = batch 1 compiled its own)")
    return int(new != 0)


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
    print(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), {dtype}, "
          f"H={cfg.hidden_size} V={cfg.vocab_size} layers={cfg.num_hidden_layers} block={cfg.block_size}")
    failures = 0

    # 1. The chain-accept Triton kernel against `accept_probs` (on the densified q).
    failures += check_chain_kernel(args, device)

    mods = build_modules(cfg, device, dtype, sizes["pool"])
    with torch.inference_mode():
        # 2-4. Draft model, proposals, accept rule.
        failures += check_draft_path(args, sizes, cfg, mods, device, dtype)
        # 5. The plugin's per-step tails, captured and replayed.
        failures += check_graph_tails(args, mods, device)
    # 6. No chain-accept variant compiled after the start-up warm-up.
    failures += check_no_compile_after_warm_up(args, device)
    print("PASS" if not failures else f"FAIL ({failures} checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
