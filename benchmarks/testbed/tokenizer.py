"""A byte-level BPE tokenizer trained on the training split, as a Transformers tokenizer.

The tokenizer has fewer tokens than the target's embedding has rows, so the last rows
are never produced by the tokenizer: the drafts use one of them as the mask token, the
way Qwen3 drafts use id 151669.
"""

from __future__ import annotations

from pathlib import Path

EOS = "<|endoftext|>"
IM_END = "<|im_end|>"
SPECIALS = [EOS, "<|im_start|>", IM_END]
# ChatML, as Qwen3 writes it (the codechat corpus is rendered the same way).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], vocab_size: int, max_length: int = 4096, eos: str = EOS):
    """`eos` is the token generation stops at: `<|im_end|>` for a chat corpus (as Qwen3's
    tokenizer has it), `<|endoftext|>` for plain text. Padding is always `<|endoftext|>`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=EOS, bos_token=None,
                                   unk_token=None, chat_template=CHAT_TEMPLATE, model_max_length=max_length)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
