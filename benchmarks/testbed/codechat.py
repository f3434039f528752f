"""A generated corpus: chat conversations in which a user asks for a small Python function
or class and an assistant answers with the code and a sentence about it.

Written by a program so that every machine has it with no download, and so that a model
of a few million parameters can learn it in an hour of two CPU cores, which the Python
standard library does not allow (the first test bed's target, trained on it, reached a
held-out perplexity of 186 and answered with loops and whitespace).

It has real structure and real branching:
- tasks compose (a filter, a transform and an aggregate over a list of numbers; string,
  dictionary and class tasks), so the answer depends on every part of the request;
- the assistant chooses freely between equivalent answers (a loop or a builtin, parameter
  and loop variable names, the opening and closing sentences), and each choice fixes what
  follows: a named loop variable recurs, the closing sentence describes the style chosen.
  Those choices are where temperature-1 samples differ and where a draft that predicts the
  positions of a block independently (DFlash) mixes two answers;
- a quarter of the conversations have a second turn that asks to rewrite the first answer
  (type hints, the other style), which is mostly copying from the context.

Held-out evaluation prompts are whole tasks the target never saw: a task is held out when
the hash of its signature (e.g. `sum/even/square`) falls in the held-out bucket.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass, field
from typing import Callable

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


@dataclass
class Answer:
    code: str
    style: str                     # "loop" or "builtin": the closing sentence depends on it
    notes: list[str] = field(default_factory=list)


@dataclass
class Task:
    signature: str                 # what the held-out split hashes
    name: str
    describe: str                  # "returns the sum of ..."
    instruct: str                  # "return the sum of ..."
    answers: dict[str, Callable[[str, str], Answer]]  # style -> (parameter, loop variable) -> Answer
    names: tuple = (["nums", "numbers", "values", "xs", "data"], ["n", "x", "v", "num", "value"])


def _sentence(phrase: str) -> str:
    return phrase[0].upper() + phrase[1:] + "."


# ----------------------------------------------------------------------------- numbers
FILTERS = {
    "all": (None, None),
    "even": ("even numbers", "{v} % 2 == 0"),
    "odd": ("odd numbers", "{v} % 2 == 1"),
    "positive": ("positive numbers", "{v} > 0"),
    "negative": ("negative numbers", "{v} < 0"),
    "nonzero": ("nonzero numbers", "{v} != 0"),
    "above": ("numbers greater than {k}", "{v} > {k}"),
    "below": ("numbers smaller than {k}", "{v} < {k}"),
    "multiple": ("multiples of {k}", "{v} % {k} == 0"),
}
TRANSFORMS = {
    "same": (None, "{v}"),
    "square": ("squares", "{v} * {v}"),
    "cube": ("cubes", "{v} ** 3"),
    "double": ("doubles", "2 * {v}"),
    "abs": ("absolute values", "abs({v})"),
}
AGGREGATES = {
    # name: (noun phrase, empty-result sentence)
    "sum": ("the sum of", "An empty selection gives 0."),
    "product": ("the product of", "An empty selection gives 1."),
    "count": ("how many", "It returns 0 when nothing matches."),
    "max": ("the largest of", "It returns None when nothing matches."),
    "min": ("the smallest of", "It returns None when nothing matches."),
    "list": ("a list of", "It returns an empty list when nothing matches."),
    "average": ("the average of", "It returns 0.0 when nothing matches, instead of dividing by zero."),
}


def _number_phrase(flt: str, tr: str, k: int) -> str:
    fnoun, _ = FILTERS[flt]
    tnoun, _ = TRANSFORMS[tr]
    base = fnoun.format(k=k) if fnoun else "numbers"
    return f"the {tnoun} of the {base}" if tnoun else f"the {base}"


def _number_task(agg: str, flt: str, tr: str, k: int) -> Task:
    what = _number_phrase(flt, tr, k)
    if agg == "count":
        describe, instruct = f"counts {what} in a list", f"count {what} in a list"
    else:
        noun = AGGREGATES[agg][0]
        describe, instruct = f"returns {noun} {what} in a list", f"return {noun} {what} in a list"
    parts = [agg] + ([flt] if flt != "all" else []) + ([tr] if tr != "same" and agg != "count" else [])
    fname = {"list": "_".join(parts[1:]) + "_list" if len(parts) > 1 else "copy_list"}.get(agg, "_".join(parts))
    if flt in ("above", "below", "multiple"):
        fname = fname.replace(flt, f"{flt}_{k}")
    _, cond_t = FILTERS[flt]
    _, expr_t = TRANSFORMS[tr]
    if agg == "count":
        expr_t = "{v}"

    def loop(param, v):
        cond = cond_t.format(v=v, k=k) if cond_t else None
        expr = expr_t.format(v=v)
        body = {
            "sum": ("total = 0", f"total += {expr}", "return total"),
            "product": ("result = 1", f"result *= {expr}", "return result"),
            "count": ("count = 0", "count += 1", "return count"),
            "list": ("result = []", f"result.append({expr})", "return result"),
            "max": ("best = None", None, "return best"),
            "min": ("best = None", None, "return best"),
            "average": ("total = 0\n    count = 0", f"total += {expr}\n{{ind}}count += 1",
                        "return total / count if count else 0.0"),
        }[agg]
        init, step, ret = body
        ind = "            " if cond else "        "
        if step is None:
            cmp = ">" if agg == "max" else "<"
            if expr == v:
                step = f"if best is None or {v} {cmp} best:\n{ind}    best = {v}"
            else:
                step = f"y = {expr}\n{ind}if best is None or y {cmp} best:\n{ind}    best = y"
        step = step.replace("{ind}", ind)
        lines = [f"def {fname}({param}):", f'    """{_sentence(instruct)}"""', f"    {init}",
                 f"    for {v} in {param}:"]
        if cond:
            lines.append(f"        if {cond}:")
        lines.append(ind + step)
        lines.append(f"    {ret}")
        return Answer("\n".join(lines), "loop", [AGGREGATES[agg][1]])

    def builtin(param, v):
        cond = cond_t.format(v=v, k=k) if cond_t else None
        expr = expr_t.format(v=v)
        gen = f"{expr} for {v} in {param}" + (f" if {cond}" if cond else "")
        head = [f"def {fname}({param}):", f'    """{_sentence(instruct)}"""']
        imports = ""
        if agg == "sum":
            body = [f"    return sum({gen})"]
        elif agg == "product":
            imports, body = "import math\n\n\n", [f"    return math.prod({gen})"]
        elif agg == "count":
            body = [f"    return sum(1 for {v} in {param}" + (f" if {cond})" if cond else ")")]
        elif agg == "list":
            body = [f"    return [{gen}]"]
        elif agg in ("max", "min"):
            body = [f"    return {agg}(({gen}), default=None)"]
        else:
            body = [f"    selected = [{gen}]", "    return sum(selected) / len(selected) if selected else 0.0"]
        return Answer(imports + "\n".join(head + body), "builtin", [AGGREGATES[agg][1]])

    sig = "/".join([agg, flt, tr if agg != "count" else "same"])
    return Task(sig, fname, describe, instruct, {"loop": loop, "builtin": builtin})


# ----------------------------------------------------------------------------- strings
@functools.cache
def _string_tasks() -> list[Task]:
    def t(sig, names, name, describe, instruct, loop, builtin, note):
        def mk(body, style):
            return lambda param, v: Answer(
                f'def {name}({param}):\n    """{_sentence(instruct)}"""\n' + body.format(p=param, v=v), style, [note])
        return Task(sig, name, describe, instruct, {"loop": mk(loop, "loop"), "builtin": mk(builtin, "builtin")}, names)

    return [
        t("str/vowels", CHAR_NAMES, "count_vowels", "counts the vowels in a string", "count the vowels in a string",
          "    count = 0\n    for {v} in {p}.lower():\n        if {v} in \"aeiou\":\n            count += 1\n    return count",
          "    return sum(1 for {v} in {p}.lower() if {v} in \"aeiou\")", "Upper-case vowels count too."),
        t("str/reverse_words", WORD_NAMES, "reverse_words", "reverses the order of the words in a sentence",
          "reverse the order of the words in a sentence",
          "    words = []\n    for {v} in {p}.split():\n        words.insert(0, {v})\n    return \" \".join(words)",
          "    return \" \".join(reversed({p}.split()))", "Runs of spaces collapse to one space."),
        t("str/title", WORD_NAMES, "capitalize_words", "capitalizes the first letter of every word",
          "capitalize the first letter of every word",
          "    words = []\n    for {v} in {p}.split():\n        words.append({v}[:1].upper() + {v}[1:])\n    return \" \".join(words)",
          "    return \" \".join({v}[:1].upper() + {v}[1:] for {v} in {p}.split())",
          "The rest of each word is left as it is."),
        t("str/palindrome", CHAR_NAMES, "is_palindrome", "checks whether a string reads the same backwards",
          "check whether a string reads the same backwards",
          "    chars = [{v}.lower() for {v} in {p} if {v}.isalnum()]\n    for i in range(len(chars) // 2):\n"
          "        if chars[i] != chars[-1 - i]:\n            return False\n    return True",
          "    chars = [{v}.lower() for {v} in {p} if {v}.isalnum()]\n    return chars == chars[::-1]",
          "Spaces, punctuation and case are ignored."),
        t("str/longest", WORD_NAMES, "longest_word", "returns the longest word in a sentence", "find the longest word in a sentence",
          "    best = \"\"\n    for {v} in {p}.split():\n        if len({v}) > len(best):\n            best = {v}\n    return best",
          "    return max({p}.split(), key=len, default=\"\")", "Ties go to the first longest word."),
        t("str/acronym", WORD_NAMES, "acronym", "builds an acronym from the first letters of the words",
          "build an acronym from the first letters of the words",
          "    letters = \"\"\n    for {v} in {p}.split():\n        letters += {v}[0].upper()\n    return letters",
          "    return \"\".join({v}[0].upper() for {v} in {p}.split())", "Empty input gives an empty string."),
        t("str/no_spaces", CHAR_NAMES, "remove_spaces", "removes every space from a string", "remove every space from a string",
          "    out = \"\"\n    for {v} in {p}:\n        if {v} != \" \":\n            out += {v}\n    return out",
          "    return {p}.replace(\" \", \"\")", "Tabs and newlines are kept."),
        t("str/word_count", WORD_NAMES, "count_words", "counts the words in a sentence", "count the words in a sentence",
          "    count = 0\n    for {v} in {p}.split():\n        count += 1\n    return count",
          "    return len({p}.split())", "Any run of whitespace separates two words."),
        t("str/char_freq", CHAR_NAMES, "char_frequencies", "counts how often each character occurs in a string",
          "count how often each character occurs in a string",
          "    counts = {{}}\n    for {v} in {p}:\n        counts[{v}] = counts.get({v}, 0) + 1\n    return counts",
          "    from collections import Counter\n\n    return dict(Counter({p}))", "The result maps each character to its count."),
        t("dict/invert", DICT_NAMES, "invert_dict", "swaps the keys and values of a dictionary", "swap the keys and values of a dictionary",
          "    result = {{}}\n    for key, {v} in {p}.items():\n        result[{v}] = key\n    return result",
          "    return {{{v}: key for key, {v} in {p}.items()}}", "If two keys share a value, the last one wins."),
        t("dict/max_key", DICT_NAMES, "key_of_max", "returns the key with the largest value in a dictionary",
          "find the key with the largest value in a dictionary",
          "    best = None\n    for key, {v} in {p}.items():\n        if best is None or {v} > {p}[best]:\n            best = key\n    return best",
          "    return max({p}, key={p}.get, default=None)", "An empty dictionary gives None."),
        t("dict/group_first", LIST_NAMES, "group_by_first_letter", "groups words by their first letter",
          "group words by their first letter",
          "    groups = {{}}\n    for {v} in {p}:\n        groups.setdefault({v}[0], []).append({v})\n    return groups",
          "    from collections import defaultdict\n\n    groups = defaultdict(list)\n    for {v} in {p}:\n"
          "        groups[{v}[0]].append({v})\n    return dict(groups)", "Words keep their original order inside each group."),
    ]


# (parameter names, loop variable names) a task's answer draws from
CHAR_NAMES = (["s", "text", "string", "line"], ["ch", "c", "char", "letter"])
WORD_NAMES = (["s", "text", "sentence", "line"], ["word", "w", "token", "part"])
DICT_NAMES = (["d", "mapping", "table", "scores"], ["value", "val", "v", "count"])
LIST_NAMES = (["words", "names", "items", "strings"], ["word", "w", "name", "item"])


# ----------------------------------------------------------------------------- classes
CLASSES = {
    "Stack": ("a stack", "self.items = []", {
        "push": ("push(self, item)", "Add item on top.", "self.items.append(item)"),
        "pop": ("pop(self)", "Remove and return the top item.", "return self.items.pop()"),
        "peek": ("peek(self)", "Return the top item without removing it.", "return self.items[-1]"),
        "is_empty": ("is_empty(self)", "Return True when the stack is empty.", "return not self.items"),
        "size": ("__len__(self)", "Return the number of items.", "return len(self.items)"),
    }),
    "Queue": ("a first-in first-out queue", "self.items = deque()", {
        "enqueue": ("enqueue(self, item)", "Add item at the back.", "self.items.append(item)"),
        "dequeue": ("dequeue(self)", "Remove and return the front item.", "return self.items.popleft()"),
        "peek": ("peek(self)", "Return the front item without removing it.", "return self.items[0]"),
        "is_empty": ("is_empty(self)", "Return True when the queue is empty.", "return not self.items"),
        "size": ("__len__(self)", "Return the number of items.", "return len(self.items)"),
    }),
    "Counter": ("a counter", "self.value = 0", {
        "increment": ("increment(self, step=1)", "Add step to the count.", "self.value += step"),
        "decrement": ("decrement(self, step=1)", "Subtract step from the count.", "self.value -= step"),
        "reset": ("reset(self)", "Set the count back to zero.", "self.value = 0"),
        "get": ("get(self)", "Return the current count.", "return self.value"),
    }),
    "BankAccount": ("a bank account", "self.balance = 0", {
        "deposit": ("deposit(self, amount)", "Add amount to the balance.", "self.balance += amount"),
        "withdraw": ("withdraw(self, amount)", "Take amount out if the balance allows it.",
                     "if amount > self.balance:\n            raise ValueError(\"insufficient funds\")\n"
                     "        self.balance -= amount"),
        "get_balance": ("get_balance(self)", "Return the current balance.", "return self.balance"),
    }),
}


def _class_task(cls: str, methods: tuple[str, ...]) -> Task:
    what, init, table = CLASSES[cls]
    listed = ", ".join(methods[:-1]) + " and " + methods[-1] if len(methods) > 1 else methods[0]
    word = "methods" if len(methods) > 1 else "method"
    describe = f"implements {what} with {listed} {word}"

    def answer(param, v):
        head = "from collections import deque\n\n\n" if cls == "Queue" else ""
        lines = [f"class {cls}:", f'    """{what[0].upper() + what[1:]}."""', "", "    def __init__(self):", f"        {init}"]
        for m in methods:
            sig, doc, body = table[m]
            lines += ["", f"    def {sig}:", f'        """{doc}"""', f"        {body}"]
        note = "Calling pop on an empty stack raises IndexError." if cls == "Stack" and "pop" in methods else \
            "Every method runs in constant time."
        return Answer(head + "\n".join(lines), "class", [note])

    return Task(f"class/{cls}/" + "+".join(methods), cls, describe, f"write a {cls} class with {listed} {word}",
                {"class": answer})


# ----------------------------------------------------------------------------- tasks
def all_task_kinds() -> list[tuple]:
    kinds: list[tuple] = []
    for agg in AGGREGATES:
        for flt in FILTERS:
            for tr in TRANSFORMS:
                if agg == "count" and tr != "same":
                    continue
                kinds.append(("num", agg, flt, tr))
    kinds += [("str", i) for i in range(len(_string_tasks()))]
    for cls, (_, _, table) in CLASSES.items():
        names = list(table)
        for mask in range(1, 2 ** len(names)):
            chosen = tuple(n for i, n in enumerate(names) if mask >> i & 1)
            if len(chosen) >= 2:
                kinds.append(("class", cls, chosen))
    return kinds


def make_task(kind: tuple, rng: random.Random) -> Task:
    if kind[0] == "num":
        return _number_task(kind[1], kind[2], kind[3], rng.choice([2, 3, 5, 10]))
    if kind[0] == "str":
        return _string_tasks()[kind[1]]
    return _class_task(kind[1], kind[2])


def signature(kind: tuple) -> str:
    if kind[0] == "num":
        return "/".join(kind[1:])
    if kind[0] == "str":
        return _string_tasks()[kind[1]].signature
    return f"class/{kind[1]}/" + "+".join(kind[2])


def is_held_out(signature: str, eval_every: int) -> bool:
    return int(hashlib.sha1(signature.encode()).hexdigest()[:8], 16) % eval_every == 0


# ----------------------------------------------------------------------------- conversations
REQUESTS = [
    "Write a Python function that {describe}.",
    "Write a function called {name} that {describe}.",
    "Can you write a function that {describe}?",
    "I need a Python function that {describe}.",
    "How do I {instruct} in Python?",
    "Please write {name}: it should {instruct}.",
]
CLASS_REQUESTS = [
    "Write a {name} class with {methods}.",
    "Can you write a Python class that {describe}?",
    "I need a class called {name} that {describe}.",
]
OPENERS = {
    "loop": ["Here is a version with a plain loop:", "A simple loop does it:", "Here is {name}, written with a loop:"],
    "builtin": ["Python's builtins make this short:", "Here is a compact version:", "Here is {name}, using a builtin:"],
    "class": ["Here is the class:", "Here is {name}:", "Sure, here is one way to write it:"],
}
CLOSERS = {
    "loop": ["The loop visits each item once, so it runs in linear time.",
             "Each item is looked at once, so the cost grows linearly with the input."],
    "builtin": ["The builtin does the looping in C, which is usually faster than a Python loop.",
                "It reads almost like the description itself."],
    "class": ["Each method is a thin wrapper over the underlying attribute.",
              "The state lives in a single attribute set up in __init__."],
}
FOLLOWUPS = {
    "hints": ["Can you add type hints?", "Please add type hints to it."],
    "other": ["Can you write it without a loop?", "Can you rewrite it with an explicit loop?"],
}


def _type_hints(code: str, kind: tuple) -> str:
    if kind[0] == "num":
        ret = {"list": "list[int]", "average": "float", "max": "int | None", "min": "int | None"}.get(kind[1], "int")
        arg = "list[int]"
    else:
        first = code.split("def ", 1)[1].split("(")[0]
        arg = "dict" if _string_tasks()[kind[1]].signature.startswith("dict") and first != "group_by_first_letter" \
            else ("list[str]" if first == "group_by_first_letter" else "str")
        ret = {"count_vowels": "int", "count_words": "int", "is_palindrome": "bool", "char_frequencies": "dict[str, int]",
               "invert_dict": "dict", "key_of_max": "object", "group_by_first_letter": "dict[str, list[str]]"}.get(first, "str")
    head, rest = code.split("):", 1)
    name, param = head.rsplit("(", 1)
    return f"{name}({param}: {arg}) -> {ret}:{rest}"


def _answer_text(opener: str, answer: Answer, closer: str) -> str:
    return f"{opener}\n\n```python\n{answer.code}\n```\n\n{' '.join(answer.notes)} {closer}"


def conversation(kind: tuple, rng: random.Random) -> list[dict]:
    """One conversation (a list of {role, content}) about `kind`, every free choice drawn from `rng`."""
    task = make_task(kind, rng)
    style = rng.choice(sorted(task.answers))
    if kind[0] == "class":
        listed = task.instruct.split(" with ", 1)[1]
        request = rng.choice(CLASS_REQUESTS).format(name=task.name, methods=listed, describe=task.describe)
        names = ("", "")
    else:
        request = rng.choice(REQUESTS).format(name=task.name, describe=task.describe, instruct=task.instruct)
        names = (rng.choice(task.names[0]), rng.choice(task.names[1]))
    answer = task.answers[style](*names)
    messages = [{"role": "user", "content": request},
                {"role": "assistant", "content": _answer_text(rng.choice(OPENERS[style]).format(name=task.name),
                                                             answer, rng.choice(CLOSERS[style]))}]
    if kind[0] != "class" and rng.random() < 0.25:
        if rng.random() < 0.5 or len(task.answers) < 2:
            messages += [{"role": "user", "content": rng.choice(FOLLOWUPS["hints"])},
                         {"role": "assistant", "content": "Here it is with type hints:\n\n```python\n"
                          + _type_hints(answer.code, kind) + "\n```"}]
        else:
            other = "builtin" if style == "loop" else "loop"
            second = task.answers[other](*names)
            ask = FOLLOWUPS["other"][0 if style == "loop" else 1]
            messages += [{"role": "user", "content": ask},
                         {"role": "assistant", "content": _answer_text(rng.choice(OPENERS[other]).format(name=task.name),
                                                                      second, rng.choice(CLOSERS[other]))}]
    return messages


def render(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """ChatML, as the test bed tokenizer's chat template writes it."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def conversations(count: int, seed: int, eval_every: int, held_out: bool) -> list[tuple[str, list[dict]]]:
    """`count` (task signature, conversation) pairs over the training tasks (or, with
    `held_out`, the held-out ones)."""
    rng = random.Random(seed)
    kinds = [k for k in all_task_kinds() if is_held_out(signature(k), eval_every) == held_out]
    # Number tasks are most of the kinds; weight the families so strings and classes are seen often.
    families = {f: [k for k in kinds if k[0] == f] for f in ("num", "str", "class")}
    weights = {"num": 0.6, "str": 0.25, "class": 0.15}
    names = [f for f in families if families[f]]
    out = []
    for _ in range(count):
        fam = rng.choices(names, [weights[f] for f in names])[0]
        kind = rng.choice(families[fam])
        out.append((signature(kind), conversation(kind, rng)))
    return out
