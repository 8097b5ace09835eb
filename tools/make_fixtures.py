#!/usr/bin/env python3
"""Tiny random Qwen3-MoE checkpoints and transformers' logits for them (the oracle of tests/llm/test_qwen3_moe).

Run with the oracle virtualenv (PyPI torch + transformers 5.x + safetensors):
    /work/oracle-venv/bin/python tools/make_fixtures.py [--out tests/data/models]

Writes, under --out:
  tied-sparse/          f32, per-expert expert tensors (what transformers v5 save_pretrained writes), one file,
                        tied lm_head, norm_topk_prob=true, layers: sparse, dense (mlp_only_layers), sparse
  tied-sparse-fused/    the same weights with fused 3-D experts (gate_up_proj [E, 2I, H], gate rows first, and
                        down_proj [E, H, I]: the layout transformers v5 holds in memory), in 2 shards with
                        model.safetensors.index.json
  untied-yarn/          f32, per-expert, untied lm_head, norm_topk_prob=false, decoder_sparse_step=2 (dense,
                        sparse, dense), yarn RoPE
  tied-sparse-bf16/     tied-sparse's weights rounded to bf16, saved as BF16
  rope.expected.safetensors (in --out): transformers' inverse frequencies and attention scaling for rope_scaling
                        types default, linear, dynamic (at a sequence length past max_position_embeddings),
                        yarn (two configurations) and llama3: rope{i}.inv_freq [d/2] F32, rope{i}.attention_scaling
                        [1] F32, with the configs in the metadata (rope{i}.config, JSON).
  <name>.expected.safetensors (in --out): for each prompt p: p{i}.prompt (I32), p{i}.prefill [L, V] (F32
                        logits of every prompt position), p{i}.decode [S, V] (F32 logits of each greedy decode
                        step, run with transformers' KV cache), p{i}.greedy [S] (I32 greedy token ids).
                        For the bf16 checkpoint, p{i}.prefill_bf16 / p{i}.decode_bf16 hold transformers' logits
                        with the model in torch.bfloat16 (greedy ids of the fp32 run are fed to it).

config.json files follow the published Qwen3-MoE checkpoints (num_experts, rope_theta and rope_scaling at the top
level, torch_dtype). transformers reads each back from disk before the logits are computed, so the oracle runs
exactly the configuration our loader sees.
"""
import argparse
import json
import math
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, Qwen3MoeForCausalLM

DECODE_STEPS = 8
PROMPT_LENGTHS = [5, 11, 17]


def base_config(**overrides):
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [1],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "use_cache": True,
    }
    cfg.update(overrides)
    return cfg


def randomize(model, seed):
    """Weights large enough that logits and router scores are well separated (the default 0.02 init makes
    nearly uniform logits whose greedy choice would hinge on rounding)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                gain = 3.0 if name.endswith("mlp.gate.weight") else 1.0
                p.copy_(gain * torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def hf_tensors(state, cfg, layout):
    """The checkpoint's tensors by name (from transformers' state dict): expert tensors per expert or fused."""
    sd = {k: v.detach().clone().contiguous() for k, v in state.items()}
    if cfg["tie_word_embeddings"]:
        sd.pop("lm_head.weight", None)
    out = {}
    for name, t in sd.items():
        if ".mlp.experts." not in name:
            out[name] = t
            continue
        prefix, what = name.rsplit(".", 1)  # model.layers.{i}.mlp.experts, gate_up_proj | down_proj
        inter = cfg["moe_intermediate_size"]
        if layout == "fused":
            out[name] = t
        elif what == "gate_up_proj":
            for j in range(t.shape[0]):
                out[f"{prefix}.{j}.gate_proj.weight"] = t[j, :inter].contiguous()
                out[f"{prefix}.{j}.up_proj.weight"] = t[j, inter:].contiguous()
        elif what == "down_proj":
            for j in range(t.shape[0]):
                out[f"{prefix}.{j}.down_proj.weight"] = t[j].contiguous()
        else:
            raise ValueError(name)
    return out


def write_checkpoint(directory, cfg, tensors, shards, dtype):
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    tensors = {k: v.to(dtype).contiguous() for k, v in sorted(tensors.items())}
    if shards == 1:
        save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    weight_map = {}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    for s in range(shards):
        part = names[s * len(names) // shards:(s + 1) * len(names) // shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")


def load_hf(directory, dtype):
    """transformers' model from our config.json, with the weights of our checkpoint."""
    config = AutoConfig.from_pretrained(directory)
    config._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(config).eval()
    return model.to(dtype)


class RouterMargins:
    """Smallest gap between the k-th and (k+1)-th router probability seen (a tie would make the expert
    choice, and so the logits, depend on rounding)."""

    def __init__(self, model, k):
        self.k, self.smallest = k, float("inf")
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        logits = output[0].float()
        probs = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True).values
        self.smallest = min(self.smallest, (probs[:, self.k - 1] - probs[:, self.k]).min().item())


def run_prompts(model, prompts, forced=None):
    """Prefill logits of every position, then DECODE_STEPS greedy steps through the KV cache."""
    results = []
    min_gap = float("inf")
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            out = model(input_ids=ids, use_cache=True)
            prefill = out.logits[0].float()
            cache = out.past_key_values
            last = prefill[-1]
            decode, greedy = [], []
            for step in range(DECODE_STEPS):
                top2 = last.topk(2).values
                min_gap = min(min_gap, (top2[0] - top2[1]).item())
                tok = int(last.argmax()) if forced is None else forced[i][step]
                greedy.append(tok)
                out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                last = out.logits[0, -1].float()
                decode.append(last)
            results.append((prefill, torch.stack(decode), greedy))
    return results, min_gap


def make_model(out_dir, name, cfg, seed, layouts, prompts, bf16_copy=None):
    master = load_hf_from_cfg(cfg)
    randomize(master, seed)
    for directory, layout, shards in layouts:
        write_checkpoint(os.path.join(out_dir, directory), cfg, hf_tensors(master.state_dict(), cfg, layout), shards,
                         torch.float32)
    # The oracle reads the first checkpoint back through transformers' own config parsing.
    model = load_hf(os.path.join(out_dir, layouts[0][0]), torch.float32)
    model.load_state_dict(master.state_dict())
    margins = RouterMargins(model, cfg["num_experts_per_tok"])
    results, gap = run_prompts(model, prompts)
    print(f"{name}: smallest greedy logit gap {gap:.4g}, smallest router top-k gap {margins.smallest:.4g}")
    save_expected(os.path.join(out_dir, f"{name}.expected.safetensors"), prompts, results)

    if bf16_copy:
        bcfg = dict(cfg, torch_dtype="bfloat16")
        rounded = {k: v.to(torch.bfloat16) for k, v in master.state_dict().items()}
        write_checkpoint(os.path.join(out_dir, bf16_copy), bcfg, hf_tensors(rounded, cfg, "per_expert"), 1,
                         torch.bfloat16)
        model32 = load_hf(os.path.join(out_dir, bf16_copy), torch.float32)
        model32.load_state_dict({k: v.float() for k, v in rounded.items()})
        results32, gap32 = run_prompts(model32, prompts)
        model16 = load_hf(os.path.join(out_dir, bf16_copy), torch.bfloat16)
        model16.load_state_dict(rounded)
        forced = [r[2] for r in results32]
        results16, _ = run_prompts(model16, prompts, forced=forced)
        print(f"{bf16_copy}: smallest greedy logit gap (fp32 on bf16 weights) {gap32:.4g}")
        save_expected(os.path.join(out_dir, f"{bf16_copy}.expected.safetensors"), prompts, results32,
                      extra=results16)


def load_hf_from_cfg(cfg):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        return load_hf(tmp, torch.float32)


def save_expected(path, prompts, results, extra=None):
    tensors = {}
    for i, (prompt, (prefill, decode, greedy)) in enumerate(zip(prompts, results)):
        tensors[f"p{i}.prompt"] = torch.tensor(prompt, dtype=torch.int32)
        tensors[f"p{i}.prefill"] = prefill.contiguous()
        tensors[f"p{i}.decode"] = decode.contiguous()
        tensors[f"p{i}.greedy"] = torch.tensor(greedy, dtype=torch.int32)
        if extra is not None:
            tensors[f"p{i}.prefill_bf16"] = extra[i][0].contiguous()
            tensors[f"p{i}.decode_bf16"] = extra[i][1].contiguous()
    save_file(tensors, path, metadata={"decode_steps": str(DECODE_STEPS)})


ROPE_CASES = [
    ({"rope_theta": 1000000.0}, None),
    ({"rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.5}}, None),
    ({"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 700),
    ({"rope_theta": 1000000.0,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, None),
    ({"rope_theta": 50000.0,
      "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16,
                       "beta_slow": 2, "attention_factor": 1.25}}, None),
    ({"rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, None),
]


def make_rope_fixtures(out_dir):
    """What transformers' Qwen3MoeRotaryEmbedding computes (dynamic: after a forward at position seq_len - 1)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRotaryEmbedding

    tensors, meta = {}, {}
    for i, (overrides, seq_len) in enumerate(ROPE_CASES):
        cfg = base_config(head_dim=128, max_position_embeddings=512, **overrides)
        config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "model_type"}, model_type="qwen3_moe")
        rope = Qwen3MoeRotaryEmbedding(config)
        if seq_len is not None:
            rope(torch.zeros(1, dtype=torch.float32), torch.tensor([[seq_len - 1]]))
        tensors[f"rope{i}.inv_freq"] = rope.inv_freq.float().contiguous()
        tensors[f"rope{i}.attention_scaling"] = torch.tensor([float(rope.attention_scaling)], dtype=torch.float32)
        meta[f"rope{i}.config"] = json.dumps(dict(cfg, seq_len=seq_len or 0))
    save_file(tensors, os.path.join(out_dir, "rope.expected.safetensors"), metadata=meta)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "models"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    make_rope_fixtures(args.out)
    g = torch.Generator().manual_seed(1234)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]

    make_model(args.out, "tied-sparse", base_config(), seed=1,
               layouts=[("tied-sparse", "per_expert", 1), ("tied-sparse-fused", "fused", 2)], prompts=prompts,
               bf16_copy="tied-sparse-bf16")
    yarn = base_config(
        tie_word_embeddings=False,
        norm_topk_prob=False,
        decoder_sparse_step=2,
        mlp_only_layers=[],
        rope_theta=50000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    )
    make_model(args.out, "untied-yarn", yarn, seed=2, layouts=[("untied-yarn", "per_expert", 1)],
               prompts=prompts)


if __name__ == "__main__":
    main()
