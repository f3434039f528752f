"""Demo: speculative decoding with a DFlash and a Domino draft, printing outputs and acceptance.

    python -m sglang_domino.demo [--target DIR --draft DIR [--draft DIR ...]] [--tokens N]

Without paths it runs the CPU test bed (benchmarks/build_testbed.sh) when its cache
holds a build, else the tiny random models the tests use: output is then the target's
own (lossless) but acceptance is ~1, since random drafts predict nothing.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def _testbed():
    """(target, [dflash, domino]) of a complete test bed build, or None."""
    try:
        from benchmarks.testbed.load import find
    except ImportError:  # installed without the repository's benchmarks/
        return None
    path = find("full")
    return (str(path / "target"), [str(path / "dflash"), str(path / "domino")]) if path else None


def _load(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import DFlashDraftModel
    from .testing import tiny_draft, tiny_target

    if not args.target and _testbed():
        args.target, args.draft = _testbed()
        print(f"using the CPU test bed: {os.path.dirname(args.target)}")
        if not args.user_prompts:
            from benchmarks.tasks import load_prompts

            args.prompt = load_prompts("heldout", len(args.prompt))   # text like the target's training data
    if args.target:
        target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.target)
        drafts = {path: DFlashDraftModel.from_pretrained(path, dtype=torch.float32) for path in args.draft}
        prompts = [tokenizer(p, return_tensors="pt").input_ids for p in args.prompt]
        return target, drafts, prompts, tokenizer.decode
    target = tiny_target()
    drafts = {"tiny DFlash (random)": tiny_draft(target, "dflash", block_size=16),
              "tiny Domino (random)": tiny_draft(target, "domino", block_size=16)}
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (1, 12), generator=g) for _ in args.prompt]
    return target, drafts, prompts, lambda ids: " ".join(map(str, ids))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="Transformers causal LM directory (with tokenizer)")
    parser.add_argument("--draft", action="append", default=[], help="draft checkpoint directory (repeatable)")
    parser.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    parser.add_argument("--tokens", type=int, default=64, help="max new tokens")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (2 are faster only on idle cores)")
    args = parser.parse_args(argv)
    if bool(args.target) != bool(args.draft):
        parser.error("--target and --draft go together")
    args.user_prompts = bool(args.prompt)
    args.prompt = args.prompt or [
        "import os\nimport sys\n\n\ndef main(argv=None):\n    \"\"\"Parse the command line and run.\"\"\"\n    if argv is None:\n",
        "class Queue:\n    \"\"\"A first-in first-out queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n        self.maxsize = maxsize\n",
    ]
    torch.set_num_threads(args.threads)
    target, drafts, prompts, decode = _load(args)
    with torch.inference_mode():
        for ids in prompts:
            t0 = time.perf_counter()
            ref = target.generate(ids, max_new_tokens=args.tokens, do_sample=False)
            base_tps = args.tokens / (time.perf_counter() - t0)
            print("=" * 72)
            print(f"prompt: {decode(ids[0].tolist())!r}")
            print(f"target only: {base_tps:7.1f} tok/s")
            for name, draft in drafts.items():
                out, stats = draft.spec_generate(input_ids=ids, target=target, max_new_tokens=args.tokens,
                                                 temperature=args.temperature, return_stats=True)
                new = out[0, ids.shape[1]:].tolist()
                same = "identical to target" if args.temperature == 0 and torch.equal(out, ref) else ""
                print(f"{name}: {stats.new_tokens / stats.total_time:7.1f} tok/s, "
                      f"mean accept length {stats.mean_accept_length:.2f} over {stats.num_verify_steps} steps {same}")
                print(f"  accept lengths: {stats.accept_lengths}")
                print(f"  output: {decode(new)!r}")


if __name__ == "__main__":
    main()
