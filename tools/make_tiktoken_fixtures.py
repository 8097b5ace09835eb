#!/usr/bin/env python3
"""Fixtures of tests/llm/test_tiktoken.cpp: a small tiktoken vocabulary and the ids the PyPI `tiktoken` package
gives for a mixed-script corpus with Kimi-K2's pre-tokenizer pattern and special tokens.

Writes tests/data/tiktoken/:
  tiktoken.model          ~3,800 tokens trained here by byte-pair merges over a mixed-script text (ranks 0..255
                          are the single bytes), in tiktoken's format (base64 token, space, rank)
  tokenizer_config.json   Kimi-K2's named special tokens at its offsets after the vocabulary (bos/eos too)
  cases.json              for each corpus text: tiktoken's ids (tiktoken.load.load_tiktoken_bpe of the file above
                          + tiktoken.Encoding(pat_str=Kimi's, special tokens), encoded the way Kimi-K2's
                          tokenization_kimi.py does), tiktoken's decode of every other id, and the pre-tokenizer
                          pieces from Python's `regex` module (VERSION1: class intersection `&&`); plus the code
                          points Python's str.isspace() accepts

Needs: pip install tiktoken regex. Run from the repository root: python3 tools/make_tiktoken_fixtures.py
"""

import base64
import collections
import json
import os
import pathlib
import sys

# tiktoken caches what load_tiktoken_bpe reads under a key of the path, not the content: a regenerated file
# would be read stale.
os.environ["TIKTOKEN_CACHE_DIR"] = ""

import regex
import tiktoken
import tiktoken.load

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "tiktoken"
VECTORS = ROOT.parent.parent / "shared" / "data" / "tokenizer-vectors"

# tokenization_kimi.py (moonshotai/Kimi-K2-Instruct)
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_RESERVED_SPECIAL_TOKENS = 256
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000

# Kimi-K2's named specials, at their offsets from the first special id (163584 in the real vocabulary), and
# the reasoning markers of K2-Thinking, which are added tokens that are not special.
NAMED_SPECIALS = {
    0: ("[BOS]", True),
    1: ("[EOS]", True),
    2: ("<|im_end|>", True),
    3: ("<|im_user|>", True),
    4: ("<|im_assistant|>", True),
    6: ("<|start_header_id|>", True),
    7: ("<|end_header_id|>", True),
    9: ("[EOT]", True),
    10: ("<|im_system|>", True),
    11: ("<|tool_calls_section_begin|>", True),
    12: ("<|tool_calls_section_end|>", True),
    13: ("<|tool_call_begin|>", True),
    14: ("<|tool_call_argument_begin|>", True),
    15: ("<|tool_call_end|>", True),
    17: ("<|im_middle|>", True),
    22: ("<think>", False),
    23: ("</think>", False),
    254: ("[UNK]", True),
    255: ("[PAD]", True),
}

TRAINING_TEXT = """
The quick brown fox jumps over the lazy dog. It's what they'd said: we're sure you'll see, I've been there, I'm here.
THE QUICK BROWN FOX IT'S WE'RE YOU'LL I'VE I'M SHE'D Don'T DON'T HELLO World Hello world hello WORLD.
Tokenizers split text into pieces, then merge the bytes of each piece by rank until no pair is left in the table.
In 2024, 1,234,567 tokens were processed at 3.14159 tokens per microsecond; version 10.0.22631 shipped on 12/03.
我们的模型使用混合专家架构。今天天气很好，我们去公园散步吧！人工智能正在改变世界。中文分词与英文不同，汉字之间没有空格。
北京是中国的首都。上海是一个国际化大都市。我想在苹果公司工作。这是一个测试句子，用来训练分词器。
日本語のテキストも含まれています。東京は日本の首都です。ひらがなとカタカナと漢字を混ぜて書きます。コンピューターが好きです。
今日はいい天気ですね。私は学生です。ラーメンを食べたい。トークナイザーのテストをしています。
한국어 문장도 있습니다. 서울은 대한민국의 수도입니다. 안녕하세요, 만나서 반갑습니다. 토크나이저를 시험합니다.
Русский текст тоже нужен. Москва — столица России. Привет, как дела? Это тестовое предложение для токенизатора.
нещо на Български. Українська мова також. Съешь же ещё этих мягких французских булок, да выпей чаю.
النص العربي مهم أيضا. القاهرة هي عاصمة مصر. مرحبا بالعالم، كيف حالك؟ هذه جملة اختبار.
Ελληνικά κείμενα επίσης. Γειά σου κόσμε! עברית גם כן. שלום עולם. हिन्दी में भी लिखा है। नमस्ते दुनिया।
Ünïcödé äccents: café, naïve, résumé, Äpfel, Straße, Cửa Việt, Tiếng Việt có dấu. Ça va? Øresund, Ågård.
Emoji: 🚀 😀 😶‍🌫️ ✅ 👍🏽 🦙 🇯🇵 ❤️ 🎉🎉🎉 — and symbols ©®™ ±×÷ ∑∫√ ≤≥≠ →←↑↓ ★☆ ♠♥♦♣ € £ ¥ ₹.
def main(argc, argv):
    for i in range(10):
        print(f"value {i}: {argv[i]!r}")
    return 0

int main(int argc, char** argv) {
  std::vector<int32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/true);
  if (ids.empty()) { return 1; }
  return static_cast<int>(ids.size());
}
{"role": "user", "content": "Hello, world!"}, {"key": [1, 2, 3], "nested": {"a": null, "b": true}}
<div class="container"><p>Hello &amp; welcome</p></div> SELECT * FROM users WHERE id = 42;
	tab	separated	values
  two spaces    four spaces        eight spaces                sixteen spaces
line one
line two

line four after an empty line
   indented line
\r\nwindows line\r\n
"""


def training_text():
    parts = [TRAINING_TEXT * 3]
    for name in ("README.md",):
        path = ROOT / name
        if path.exists():
            parts.append(path.read_text(encoding="utf-8")[:60000])
    for path in sorted((ROOT / "src" / "llm" / "tokenizer").glob("*.cpp"))[:6]:
        parts.append(path.read_text(encoding="utf-8"))
    parts.append(" " * 64 + "\n" * 8 + "\t" * 8 + " " + "a" * 256)
    return "\n".join(parts)


def train_ranks(text, vocab_size):
    """Byte-pair merges over the pattern's pieces, most frequent pair first (ties: the smaller pair)."""
    pattern = regex.compile(KIMI_PAT_STR, flags=regex.V1)
    word_counts = collections.Counter(piece.encode("utf-8") for piece in pattern.findall(text))
    words = [[bytes([b]) for b in word] for word in word_counts]
    counts = list(word_counts.values())
    ranks = {bytes([b]): b for b in range(256)}
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)
    for w, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:]):
            pair_counts[pair] += counts[w]
            where[pair].add(w)
    while len(ranks) < vocab_size and pair_counts:
        best = max(pair_counts.items(), key=lambda kv: (kv[1], [-x for x in kv[0][0] + kv[0][1]]))[0]
        if pair_counts[best] < 2:
            break
        merged = best[0] + best[1]
        if merged not in ranks:
            ranks[merged] = len(ranks)
        for w in list(where[best]):
            symbols = words[w]
            for pair in zip(symbols, symbols[1:]):
                pair_counts[pair] -= counts[w]
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[w] = out
            for pair in zip(out, out[1:]):
                pair_counts[pair] += counts[w]
                where[pair].add(w)
        where.pop(best, None)
    return ranks


def kimi_chunks(text):
    """tokenization_kimi.py's encode: 400k-character slices, cut where a run of whitespace or non-whitespace
    exceeds 25k characters (_split_whitespaces_or_nonwhitespaces)."""
    for i in range(0, len(text), TIKTOKEN_MAX_ENCODE_CHARS):
        s = text[i : i + TIKTOKEN_MAX_ENCODE_CHARS]
        current_slice_len = 0
        current_slice_is_space = s[0].isspace() if len(s) > 0 else False
        slice_start = 0
        for j in range(len(s)):
            is_now_space = s[j].isspace()
            if current_slice_is_space ^ is_now_space:
                current_slice_len = 1
                current_slice_is_space = is_now_space
            else:
                current_slice_len += 1
                if current_slice_len > MAX_NO_WHITESPACES_CHARS:
                    yield s[slice_start:j]
                    slice_start = j
                    current_slice_len = 1
        yield s[slice_start:]


def corpus(special_names):
    texts = []
    for name in ("ggml-vocab-qwen35.gguf.inp", "ggml-vocab-gpt-2.gguf.inp"):
        path = VECTORS / name
        if path.exists():
            for t in path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n"):
                if t not in texts:
                    texts.append(t)
    texts += [
        "Hello world",
        "It's IT'S it'S We'RE they'd THEY'D I'm I'M you'll YOU'LL we've WE'VE can't CAN'T",
        "'s 's's 'S 'ſ (long s) 'ſs 'K 'k — apostrophes: ’s ‘quoted’ ''",
        "McDonald's iPhone iOS macOS JavaScript XMLHttpRequest HTTPServer ABCdef abcDEF DŽungla ǅemal ǈ ǋ",
        "ʰʲ ˈstress ǀclick ªº ᵃᵇᶜ Ⅻ ⅻ ⑫ ㊿ ½ ¾ ²³",
        "我们的模型使用混合专家架构。今天天气很好，我们去公园散步吧！",
        "中文，标点。「引号」『书名』、顿号；分号：冒号？问号！感叹号……省略号——破折号",
        "日本語のテキストです。東京は日本の首都です。カタカナ：コンピューター、ー長音符、々踊り字",
        "한국어 문장입니다. 서울은 대한민국의 수도입니다. 한글 자모 ㄱㄴㄷ ㅏㅑㅓ",
        "Москва — столица России. Привет, как дела? ЁЖИК ёжик Ёжик",
        "مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥٦٧٨٩٠ العربية",
        "Γειά σου κόσμε! שלום עולם. नमस्ते दुनिया। ภาษาไทย ไม่มีช่องว่าง ქართული",
        "Vietnamese: Cửa Việt, Tiếng Việt có dấu; combining: e\u0301 a\u0300 n\u0303 o\u0308\u0304",
        "Emoji 🚀😀 😶‍🌫️ ✅ 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇺🇸 ❤️ 🎉🎉🎉",
        "digits 1 12 123 1234 12345 123456 1234567 3.14159 1,234,567 ０１２３ ①②③ ٣٤٥",
        "   leading spaces and trailing spaces   ",
        "tabs\t\tand\t \tmixed \t whitespace\u00a0nbsp\u2003em\u3000ideographic",
        "line\nbreaks\n\nand\r\nCRLF\r\n\r\nand\rCR\n   \n\t\n",
        "\n\n\n",
        "    indented code\n        more indented\n    back",
        "x = foo(a, b) + bar[3] * 2;  // comment\nif (x != y && z >= 0) { return -1; }",
        'def f(x):\n    return {"k": [1, 2, 3], "s": f"{x!r}"}\n',
        "<html><body class=\"main\">Text &amp; more</body></html>",
        "!!!!!! ??? ... ---- ==== **bold** __under__ ~~strike~~ `code` ```block```",
        "mixed中文English混合123数字and日本語とEnglish",
        "Hello世界Привет🌍مرحبا",
        # Unicode 15-16 characters (CJK extensions H and I, Cyrillic Ᲊ, Latin Ꟍ, Kannada ೳ, Kawi, Garay digits):
        # properties of tiktoken's Unicode version, not of an older library's.
        "CJK Ext H \U00031350\U00031351 Ext I \U0002EBF0\U0002EBF1 Ᲊᲊ ꟋꟌꟍ x\u0CF3y \U00011F04\U00011F05 \U00010D40\U00010D41\U00010D42\U00010D43",
        "\u200b zero\u200cwidth\u200djoiner \ufeff bom \u00ad soft",
        "unassigned and private use: \ue000\U000f0000 and noncharacters \ufdd0\uffff",
        "[BOS]Hello[EOS]",
        "<|im_user|>user<|im_middle|>What's 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|><think>4</think>Four<|im_end|>",
        "<|im_system|>system<|im_middle|>You are helpful.<|im_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"北京\"}<|tool_call_end|><|tool_calls_section_end|>",
        "near misses: <|im_end| <|im_end |> [BOS [EOS]] <<|im_end|>> <think></think> <|reserved_token_1|>",
        f"reserved: {special_names[5]} {special_names[100]}{special_names[253]}x",
        "[UNK][PAD][EOT]<|start_header_id|>user<|end_header_id|>",
        "a" * 100,
        "ab" * 60,
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbb",
        " " * 25010 + "end of a long space run",
        "a" * 25003 + " and a long letter run",
        "",
    ]
    return texts


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ranks = train_ranks(training_text(), 3800)
    model_path = OUT / "tiktoken.model"
    with open(model_path, "wb") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")

    # The oracle reads the file back, as tokenization_kimi.py does.
    mergeable_ranks = tiktoken.load.load_tiktoken_bpe(str(model_path))
    assert mergeable_ranks == ranks
    num_base = len(mergeable_ranks)
    named = {num_base + k: v for k, v in NAMED_SPECIALS.items()}
    special_tokens = {}
    special_names = []
    for i in range(num_base, num_base + NUM_RESERVED_SPECIAL_TOKENS):
        name = named[i][0] if i in named else f"<|reserved_token_{i}|>"
        special_tokens[name] = i
        special_names.append(name)
    encoding = tiktoken.Encoding(
        name="kimi-fixture", pat_str=KIMI_PAT_STR, mergeable_ranks=mergeable_ranks, special_tokens=special_tokens
    )

    config = {
        "added_tokens_decoder": {
            str(i): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (content, special) in sorted(named.items())
        },
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 131072,
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    pieces_re = regex.compile(KIMI_PAT_STR, flags=regex.V1)
    special_re = regex.compile("|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True)))
    cases = []
    for text in corpus(special_names):
        ids = []
        for chunk in kimi_chunks(text):
            ids += encoding.encode(chunk, allowed_special="all")
        assert encoding.decode(ids) == text, text
        case = {"text": text, "ids": ids, "decoded_odd": encoding.decode(ids[1::2])}
        if not special_re.search(text) and len(text) < 1000:
            case["pieces"] = pieces_re.findall(text)
            # The pieces encoded one by one give the same ids: the split is the one tiktoken made.
            assert [t for p in case["pieces"] for t in encoding.encode_ordinary(p)] == ids, text
        cases.append(case)
    fixture = {
        "provenance": f"tools/make_tiktoken_fixtures.py: tiktoken {tiktoken.__version__}, regex {regex.__version__}, "
        f"Python {sys.version.split()[0]}",
        "num_base_tokens": num_base,
        "python_isspace": [c for c in range(0x110000) if chr(c).isspace()],
        "cases": cases,
    }
    (OUT / "cases.json").write_text(json.dumps(fixture, ensure_ascii=False) + "\n", encoding="utf-8")
    total_ids = sum(len(c["ids"]) for c in cases)
    print(f"{model_path}: {num_base} tokens, {model_path.stat().st_size} bytes; {len(cases)} cases, {total_ids} ids")


if __name__ == "__main__":
    main()
