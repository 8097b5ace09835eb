#!/usr/bin/env python3
"""Writes the seed inputs of each fuzz target (tests/fuzz/fuzz_<target>.cpp) under OUT/<target>/, from the
test fixtures and the real files in tests/data (checkpoints, configs, tokenizers, chat templates) plus a few
hand-written request bodies and model outputs. Python standard library only. tools/fuzz.sh calls it; the
committed corpora under tests/fuzz/corpus are what the campaigns kept after minimising (libFuzzer -merge=1).

    python3 tools/make_fuzz_seeds.py OUT
"""
import hashlib
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def writer(out, target):
    folder = out / target
    folder.mkdir(parents=True, exist_ok=True)

    def write(data):
        if isinstance(data, str):
            data = data.encode()
        (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)

    return write


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False)


def safetensors(out):
    write = writer(out, "safetensors")
    for path in sorted(DATA.rglob("*.safetensors")):
        if path.stat().st_size <= 64 * 1024:
            write(path.read_bytes())


def checkpoint_index(out):
    # The shards fuzz_checkpoint_index.cpp writes next to the index.
    write = writer(out, "checkpoint_index")
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    full = {"model.embed_tokens.weight": first, "lm_head.weight": first, "model.norm.weight": second,
            "model.codes": second}
    write(dumps({"metadata": {"total_size": 34}, "weight_map": full}))
    write(dumps({"weight_map": {"lm_head.weight": first}}))
    write(dumps({"weight_map": {"model.norm.weight": "../" + second}}))
    write(dumps({"weight_map": {"model.norm.weight": "/etc/passwd"}}))
    write(dumps({"weight_map": {"model.norm.weight": "./" + second}}))
    write(dumps({"weight_map": {"model.norm.weight": "config.json"}}))
    for path in sorted(DATA.rglob("model.safetensors.index.json")):
        write(path.read_bytes())


def model_config(out):
    write = writer(out, "model_config")
    for path in sorted(DATA.rglob("*.json")):
        if "config" in path.name and "quant" not in path.name and path.stat().st_size <= 64 * 1024:
            write(path.read_bytes())


def quantization_config(out):
    write = writer(out, "quantization_config")
    for path in sorted(DATA.rglob("config.json")):
        text = path.read_text()
        if "quantization_config" in text:
            write(b"\x00" + text.encode())
    for path in sorted(DATA.rglob("hf_quant_config.json")):
        write(b"\x01" + path.read_bytes())
    write(b"\x00" + dumps({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                   "weight_block_size": [128, 128],
                                                   "modules_to_not_convert": ["lm_head", "re:.*gate$",
                                                                              "model.layers.*.mlp.gate"]}}).encode())


def shrunk_tokenizer(tok, entries=300, merges=48, added=8):
    """The tokenizer with its first `entries` vocabulary ids, the merges among them and a few added tokens:
    every section and option of the original in a few KB. Campaigns bound tokenizer_json inputs to 8 KB (see
    tools/fuzz.sh): the loader's code is the same for 300 entries as for 150k, and parsing 40-80 KB of JSON
    per input made the fuzzer ten times slower."""
    tok = json.loads(json.dumps(tok))
    model = tok.get("model", {})
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        model["vocab"] = {k: v for k, v in vocab.items() if isinstance(v, int) and v < entries}
        kept = model["vocab"]
        pairs = []
        for m in model.get("merges", []):
            a, b = m.split(" ", 1) if isinstance(m, str) else (m + ["", ""])[:2]
            if a in kept and b in kept and a + b in kept:
                pairs.append(m)
        model["merges"] = pairs[:merges]
    if isinstance(tok.get("added_tokens"), list):
        tok["added_tokens"] = tok["added_tokens"][:added]
    return tok


def tokenizer_json(out):
    write = writer(out, "tokenizer_json")
    for path in sorted(DATA.glob("tokenizer/*/tokenizer.json")):
        write(dumps(shrunk_tokenizer(json.loads(path.read_text()))))


def tokenizer_encode(out):
    write = writer(out, "tokenizer_encode")
    lines = [l for l in (DATA / "tokenizer" / "corpus.jsonl").read_text().split("\n") if l]
    rows = [json.loads(line) for line in lines]
    texts = [r["text"].encode() if "text" in r else bytes.fromhex(r["hex"]) for r in rows]
    for i, text in enumerate(sorted(texts, key=len, reverse=True)[:40] + [t for t in texts if len(t) < 8][:12]):
        write(bytes([i % 6]) + text)
    for i, raw in enumerate([b"<|endoftext|>hi<|im_start|>", b"\xff\xfe\xc3(abc\xe2\x82", b"   \n\n\t 12345 6",
                             "😀👍🏽 ünïcödé 中文 العربية".encode()]):
        write(bytes([i]) + raw)


def tiktoken(out):
    # Byte 0: 0 = a tiktoken.model file, 1 = a tokenizer_config.json, else text to encode (fuzz_tiktoken.cpp).
    write = writer(out, "tiktoken")
    folder = DATA / "tiktoken"
    model = (folder / "tiktoken.model").read_bytes()
    write(b"\0" + model[:4096])  # the single bytes and the first merges
    write(b"\0" + b"\n".join(model.split(b"\n")[:300]) + b"\n")
    write(b"\1" + (folder / "tokenizer_config.json").read_bytes())
    write(b'\1{"pat_str": "\\\\p{L}+|\\\\s+|.", "added_tokens_decoder": {"3801": {"content": "<x>", "lstrip": true}}}')
    cases = json.loads((folder / "cases.json").read_text(encoding="utf-8"))["cases"]
    texts = [c["text"].encode() for c in cases if len(c["text"]) < 2000]
    for i, text in enumerate(texts):
        write(bytes([2 + i % 2]) + text)
    write(b"\2\xff\xfe\xc3(abc\xe2\x82 <|im_end|\xe4\xb8")


def jinja_template(out):
    write = writer(out, "jinja_template")
    for path in sorted((DATA / "chat_templates").glob("*.jinja")):
        write(path.read_bytes())
    for case in json.loads((DATA / "chat_templates" / "constructs.json").read_text())["cases"]:
        write(case["template"])


FAMILY_CONVERSATIONS = {"agent_loop", "three_results_in_a_row", "answer_after_last_user", "string_arguments",
                        "two_system_messages", "assistant_prefix", "think_tags_in_content", "tool_result_without_call"}


def chat_template_render(out):
    # Byte 0 picks the template in sorted file-name order, as fuzz_chat_template_render.cpp does.
    write = writer(out, "chat_template_render")
    templates = sorted(p.name for p in (DATA / "chat_templates").glob("*.jinja"))
    for index, name in enumerate(templates):
        cases = json.loads((DATA / "chat_templates" / (name[:-len(".jinja")] + ".json")).read_text())["cases"]
        for case in cases[:12]:
            write(bytes([index]) + dumps(case["context"]).encode())
        # The DeepSeek / Kimi / GLM conversations (tools/family_template_cases.py), under one flag set each.
        for case in cases[12:]:
            if case["name"].split("/")[0] in FAMILY_CONVERSATIONS and case["name"].endswith("/thinking"):
                write(bytes([index]) + dumps(case["context"]).encode())


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"},
                                                                          "days": {"type": "integer"}},
                                                           "required": ["city"]}}}


def openai_request(out):
    write = writer(out, "openai_request")
    for case in json.loads((DATA / "serve" / "chat_prompts.json").read_text())["cases"]:
        write(dumps(case["request"]))
    hello = [{"role": "user", "content": "Hi"}]
    write(dumps({"model": "m", "messages": hello, "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                 "stop": ["\n"], "n": 2, "logprobs": True, "top_logprobs": 3, "seed": 1}))
    write(dumps({"messages": hello, "tools": [WEATHER], "tool_choice": "required"}))
    write(dumps({"messages": hello, "tools": [WEATHER],
                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    write(dumps({"messages": hello, "response_format": {"type": "json_object"}}))
    write(dumps({"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief"}]},
                              {"role": "user", "content": "Weather?"},
                              {"role": "assistant", "content": None, "reasoning_content": "tool",
                               "tool_calls": [{"id": "call_1", "type": "function",
                                               "function": {"name": "get_weather",
                                                            "arguments": "{\"city\": \"Paris\"}"}}]},
                              {"role": "tool", "tool_call_id": "call_1", "content": "21C"}],
                 "tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": False}}))


def anthropic_request(out):
    write = writer(out, "anthropic_request")
    hello = [{"role": "user", "content": "Hi"}]
    tool = {"name": "get_weather", "description": "Weather",
            "input_schema": WEATHER["function"]["parameters"]}
    write(dumps({"model": "claude", "max_tokens": 12, "system": "Be brief", "messages": hello}))
    write(dumps({"max_tokens": 12, "system": [{"type": "text", "text": "Be brief"}], "messages": hello,
                 "stop_sequences": ["x"], "temperature": 0.5, "top_k": 4, "top_p": 0.9}))
    write(dumps({"max_tokens": 60, "tools": [tool], "messages": hello,
                 "tool_choice": {"type": "tool", "name": "get_weather"}}))
    write(dumps({"max_tokens": 60, "tools": [tool], "messages": hello, "tool_choice": {"type": "any"}}))
    write(dumps({"max_tokens": 16, "messages": hello, "thinking": {"type": "enabled", "budget_tokens": 1024}}))
    write(dumps({"max_tokens": 16, "tools": [tool], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "use it", "signature": "s"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "21C"}]}]}]}))


# fuzz_output_parser.cpp's formats, in its order: byte 0 % 3 + 3 × (byte 1 >> 4) indexes this list.
OUTPUT_FORMATS = ["plain", "qwen3", "qwen3_coder", "harmony", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm4"]
# The oracle fixture's templates and the format each one's text is in.
ORACLE_FORMATS = {"deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v3", "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek_v32",
                  "moonshotai-Kimi-K2.jinja": "kimi_k2", "Kimi-K2-Instruct.jinja": "kimi_k2",
                  "Kimi-K2-Thinking.jinja": "kimi_k2", "GLM-4.6.jinja": "glm4", "GLM-4.7-Flash.jinja": "glm4"}


def output_parser_header(flags, chunk, format_name):
    # flags: bits 2-5 of byte 0 (tools, thinking, starts in thinking, schemas); chunk: 0..15.
    f = OUTPUT_FORMATS.index(format_name)
    nibble = ((f - flags % 3) * 3) % len(OUTPUT_FORMATS)  # 3 is its own inverse mod 8
    assert (flags % 3 + 3 * nibble) % len(OUTPUT_FORMATS) == f
    return bytes([flags, nibble << 4 | chunk])


def output_parser(out):
    # Byte 0: format (% 3: plain, qwen3, qwen3_coder) and option bits; byte 1: chunk size (low nibble) and, in
    # the high nibble, 3 × the formats after the first three.
    write = writer(out, "output_parser")
    qwen3 = ('<think>\nthe user wants weather\n</think>\n\nLet me check.\n<tool_call>\n'
             '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>')
    coder = ('I will call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
             '<parameter=days>\n2\n</parameter>\n<parameter=where>\n{"lat": 1.5}\n</parameter>\n</function>\n'
             '</tool_call>')
    for flags in (0b101100, 0b001100, 0b111100, 0b000000):
        for chunk in (0, 2, 6):
            write(bytes([flags | 1, chunk]) + qwen3.encode())
            write(bytes([flags | 2, chunk]) + coder.encode())
            write(bytes([flags, chunk]) + b"plain <b>text</b> <think>")
    # The texts the DeepSeek, Kimi and GLM templates write (tools/make_output_parser_fixtures.py).
    oracle = json.loads((DATA / "serve" / "output_parser_oracle.json").read_text())
    for entry in oracle["templates"]:
        format_name = ORACLE_FORMATS[entry["template"]]
        for i, case in enumerate(entry["cases"]):
            if i % 3:
                continue  # a third of the cases: each family's shapes without near-duplicates
            flags = 0b101100 | (0b010000 if case["starts_in_thinking"] else 0)
            write(output_parser_header(flags, i % 16, format_name) + case["generated"].encode())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    for make in (safetensors, checkpoint_index, model_config, quantization_config, tokenizer_json,
                 tokenizer_encode, tiktoken, jinja_template, chat_template_render, openai_request, anthropic_request,
                 output_parser):
        make(out)


if __name__ == "__main__":
    main()
