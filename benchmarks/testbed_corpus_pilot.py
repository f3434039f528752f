"""Which corpus for the test bed: the same target trained for the same budget on each,
then measured on held-out text.

    python benchmarks/testbed_corpus_pilot.py [--steps 600] [--out benchmarks/results/testbed-corpus-pilot.json]

Both targets have the `full` preset's architecture (the stdlib one with a 4096-token
vocabulary, as the stdlib test bed had) and are trained for `--steps` steps of 16 x 256
tokens on one thread. Per corpus: held-out perplexity and bits per byte (comparable
across tokenizers), and on 16 held-out prompts the target's greedy continuations: the
mean probability of the greedy token along them (what the point-mass rule accepts a
perfect draft with at temperature 1), the share of repeated lines, and whitespace-only
outputs. Builds go to a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from benchmarks.testbed import corpus  # noqa: E402
from benchmarks.testbed.build import build  # noqa: E402
from benchmarks.testbed.spec import PRESETS  # noqa: E402


@torch.no_grad()
def measure(name: str, steps: int, root: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = PRESETS["full"]
    target = base.target.model_copy(update=dict(steps=steps, warmup_steps=50))
    if name == "stdlib":
        target = target.model_copy(update=dict(vocab_size=4096, tokenizer_vocab=4093))
    spec = base.model_copy(update=dict(corpus=name, target=target))
    out = build("pilot-" + name, root=root, until="target", threads=1, spec=spec)
    model = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out / "target")
    max_p, repeated, texts = [], [], []
    for row in corpus.prompts(spec, tok, held_out=True, count=16, seed=3):
        ids = torch.tensor([row["prompt_ids"]])
        gen = model.generate(ids, max_new_tokens=96, do_sample=False, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        text = tok.decode(gen.sequences[0, ids.shape[1]:], skip_special_tokens=True)
        lines = [line for line in text.split("\n") if line.strip()]
        repeated.append(1 - len(set(lines)) / max(len(lines), 1))
        probs = [torch.softmax(s[0].float(), -1).max().item() for s in gen.scores]
        max_p.append(sum(probs) / len(probs))
        texts.append(text)
    stage = json.loads((out / "manifest.json").read_text())["stages"]["target"]
    return {"corpus": name, "steps": steps, "train_tokens": stage["train_tokens"], "train_seconds": stage["train_seconds"],
            "heldout_perplexity": stage["heldout_perplexity"], "heldout_bits_per_byte": stage["heldout_bits_per_byte"],
            "mean_greedy_token_probability": round(sum(max_p) / len(max_p), 4),
            "repeated_line_share": round(sum(repeated) / len(repeated), 4),
            "whitespace_only_outputs": sum(not t.strip() for t in texts), "first_output": texts[0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--corpus", action="append", choices=["stdlib", "codechat"], default=None)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "testbed-corpus-pilot.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(name, args.steps, Path(tmp)) for name in args.corpus or ["stdlib", "codechat"]]
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "first_output"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
