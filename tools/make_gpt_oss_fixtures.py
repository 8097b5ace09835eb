#!/usr/bin/env python3
"""gpt-oss fixtures, with transformers' GptOss modules as the oracle.

Run: /work/venv/bin/python tools/make_gpt_oss_fixtures.py [--out tests/data]

Writes (all small):
  gpt_oss/experts.safetensors   the MoE parts on their own (tests/test_gpt_oss_moe.cpp): transformers'
                                GptOssTopKRouter and GptOssExperts modules run directly on random inputs large
                                enough that both clamps of the SwiGLU bite. Inputs x [T, H]; router.weight [E, H],
                                router.bias [E]; experts as transformers holds them (gate_up_proj [E, H, 2I], gate
                                at even columns, up at odd; gate_up_proj_bias [E, 2I]; down_proj [E, I, H];
                                down_proj_bias [E, H]); the published MXFP4 codes of the same experts
                                (gate_up_proj_blocks U8 [E, 2I, H/32, 16] + _scales [E, 2I, H/32], down_proj_blocks
                                [E, H, I/32, 16] + _scales); outputs router_logits [T, E], router_scores [T, k],
                                router_indices [T, k] (I32), out [T, H] (experts on the plain weights) and
                                out_mxfp4 [T, H] (experts on the dequantised MXFP4 weights, the same routing).
  models/gpt-oss-bf16/          a tiny GptOssForCausalLM (4 layers: sliding, full, sliding, full; window 6; sinks,
                                attention and expert biases non-zero; YaRN as gpt-oss publishes it; top-4 of 6
                                experts), every tensor BF16, experts fused as transformers saves them.
  models/gpt-oss-mxfp4/         the same model as gpt-oss is published: experts MXFP4 (triton_kernels'
                                downcast_to_mxfp rounding), biases and everything else BF16, quantization_config
                                {quant_method mxfp4, modules_to_not_convert as published}.
  models/gpt-oss-bf16.expected.safetensors   transformers in fp32 on the BF16 weights: prefill logits of every
                                prompt position, 8 greedy decode steps through its KV cache, greedy ids; and the
                                same prompts run by transformers in bf16 (forced to the fp32 greedy ids).
  models/gpt-oss-mxfp4.expected.safetensors  transformers in fp32 on the dequantised MXFP4 experts.
The prompts (up to 19 tokens) are longer than the window, so the sliding layers drop keys during prefill and decode.
The MXFP4 directory is also loaded by transformers itself (Mxfp4Config(dequantize=True), CPU) and its logits must
equal those on our dequantised state: that checks the published layout (blocks' row order, nibble order, the
transposition into GptOssExperts' [E, H, 2I]) against transformers' own loader.
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
from make_quant_model_fixtures import quantize_mxfp4  # noqa: E402

from transformers import AutoConfig, GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssTopKRouter  # noqa: E402

PROMPT_LENGTHS = [5, 13, 19]
# As openai/gpt-oss-20b's config.json lists them.
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def model_config():
    """config.json in the published form (rope_theta + rope_scaling, experts_per_token, layer_types)."""
    layers = 4
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": 2,
        "pad_token_id": 1,
        "experts_per_token": 4,
        "num_experts_per_tok": 4,
        "num_local_experts": 6,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 32,
        "intermediate_size": 32,
        "initial_context_length": 16,
        "initializer_range": 0.02,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "max_position_embeddings": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 16,
                         "rope_type": "yarn", "truncate": False},
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 6,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128,
    }


def randomize(model, seed):
    """Weights large enough that logits and router choices are well separated and the clamps are active."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("sinks"):
                p.copy_(1.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("experts.gate_up_proj"):
                p.copy_(4.0 * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))  # [E, H, 2I]
            elif name.endswith("experts.down_proj"):
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]) / 4.0)  # [E, I, H]
            else:
                gain = 3.0 if name.endswith("router.weight") else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


class RouterMargins:
    """Smallest gap between the k-th and (k+1)-th router logit seen (a tie would make the choice hinge on
    rounding)."""

    def __init__(self, model, k):
        self.k, self.smallest = k, float("inf")
        for layer in model.model.layers:
            layer.mlp.router.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        v = output[0].float().sort(dim=-1, descending=True).values
        self.smallest = min(self.smallest, (v[:, self.k - 1] - v[:, self.k]).min().item())


def mxfp4_experts(gate_up, down):
    """The published MXFP4 tensors of GptOssExperts' weights, and the dequantised weights in its layout.
    gate_up [E, H, 2I] is stored transposed, output rows first: blocks [E, 2I, H/32, 16] (row n = column n of
    gate_up_proj, so gate rows are even and up rows odd); down [E, I, H] as blocks [E, H, I/32, 16]."""
    out, dq_gate_up, dq_down = {}, [], []
    for name, w, dq_list in (("gate_up_proj", gate_up, dq_gate_up), ("down_proj", down, dq_down)):
        blocks, scales = [], []
        for e in range(w.shape[0]):
            b, s, dq = quantize_mxfp4(w[e].t().contiguous().float())
            blocks.append(b)
            scales.append(s)
            dq_list.append(dq.t())
        out[f"{name}_blocks"] = torch.stack(blocks)
        out[f"{name}_scales"] = torch.stack(scales)
    return out, torch.stack(dq_gate_up).contiguous(), torch.stack(dq_down).contiguous()


def write_dir(directory, cfg, tensors):
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})


def load_hf(directory, dtype):
    config = AutoConfig.from_pretrained(directory)
    config._attn_implementation = "eager"
    return GptOssForCausalLM(config).eval().to(dtype)


def run_checked(model, prompts, k, name):
    margins = RouterMargins(model, k)
    results, gap = run_prompts(model, prompts)
    print(f"{name}: smallest greedy logit gap {gap:.4g}, smallest router top-k logit gap {margins.smallest:.4g}")
    return results


def make_models(out_dir):
    cfg = model_config()
    directory = os.path.join(out_dir, "gpt-oss-bf16")
    write_dir(directory, cfg, {})
    master = load_hf(directory, torch.float32)
    assert master.config.layer_types == cfg["layer_types"] and master.config.sliding_window == 6
    assert master.config.rope_parameters["rope_type"] == "yarn", master.config.rope_parameters
    randomize(master, 7)
    state = {k: v.to(torch.bfloat16) for k, v in master.state_dict().items()}
    write_dir(directory, cfg, state)
    g = torch.Generator().manual_seed(99)
    prompts = [torch.randint(3, cfg["vocab_size"], (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    k = cfg["num_experts_per_tok"]

    model32 = load_hf(directory, torch.float32)
    model32.load_state_dict({kk: v.float() for kk, v in state.items()})
    results32 = run_checked(model32, prompts, k, "gpt-oss-bf16 (fp32 on bf16 weights)")
    model16 = load_hf(directory, torch.bfloat16)
    model16.load_state_dict(state)
    results16, _ = run_prompts(model16, prompts, forced=[r[2] for r in results32])
    save_expected(os.path.join(out_dir, "gpt-oss-bf16.expected.safetensors"), prompts, results32, extra=results16)

    # MXFP4 experts, as published.
    qcfg = dict(cfg, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED})
    tensors, dq_state = {}, {kk: v.float() for kk, v in state.items()}
    for name, t in state.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            q, dq_gu, dq_dn = mxfp4_experts(t, state[prefix + "down_proj"])
            tensors.update({prefix + kk: v for kk, v in q.items()})
            dq_state[name], dq_state[prefix + "down_proj"] = dq_gu, dq_dn
        elif not name.endswith("mlp.experts.down_proj"):
            tensors[name] = t
    mdir = os.path.join(out_dir, "gpt-oss-mxfp4")
    write_dir(mdir, qcfg, tensors)
    model = load_hf(directory, torch.float32)
    model.load_state_dict(dq_state)
    results = run_checked(model, prompts, k, "gpt-oss-mxfp4 (fp32 on dequantised experts)")
    save_expected(os.path.join(out_dir, "gpt-oss-mxfp4.expected.safetensors"), prompts, results)
    check_transformers_loader(mdir, prompts, results)


def check_transformers_loader(directory, prompts, results):
    """transformers' own MXFP4 loader (dequantising on the CPU) must reproduce the logits on our dequantised
    state exactly: the published layout is what we think it is."""
    from transformers import Mxfp4Config

    model = GptOssForCausalLM.from_pretrained(directory, quantization_config=Mxfp4Config(dequantize=True),
                                              dtype=torch.float32, attn_implementation="eager").eval()
    theirs, _ = run_prompts(model, prompts)
    for (p0, d0, g0), (p1, d1, g1) in zip(results, theirs):
        assert g0 == g1, (g0, g1)
        assert torch.equal(p0, p1) and torch.equal(d0, d1), ((p0 - p1).abs().max(), (d0 - d1).abs().max())
    print("gpt-oss-mxfp4: transformers' Mxfp4Config(dequantize=True) loader gives identical logits")


def make_moe_parts(out_dir):
    """The router and experts modules alone, f32, with inputs that drive the gate past +7 and up past ±7."""
    T, H, I, E, k = 7, 32, 32, 6, 4
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=k,
                       num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=8)
    g = torch.Generator().manual_seed(2026)
    router = GptOssTopKRouter(cfg).eval()
    experts = GptOssExperts(cfg).eval()
    with torch.no_grad():
        router.weight.copy_(2.0 * torch.randn(E, H, generator=g) / math.sqrt(H))
        router.bias.copy_(0.5 * torch.randn(E, generator=g))
        experts.gate_up_proj.copy_(5.0 * torch.randn(E, H, 2 * I, generator=g) / math.sqrt(H))
        experts.gate_up_proj_bias.copy_(torch.randn(E, 2 * I, generator=g))
        experts.down_proj.copy_(torch.randn(E, I, H, generator=g) / math.sqrt(I))
        experts.down_proj_bias.copy_(0.5 * torch.randn(E, H, generator=g))
        x = torch.randn(T, H, generator=g)
        logits, scores, indices = router(x)
        out = experts(x, indices, scores)
        gu = torch.einsum("th,ehn->ten", x, experts.gate_up_proj) + experts.gate_up_proj_bias
        print(f"experts: gate above +7 in {(gu[..., ::2] > 7).float().mean():.2%} of values, up beyond ±7 in "
              f"{(gu[..., 1::2].abs() > 7).float().mean():.2%}")
        plain = {"gate_up_proj": experts.gate_up_proj.detach().clone(), "down_proj": experts.down_proj.detach().clone()}
        q, dq_gu, dq_dn = mxfp4_experts(experts.gate_up_proj, experts.down_proj)
        experts.gate_up_proj.copy_(dq_gu)
        experts.down_proj.copy_(dq_dn)
        out_mx = experts(x, indices, scores)
    v = logits.sort(dim=-1, descending=True).values
    print(f"router: smallest top-k logit gap {(v[:, k - 1] - v[:, k]).min():.4g}")
    tensors = {
        "x": x,
        "router.weight": router.weight.detach(),
        "router.bias": router.bias.detach(),
        "gate_up_proj": plain["gate_up_proj"],
        "gate_up_proj_bias": experts.gate_up_proj_bias.detach(),
        "down_proj": plain["down_proj"],
        "down_proj_bias": experts.down_proj_bias.detach(),
        "router_logits": logits,
        "router_scores": scores,
        "router_indices": indices.to(torch.int32),
        "out": out,
        "out_mxfp4": out_mx,
    }
    tensors.update(q)
    os.makedirs(os.path.join(out_dir, "gpt_oss"), exist_ok=True)
    save_file({kk: v.contiguous() for kk, v in tensors.items()}, os.path.join(out_dir, "gpt_oss", "experts.safetensors"),
              metadata={"alpha": str(cfg.swiglu_alpha), "limit": str(cfg.swiglu_limit), "top_k": str(k)})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    args = parser.parse_args()
    torch.manual_seed(0)
    make_moe_parts(args.out)
    make_models(os.path.join(args.out, "models"))
    assert DECODE_STEPS == 8


if __name__ == "__main__":
    main()
