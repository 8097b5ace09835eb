#!/usr/bin/env python3
"""Fixtures for the checkpoint loader tests (tests/llm/test_checkpoint.cpp, test_model_config.cpp,
test_init_model.cpp), made by libraries we did not write: transformers (config.json as v5 writes it, the
Qwen3MoeConfig defaults, the tensor names/shapes of Qwen3MoeForCausalLM), torch (F16/BF16/F32 conversions)
and safetensors (the file holding the conversion cases).

    /work/oracle-venv/bin/python tools/make_checkpoint_fixtures.py            # writes tests/data/checkpoints/
    /work/oracle-venv/bin/python tools/make_checkpoint_fixtures.py --check DIR...
        # development check: DIR (from `xmoe init-model`) loads in transformers with every weight from the file,
        # runs a forward pass, and its tokenizer.json round-trips text through HF tokenizers.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "checkpoints")

# The tiny config the init-model tests instantiate: sparse and dense layers, GQA, attention bias.
TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, mlp_only_layers=[1], attention_bias=True, rope_theta=1e6,
            max_position_embeddings=4096, tie_word_embeddings=False)


def write_json(name, obj):
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def config_fixtures():
    tmp = tempfile.mkdtemp()
    try:
        # config.json exactly as transformers v5 saves it (num_local_experts, dtype, rope_parameters).
        c = Qwen3MoeConfig(**TINY)
        Qwen3MoeForCausalLM(c).save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(OUT, "v5_saved_config.json"))
        # yarn scaling given the v4 way (rope_scaling + top-level rope_theta), re-saved by v5.
        c = Qwen3MoeConfig(**dict(TINY, rope_scaling={"type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 1024}))
        c.save_pretrained(tmp)
        shutil.copy(os.path.join(tmp, "config.json"), os.path.join(OUT, "v5_saved_yarn_config.json"))
    finally:
        shutil.rmtree(tmp)
    d = Qwen3MoeConfig()
    write_json("qwen3_moe_defaults.json", {
        k: getattr(d, k) for k in ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                                   "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "num_experts", "num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step",
                                   "mlp_only_layers", "rms_norm_eps", "max_position_embeddings",
                                   "tie_word_embeddings", "attention_bias"]}
        | {"rope_theta": d.rope_parameters["rope_theta"],
           "head_dim": d.hidden_size // d.num_attention_heads})


def tensor_fixtures():
    # Names and shapes transformers expects: the fused layout is the module's own state_dict, the per-expert
    # one what save_pretrained writes (and what Hub checkpoints hold).
    c = Qwen3MoeConfig(**TINY)
    model = Qwen3MoeForCausalLM(c)
    fused = {k: list(v.shape) for k, v in model.state_dict().items()}
    tmp = tempfile.mkdtemp()
    try:
        model.save_pretrained(tmp)
        from safetensors import safe_open
        with safe_open(os.path.join(tmp, "model.safetensors"), "pt") as f:
            per_expert = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    finally:
        shutil.rmtree(tmp)
    write_json("tiny_config.json", dict(TINY, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe"))
    write_json("tiny_tensors.json", {"per-expert": per_expert, "fused": fused})


def conversion_fixture():
    # F16 bit patterns covering zero, subnormals (smallest, largest), normals, max, inf, NaN, both signs.
    f16_bits = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x0002, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3555, 0x7bff,
                         0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0200, 0x1234, 0xc000, 0x5640], dtype=np.uint16)
    f16 = torch.from_numpy(f16_bits.view(np.float16).copy())
    f16_as_f32 = f16.float().numpy().view(np.uint32)
    f16_as_bf16 = f16.float().bfloat16().view(torch.int16).numpy().view(np.uint16)
    # F32 values around bf16 rounding boundaries (ties to even both ways, carries into the exponent), extremes.
    f32_bits = np.array([0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f807fff, 0x3f7fffff, 0x7f7fffff,
                         0xff7fffff, 0x00000001, 0x007fffff, 0x00800000, 0x7f800000, 0xff800000, 0x7fc00000,
                         0x80000000, 0x3eaaaaab, 0x40490fdb, 0xc2f6e979], dtype=np.uint32)
    f32 = torch.from_numpy(f32_bits.view(np.float32).copy())
    f32_as_bf16 = f32.bfloat16().view(torch.int16).numpy().view(np.uint16)
    bf16_bits = np.array([0x0000, 0x8000, 0x3f80, 0xbf80, 0x0001, 0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0x4049, 0x3eab],
                         dtype=np.uint16)
    bf16_as_f32 = torch.from_numpy(bf16_bits.astype(np.int16)).view(torch.bfloat16).float().numpy().view(np.uint32)
    from safetensors.torch import save_file as save_torch
    t = {
        "f16": torch.from_numpy(f16_bits.view(np.float16).reshape(4, 5).copy()),
        "f32": torch.from_numpy(f32_bits.view(np.float32).reshape(2, 9).copy()),
        "bf16": torch.from_numpy(bf16_bits.astype(np.int16)).view(torch.bfloat16),
        "expected.f16_as_f32": torch.from_numpy(f16_as_f32.astype(np.int64)),
        "expected.f16_as_bf16": torch.from_numpy(f16_as_bf16.astype(np.int64)),
        "expected.f32_as_bf16": torch.from_numpy(f32_as_bf16.astype(np.int64)),
        "expected.bf16_as_f32": torch.from_numpy(bf16_as_f32.astype(np.int64)),
    }
    path = os.path.join(OUT, "conversions.safetensors")
    save_torch(t, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)


def check(dirs):
    from tokenizers import Tokenizer
    from safetensors.torch import load_file
    texts = ["Hello world, the model", "über café 日本語 🎉", "def f(x):\n    return x+1\n",
             "<|im_start|>user\nhi<|im_end|>", "  spaces\t\ttabs\n\n", "numbers 12345 and emoji 👍🏽"]
    for d in dirs:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        state = model.state_dict()
        files = ([os.path.join(d, "model.safetensors")] if os.path.exists(os.path.join(d, "model.safetensors"))
                 else sorted({os.path.join(d, f) for f in
                              json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"].values()}))
        stored = {}
        for f in files:
            stored.update(load_file(f))
        # Every module parameter must come from the file: per-expert files are fused by transformers on load.
        for name, value in state.items():
            if name == "lm_head.weight" and name not in stored and model.config.tie_word_embeddings:
                assert torch.equal(value, stored["model.embed_tokens.weight"].float()), name
            elif name in stored:
                assert torch.equal(value, stored[name].float()), name
            elif name.endswith("experts.gate_up_proj"):
                p = name[: -len("gate_up_proj")]
                E = value.shape[0]
                g = torch.stack([stored[f"{p}{j}.gate_proj.weight"] for j in range(E)])
                u = torch.stack([stored[f"{p}{j}.up_proj.weight"] for j in range(E)])
                assert torch.equal(value, torch.cat([g, u], 1).float()), name
            elif name.endswith("experts.down_proj"):
                p = name[: -len("down_proj")]
                dn = torch.stack([stored[f"{p}{j}.down_proj.weight"] for j in range(value.shape[0])])
                assert torch.equal(value, dn.float()), name
            else:
                raise AssertionError(f"{d}: parameter {name} is not in the checkpoint")
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
        assert torch.isfinite(logits).all()
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        vocab_size = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
        assert tok.get_vocab_size() == vocab_size
        assert all(tok.id_to_token(i) is not None for i in range(vocab_size))
        for s in texts:
            ids = tok.encode(s).ids
            assert tok.decode(ids, skip_special_tokens=False) == s, (s, ids)
        hf = AutoTokenizer.from_pretrained(d)
        prompt = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                        add_generation_prompt=True)
        assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", prompt
        assert hf.eos_token == "<|im_end|>"
        print(f"{d}: ok ({len(state)} parameters, {len(files)} file(s), tokenizer {vocab_size} ids)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", nargs="+", metavar="DIR")
    args = ap.parse_args()
    if args.check:
        check(args.check)
        return
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    config_fixtures()
    tensor_fixtures()
    conversion_fixture()
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    sys.exit(main())
