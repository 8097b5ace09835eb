#!/usr/bin/env python3
"""GLM-4.5+ (Glm4MoeForCausalLM) fixtures, with transformers' Glm4MoeForCausalLM as the oracle.

Run: /work/venv/bin/python tools/make_glm4_moe_fixtures.py [--out tests/data/models]

Two tiny random models, their weights rounded to bf16 and saved as BF16 (config.json in GLM's published form),
exercising every branch of the architecture:
  glm4-moe-a/     layers dense, MoE (first_k_dense_replace 1) + one MTP layer (num_nextn_predict_layers 1:
                  model.layers.2.* — a whole decoder layer plus embed_tokens, enorm, hnorm, eh_proj,
                  shared_head.{norm,head}, as GLM publishes it; transformers does not build it and our loader
                  must skip it); QKV biases (attention_bias), use_qk_norm, partial_rotary_factor 0.25 at the top
                  level (v4 form), 8 routed experts top-3 in n_group 4 / topk_group 2, 2 shared experts,
                  norm_topk_prob, routed_scaling_factor 2.5, a non-zero e_score_correction_bias; the experts fused
                  (mlp.experts.gate_up_proj [E, 2I, H] + down_proj [E, H, I], transformers v5's layout).
  glm4-moe-b/     layers dense, dense, MoE (first_k_dense_replace 2), no MTP layer, no biases, no qk norm, one kv
                  head, partial_rotary_factor absent (Glm4MoeConfig's default 0.5), rope_parameters (v5 form),
                  top-2 of 8 experts in one group, 1 shared expert, norm_topk_prob false; per-expert tensors
                  (mlp.experts.<e>.{gate,up,down}_proj.weight, the layout GLM publishes).
  glm4-moe-b-fp8/ glm4-moe-b in GLM's published FP8 layout (DeepSeek's block FP8: quantization_config
                  {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size [128, 128],
                  modules_to_not_convert}; every attention, dense-MLP, routed- and shared-expert linear is
                  weight F8_E4M3 + weight_scale_inv F32 (transformers' Fp8Quantize); the router mlp.gate, norms,
                  correction bias, embeddings and lm_head stay BF16).
  glm4-moe-lite-a/ Glm4MoeLiteForCausalLM (GLM-4.7-Flash: MLA attention on GLM's MoE): q_lora_rank, interleaved
                  RoPE, YaRN with mscale / mscale_all_dim, mlp_layer_types dense then sparse, 2 groups; per-expert.
  glm4-moe-lite-b/ q_proj (q_lora_rank null), RoPE not interleaved, default RoPE, one MoE layer, v_head_dim !=
                  qk_nope_head_dim, norm_topk_prob false; fused experts. (Two prompts each.)
  <name>.expected.safetensors: transformers in fp32 on those weights (on the dequantised weights for -fp8):
                  prefill logits of every prompt position, 8 greedy decode steps through its KV cache, greedy
                  ids (tools/make_fixtures.py's layout).
transformers itself loads glm4-moe-a (from_pretrained, with the MTP tensors present) and must reproduce the
logits computed on the state dict: that checks the published names and that the MTP tensors are extra.
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
from make_fixtures import DECODE_STEPS, run_prompts, save_expected  # noqa: E402
from make_quant_model_fixtures import quantize_fp8  # noqa: E402

from transformers import AutoConfig, Glm4MoeForCausalLM, Glm4MoeLiteForCausalLM  # noqa: E402
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer  # noqa: E402

PROMPT_LENGTHS = [5, 11, 17]
VOCAB = 64


def config_a():
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": [1, 2],
        "pad_token_id": 1,
        "first_k_dense_replace": 1,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 48,
        "max_position_embeddings": 128,
        "moe_intermediate_size": 8,
        "n_group": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 3,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False,
        "topk_group": 2,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_qk_norm": True,
        "vocab_size": VOCAB,
    }


def config_b():
    return {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": False,
        "eos_token_id": 2,
        "first_k_dense_replace": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "intermediate_size": 32,
        "max_position_embeddings": 128,
        "moe_intermediate_size": 8,
        "n_group": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "norm_topk_prob": False,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 3,
        "num_key_value_heads": 1,
        "num_nextn_predict_layers": 0,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "dtype": "bfloat16",
        "use_qk_norm": False,
        "vocab_size": VOCAB,
    }


def config_lite_a():
    """GLM-4.7-Flash's form: MLA with q_lora, interleaved RoPE, YaRN with mscale_all_dim (softmax scale)."""
    return {
        "architectures": ["Glm4MoeLiteForCausalLM"],
        "model_type": "glm4_moe_lite",
        "attention_bias": False,
        "eos_token_id": [1, 2],
        "pad_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": 32,
        "intermediate_size": 32,
        "kv_lora_rank": 16,
        "max_position_embeddings": 128,
        "mlp_layer_types": ["dense", "sparse"],
        "moe_intermediate_size": 8,
        "n_group": 2,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "q_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "rms_norm_eps": 1e-05,
        "rope_interleave": True,
        "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                            "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0},
        "routed_scaling_factor": 1.8,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "dtype": "bfloat16",
        "v_head_dim": 8,
        "vocab_size": VOCAB,
    }


def config_lite_b():
    """No q_lora (q_proj), RoPE not interleaved, default RoPE, every layer MoE, norm_topk_prob false."""
    cfg = config_lite_a()
    cfg.update({"q_lora_rank": None, "rope_interleave": False, "mlp_layer_types": ["sparse"], "num_hidden_layers": 1,
                "n_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0, "v_head_dim": 12,
                "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}})
    return cfg


def randomize(params, seed):
    """Weights large enough that logits and router choices are well separated."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in params:
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("experts.gate_up_proj"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[2]))  # [E, 2I, H]
            elif name.endswith("experts.down_proj"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[2]))  # [E, H, I]
            else:
                gain = 3.0 if name.endswith("gate.weight") else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


class RouterMargins:
    """Smallest gap in the router's choices (a tie would make them, and so the logits, hinge on rounding):
    between the topk_group-th and next group score, and between the k-th and next selection score among the
    kept groups."""

    def __init__(self, model):
        self.smallest = float("inf")
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        logits = output[0].float()
        s = logits.sigmoid() + module.e_score_correction_bias
        G, E = module.num_group, module.num_experts
        groups = s.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
        if module.topk_group < G:
            gv = groups.sort(dim=-1, descending=True).values
            self.smallest = min(self.smallest, (gv[:, module.topk_group - 1] - gv[:, module.topk_group]).min().item())
        keep = torch.zeros_like(groups).scatter_(1, groups.topk(module.topk_group, dim=-1)[1], 1)
        mask = keep.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
        v = s.masked_fill(~mask, float("-inf")).sort(dim=-1, descending=True).values
        self.smallest = min(self.smallest, (v[:, module.top_k - 1] - v[:, module.top_k]).min().item())


def write_dir(directory, cfg, tensors):
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})


def load_hf(directory):
    config = AutoConfig.from_pretrained(directory)
    config._attn_implementation = "eager"
    cls = Glm4MoeLiteForCausalLM if config.model_type == "glm4_moe_lite" else Glm4MoeForCausalLM
    return cls(config).eval().float()


def per_expert(state):
    """transformers' fused experts as GLM's published per-expert tensors (gate rows first in gate_up_proj)."""
    out = {}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix, I = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :I]
                out[f"{prefix}{e}.up_proj.weight"] = t[e, I:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e]
        else:
            out[name] = t
    return out


def fused(state):
    """Per-expert tensors back into transformers' fused state dict."""
    out, experts = {}, {}
    for name, t in state.items():
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            e, proj = rest.split(".")[:2]
            experts.setdefault(prefix, {}).setdefault(int(e), {})[proj] = t
        else:
            out[name] = t
    for prefix, by_expert in experts.items():
        ids = sorted(by_expert)
        out[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]]) for e in ids])
        out[f"{prefix}.mlp.experts.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in ids])
    return out


def mtp_tensors(config, index, seed):
    """One MTP layer as GLM publishes it: a decoder layer plus the MTP projections, shared head and embeddings."""
    layer = Glm4MoeDecoderLayer(config, index)
    H, V = config.hidden_size, config.vocab_size
    extra = {"embed_tokens.weight": torch.zeros(V, H), "enorm.weight": torch.zeros(H),
             "hnorm.weight": torch.zeros(H), "eh_proj.weight": torch.zeros(H, 2 * H),
             "shared_head.norm.weight": torch.zeros(H), "shared_head.head.weight": torch.zeros(V, H)}
    params = [(k, v) for k, v in layer.state_dict().items()] + list(extra.items())
    randomize(params, seed)
    return {f"model.layers.{index}.{k}": v for k, v in params}


def oracle(directory, state, prompts, name, out_dir):
    model = load_hf(directory)
    model.load_state_dict(state)
    margins = RouterMargins(model)
    results, gap = run_prompts(model, prompts)
    print(f"{name}: smallest greedy logit gap {gap:.4g}, smallest router choice gap {margins.smallest:.4g}")
    save_expected(os.path.join(out_dir, f"{name}.expected.safetensors"), prompts, results)
    return results


def check_transformers_loader(directory, prompts, results):
    model = Glm4MoeForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    theirs, _ = run_prompts(model, prompts)
    for (p0, d0, g0), (p1, d1, g1) in zip(results, theirs):
        assert g0 == g1, (g0, g1)
        assert torch.equal(p0, p1) and torch.equal(d0, d1), ((p0 - p1).abs().max(), (d0 - d1).abs().max())
    print(f"{directory}: transformers' from_pretrained gives identical logits (MTP tensors ignored)")


def make_model(out_dir, name, cfg, seed, layout, prompts):
    directory = os.path.join(out_dir, name)
    write_dir(directory, cfg, {})
    master = load_hf(directory)
    randomize(list(master.state_dict().items()), seed)
    state = {k: v.to(torch.bfloat16) for k, v in master.state_dict().items()}  # the bf16 model
    tensors = per_expert(state) if layout == "per_expert" else dict(state)
    for i in range(cfg.get("num_nextn_predict_layers", 0)):
        tensors.update({k: v.to(torch.bfloat16)
                        for k, v in mtp_tensors(master.config, cfg["num_hidden_layers"] + i, seed + 1 + i).items()})
    write_dir(directory, cfg, tensors)
    state32 = {k: v.float() for k, v in state.items()}
    results = oracle(directory, state32, prompts, name, out_dir)
    return state32, results


def make_fp8(out_dir, name, cfg, state32, prompts):
    plain = per_expert(state32)
    tensors, dq = {}, {}
    for k, v in plain.items():
        # Attention, dense MLP, routed and shared experts; not the router (mlp.gate), lm_head, norms, biases.
        if k.endswith("_proj.weight"):
            q, dq[k] = quantize_fp8(v)
            tensors[k] = q["weight"]
            tensors[k[: -len("weight")] + "weight_scale_inv"] = q["weight_scale_inv"]
        else:
            tensors[k] = v.to(torch.bfloat16)
            dq[k] = v
    qcfg = dict(cfg, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                          "weight_block_size": [128, 128],
                                          "modules_to_not_convert": ["lm_head", "mlp.gate"]})
    write_dir(os.path.join(out_dir, name), qcfg, tensors)
    oracle(os.path.join(out_dir, name), fused(dq), prompts, name, out_dir)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models"))
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(4242)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    _, results_a = make_model(args.out, "glm4-moe-a", config_a(), 11, "fused", prompts)
    check_transformers_loader(os.path.join(args.out, "glm4-moe-a"), prompts, results_a)
    state_b, _ = make_model(args.out, "glm4-moe-b", config_b(), 12, "per_expert", prompts)
    make_fp8(args.out, "glm4-moe-b-fp8", config_b(), state_b, prompts)
    make_model(args.out, "glm4-moe-lite-a", config_lite_a(), 13, "per_expert", prompts[:2])
    make_model(args.out, "glm4-moe-lite-b", config_lite_b(), 14, "fused", prompts[:2])
    assert DECODE_STEPS == 8


if __name__ == "__main__":
    main()
