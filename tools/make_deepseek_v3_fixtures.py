#!/usr/bin/env python3
"""DeepSeek-V3 / Kimi-K2 fixtures, with transformers' DeepseekV3ForCausalLM (fp32, eager attention) as the oracle.

Run: /work/venv/bin/python tools/make_deepseek_v3_fixtures.py [--out tests/data/deepseek_v3]

Writes tiny checkpoints (BF16 weights, per-expert tensors as DeepSeek publishes them) and, per checkpoint,
<name>.expected.safetensors: transformers in fp32 on the BF16 weights, prefill logits of every prompt position, 8
greedy decode steps through its KV cache, greedy ids (the layout of tests/llm/model_oracle.hpp).
  ds-qlora/    q_lora_rank on (q_a_proj → q_a_layernorm → q_b_proj); 1 dense layer then 2 MoE layers; 8 experts in
               4 groups, topk_group 2 (< n_group), top-3; 2 shared experts; YaRN with mscale = mscale_all_dim
               = 0.707 (softmax scale · mscale²; the RoPE attention factor 1); rope_interleave on; random
               e_score_correction_bias; routed_scaling_factor 2.5; one MTP layer's tensors (model.layers.3.*, which
               transformers does not run) that the loader must skip.
  ds-noqlora/  q_lora_rank null (q_proj); 2 layers, the first dense; one group; norm_topk_prob false; plain RoPE
               (rotate_half, rope_interleave false); mscale 1.0 / mscale_all_dim 0.8 YaRN (attention factor ≠ 1).
  ds-v32/      DeepseekV32ForCausalLM (deepseek_v32): the same MLA/MoE plus the lightning indexer's tensors; index_topk
               32 is longer than every prompt + decode (20 tokens), where the indexer keeps every position and dense
               MLA is exact.
  kimi/        model_type kimi_k2 (architectures DeepseekV3ForCausalLM): one group, first_k_dense_replace 1,
               YaRN as Kimi-K2 publishes it (mscale = mscale_all_dim = 1).
  ds-fp8/      ds-qlora with every *_proj linear (attention incl. kv_b_proj, dense MLP, experts, shared experts)
               FP8 block-quantized as DeepSeek publishes it (weight_scale_inv per 128×128); the oracle runs on the
               dequantised weights.
"""
import argparse
import json
import math
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import run_prompts, save_expected  # noqa: E402
from make_quant_model_fixtures import quantize_fp8  # noqa: E402

from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, DeepseekV32Config, DeepseekV32ForCausalLM  # noqa: E402

PROMPT_LENGTHS = [5, 12]
VOCAB = 96


def base(**over):
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": VOCAB,
        "hidden_size": 16,
        "intermediate_size": 32,
        "moe_intermediate_size": 8,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 2,
        "n_routed_experts": 8,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "qk_nope_head_dim": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
        "rope_interleave": True,
        "attention_bias": False,
        "num_nextn_predict_layers": 1,
        "torch_dtype": "bfloat16",
    }
    cfg.update(over)
    return cfg


def hf_model(cfg):
    args = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype", "rope_scaling",
                                                      "rope_theta", "num_nextn_predict_layers")}
    rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    if cfg.get("rope_scaling"):
        rope = {k: v for k, v in cfg["rope_scaling"].items() if k != "type"}
        rope["rope_type"] = cfg["rope_scaling"]["type"]
        rope["rope_theta"] = cfg["rope_theta"]
    if cfg["model_type"] == "deepseek_v32":
        args = {k: v for k, v in args.items() if k not in ("rope_interleave",)}
        config = DeepseekV32Config(**args, rope_parameters=rope)
        config._attn_implementation = "eager"
        return DeepseekV32ForCausalLM(config).eval()
    config = DeepseekV3Config(**args, rope_parameters=rope)
    config._attn_implementation = "eager"
    return DeepseekV3ForCausalLM(config).eval()


def randomize(model, seed):
    """Weights that make logits and router choices well separated; norms away from 1; a correction bias that
    changes which experts win."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "rotary_emb" in name:
                continue
            if name.endswith("k_norm.bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                p.copy_(2.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            else:
                gain = 3.0 if name.endswith("gate.weight") else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def published_tensors(state):
    """transformers' state dict in DeepSeek's published names: per-expert gate/up/down instead of the fused
    [E, 2I, H] / [E, H, I] tensors."""
    out = {}
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :inter]
                out[f"{p}{e}.up_proj.weight"] = v[e, inter:]
        elif k.endswith("mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e]
        else:
            out[k] = v
    return out


def state_from_published(tensors, state):
    out = dict(state)
    for k in state:
        if k.endswith("mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            E = state[k].shape[0]
            out[k] = torch.stack([torch.cat([tensors[f"{p}{e}.gate_proj.weight"], tensors[f"{p}{e}.up_proj.weight"]])
                                  for e in range(E)])
            out[p + "down_proj"] = torch.stack([tensors[f"{p}{e}.down_proj.weight"] for e in range(E)])
        elif k in tensors:
            out[k] = tensors[k]
    return out


def mtp_tensors(cfg, g):
    """A few tensors of DeepSeek's MTP layer (model.layers.<num_hidden_layers>.*), which inference skips."""
    p = f"model.layers.{cfg['num_hidden_layers']}."
    H = cfg["hidden_size"]
    return {p + "enorm.weight": torch.ones(H), p + "hnorm.weight": torch.ones(H),
            p + "eh_proj.weight": torch.randn(H, 2 * H, generator=g),
            p + "self_attn.kv_a_layernorm.weight": torch.ones(cfg["kv_lora_rank"])}


def write_dir(directory, cfg, tensors):
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})


class RouterMargins:
    """Smallest gap between the k-th and (k+1)-th selection score the routers saw (a near tie would make the
    choice hinge on rounding)."""

    def __init__(self, model, k):
        self.k, self.smallest = k, float("inf")
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        logits = output[0].float()
        s = (logits.sigmoid() + module.e_score_correction_bias).sort(dim=-1, descending=True).values
        self.smallest = min(self.smallest, (s[:, self.k - 1] - s[:, self.k]).min().item())


def oracle(out_dir, name, cfg, state, prompts):
    model = hf_model(cfg)
    model.load_state_dict(state)
    margins = RouterMargins(model, cfg["num_experts_per_tok"])
    results, gap = run_prompts(model, prompts)
    print(f"{name}: smallest greedy logit gap {gap:.4g}, smallest router top-k gap {margins.smallest:.4g}")
    save_expected(os.path.join(out_dir, f"{name}.expected.safetensors"), prompts, results)


def make(out_dir, name, cfg, seed, prompts, fp8_name=None):
    master = hf_model(cfg)
    randomize(master, seed)
    state = {k: v.to(torch.bfloat16).float() for k, v in master.state_dict().items()}
    tensors = {k: v.to(torch.bfloat16) for k, v in published_tensors(state).items()}
    # transformers keeps the correction bias in f32 (DeepSeek publishes it so).
    tensors.update({k: state[k] for k in state if k.endswith("e_score_correction_bias")})
    g = torch.Generator().manual_seed(seed + 1)
    if cfg.get("num_nextn_predict_layers"):
        tensors.update({k: v.to(torch.bfloat16) for k, v in mtp_tensors(cfg, g).items()})
    write_dir(os.path.join(out_dir, name), cfg, tensors)
    oracle(out_dir, name, cfg, state, prompts)
    if fp8_name is None:
        return
    plain = published_tensors(state)
    q_tensors, dq = dict(tensors), {}
    for k in plain:
        if k.endswith("_proj.weight") or k.endswith("_proj_with_mqa.weight"):
            q, dq[k] = quantize_fp8(plain[k])
            q_tensors[k] = q["weight"]
            q_tensors[k[: -len("weight")] + "weight_scale_inv"] = q["weight_scale_inv"]
    fp8_cfg = dict(cfg, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128]})
    write_dir(os.path.join(out_dir, fp8_name), fp8_cfg, q_tensors)
    oracle(out_dir, fp8_name, cfg, state_from_published(dq, state), prompts)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "deepseek_v3"))
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(2026)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    make(out, "ds-qlora", base(), 11, prompts, fp8_name="ds-fp8")
    make(out, "ds-noqlora",
         base(q_lora_rank=None, num_hidden_layers=2, n_group=1, topk_group=1, norm_topk_prob=False,
              rope_interleave=False, num_nextn_predict_layers=0, n_shared_experts=1,
              rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "mscale": 1.0,
                            "mscale_all_dim": 0.8}), 12, prompts)
    make(out, "ds-v32",
         base(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", num_hidden_layers=2,
              num_nextn_predict_layers=0, n_shared_experts=1, index_topk=32, index_head_dim=16, index_n_heads=2,
              mlp_layer_types=["dense", "sparse"]), 14, prompts)
    make(out, "kimi",
         base(model_type="kimi_k2", num_hidden_layers=2, max_position_embeddings=512, n_group=1, topk_group=1, n_shared_experts=1,
              num_nextn_predict_layers=0,
              rope_scaling={"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 16, "beta_fast": 1.0,
                            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}), 13, prompts)


if __name__ == "__main__":
    main()
