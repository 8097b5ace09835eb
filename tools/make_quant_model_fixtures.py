#!/usr/bin/env python3
"""Tiny Qwen3-MoE checkpoints in each quantized format and transformers' logits for them (the oracle of
tests/llm/test_quantized_models.cpp).

Run: /work/venv/bin/python tools/make_quant_model_fixtures.py [--out tests/data/models]

One random model (tools/make_fixtures.py's tied-sparse shapes widened so every linear divides into the
formats' blocks, and hidden_size 160 so FP8's 128x128 blocks have partial edges in both dimensions) is rounded
to bf16, then written in the exact published layouts (tensors quantized in PyTorch with the published reference
formulas, the quantizers of tools/make_quant_fixtures.py):
  quant-fp8/             DeepSeek FP8 block: config.json quantization_config {quant_method fp8, fmt e4m3,
                         activation_scheme dynamic, weight_block_size [128, 128], modules_to_not_convert};
                         every linear but the router and lm_head: weight F8_E4M3 [N, K] + weight_scale_inv F32
                         [ceil(N/128), ceil(K/128)] (transformers' Fp8Quantize; element (i, j) takes scale
                         [i // 128, j // 128], DeepSeek's rule); per-expert tensors.
  quant-mxfp4/           gpt-oss MXFP4: quantization_config {quant_method mxfp4, modules_to_not_convert}; the
                         routed experts only (as gpt-oss), fused: mlp.experts.gate_up_proj_blocks U8
                         [E, 2I, H/32, 16] + gate_up_proj_scales U8 [E, 2I, H/32] (E8M0), down_proj_blocks /
                         down_proj_scales (triton_kernels' downcast_to_mxfp_torch: ROUND_UP scale, RTNE nibbles,
                         low nibble = even element); Qwen3's row order (gate rows, then up rows).
  quant-nvfp4-modelopt/  ModelOpt NVFP4: hf_quant_config.json {quant_algo NVFP4, group_size 16,
                         exclude_modules}; every linear but the router and lm_head: weight U8 [N, K/2],
                         weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 scalar, input_scale F32 scalar;
                         q/k/v of a layer and gate/up of an MLP or expert share weight_scale_2 (as ModelOpt
                         exports them for fused kernels); per-expert tensors.
  quant-nvfp4-ct/        the same NVFP4 codes in compressed-tensors naming: config.json quantization_config
                         {quant_method compressed-tensors, format nvfp4-pack-quantized, ignore}; weight_packed,
                         weight_scale, weight_global_scale = 1 / weight_scale_2 (stored inverted).
  quant-<format>.expected.safetensors: transformers' Qwen3MoeForCausalLM in fp32 on the dequantised weights
                         (the other tensors bf16 widened to f32): prefill logits of every prompt position, greedy
                         decode steps through its KV cache, greedy ids (tools/make_fixtures.py's layout). The two
                         NVFP4 layouts hold the same values and share quant-nvfp4.expected.safetensors.
"""
import argparse
import json
import os
import shutil
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import RouterMargins, base_config, hf_tensors, load_hf, load_hf_from_cfg, randomize, run_prompts, \
    save_expected  # noqa: E402
from make_quant_fixtures import E2M1, e2m1_modelopt, e2m1_triton_rtne, pack_nibbles, unpack_nibbles  # noqa: E402

PROMPT_LENGTHS = [5, 11, 17]
NOT_CONVERTED = ["lm_head", "mlp.gate"]  # the router and the (tied) output layer stay bf16


def quantize_fp8(w):
    """transformers' Fp8Quantize on W zero-padded to whole 128 blocks (padding leaves each block's amax as it is),
    cropped back; dequantised by DeepSeek's rule."""
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    rows, cols = w.shape
    pr, pc = -(-rows // 128) * 128, -(-cols // 128) * 128
    padded = torch.zeros(pr, pc)
    padded[:rows, :cols] = w
    cfg = SimpleNamespace(weight_block_size=(128, 128), scale_fmt=None)
    out = Fp8Quantize(SimpleNamespace(quantization_config=cfg))._quantize_one("l.weight", padded)
    q = out["l.weight"][:rows, :cols].contiguous()
    s = out["l.weight_scale_inv"].float().contiguous()
    dq = q.float() * s.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]
    return {"weight": q, "weight_scale_inv": s}, dq


def quantize_mxfp4(w):
    """triton_kernels' downcast_to_mxfp_torch (as tools/make_quant_fixtures.py): blocks [N, K/32, 16], scales."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    ds = g.abs().amax(-1, keepdim=True) / 6.0
    rounded_int = (ds.view(torch.int32) + 0x007FFFFF) & 0x7F800000
    rounded = rounded_int.view(torch.float32)
    qscale = torch.where(rounded == 0, torch.tensor(0.0), 1.0 / rounded)
    codes = e2m1_triton_rtne((g * qscale).reshape(rows, cols))
    blocks = pack_nibbles(codes).view(rows, cols // 32, 16)
    scales = (rounded_int.squeeze(-1) >> 23).to(torch.uint8)
    dq = (E2M1[unpack_nibbles(blocks.reshape(rows, cols // 2)).long()].view(rows, cols // 32, 32)
          * scales.view(torch.float8_e8m0fnu).float().unsqueeze(-1)).reshape(rows, cols)
    return blocks, scales, dq


def quantize_nvfp4(w, ws2):
    """ModelOpt NVFP4QTensor with the given per-tensor scale weight_scale_2 (shared by fused partners)."""
    rows, cols = w.shape
    g = w.view(rows, cols // 16, 16)
    pbs = g.abs().amax(-1).float() / (6.0 * ws2)
    pbs[pbs == 0] = 1.0
    ws = pbs.to(torch.float8_e4m3fn)
    codes = e2m1_modelopt((g / (ws.float() * ws2).unsqueeze(-1)).reshape(rows, cols))
    packed = pack_nibbles(codes)
    dq = (E2M1[unpack_nibbles(packed).long()].view(rows, cols // 16, 16) * (ws.float() * ws2).unsqueeze(-1)).reshape(
        rows, cols)
    return packed, ws, dq


def nvfp4_global_scale(*ws):
    return max(w.abs().amax().float() for w in ws) / (6.0 * 448.0)


def linear_groups(names):
    """Linears that share an NVFP4 global scale: q/k/v of a layer, gate/up of an MLP or expert."""
    groups, seen = [], set()
    for n in names:
        if n in seen:
            continue
        for a, partners in ((".q_proj.", (".q_proj.", ".k_proj.", ".v_proj.")), (".gate_proj.", (".gate_proj.", ".up_proj."))):
            if a in n:
                group = [n.replace(a, p) for p in partners]
                break
        else:
            group = [n]
        groups.append(group)
        seen.update(group)
    return groups


def is_quantized_linear(name):
    return name.endswith("_proj.weight")  # attention, dense MLP and expert projections; not the router or lm_head


def write_dir(directory, cfg, tensors, extra_files=None):
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name, content in (extra_files or {}).items():
        with open(os.path.join(directory, name), "w") as f:
            json.dump(content, f, indent=2, sort_keys=True)
            f.write("\n")
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(directory, "model.safetensors"),
              metadata={"format": "pt"})


def per_expert_to_state(dq, cfg, state):
    """The dequantised per-expert tensors back into transformers' fused state dict (gate rows, then up rows)."""
    out = dict(state)
    for key in state:
        if not key.endswith("mlp.experts.gate_up_proj"):
            continue
        prefix = key[: -len("gate_up_proj")]
        E = state[key].shape[0]
        out[key] = torch.stack([torch.cat([dq[f"{prefix}{j}.gate_proj.weight"], dq[f"{prefix}{j}.up_proj.weight"]])
                                for j in range(E)])
        out[prefix + "down_proj"] = torch.stack([dq[f"{prefix}{j}.down_proj.weight"] for j in range(E)])
    for key, value in dq.items():
        if key in out:
            out[key] = value
    return out


def oracle(directory, cfg, state, prompts, name, out_dir):
    model = load_hf(directory, torch.float32)
    model.load_state_dict(state)
    margins = RouterMargins(model, cfg["num_experts_per_tok"])
    results, gap = run_prompts(model, prompts)
    print(f"{name}: smallest greedy logit gap {gap:.4g}, smallest router top-k gap {margins.smallest:.4g}")
    save_expected(os.path.join(out_dir, f"{name}.expected.safetensors"), prompts, results)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models"))
    args = parser.parse_args()
    out = args.out
    cfg = base_config(hidden_size=160, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                      torch_dtype="bfloat16")  # layers: sparse, dense (mlp_only_layers [1])
    master = load_hf_from_cfg(cfg)
    randomize(master, 3)
    state = {k: v.to(torch.bfloat16).float() for k, v in master.state_dict().items()}  # the bf16 model
    plain = hf_tensors(state, cfg, "per_expert")  # per-expert names, tied lm_head dropped
    g = torch.Generator().manual_seed(4321)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    bf16 = {k: v.to(torch.bfloat16) for k, v in plain.items()}

    # FP8 block.
    tensors, dq = dict(bf16), {}
    for name in plain:
        if is_quantized_linear(name):
            q, dq[name] = quantize_fp8(plain[name])
            del tensors[name]
            tensors[name] = q["weight"]
            tensors[name[: -len("weight")] + "weight_scale_inv"] = q["weight_scale_inv"]
    fp8_cfg = dict(cfg, quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                             "weight_block_size": [128, 128],
                                             "modules_to_not_convert": NOT_CONVERTED})
    write_dir(os.path.join(out, "quant-fp8"), fp8_cfg, tensors)
    oracle(os.path.join(out, "quant-fp8"), cfg, per_expert_to_state(dq, cfg, state), prompts, "quant-fp8", out)

    # MXFP4 (gpt-oss): the routed experts, fused.
    fused = hf_tensors(state, cfg, "fused")
    tensors = {k: v.to(torch.bfloat16) for k, v in fused.items() if ".mlp.experts." not in k}
    dq_state = dict(state)
    for name, t in fused.items():
        if ".mlp.experts." not in name:
            continue
        parts = [quantize_mxfp4(t[e]) for e in range(t.shape[0])]
        tensors[name + "_blocks"] = torch.stack([p[0] for p in parts])
        tensors[name + "_scales"] = torch.stack([p[1] for p in parts])
        dq_state[name] = torch.stack([p[2] for p in parts])
    mx_cfg = dict(cfg, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED})
    write_dir(os.path.join(out, "quant-mxfp4"), mx_cfg, tensors)
    oracle(os.path.join(out, "quant-mxfp4"), cfg, dq_state, prompts, "quant-mxfp4", out)

    # NVFP4: ModelOpt and compressed-tensors layouts of the same codes.
    modelopt, ct, dq = dict(bf16), dict(bf16), {}
    for group in linear_groups([n for n in plain if is_quantized_linear(n)]):
        ws2 = nvfp4_global_scale(*[plain[n] for n in group])
        for name in group:
            packed, ws, dq[name] = quantize_nvfp4(plain[name], ws2)
            module = name[: -len(".weight")]
            del modelopt[name], ct[name]
            modelopt[name] = packed
            modelopt[module + ".weight_scale"] = ws
            modelopt[module + ".weight_scale_2"] = ws2.clone().reshape([])
            modelopt[module + ".input_scale"] = torch.tensor(1.0 / (6.0 * 448.0))
            ct[module + ".weight_packed"] = packed
            ct[module + ".weight_scale"] = ws
            ct[module + ".weight_global_scale"] = (1.0 / ws2).clone().reshape([1])
            ct[module + ".input_global_scale"] = torch.tensor([6.0 * 448.0])
    hf_quant = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                 "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}}
    write_dir(os.path.join(out, "quant-nvfp4-modelopt"), cfg, modelopt, {"hf_quant_config.json": hf_quant})
    group = {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
             "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                         "symmetric": True, "dynamic": False},
             "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                   "symmetric": True, "dynamic": "local"}}
    ct_cfg = dict(cfg, quantization_config={"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                            "config_groups": {"group_0": group},
                                            "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"})
    write_dir(os.path.join(out, "quant-nvfp4-ct"), ct_cfg, ct)
    oracle(os.path.join(out, "quant-nvfp4-modelopt"), cfg, per_expert_to_state(dq, cfg, state), prompts,
           "quant-nvfp4", out)
    for d in ("quant-fp8", "quant-mxfp4", "quant-nvfp4-modelopt", "quant-nvfp4-ct"):
        size = sum(os.path.getsize(os.path.join(out, d, f)) for f in os.listdir(os.path.join(out, d)))
        print(f"{d}: {size} bytes")


if __name__ == "__main__":
    main()
