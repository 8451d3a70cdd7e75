"""A byte-level BPE tokenizer trained offline on a generated arithmetic-and-words corpus."""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
#: ids 0, 1, 2: the BPE trainer places special tokens first, in this order
SPECIAL_TOKENS = (BOS, EOS, PAD)
#: Qwen2's pre-tokenizer split (words, single digits, punctuation runs, whitespace). transformers 5
#: rebuilds qwen2/qwen3 tokenizers around this split and NFC whatever tokenizer.json says, so
#: training with it makes every loader tokenize alike
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
#: the byte alphabet plus the special tokens: the smallest vocabulary byte-level BPE allows
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

_WORDS = (
    "the", "a", "an", "is", "of", "and", "or", "to", "in", "on", "it", "we", "you", "so",
    "what", "how", "many", "much", "each", "then", "first", "next", "last", "step", "answer",
    "number", "sum", "product", "difference", "total", "plus", "minus", "times", "divided",
    "by", "equals", "left", "has", "have", "gets", "buys", "sells", "gives", "apples", "books",
    "cats", "dogs", "coins", "cars", "trees", "red", "blue", "green", "small", "big", "old",
    "new", "Tom", "Ann", "Sam", "Mia", "therefore", "because", "check", "result", "true",
)  # fmt: skip
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _word(rng: random.Random) -> str:
    """A common word, or (one time in three) an invented one, which gives BPE merges to learn."""
    if rng.random() < 2 / 3:
        return rng.choice(_WORDS)
    return "".join(
        rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(1, 3))
    )


def corpus(n_lines: int) -> list[str]:
    """Deterministic training text: arithmetic with digits, symbols and spaces, and word salad.

    The generator is seeded by a constant, so every model shares one tokenizer per vocab size.
    """
    rng = random.Random(0)
    lines = []
    for i in range(n_lines):
        a, b = rng.randrange(10 ** rng.randint(1, 4)), rng.randrange(10 ** rng.randint(1, 3))
        op = rng.choice(tuple(_OPS))
        words = " ".join(_word(rng) for _ in range(rng.randint(3, 10)))
        if i % 3 == 0:
            lines.append(f"What is {a} {op} {b}? The answer is {_OPS[op](a, b)}.")
        elif i % 3 == 1:
            lines.append(f"Step {i // 3 % 9 + 1}: ({a}{op}{b}) = {_OPS[op](a, b)}, {words}.")
        else:
            lines.append(f"{words[0].upper()}{words[1:]} {a} {_word(rng)}!")
    return lines


def train_tokenizer(vocab: int, max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE of up to ``vocab`` tokens, ids 0–2 being bos, eos, pad."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_json(vocab)),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=max_length,
    )


@functools.cache
def _trained_json(vocab: int) -> str:
    """The trained tokenizer, serialised; it depends on ``vocab`` only, so train once each."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # two lines per token leaves merges to spare up to vocab 8192 at least
    tokenizer.train_from_iterator(corpus(2 * vocab), trainer=trainer)
    return tokenizer.to_str()


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """``save_pretrained``, naming the class ``PreTrainedTokenizerFast`` and no unk token.

    transformers 5 records its own class name, ``TokenizersBackend``, which transformers 4
    cannot load; both load ``PreTrainedTokenizerFast`` from the same ``tokenizer.json``.
    """
    tokenizer.save_pretrained(out_dir)
    config_file = out_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # Qwen2Tokenizer (what transformers 5 loads for qwen2/qwen3) otherwise adds an unk token
    config["unk_token"] = None
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
