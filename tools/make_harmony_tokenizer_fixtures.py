#!/usr/bin/env python3
"""An o200k-style tokenizer with harmony's special tokens, and HF tokenizers' ids for it (the oracle of
tests/llm/test_tokenizer.cpp, case "o200k-harmony").

Run: /work/venv/bin/python tools/make_harmony_tokenizer_fixtures.py

gpt-oss ships o200k_harmony (tiktoken's o200k_base plus harmony's special tokens) as a tokenizer.json whose
pipeline is Split(o200k's regex, Isolated) + ByteLevel(use_regex false), a ByteLevel decoder and a BPE with
ignore_merges. Its 200k-entry vocabulary cannot be fetched here (no network) and would not be small, so this
trains a 1500-token BPE with that exact pipeline on tests/data/tokenizer/corpus.jsonl and harmony prompts, adds
the special tokens gpt-oss's tokenizer.json lists (<|start|>, <|end|>, <|message|>, <|channel|>,
<|constrain|>, <|return|>, <|call|>, …, all special), and records HF's ids and decodes for the corpus's fixed strings, 300 sampled ones and
for harmony-formatted texts. What the regex splits (case-sensitive letter classes, contractions attached to
words, 1-3 digit numbers, punctuation runs with trailing newlines or slashes) is what the test exercises.
Writes tests/data/tokenizer/o200k-harmony/{tokenizer.json,cases.jsonl,meta.json}.
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_fixtures import (ACCENTED, CJK, CODE, CONTRACTIONS, DECOMPOSED, EMOJI, FLAG_TEXTS,  # noqa: E402
                                     INVALID_UTF8, NUMBERS, OUT, SCRIPTS, SPECIAL_TEXTS, WHITESPACE, WORDS,
                                     random_id_lists, write_cases)

# tiktoken's o200k_base pat_str, as gpt-oss's tokenizer.json carries it.
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
# gpt-oss's special tokens in id order (199998 and up in the real vocabulary; reserved ones left out).
HARMONY_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                    "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"]
HARMONY_TEXTS = [
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
    "2024-06\nCurrent date: 2026-03-07\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. "
    "Channel must be included for every message.<|end|><|start|>user<|message|>What's 17*23?<|end|>"
    "<|start|>assistant",
    "<|channel|>analysis<|message|>We need 17*23 = 391. They'll want it short.<|end|><|start|>assistant"
    "<|channel|>final<|message|>**391**<|return|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"location\":\"San Francisco, CA\",\"unit\":\"celsius\"}<|call|>",
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20.5, \"sunny\": true}"
    "<|end|>",
    "namespace functions {\n\n// Gets the weather\ntype get_weather = (_: {\n// City and state\nlocation: string,\n"
    "unit?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n} // namespace functions",
    "I'M HERE, you're THERE; WE'LL see. Don'T SHOUT'S o'clock 'tis",
    "12345678 3.14159 1/2/2026 https://x.org/a/b// \r\n\r\n  \n\t x",
    "ǅungla Ǆ ǆ ʰʱ ـــ ゝゞ Ⅻ ⅻ ❶ ½ ๑๒ ㊀",  # titlecase, modifier, other letters; numbers of every kind
]


def main():
    rng = random.Random(200019)
    corpus = []
    with open(OUT / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            item = json.loads(line)
            corpus.append(bytes.fromhex(item["hex"]) if "hex" in item else item["text"])
    lines = [c.decode("utf-8", "replace") if isinstance(c, bytes) else c for c in corpus] + HARMONY_TEXTS * 20
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS])
    tok_json = json.loads(tok.to_str())
    extra = [(t, tok.encode(t, add_special_tokens=False).ids) for t in HARMONY_TEXTS]
    # The corpus's fixed strings (every script, number, whitespace and contraction group) and a random sample.
    fixed = sum(len(g) for g in (WORDS[:40], ACCENTED, DECOMPOSED, CJK, EMOJI, SCRIPTS, CODE, NUMBERS, WHITESPACE,
                                 CONTRACTIONS, SPECIAL_TEXTS, FLAG_TEXTS, INVALID_UTF8))
    indices = list(range(fixed)) + sorted(rng.sample(range(fixed, len(corpus)), 300))
    write_cases("o200k-harmony", tok_json, corpus, indices, extra_texts=extra,
                decode_id_lists=random_id_lists(rng, tok_json, 100))


if __name__ == "__main__":
    main()
