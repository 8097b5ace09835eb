#!/usr/bin/env python3
"""Reference outputs for the architecture kit's parts (tests/llm/test_arch_kit.cpp), computed by transformers.

* rope.json: RoPE variants. transformers' ROPE_INIT_FUNCTIONS (linear, yarn with truncate true/false,
  attention_factor / mscale pairs, llama3) and the default inverse frequencies, with partial rotary factors;
  cos/sin as transformers' rotary embeddings build them and q rotated by transformers' apply_rotary_pos_emb
  over the rotary slice (the rest of the head passes through, as partial-rotary models do).
* attention.json: transformers' GptOssAttention (q/k/v/o with biases, GQA, learned sinks, YaRN RoPE with
  truncate=false) for a sliding-window layer and a full layer, run on one sequence longer than the window
  with eager_attention_forward and the causal (+ window) mask: the C++ attention block must give the same
  rows whether it sees the sequence at once, in chunks or one token at a time (decode steps past the window
  against this full recompute).

Run: /work/venv/bin/python tools/make_arch_kit_fixtures.py  (writes tests/data/arch_kit/)
"""
import json
import os

import numpy as np
import torch
from transformers import GptOssConfig, LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss import modeling_gpt_oss as gpt_oss
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "arch_kit")


def floats(t):
    # The shortest decimal that reads back as the same float32 (half the size of a double's repr).
    return [float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
            for x in t.detach().to(torch.float32).reshape(-1).tolist()]


def rope_case(name, head_dim, rope_parameters, max_position_embeddings=4096, heads=2):
    cfg_json = {
        "hidden_size": head_dim * 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings,
        "rope_parameters": rope_parameters,
    }
    config = LlamaConfig(**cfg_json)
    params = config.rope_parameters
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        inv_freq, attention_factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    rotary_dim = 2 * inv_freq.numel()
    positions = torch.tensor([0, 1, 5, 77, 1000, 4095, 9000])
    torch.manual_seed(len(name))
    x = torch.randn(len(positions), heads, head_dim)
    # transformers' rotary embedding forward: cat(freqs, freqs) → cos/sin × attention scaling.
    freqs = positions[:, None].float() * inv_freq[None, :].float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
    q = x.transpose(0, 1)[None]  # [1, heads, T, D]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    q_embed, _ = apply_rotary_pos_emb(q_rot, q_rot, cos[None], sin[None])
    rotated = torch.cat((q_embed, q_pass), dim=-1)[0].transpose(0, 1)
    return {
        "name": name,
        "config": cfg_json,
        "rotary_dim": rotary_dim,
        "inv_freq": floats(inv_freq),
        "attention_factor": float(attention_factor),
        "heads": heads,
        "positions": positions.tolist(),
        "x": floats(x),
        "rotated": floats(rotated),
    }


def rope_cases():
    return [
        rope_case("default", 16, {"rope_type": "default", "rope_theta": 10000.0}),
        rope_case("linear_partial", 32, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0,
                                         "partial_rotary_factor": 0.5}),
        rope_case("yarn_gpt_oss", 64, {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                       "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                       "original_max_position_embeddings": 4096}, 131072),
        rope_case("yarn_truncate", 64, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 2048}, 8192),
        rope_case("yarn_mscale", 32, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                      "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
                                      "original_max_position_embeddings": 4096}, 163840),
        rope_case("yarn_attention_factor_partial", 32,
                  {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "attention_factor": 1.25,
                   "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.75}, 8192),
        rope_case("llama3", 32, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192}, 131072),
    ]


def attention_fixture():
    torch.manual_seed(0)
    window, T = 5, 13
    config = GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=window, attention_bias=True,
        max_position_embeddings=131072, vocab_size=64, intermediate_size=16, num_local_experts=4,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})
    config._attn_implementation = "eager"
    rotary = gpt_oss.GptOssRotaryEmbedding(config)
    x = torch.randn(1, T, config.hidden_size)
    position_ids = torch.arange(T)[None]
    cos, sin = rotary(x, position_ids)
    layers = []
    for layer_idx in range(2):
        attn = gpt_oss.GptOssAttention(config, layer_idx).eval()
        with torch.no_grad():
            for p in attn.parameters():
                p.copy_(torch.randn_like(p) * 0.5)
            attn.sinks.copy_(torch.randn(config.num_attention_heads) * 2.0)
        kind = config.layer_types[layer_idx]
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if kind == "sliding_attention":
            allowed = allowed & (i - j < window)  # transformers' sliding window: q_idx - kv_idx < window
        mask = torch.zeros(T, T).masked_fill(~allowed, float("-inf"))[None, None]
        with torch.no_grad():
            out, _ = attn(x, (cos, sin), attention_mask=mask)
        layers.append({
            "kind": kind,
            "window": window if kind == "sliding_attention" else 0,
            "q_weight": floats(attn.q_proj.weight), "q_bias": floats(attn.q_proj.bias),
            "k_weight": floats(attn.k_proj.weight), "k_bias": floats(attn.k_proj.bias),
            "v_weight": floats(attn.v_proj.weight), "v_bias": floats(attn.v_proj.bias),
            "o_weight": floats(attn.o_proj.weight), "o_bias": floats(attn.o_proj.bias),
            "sinks": floats(attn.sinks),
            "out": floats(out[0]),
        })
    return {
        "config": {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                   "max_position_embeddings": 131072, "rope_parameters": config.rope_parameters},
        "tokens": T,
        "x": floats(x[0]),
        "layers": layers,
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "rope.json"), "w") as f:
        json.dump({"cases": rope_cases()}, f)
    with open(os.path.join(OUT, "attention.json"), "w") as f:
        json.dump(attention_fixture(), f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
