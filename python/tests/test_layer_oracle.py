"""xmoe.moe.moe_layer against the dense PyTorch formulation of Tutel's layer (autograd for every gradient).

Every case of tools/make_layer_fixtures.py (top-k 1/2/4/5, capacity factors > 0 / 0 / < 0 with and without
drops, batch-prioritized routing, top and cosine gates, ffn (relu/gelu/silu, with and without biases, another
output_dim) and swiglu experts, pre- and post-score, gate noise with both losses, eval mode; float32, bfloat16,
float64) is built as a Tutel-style module: Tutel parameter names loaded through load_state_dict, y and y.l_aux
from forward, then loss = sum(y * dy) + daux * l_aux and loss.backward(). Metric and tolerances as the C++
oracle test (tests/test_layer_oracle.cpp): err = max|a - b| / max(max|b|, 1e-6) <= 1e-5 (float32),
1e-10 (float64), 3e-2 (bfloat16).
"""

import math

import pytest
import torch

from conftest import float64_default, oracle
from xmoe import moe as tutel_moe

TOL = {"float32": 1e-5, "float64": 1e-10, "bfloat16": 3e-2}
DTYPE = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
ACTIVATION = {"relu": lambda h: torch.nn.functional.relu(h), "gelu": torch.nn.functional.gelu,
              "silu": torch.nn.functional.silu}

# Per-call alignment is not a Tutel constructor argument (Tutel derives it from the overlap degree).
CASES = [c for c in oracle.build_cases() if c["capacity_alignment"] == 1]


def tutel_name(cfg, name, gate_index=0):
    """Tutel's parameter name for an oracle (xmoe) parameter name."""
    gate = {"gate.wg": "wg.weight", "gate.cosine_projector": "cosine_projector.weight",
            "gate.sim_matrix": "sim_matrix", "gate.temperature": "temperature"}
    if name in gate:
        return f"gates.{gate_index}.{gate[name]}"
    return name


def make_layer(cfg, expert_type=None):
    expert_type = expert_type or cfg["expert_type"]
    experts = {"type": expert_type, "count_per_node": cfg["num_experts"],
               "hidden_size_per_expert": cfg["hidden_size"]}
    if expert_type == "ffn":
        experts.update(output_dim=cfg["output_dim"], activation_fn=ACTIVATION[cfg["activation"]],
                       has_fc1_bias=cfg["has_fc1_bias"], has_fc2_bias=cfg["has_fc2_bias"])
    gate = {"type": cfg["gate_type"], "k": cfg["k"], "capacity_factor": cfg["capacity_factor"],
            "gate_noise": cfg["gate_noise"]}
    if cfg["gate_type"] == "cosine_top":
        gate["proj_dim"] = cfg["proj_dim"]
    layer = tutel_moe.moe_layer(gate_type=gate, model_dim=cfg["model_dim"], experts=experts,
                                is_postscore=cfg["is_postscore"],
                                batch_prioritized_routing=cfg["batch_prioritized_routing"],
                                normalize_gate=cfg["normalize_gate"], is_gshard_loss=cfg["is_gshard_loss"])
    return layer.to(DTYPE[cfg["dtype"]]).train(cfg["training"])


def load_oracle_params(layer, cfg, p, expert_type):
    dt = DTYPE[cfg["dtype"]]
    state = {"_num_global_experts": torch.tensor(cfg["num_experts"])}
    for name, v in p.items():
        v = v.to(dt)
        if expert_type == "llama_ffn":
            # Tutel's llama_ffn holds W1 = gate_proj^T, W2 = up_proj^T [E, M, H] and W3 = down_proj^T [E, H, M],
            # flattened.
            name = {"experts.gate_proj": "experts.W_fc1", "experts.up_proj": "experts.W_fc2",
                    "experts.down_proj": "experts.W_fc3"}.get(name, name)
            if name.startswith("experts.W_fc"):
                v = v.transpose(1, 2).reshape(-1)
        state[tutel_name(cfg, name)] = v
    layer.load_state_dict(state, strict=True)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-6)) if b.numel() else 0.0


def noise_for(cfg, seed, T):
    """The draws the layer makes for its gate noise after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    acc = torch.float64 if cfg["dtype"] == "float64" else torch.float32
    return torch.randn(T, cfg["num_experts"], dtype=acc).double()


def run_case(cfg, expert_type=None):
    expert_type = expert_type or cfg["expert_type"]
    with float64_default():
        _, p, x, dy, _ = oracle.build_case(cfg)
        noisy = cfg["training"] and cfg["gate_noise"] > 0
        noise_seed = 1234
        noise = torch.zeros(x.shape[0], cfg["num_experts"])
        if noisy:
            # The layer draws its own noise (torch.randn, as Tutel); find a seed whose draws keep the routing
            # margins the oracle needs.
            for noise_seed in range(1234, 1334):
                noise = noise_for(cfg, noise_seed, x.shape[0])
                _, _, routing = oracle.forward_dense(cfg, p, x, noise)
                if oracle.margin_ok(cfg, routing):
                    break
            else:
                pytest.fail("no noise seed keeps the routing margins")
        y_ref, aux_ref, _, dx_ref, grads_ref = oracle.run_with_grads(oracle.forward_dense, cfg, p, x, dy, noise)

    dt = DTYPE[cfg["dtype"]]
    layer = make_layer(cfg, expert_type)
    load_oracle_params(layer, cfg, p, expert_type)
    xv = x.to(dt).requires_grad_(True)
    torch.manual_seed(noise_seed)
    y = layer(xv, top_k=cfg["top_k"])
    loss = (y.double() * dy).sum() + cfg["daux"] * y.l_aux.double()
    loss.backward()
    tol = TOL[cfg["dtype"]]
    assert y.dtype == dt and tuple(y.shape) == tuple(y_ref.shape)
    assert rel(y, y_ref) <= tol, ("y", rel(y, y_ref))
    assert abs(float(y.l_aux) - aux_ref) / max(abs(aux_ref), 1e-6) <= tol, ("l_aux", float(y.l_aux), aux_ref)
    assert rel(xv.grad, dx_ref) <= tol, ("dx", rel(xv.grad, dx_ref))
    params = dict(layer.named_parameters())
    for name, g_ref in grads_ref.items():
        if expert_type == "llama_ffn" and name.startswith("experts."):
            tname = {"experts.gate_proj": "experts.W_fc1", "experts.up_proj": "experts.W_fc2",
                     "experts.down_proj": "experts.W_fc3"}[name]
            g = params[tname].grad.view(g_ref.shape[0], g_ref.shape[2], g_ref.shape[1]).transpose(1, 2)
        else:
            g = params[tutel_name(cfg, name)].grad
        assert g is not None and g.dtype == dt, name
        assert rel(g, g_ref) <= tol, (name, rel(g, g_ref))


@pytest.mark.parametrize("cfg", CASES, ids=[c["name"] for c in CASES])
def test_layer_matches_dense_torch(cfg):
    run_case(cfg)


@pytest.mark.parametrize("name", ["f32_top_k2_cf1_swiglu_drops_post", "bf16_top_k2_cf0_swiglu_pre",
                                  "f64_cos_k2_cf0_swiglu_pre"])
def test_tutel_llama_ffn_layout(name):
    cfg = next(c for c in CASES if c["name"] == name)
    run_case(cfg, expert_type="llama_ffn")
