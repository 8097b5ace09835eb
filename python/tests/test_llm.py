"""xmoe.LLM: greedy ids equal transformers' (the committed tiny checkpoints' expectations) and `xmoe generate`."""

import json
import os
import re
import struct
import subprocess

from conftest import ROOT, xmoe_cli
import xmoe

MODELS = os.path.join(ROOT, "tests", "data", "models")


def read_int32_tensors(path):
    """The int32 tensors of a safetensors file (a small reader: 8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        if name == "__metadata__" or h["dtype"] != "I32":
            continue
        b, e = h["data_offsets"]
        out[name] = list(struct.unpack(f"<{(e - b) // 4}i", data[b:e]))
    return out


def test_greedy_ids_equal_transformers():
    expected = read_int32_tensors(os.path.join(MODELS, "tied-sparse.expected.safetensors"))
    prompts = [expected[f"p{i}.prompt"] for i in range(3)]
    greedy = [expected[f"p{i}.greedy"] for i in range(3)]
    llm = xmoe.LLM(os.path.join(MODELS, "tied-sparse"), dtype="f32")
    out = llm.generate(prompts, max_tokens=max(len(g) for g in greedy), temperature=0, ignore_eos=True)
    assert [o.token_ids[:len(g)] for o, g in zip(out, greedy)] == greedy
    assert all(o.finish_reason == "length" for o in out)


def test_text_prompt_equals_xmoe_generate(tmp_path):
    model = str(tmp_path / "tiny")
    cli = xmoe_cli()
    with open(os.path.join(ROOT, "tests", "data", "checkpoints", "tiny_config.json")) as f:
        config = json.load(f)
    config["attention_bias"] = False
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    subprocess.run([cli, "init-model", "--config", str(tmp_path / "config.json"), "--out", model, "--dtype", "f32",
                    "--seed", "5"], check=True, capture_output=True)
    run = subprocess.run([cli, "generate", "--model", model, "--prompt", "Hello, MoE world", "--max-tokens", "12",
                          "--temperature", "0", "--ignore-eos", "--no-stream", "--print-ids", "--dtype", "f32"],
                         check=True, capture_output=True, text=True)
    ids = [int(v) for v in re.search(r"generated ids: ([0-9,]*)", run.stderr).group(1).split(",") if v]
    text = run.stdout.rstrip("\n")
    out = xmoe.LLM(model, dtype="f32").generate("Hello, MoE world", max_tokens=12, temperature=0,
                                                ignore_eos=True)
    assert len(out) == 1 and out[0].token_ids == ids and len(ids) == 12
    assert out[0].text == text
    # Sampling with a seed is reproducible, and a bad argument is a clear error.
    a = xmoe.LLM(model, dtype="f32")
    s1 = a.generate(["Hi", [1, 2, 3]], max_tokens=6, temperature=0.8, seed=3, ignore_eos=True)
    s2 = a.generate(["Hi", [1, 2, 3]], max_tokens=6, temperature=0.8, seed=3, ignore_eos=True)
    assert [o.token_ids for o in s1] == [o.token_ids for o in s2]
    try:
        a.generate([[1, 2, 100000]], max_tokens=2)
    except ValueError as e:
        assert "100000" in str(e) or "vocab" in str(e)
    else:
        raise AssertionError("an out-of-range prompt id was accepted")
